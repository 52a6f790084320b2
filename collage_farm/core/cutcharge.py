"""A cut's charge by the bytes crossing it: ``fixed + per_byte x bytes``, floored at 0.

Entering a partition from another toolchain costs more where larger tensors cross the cut
(the receiving toolchain copies, reorders or re-packs them; the caches hold less of them), so a
target's cut charge is a line in the bytes that enter the partition from other partitions.
`fit_cut_charge` fits it from measured ``(bytes, extra seconds)`` points robustly (Theil-Sen:
the slope is the median of the pairwise slopes, the intercept the median residual), because
each point is the difference of two noisy in-chain medians and a few of them are far off.
`level_cut_charge` spreads a measured total over cuts of known sizes instead: the level comes
from the total (a robust paired measurement), only the slope from noisy per-cut points.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from collage_farm.core.subgraph import SubGraph

__all__ = ["CutCharge", "entering_bytes", "fit_cut_charge", "level_cut_charge"]


@dataclass(frozen=True)
class CutCharge:
    """Seconds charged for one cut into a target: ``fixed_s + per_byte_s x nbytes``, never
    below 0. ``per_byte_s`` is never negative (`fit_cut_charge`); ``fixed_s`` may be, so
    that small cuts are charged 0 where the line crosses zero above 0 bytes."""

    fixed_s: float
    per_byte_s: float = 0.0

    def cost(self, nbytes: int) -> float:
        """The charge for a cut crossed by ``nbytes`` bytes (negative counts as 0)."""
        return max(0.0, self.fixed_s + self.per_byte_s * max(0, int(nbytes)))

    def to_json(self) -> dict[str, Any]:
        return {"fixed_s": self.fixed_s, "per_byte_s": self.per_byte_s}


def fit_cut_charge(points: Sequence[tuple[int, float]]) -> CutCharge:
    """Theil-Sen line through ``(bytes, seconds)`` points: slope = median of the slopes of
    every pair with different bytes, floored at 0 (a cut does not get cheaper with more
    bytes; a falling median is noise); intercept = median of ``seconds - slope x bytes``.
    One distinct size (or none): the median seconds, no per-byte part. No points: 0."""
    pts = [(int(b), float(s)) for b, s in points]
    if not pts:
        return CutCharge(0.0, 0.0)
    slopes = [(s2 - s1) / (b2 - b1)
              for i, (b1, s1) in enumerate(pts) for b2, s2 in pts[i + 1:] if b2 != b1]
    slope = max(0.0, statistics.median(slopes)) if slopes else 0.0
    return CutCharge(statistics.median(s - slope * b for b, s in pts), slope)


def level_cut_charge(total_s: float, cut_bytes: Sequence[int],
                     points: Sequence[tuple[int, float]]) -> CutCharge:
    """The line whose charges at cuts of ``cut_bytes`` add up to ``total_s`` (what those cuts
    were measured to cost together), sloped by the Theil-Sen slope of ``points`` clamped to
    ``[0, total_s / sum(cut_bytes)]``: between one figure per cut (slope 0) and a charge
    proportional to the bytes (fixed 0), so neither part is ever negative. No cuts or a
    total <= 0: 0."""
    n, total_b = len(cut_bytes), sum(max(0, int(b)) for b in cut_bytes)
    if n == 0 or not total_s > 0:
        return CutCharge(0.0, 0.0)
    slope = fit_cut_charge(points).per_byte_s if points else 0.0
    slope = min(slope, total_s / total_b) if total_b > 0 else 0.0
    return CutCharge((total_s - slope * total_b) / n, slope)


def entering_bytes(sub_graph: SubGraph) -> int:
    """Bytes of the tensors ``sub_graph``'s nodes read from nodes outside it (graph inputs
    and initializers excluded): what crosses the cut into a partition of those nodes."""
    g = sub_graph.graph
    return sum(g.tensors[name].nbytes if name in g.tensors else 0
               for name in sub_graph.input_tensors if g.producer.get(name) is not None)
