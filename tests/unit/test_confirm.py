"""The confirmation step (`collage_farm.postsearch.confirm`): the winner's curse, undone.

A campaign's first costs are noisy, and the search picks the cheapest path, so the costs on
that path are biased low. These tests script exactly that: an estimator whose first answer for
each fingerprint is the true cost times a bias in (0.5, 1] (a lower bound, as the winner's curse
makes the chosen ones), and whose `remeasure` answers the true cost. The law: when confirmation
ends "stable" (the path is made of re-measured candidates), the path is optimal under the true
costs, because its own costs are true and every other cost is at most true.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collage_farm import zoo
from collage_farm.campaign import build_specs
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.core.rules import RuleOptions, all_candidates
from collage_farm.core.search import search
from collage_farm.core.target import parse_targets
from collage_farm.postsearch.confirm import confirm
from estimators.base import CostEstimator
from estimators.mock import MockEstimator

ORT, OV = parse_targets("ort-cpu,openvino-cpu")


class FirstBiasedLow(CostEstimator):
    """True costs from `MockEstimator`; first answers biased low per fingerprint."""

    label = "farm"

    def __init__(self, seed: int, lo: float) -> None:
        self.true = MockEstimator(seed=3)
        self.seed, self.lo = seed, lo
        self.memo: dict[str, Cost] = {}
        self.remeasured: list[str] = []

    def bias(self, fp: str) -> float:
        h = int(hashlib.sha256(f"{self.seed}|{fp}".encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        return self.lo + (1.0 - self.lo) * h

    def estimate(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        out = []
        for c in candidates:
            if c.fingerprint not in self.memo:
                t = self.true.estimate([c])[0]
                self.memo[c.fingerprint] = (Cost(t.seconds * self.bias(c.fingerprint))
                                            if t.is_known else t)
            out.append(self.memo[c.fingerprint])
        return out

    def remeasure(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        out = []
        for c in candidates:
            self.remeasured.append(c.fingerprint)
            self.memo[c.fingerprint] = self.true.estimate([c])[0]
            out.append(self.memo[c.fingerprint])
        return out


@pytest.fixture(scope="module")
def mnist() -> DataflowGraph:
    return load_graph(zoo.build("mnist"), name="mnist")


@pytest.fixture(scope="module")
def cands(mnist: DataflowGraph) -> list[CandidatePartition]:
    return all_candidates(mnist, build_specs([ORT, OV], RuleOptions(max_depth=3)))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), lo=st.floats(0.5, 1.0))
def test_stable_confirmation_is_optimal_under_true_costs(
        mnist: DataflowGraph, cands: list[CandidatePartition], seed: int, lo: float) -> None:
    est = FirstBiasedLow(seed, lo)
    first = search(mnist, cands, est, lazy=False)
    res, info = confirm(mnist, cands, est, None, first, [ORT, OV], rounds=50, lazy=False)
    truth = search(mnist, cands, MockEstimator(seed=3), lazy=False)
    assert info["stopped_by"] == "stable"
    assert res.total_s == pytest.approx(truth.total_s, rel=1e-9)
    # every candidate on the final path was re-measured, and nothing twice
    assert {p.candidate.fingerprint for p in res.partitions} <= set(est.remeasured)
    assert len(est.remeasured) == len(set(est.remeasured)) == info["remeasured"]
    assert res.total_s >= first.total_s - 1e-15  # fresh costs are not biased low


def test_confirmation_rounds_are_a_budget(mnist: DataflowGraph,
                                          cands: list[CandidatePartition]) -> None:
    est = FirstBiasedLow(7, 0.5)
    first = search(mnist, cands, est, lazy=False)
    _, info = confirm(mnist, cands, est, None, first, [ORT, OV], rounds=1, lazy=False)
    # one round: the first path's candidates and both whole models, re-measured once
    path = {p.candidate.fingerprint for p in first.partitions}
    assert path <= set(est.remeasured) and info["remeasured"] == len(est.remeasured)
    assert info["stopped_by"] in ("stable", "rounds")
    assert [e["before_s"] <= e["after_s"] for e in info["log"]] == [True] * len(info["log"])


def test_estimators_that_cannot_measure_skip_it(mnist: DataflowGraph,
                                                cands: list[CandidatePartition]) -> None:
    est = MockEstimator(seed=3)
    first = search(mnist, cands, est, lazy=False)
    res, info = confirm(mnist, cands, est, None, first, [ORT, OV], rounds=3, lazy=False)
    assert res is first and "cannot re-measure" in info["skipped"]
