"""MockEstimator: deterministic, structure-derived fake costs, labelled "mock".

Why: the CLI, the search and the property tests need costs before any runner exists (and on
machines with no devices); they need them deterministic (a test that fails must fail again),
derived only from what a fingerprint covers (equal fingerprints, equal costs), and shaped like
real costs, so that the search has real trade-offs to make:

* a per-partition launch overhead (so fusing nodes into one partition pays),
* per-node overhead and FLOPs over a rate, both scaled by a per-(target, op type) multiplier
  (so no target wins everywhere: a mix is worth searching for),
* boundary bytes over a bandwidth,
* everything scaled by a per-target multiplier.

Multipliers come from a SHA-256 of ``seed``, the target name and the op type, never from Python's
salted ``hash``. ``invalid_ops`` makes chosen (target, op type) pairs fail (`Cost.invalid()`), to
exercise failure paths. `lower_bound` is ``lb_ratio`` x the estimate, so it never exceeds it.

These are not measurements: the label "mock" travels with every cost shown.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from estimators.analytic import node_flops
from estimators.base import CostEstimator, EstimatorKind, EstimatorStats


def _unit(*parts: object) -> float:
    """A deterministic number in [0, 1) from the parts."""
    h = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


class MockEstimator(CostEstimator):
    """Deterministic fake costs from structure (see the module docstring)."""

    label = "mock"
    kind = EstimatorKind.MOCK
    has_lower_bound = True

    def __init__(
        self,
        *,
        seed: int = 0,
        launch_s: float = 8e-6,
        per_op_s: float = 1.5e-6,
        flops_per_s: float = 20e9,
        bytes_per_s: float = 10e9,
        target_spread: tuple[float, float] = (0.6, 1.6),
        op_spread: tuple[float, float] = (0.5, 1.5),
        invalid_ops: Iterable[tuple[str, str]] = (),
        lb_ratio: float = 0.5,
    ) -> None:
        if not 0.0 <= lb_ratio <= 1.0:
            raise ValueError("lb_ratio must be within [0, 1] so the bound never exceeds the cost")
        self.seed = seed
        self.launch_s = launch_s
        self.per_op_s = per_op_s
        self.flops_per_s = flops_per_s
        self.bytes_per_s = bytes_per_s
        self.target_spread = target_spread
        self.op_spread = op_spread
        self.invalid_ops = frozenset(invalid_ops)
        self.lb_ratio = lb_ratio
        self._memo: dict[str, Cost] = {}
        self._requested = 0
        self._failed = 0
        self._estimated: set[str] = set()

    def target_multiplier(self, target_name: str) -> float:
        lo, hi = self.target_spread
        return lo + (hi - lo) * _unit(self.seed, "target", target_name)

    def op_multiplier(self, target_name: str, op_type: str) -> float:
        lo, hi = self.op_spread
        return lo + (hi - lo) * _unit(self.seed, "op", target_name, op_type)

    def cost(self, candidate: CandidatePartition) -> Cost:
        fp = candidate.fingerprint
        got = self._memo.get(fp)
        if got is not None:
            return got
        t = candidate.target
        sg = candidate.sub_graph
        g = sg.graph
        if any((t.name, n.op_type) in self.invalid_ops for n in sg.nodes):
            c = Cost.invalid()
        else:
            s = self.launch_s
            for n in sg.nodes:
                m = self.op_multiplier(t.name, n.op_type)
                s += m * (self.per_op_s + node_flops(n, g) / self.flops_per_s)
            bin_, bout = sg.boundary_bytes()
            s += (bin_ + bout) / self.bytes_per_s
            c = Cost(s * self.target_multiplier(t.name))
        self._memo[fp] = c
        return c

    def estimate(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        self._requested += len(candidates)
        out = []
        for c in candidates:
            new = c.fingerprint not in self._estimated
            self._estimated.add(c.fingerprint)
            cost = self.cost(c)
            if new and cost.is_invalid:
                self._failed += 1
            out.append(cost)
        return out

    def lower_bound(self, candidate: CandidatePartition) -> Cost:
        c = self.cost(candidate)
        if not c.is_known:
            return Cost.zero()
        return Cost(c.seconds * self.lb_ratio)

    def stats(self) -> EstimatorStats:
        return EstimatorStats(requested=self._requested, distinct=len(self._estimated),
                              failed=self._failed)
