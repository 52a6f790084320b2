"""A cut's charge by the bytes crossing it: ``fixed + per_byte x bytes``, floored at 0, capped.

Entering a partition from another toolchain costs more where larger tensors cross the cut
(the receiving toolchain copies, reorders or re-packs them; the caches hold less of them), so a
target's cut charge is a line in the bytes that enter the partition from other partitions.
`fit_cut_charge` fits it from measured ``(bytes, extra seconds)`` points robustly (Theil-Sen:
the slope is the median of the pairwise slopes, the intercept the median residual), because
each point is the difference of two noisy in-chain medians and a few of them are far off.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from collage_farm.core.subgraph import SubGraph

__all__ = ["CutCharge", "entering_bytes", "fit_cut_charge"]


@dataclass(frozen=True)
class CutCharge:
    """Seconds charged for one cut into a target: ``fixed_s + per_byte_s x nbytes``, never
    below 0 nor above ``cap_s``. ``per_byte_s`` is never negative (`fit_cut_charge`);
    ``fixed_s`` may be, so that small cuts are charged 0 where the line crosses zero above 0
    bytes; ``cap_s`` keeps a noisy slope from charging a cut larger than the probe's more than
    any cut was measured to cost."""

    fixed_s: float
    per_byte_s: float = 0.0
    cap_s: float = math.inf

    def cost(self, nbytes: int) -> float:
        """The charge for a cut crossed by ``nbytes`` bytes (negative counts as 0)."""
        return min(self.cap_s, max(0.0, self.fixed_s + self.per_byte_s * max(0, int(nbytes))))

    def to_json(self) -> dict[str, Any]:
        out = {"fixed_s": self.fixed_s, "per_byte_s": self.per_byte_s}
        if math.isfinite(self.cap_s):
            out["cap_s"] = self.cap_s
        return out


def fit_cut_charge(points: Sequence[tuple[int, float]]) -> CutCharge:
    """Theil-Sen line through ``(bytes, seconds)`` points: slope = median of the slopes of
    every pair with different bytes, floored at 0 (a cut does not get cheaper with more
    bytes; a falling median is noise); intercept = median of ``seconds - slope x bytes``;
    capped at the largest point (floored at 0). One distinct size (or none): the median
    seconds, no per-byte part. No points: 0."""
    pts = [(int(b), float(s)) for b, s in points]
    if not pts:
        return CutCharge(0.0, 0.0)
    slopes = [(s2 - s1) / (b2 - b1)
              for i, (b1, s1) in enumerate(pts) for b2, s2 in pts[i + 1:] if b2 != b1]
    slope = max(0.0, statistics.median(slopes)) if slopes else 0.0
    return CutCharge(statistics.median(s - slope * b for b, s in pts), slope,
                     max(0.0, max(s for _, s in pts)))


def entering_bytes(sub_graph: SubGraph) -> int:
    """Bytes of the tensors ``sub_graph``'s nodes read from nodes outside it (graph inputs
    and initializers excluded): what crosses the cut into a partition of those nodes."""
    g = sub_graph.graph
    return sum(g.tensors[name].nbytes if name in g.tensors else 0
               for name in sub_graph.input_tensors if g.producer.get(name) is not None)
