"""`CostTableWriter`: the one writer a campaign holds on its cost table.

It buffers rows and writes each flush as one part file (`collage_farm.costtable.parts`), so a
campaign killed at any moment loses at most the rows buffered since its last flush.

Flush policy
------------
A writer flushes when its buffer holds ``max_rows`` rows or its oldest buffered row is older
than ``flush_interval_s`` (default 2 s), and on `close()` / context exit (and at interpreter
exit if the owner forgot to close it). The age check runs **both** on every `append` and on a
daemon **background timer thread** (``background=True``, the default), so rows measured just
before a long silence (a 120 s timeout on the next candidate) still reach disk within about
``flush_interval_s``. With ``background=False`` only appends, `flush()` and `close()` flush.

Writers never take the compaction lock: appends go on during a compaction
(`collage_farm.costtable.compact`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from collage_farm.costtable.errors import CostTableError
from collage_farm.costtable.parts import rescue_dir, write_part
from collage_farm.costtable.rows import normalize_row, row_from_result, rows_to_table
from runners.base import MeasureResult

log = logging.getLogger(__name__)


class CostTableWriter:
    """Buffers rows and flushes them as part files (module docstring: "Flush policy").

    Thread-safe: `append` may be called from several threads (a farm's result callbacks).
    One writer belongs to one process; a forked child must open its own.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        campaign_id: str = "",
        flush_interval_s: float = 2.0,
        max_rows: int = 5000,
        background: bool = True,
        compression: str = "zstd",
        durable: bool = True,
    ) -> None:
        if flush_interval_s <= 0 or max_rows <= 0:
            raise ValueError("flush_interval_s and max_rows must be positive")
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.campaign_id = campaign_id
        self.flush_interval_s = float(flush_interval_s)
        self.max_rows = int(max_rows)
        self.compression = compression
        self.durable = durable
        self.rows_written = 0
        self.files_written: list[Path] = []
        self.last_error: BaseException | None = None
        self._tag = campaign_id or f"pid{os.getpid()}"
        self._pid = os.getpid()
        self._buf: list[dict[str, Any]] = []
        self._oldest: float | None = None
        self._lock = threading.Lock()  # guards the buffer
        self._flush_lock = threading.Lock()  # one flush at a time, in order
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=self._run_timer, name=f"costtable-flush-{self._tag}", daemon=True
            )
            self._thread.start()
        atexit.register(self._atexit)

    # -- public API
    @property
    def pending(self) -> int:
        """Rows buffered, not yet on disk."""
        with self._lock:
            return len(self._buf)

    def append(self, row: Mapping[str, Any]) -> None:
        """Buffer one row (checked now: `normalize_row`); flush if due."""
        self._check_open()
        norm = normalize_row(row, campaign_id=self.campaign_id)
        with self._lock:
            self._buf.append(norm)
            if self._oldest is None:
                self._oldest = time.monotonic()
            due = self._due_locked()
        if due:
            self.flush()

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.append(row)

    def append_result(
        self,
        result: MeasureResult,
        *,
        model: str = "",
        nodes: Sequence[str] = (),
        op_types: Sequence[str] = (),
    ) -> None:
        self.append(row_from_result(result, campaign_id=self.campaign_id, model=model,
                                    nodes=nodes, op_types=op_types))

    def flush(self) -> Path | None:
        """Write the buffered rows as one part file now; None when there was nothing."""
        with self._flush_lock:
            with self._lock:
                rows, oldest = self._buf, self._oldest
                self._buf, self._oldest = [], None
            if not rows:
                return None
            try:
                path = write_part(self.path, rows_to_table(rows), tag=self._tag,
                                  compression=self.compression, durable=self.durable)
            except BaseException as e:
                with self._lock:  # put the rows back, in order, to retry later
                    self._buf[:0] = rows
                    if oldest is not None and (self._oldest is None or oldest < self._oldest):
                        self._oldest = oldest
                self.last_error = e
                raise
            self.rows_written += len(rows)
            self.files_written.append(path)
            return path

    def close(self) -> None:
        """Stop the timer and flush what is left.

        If that final flush fails (a read-only or full disk, a directory removed under us), the
        rows are not dropped: they are written as a part file under `rescue_dir` and
        `CostTableError` names it (move it into the table to keep them); only if that fails
        too does the original error propagate.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        atexit.unregister(self._atexit)
        if os.getpid() != self._pid:
            return
        try:
            self.flush()
        except Exception as e:
            with self._lock:
                rows, self._buf, self._oldest = self._buf, [], None
            try:
                saved = write_part(rescue_dir(), rows_to_table(rows), tag=self._tag,
                                   compression=self.compression, durable=self.durable)
            except Exception:
                with self._lock:
                    self._buf[:0] = rows
                raise e from None
            raise CostTableError(
                f"cost table {self.path}: could not write {len(rows)} row(s) "
                f"({type(e).__name__}: {e}); they are saved in {saved}: move that file into "
                "the table directory to keep them") from e

    def __enter__(self) -> CostTableWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("append to a closed CostTableWriter")
        if os.getpid() != self._pid:
            raise RuntimeError("a CostTableWriter cannot be shared across fork; open a new one")

    def _due_locked(self) -> bool:
        if not self._buf:
            return False
        if len(self._buf) >= self.max_rows:
            return True
        return self._oldest is not None and (
            time.monotonic() - self._oldest >= self.flush_interval_s
        )

    def _run_timer(self) -> None:
        tick = min(max(self.flush_interval_s / 4, 0.01), 0.5)
        while not self._stop.wait(tick):
            with self._lock:
                due = self._due_locked()
            if due:
                try:
                    self.flush()
                except Exception as e:  # rows stay buffered; retried next tick; close raises
                    log.warning("cost table %s: background flush failed: %s", self.path, e)

    def _atexit(self) -> None:
        with contextlib.suppress(Exception):
            self.close()
