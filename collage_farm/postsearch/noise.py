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

Each comparison also carries a 95% interval for the ratio (`Paired.low`, `Paired.high`):
``exp(median log ratio -/+ t * 1.25 * sd(log ratios) / sqrt(pairs))``, ``t`` the Student
quantile for ``pairs - 1`` degrees of freedom (`t_quantile_95`), the same standard error the
threshold uses; unpaired, the cv's of both medians give it with the normal quantile.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from runners.base import Summary

__all__ = ["NOISE_FLOOR", "NOISE_SIGMAS", "Paired", "beyond_noise", "noise_threshold", "paired",
           "t_quantile_95"]

NOISE_FLOOR = 0.03
NOISE_SIGMAS = 2.5
MEDIAN_SE = 1.2533  # standard error of a median / standard error of a mean (normal samples)
Z_95 = 1.959964  # two-sided 95% normal quantile


def t_quantile_95(df: int) -> float:
    """The two-sided 95% quantile of Student's t with ``df`` degrees of freedom: the
    Cornish-Fisher expansion around the normal quantile (within 1% of the exact value from
    ``df`` 3 up; 4.17 for the exact 4.30 at ``df`` 2); the normal quantile for ``df`` < 1."""
    if df < 1:
        return Z_95
    z, v = Z_95, float(df)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3))


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
    low: float = math.nan  # 95% interval of ``ratio`` (see module doc); NaN when unknown
    high: float = math.nan

    @property
    def a_faster(self) -> bool:
        """``a`` beats ``b`` beyond noise. A ratio on the boundary to within rounding is not a
        win: a per-round drift that scales both sides must not flip the decision (hypothesis
        found 0.97 and 0.96999999999999990 for one set of rounds with and without drift)."""
        return self.ratio < (1.0 - self.threshold) * (1.0 - 1e-12)

    def to_json(self) -> dict:
        finite = math.isfinite(self.low) and math.isfinite(self.high)
        return {"ratio": self.ratio, "threshold": self.threshold, "pairs": self.pairs,
                "low": self.low if finite else None, "high": self.high if finite else None}


def paired(a: Summary, b: Summary, a_rounds: Sequence[float] = (),
           b_rounds: Sequence[float] = (), rounds: int = 1) -> Paired:
    """Compare ``a`` with ``b`` round by round when both have >= 3 positive round medians,
    else on their medians with the unpaired `noise_threshold` (see module doc)."""
    pairs = [(x, y) for x, y in zip(a_rounds, b_rounds) if x > 0 and y > 0]
    if len(pairs) >= 3:
        logs = [math.log(x / y) for x, y in pairs]
        sd = float(np.std(logs, ddof=1))
        se = MEDIAN_SE * sd / math.sqrt(len(pairs))
        thr = max(NOISE_FLOOR, NOISE_SIGMAS * se)
        mid = float(np.median(logs))
        half = t_quantile_95(len(pairs) - 1) * se
        return Paired(float(math.exp(mid)), thr, len(pairs), math.exp(mid - half),
                      math.exp(mid + half))
    ratio = a.median / b.median if b.median > 0 else math.inf
    ca = a.cv if math.isfinite(a.cv) else 0.0
    cb = b.cv if math.isfinite(b.cv) else 0.0
    half = Z_95 * math.hypot(ca, cb) / math.sqrt(max(1, rounds))
    low, high = ((ratio * math.exp(-half), ratio * math.exp(half))
                 if math.isfinite(ratio) and ratio > 0 else (math.nan, math.nan))
    return Paired(ratio, noise_threshold(a, b, rounds), 0, low, high)
