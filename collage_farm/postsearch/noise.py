"""When one measured plan beats another: the noise rule of refinement and never-worse.

Two plans timed interleaved in one run are compared **round by round** (`paired`): round ``i``
of each ran within one turn of the rotation, so the ratio of their round-``i`` medians is free
of the drift between turns, which on a shared VM is the larger noise (a whole model moved 30%
between back-to-back runs; the unpaired spread of round medians made the never-worse threshold
3-20%). ``a`` beats ``b`` when the median of the per-round ratios ``a_i / b_i`` is below
``1 - threshold``, ``threshold = max(NOISE_FLOOR, NOISE_SIGMAS * 1.25 * sd(log ratios) /
sqrt(rounds))``: ~2.5 standard errors of that median. The floor (3%) is the spread of one
plan's latency from one process to the next, so a plan is never swapped for a gain a second
run would not reproduce. Without round data (one round, or a caller's summaries only) the
unpaired rule stands: ``max(NOISE_FLOOR, NOISE_SIGMAS * sqrt(cv_a^2 + cv_b^2) /
sqrt(rounds))`` on the medians, the cv's being those of each side's round medians
(`Summary.cv`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from runners.base import Summary

__all__ = ["NOISE_FLOOR", "NOISE_SIGMAS", "Paired", "beyond_noise", "noise_threshold", "paired"]

NOISE_FLOOR = 0.03
NOISE_SIGMAS = 2.5
MEDIAN_SE = 1.2533  # standard error of a median / standard error of a mean (normal samples)


def noise_threshold(a: Summary, b: Summary, rounds: int) -> float:
    """Relative difference below which two interleaved medians are the same (see module doc)."""
    ca = a.cv if math.isfinite(a.cv) else 0.0
    cb = b.cv if math.isfinite(b.cv) else 0.0
    return max(NOISE_FLOOR, NOISE_SIGMAS * math.hypot(ca, cb) / math.sqrt(max(1, rounds)))


def beyond_noise(faster: Summary, slower: Summary, rounds: int) -> bool:
    """Whether ``faster`` beats ``slower`` by more than `noise_threshold` (unpaired)."""
    return faster.median < slower.median * (1.0 - noise_threshold(faster, slower, rounds))


@dataclass(frozen=True)
class Paired:
    """``a`` against ``b`` from one interleaved run (see module doc)."""

    ratio: float  # a / b: the median of the per-round ratios (paired), else of the medians
    threshold: float  # relative difference below which a and b are the same
    pairs: int  # rounds compared pairwise; 0 = the unpaired rule decided

    @property
    def a_faster(self) -> bool:
        """``a`` beats ``b`` beyond noise. A ratio on the boundary to within rounding is not a
        win: a per-round drift that scales both sides must not flip the decision (hypothesis
        found 0.97 and 0.96999999999999990 for one set of rounds with and without drift)."""
        return self.ratio < (1.0 - self.threshold) * (1.0 - 1e-12)

    def to_json(self) -> dict:
        return {"ratio": self.ratio, "threshold": self.threshold, "pairs": self.pairs}


def paired(a: Summary, b: Summary, a_rounds: Sequence[float] = (),
           b_rounds: Sequence[float] = (), rounds: int = 1) -> Paired:
    """Compare ``a`` with ``b`` round by round when both have >= 3 positive round medians,
    else on their medians with the unpaired `noise_threshold` (see module doc)."""
    pairs = [(x, y) for x, y in zip(a_rounds, b_rounds) if x > 0 and y > 0]
    if len(pairs) >= 3:
        logs = [math.log(x / y) for x, y in pairs]
        sd = float(np.std(logs, ddof=1))
        thr = max(NOISE_FLOOR, NOISE_SIGMAS * MEDIAN_SE * sd / math.sqrt(len(pairs)))
        return Paired(float(math.exp(float(np.median(logs)))), thr, len(pairs))
    ratio = a.median / b.median if b.median > 0 else math.inf
    return Paired(ratio, noise_threshold(a, b, rounds), 0)
