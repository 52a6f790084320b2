"""Campaign progress: a one-line bar on a TTY, otherwise parseable log lines.

The bar shows counts, cache hits, failures, what is in flight and the ETA; without a TTY a
``logging`` line (``farm progress done=.. total=.. hits=.. failed=.. inflight=.. eta_s=..``)
goes out every few seconds. The farm's `MeasurementService.expect` / ``settle`` / ``finish``
feed it the campaign's size and end a caller's share; the dispatch loop feeds it every result.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Mapping
from typing import TextIO

from runners.base import MeasureResult

log = logging.getLogger(__name__)


class Progress:
    """Campaign progress: a bar on a TTY, otherwise a parseable log line every few seconds.

    The estimator reports the campaign's size and cache hits through the farm (`Farm.expect`
    calls `add`), per device kind when it can; the dispatch loop reports each result
    (`result`) and what is in flight. The ETA is the slowest
    kind's: a GPU's candidates go through one runner per GPU while a node's CPU candidates go
    through a runner per core, and on an H100 host the aggregate rate said "5 s left" while the
    CUDA queue needed over a minute. Results nobody announced (re-measurements) grow the total,
    so ``done`` never exceeds it.
    """

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None,
                 log_every_s: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.bar = tty if enabled is None else (enabled and tty)
        self.log_every_s = log_every_s
        self.total = 0
        self.hits = 0
        self.done = 0
        self.failed = 0
        self.inflight = 0
        self.t0 = time.monotonic()
        self.kind_total: dict[str, int] = {}  # to measure, per device kind (announced)
        self.kind_done: dict[str, int] = {}
        self._kind_start: dict[str, tuple[float, int]] = {}  # batch start: (time, done then)
        self._t_first: float | None = None
        self._last = 0.0
        self._drawn = False
        self._logged = ""

    def add(self, total: int = 0, hits: int = 0,
            kinds: Mapping[str, int] | None = None) -> None:
        """``total`` candidates, ``hits`` of them cached; ``kinds``: the rest per device kind.

        A kind with nothing outstanding starts a new batch: its rate is timed from now, so a GPU
        that first gets work after ten minutes of CPU-only campaigns is not judged by them.
        """
        self.total += total
        self.hits += hits
        now = time.monotonic()
        for kind, n in (kinds or {}).items():
            if n <= 0:
                continue
            done = self.kind_done.get(kind, 0)
            if self.kind_total.get(kind, 0) <= done:  # idle: a new batch
                self._kind_start[kind] = (now, done)
                self.kind_total[kind] = done
            self.kind_total[kind] += n
        self.render()

    def settle(self) -> None:
        """The announced work is over (what never came back never will): totals = results."""
        self.total = self.done + self.hits
        for kind in self.kind_total:
            self.kind_total[kind] = self.kind_done.get(kind, 0)
        self.render()

    def result(self, res: MeasureResult) -> None:
        if self._t_first is None:
            self._t_first = time.monotonic()
        self.done += 1
        self.total = max(self.total, self.done + self.hits)
        kind = res.target.device.kind
        self.kind_done[kind] = self.kind_done.get(kind, 0) + 1
        if kind in self.kind_total:
            self.kind_total[kind] = max(self.kind_total[kind], self.kind_done[kind])
        if not res.ok:
            self.failed += 1
        self.render()

    def eta_s(self) -> float:
        """Seconds left: the slowest device kind's at its batch's rate.

        Work announced without kinds is timed at the overall rate since the farm started.
        """
        now = time.monotonic()
        elapsed = now - self.t0
        if self.done == 0 or elapsed <= 0:
            return math.nan
        left = max(0, self.total - self.hits - self.done)
        by_kind = sum(max(0, t - self.kind_done.get(k, 0)) for k, t in self.kind_total.items())
        etas = [left * elapsed / self.done] if left > by_kind else [0.0]
        for kind, total in self.kind_total.items():
            done = self.kind_done.get(kind, 0)
            if total - done <= 0:
                continue
            t0, done0 = self._kind_start.get(kind, (self.t0, 0))
            if done - done0 <= 0 or now - t0 <= 0:
                return math.nan  # work of this kind is waiting and its rate is unknown yet
            etas.append((total - done) * (now - t0) / (done - done0))
        return max(etas)

    def line(self) -> str:
        eta = self.eta_s()
        eta_s = "-" if math.isnan(eta) else f"{eta:.0f}"
        return (f"farm progress done={self.done} total={self.total} hits={self.hits} "
                f"failed={self.failed} inflight={self.inflight} eta_s={eta_s}")

    def render(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.bar:
            if not force and now - self._last < 0.2:
                return
            self._last = now
            need = max(1, self.total)
            frac = min(1.0, (self.done + self.hits) / need)
            width = 24
            filled = int(frac * width)
            eta = self.eta_s()
            eta_txt = "--:--" if math.isnan(eta) else f"{int(eta) // 60:02d}:{int(eta) % 60:02d}"
            text = (f"\r[{'#' * filled}{'.' * (width - filled)}] "
                    f"{self.done + self.hits}/{self.total} measured {self.done} hits {self.hits} "
                    f"failed {self.failed} in-flight {self.inflight} ETA {eta_txt} ")
            self.stream.write(text)
            self.stream.flush()
            self._drawn = True
        elif force or now - self._last >= self.log_every_s:
            self._last = now
            line = self.line()
            if (self.total or self.done) and line != self._logged:
                self._logged = line
                log.info(line)

    def close(self) -> None:
        if self.bar and self._drawn:
            self.render(force=True)
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
        elif not self.bar:
            self.render(force=True)
