"""Compaction: merge a table's part files into one without ever counting a row twice.

POSIX cannot replace many files atomically, so the merged file carries, in its Parquet
key-value metadata (`REPLACES_KEY`, ``collage_farm.replaces``), the names of the files it
replaces. The protocol: take an exclusive ``flock`` (one compaction at a time), read the
current files, write the merged file staged, fsync, rename it in (its name contains
`COMPACT_TAG`), then unlink the files it replaces. `CostTable` applies the rule *a file named
in any present file's ``replaces`` list is ignored*, so at every instant it counts each row
exactly once: before the rename it sees only the old files; between the rename and the unlinks
it sees both and drops the old ones; after, only the merged file. If a compaction dies between
rename and unlinks, readers still count once and the next `compact` deletes the leftovers.
Writers never take the lock: appends go on during a compaction.

Readers that glob the directory themselves (pyarrow datasets, pandas, DuckDB) do not know this
rule: for the milliseconds between the rename and the last unlink (or, after a crash in that
window, until the next `compact`) they may count the replaced rows twice. Compact while no
such reader runs, or query through `CostTable.query` / ``collage-farm costs query``, which
apply the rule.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from collage_farm.costtable.parts import (
    COMPACT_TAG,
    STAGED_SUFFIX,
    fsync_dir,
    staging_dir,
    write_part,
)
from collage_farm.costtable.reader import CostTable
from collage_farm.costtable.schema import REPLACES_KEY


@dataclass(frozen=True)
class CompactResult:
    """What `compact` did."""

    files_before: int  # readable part files listed
    files_after: int  # readable part files left (1, or 0 for an empty table)
    rows: int
    output: Path | None  # the merged file (None: nothing was done)
    removed: tuple[str, ...]
    skipped: tuple[str, ...]  # unreadable files (left in place unless quarantined)
    quarantined: tuple[str, ...] = ()


@contextlib.contextmanager
def _compaction_lock(directory: Path) -> Iterator[None]:
    stage = staging_dir(directory)
    lock_path = stage / ("_compact.lock" if stage == directory else "compact.lock")
    with open(lock_path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _remove_stale_staging(directory: Path, max_age_s: float = 24 * 3600) -> None:
    """Staged files left by killed writers: this host's dead pids, or anything a day old."""
    stage = staging_dir(directory)
    host = socket.gethostname()
    now = time.time()
    for e in list(os.scandir(stage)):
        name = e.name
        if stage == directory:
            if not name.startswith(".staging-"):
                continue
            name = name.removeprefix(".staging-")
        m = re.fullmatch(r"(.*)-(\d+)-[0-9a-f]{32}" + re.escape(STAGED_SUFFIX), name)
        if m is None:
            continue
        dead = False
        if m.group(1) == host:
            try:
                os.kill(int(m.group(2)), 0)
            except ProcessLookupError:
                dead = True
            except OSError:
                pass
        with contextlib.suppress(OSError):
            if dead or now - e.stat().st_mtime > max_age_s:
                os.unlink(e.path)


def compact(
    path: str | os.PathLike[str],
    *,
    min_files: int = 2,
    quarantine: bool = False,
    durable: bool = True,
) -> CompactResult:
    """Merge the part files of ``path`` into one, atomically (module docstring: the protocol).

    Does nothing when fewer than ``min_files`` effective files exist and no replaced leftovers
    remain. Unreadable files are never deleted: they stay in place (and keep being skipped with
    a warning), or with ``quarantine=True`` move to ``<dir>.quarantine/`` so that globbing
    readers (DuckDB, pandas) can read the directory again. Also removes staged files that
    killed writers left behind.
    """
    d = Path(path)
    if not d.is_dir():
        raise FileNotFoundError(f"cost table directory not found: {d}")
    table = CostTable(d)
    with _compaction_lock(d):
        snap = table.snapshot()
        quarantined: list[str] = []
        if quarantine and snap.skipped:
            qdir = d.parent / f"{d.name}.quarantine"
            qdir.mkdir(exist_ok=True)
            for s in snap.skipped:
                with contextlib.suppress(FileNotFoundError):
                    os.replace(d / s.name, qdir / s.name)
                    quarantined.append(s.name)
        skipped = tuple(s.name for s in snap.skipped)
        leftovers = len(snap.valid) - len(snap.parts)
        merged = table.table_of(snap)
        if len(snap.parts) < min_files and leftovers == 0:
            _remove_stale_staging(d)
            return CompactResult(len(snap.valid), len(snap.valid), merged.num_rows, None, (),
                                 skipped, tuple(quarantined))
        output: Path | None = None
        if merged.num_rows:  # rows stay in file (time) order: sorting 1e6 rows costs ~3 s
            meta = {REPLACES_KEY: json.dumps(sorted(snap.valid)).encode()}
            output = write_part(d, merged, tag=COMPACT_TAG, metadata=meta, durable=durable)
        for name in snap.valid:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(d / name)
        if durable:
            fsync_dir(d)
        _remove_stale_staging(d)
        return CompactResult(
            files_before=len(snap.valid),
            files_after=1 if output else 0,
            rows=merged.num_rows,
            output=output,
            removed=tuple(snap.valid),
            skipped=skipped,
            quarantined=tuple(quarantined),
        )
