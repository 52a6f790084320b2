"""Per-phase wall times of a campaign: where its seconds went.

A `PhaseClock` is started once; each `PhaseClock.lap` charges the seconds since the previous
lap (or the start) to a named phase, adding to what that phase already has, so the phases of
one clock add up to its wall time. `top_phases` names the largest ones for a one-line summary.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

__all__ = ["PhaseClock", "top_phases"]


class PhaseClock:
    """Wall seconds per named phase, laps back to back from the clock's start."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self._last = self.start
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> float:
        """Charge the seconds since the last lap to ``phase``; return them."""
        now = time.perf_counter()
        dt = now - self._last
        self._last = now
        self.phases[phase] = self.phases.get(phase, 0.0) + dt
        return dt

    def add(self, phases: Mapping[str, float], into: str) -> None:
        """Split the phase ``into`` (already lapped) by ``phases``, a breakdown timed by a
        step inside it: each of ``phases`` moves its seconds out of ``into``, which keeps the
        rest (never below 0), so the total is unchanged."""
        left = self.phases.get(into, 0.0)
        for k, v in phases.items():
            take = min(max(0.0, float(v)), left)
            self.phases[k] = self.phases.get(k, 0.0) + take
            left -= take
        if left > 0.0 or into in self.phases:
            self.phases[into] = left

    @property
    def wall_s(self) -> float:
        return time.perf_counter() - self.start


def top_phases(phases: Mapping[str, float], n: int = 4, min_s: float = 0.05) -> str:
    """The ``n`` largest phases, largest first, as ``"search 12.3 s, verify 4.5 s"``."""
    big = sorted(((v, k) for k, v in phases.items() if v >= min_s), reverse=True)[:n]
    return ", ".join(f"{k} {v:.1f} s" for v, k in big)
