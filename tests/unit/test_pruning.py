"""Lower-bound pruning on the zoo: the lazy search picks the same plan and asks for fewer costs.

The property tests (test_search.py) prove lazy == eager on random DAGs of <= 10 nodes; this file
checks the same law where it pays, on the zoo models a campaign runs (hundreds of candidates,
repeated layers), and counts what the bounds saved. Costs are the deterministic mock estimator
(labelled as such) whose `lower_bound` is a true bound (half its estimate); the farm estimator
uses the analytic roofline bound the same way (`estimators/measured.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from collage_farm import zoo
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import load_graph
from collage_farm.core.rules import RuleOptions, all_candidates, default_spec
from collage_farm.core.search import search
from collage_farm.core.target import BUILTIN_TARGETS
from collage_farm.core.transition import AnalyticTransitionModel
from estimators.mock import MockEstimator
from runners.registry import capabilities_for

MODELS = {
    "mnist": {},
    "resnet18": {"image_size": 32},
    "mobilenet_v2": {"image_size": 32, "width_mult": 0.25},
    "gpt2": {"layers": 2, "width": 64, "heads": 2, "seq_len": 8, "vocab": 128},
    "bert": {"layers": 2, "width": 64, "heads": 2, "seq_len": 8, "vocab": 128},
}


class CountingEstimator(MockEstimator):
    """The mock costs, counting which distinct candidates had to be estimated."""

    def __init__(self) -> None:
        super().__init__(seed=3, lb_ratio=0.5)
        self.asked: set[str] = set()

    def estimate(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        self.asked.update(c.fingerprint for c in candidates)
        return super().estimate(candidates)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lazy_bounds_give_the_eager_plan_on_the_zoo(name: str) -> None:
    g = load_graph(zoo.build(name, **MODELS[name]), name=name)
    targets = [BUILTIN_TARGETS["ort-cpu"], BUILTIN_TARGETS["openvino-cpu"]]
    specs = []
    for t in targets:
        caps = capabilities_for(t.toolchain)
        specs.append(default_spec(t, caps.supports, caps.style, RuleOptions(max_depth=3)))
    cands = all_candidates(g, specs)
    transition = AnalyticTransitionModel()

    eager_est, lazy_est = CountingEstimator(), CountingEstimator()
    eager = search(g, cands, eager_est, transition, lazy=False)
    lazy = search(g, cands, lazy_est, transition, lazy=True)

    assert lazy.total_s == pytest.approx(eager.total_s, rel=1e-12)
    assert [(p.candidate.fingerprint) for p in lazy.partitions] == [
        p.candidate.fingerprint for p in eager.partitions]
    # pruning never asks for more, and on real models it saves measurements
    assert lazy_est.asked <= eager_est.asked
    assert len(lazy_est.asked) < len(eager_est.asked), (
        f"{name}: bounds saved nothing ({len(lazy_est.asked)} of {len(eager_est.asked)})")
