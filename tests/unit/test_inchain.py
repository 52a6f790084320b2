"""In-chain pricing of the best plans (profile mode), without Ray: the estimator's prices and
the exit charge it learns from them, the loop that times mixed plans (scripted timings, and
one real timing of mnist's plan on ONNX Runtime and OpenVINO), and the prices as cost-table
rows read back by pyarrow and DuckDB."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from collage_farm.campaign import build_specs, load_source
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.rules import RuleOptions, all_candidates
from collage_farm.core.search import PlannedPartition, SearchResult, search
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import parse_targets
from collage_farm.core.transition import ZeroTransitionModel
from collage_farm.costtable import CostTable, CostTableWriter
from collage_farm.costtable.inchain import (
    in_chain_fingerprint,
    in_chain_row,
    stored_in_chain_prices,
)
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.postsearch import inchain
from collage_farm.postsearch.inchain import (
    PlanTiming,
    near_best_single,
    price_best_plans,
    single_instead,
    time_plan_in_chain,
)
from collage_farm.report.nodecosts import node_costs
from estimators.mock import MockEstimator
from estimators.profiled import ProfiledEstimator, TargetProfile, fed_by_partition

ORT, OV = parse_targets("ort-cpu,openvino-cpu")


@pytest.fixture(scope="module")
def mnist() -> DataflowGraph:
    return load_source("zoo:mnist")


def _profile(graph: DataflowGraph, us: list[float]) -> TargetProfile:
    """One node per group, node i costing ``us[i]`` microseconds."""
    names = [n.name for n in graph.nodes]
    return TargetProfile({n: u * 1e-6 for n, u in zip(names, us)},
                         {n: k for k, n in enumerate(names)},
                         dict.fromkeys(range(len(names)), 1), 1.0, sum(us) * 1e-6)


def _halves(graph: DataflowGraph, cheap: float, dear: float) -> ProfiledEstimator:
    """ORT at ``cheap`` us a node on the first half of the nodes and ``dear`` on the second,
    OpenVINO the other way round."""
    n = len(graph.nodes)
    half = n // 2
    ort = [cheap if i < half else dear for i in range(n)]
    ov = [dear if i < half else cheap for i in range(n)]
    return ProfiledEstimator({ORT.id: _profile(graph, ort), OV.id: _profile(graph, ov)},
                             MockEstimator(), graph)


def _mix_estimator(graph: DataflowGraph) -> ProfiledEstimator:
    """ORT cheap on the first half of the nodes, OpenVINO on the second: the search's plan
    is a mix of the two (each whole model costs 5.5 us a node, the mix 1 us)."""
    return _halves(graph, 1.0, 10.0)


def _candidates(graph: DataflowGraph) -> list[CandidatePartition]:
    return all_candidates(graph, build_specs([ORT, OV], RuleOptions(max_depth=4)))


def _search(graph: DataflowGraph, est: ProfiledEstimator) -> SearchResult:
    return search(graph, _candidates(graph), est, ZeroTransitionModel(), lazy=False)


def _feeds(c: CandidatePartition) -> bool:
    g = c.sub_graph.graph
    return any(not c.mask >> u & 1 for o in c.sub_graph.output_tensors
               for u in g.consumers.get(o, ()))


def test_prices_answer_first_and_teach_an_exit_charge(mnist: DataflowGraph) -> None:
    est = _mix_estimator(mnist)
    cands = _candidates(mnist)
    raw = dict(zip(cands, est.estimate(cands)))
    producers = [c for c in cands if c.target.id == OV.id and _feeds(c)]
    assert len(producers) >= 3
    a, b, c3 = producers[:3]
    # three producers of OpenVINO priced 100 and 300 us above their profile answers, and
    # one at half of it
    prices = {(a.target.id, a.mask): raw[a].seconds + 100e-6,
              (b.target.id, b.mask): raw[b].seconds + 300e-6,
              (c3.target.id, c3.mask): raw[c3].seconds * 0.5}
    est.price_in_chain(prices)
    assert est.exit_charges == {OV.id: pytest.approx(100e-6)}  # the median residual
    for c, cost in zip(cands, est.estimate(cands)):
        key = (c.target.id, c.mask)
        if key in prices:
            want = prices[key]  # a price answers as it is
        elif c.target.id == OV.id and _feeds(c):
            want = raw[c].seconds + 100e-6  # every other OpenVINO producer pays the exit
        else:
            want = raw[c].seconds  # ORT, and partitions that feed no other, unchanged
        assert cost.seconds == pytest.approx(want, rel=1e-12), c.label()
        assert est.lower_bound(c).seconds <= cost.seconds + 1e-15
        assert est.is_confirmed(c) and not (key in prices and est.uncertain(c))
    # a price once given stays: a later one for the same partition is ignored
    est.price_in_chain({(a.target.id, a.mask): 1.0})
    assert est.in_chain_price(a) == pytest.approx(prices[(a.target.id, a.mask)])
    # another estimator given the same prices answers the same (a re-run, offline)
    again = _mix_estimator(mnist)
    again.price_in_chain(dict(reversed(list(prices.items()))))
    assert [x.seconds for x in again.estimate(cands)] == [x.seconds for x in est.estimate(cands)]


def test_exit_charge_is_never_negative_and_needs_the_graph(mnist: DataflowGraph) -> None:
    est = _mix_estimator(mnist)
    cands = _candidates(mnist)
    p = next(c for c in cands if c.target.id == ORT.id and _feeds(c))
    est.price_in_chain({(p.target.id, p.mask): 0.0})  # faster than its share: no charge
    assert est.exit_charges == {ORT.id: 0.0}
    blind = ProfiledEstimator(est.profiles, MockEstimator())  # no graph: prices, no learning
    blind.price_in_chain({(p.target.id, p.mask): 1.0})
    assert blind.exit_charges == {} and blind.estimate([p])[0].seconds == 1.0


def _scripted(exit_s: float, calls: list[list[Part]]):  # type: ignore[no-untyped-def]
    """A `time_plan_in_chain` that "measures" each partition at its profile share, plus
    ``exit_s`` for a partition that feeds a later one; whole models at their time base."""
    def fake(builder: PlanBuilder, parts, targets, *, rounds: int = 5,  # type: ignore[no-untyped-def]
             min_round_s: float = 0.05) -> PlanTiming:
        calls.append(list(parts))
        est = _mix_estimator(builder.graph)
        out = []
        for k, p in enumerate(parts):
            c = CandidatePartition(SubGraph(builder.graph, p.mask), p.target)
            share = est.profiles[p.target.id].cost_s(c.node_names, fed_by_partition(c))
            out.append(share + (exit_s if k < len(parts) - 1 else 0.0))
        wholes = {t.id: est.profiles[t.id].whole_s for t in targets}
        return PlanTiming(tuple(out), sum(out), wholes, rounds, 0.0)
    return fake


def test_a_mix_that_loses_in_chain_gives_way_to_the_single(
        mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    est = _mix_estimator(mnist)
    first = _search(mnist, est)
    assert len(first.partitions) >= 2  # the profile shares make a mix
    calls: list[list[Part]] = []
    monkeypatch.setattr(inchain, "time_plan_in_chain", _scripted(200e-6, calls))
    builder = PlanBuilder(mnist)
    result, info, prices = price_best_plans(mnist, est, lambda: _search(mnist, est), first,
                                            builder, rounds=4)
    assert info["plans"] == len(calls) >= 1 and info["priced"] == len(prices) >= 2
    assert info["stopped_by"] == "single" and info["error"] is None
    assert info["exit_s"][calls[0][0].target.id] == pytest.approx(200e-6)
    # the first plan is now priced at what it "ran": its partitions' in-chain sum
    timed = info["log"][0]
    assert sum(p["price_s"] for p in timed["partitions"]) == pytest.approx(
        timed["in_chain_sum_s"], rel=1e-9)
    assert result.total_s > first.total_s  # the exit the profiles did not see
    assert len(result.partitions) == 1 and info["plans"] == 1  # one timing was enough


def _near_estimator(graph: DataflowGraph) -> ProfiledEstimator:
    """ORT 1% cheaper than OpenVINO on the first half of the nodes, dearer on the second: the
    search's plan is a mix, estimated ~1% under either whole model."""
    return _halves(graph, 9.8, 10.0)


def test_a_mix_within_noise_of_a_whole_model_is_not_priced(
        mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    """No end-to-end run tells a mix ~1% under a whole model from it (3% noise floor), and
    the never-worse run times the mix against every whole model anyway: nothing is timed."""
    est = _near_estimator(mnist)
    first = _search(mnist, est)
    assert len(first.partitions) >= 2
    best = min(est.profiles, key=lambda t: est.profiles[t].whole_s)
    assert 0 < 1 - first.total_s / est.profiles[best].whole_s < 0.03
    why = near_best_single(first, est)
    assert why is not None and "noise floor" in why and f"{best}'s whole model" in why

    def never(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("a mix within noise was timed in chain")
    monkeypatch.setattr(inchain, "time_plan_in_chain", never)
    result, info, prices = price_best_plans(mnist, est, lambda: _search(mnist, est), first,
                                            PlanBuilder(mnist))
    assert result is first and prices == [] and info["plans"] == 0
    assert info["stopped_by"] == "within_noise" and info["why"] == why
    # a mix far faster than every whole model, or one partition, is not near
    far = _mix_estimator(mnist)
    assert near_best_single(_search(mnist, far), far) is None
    one = CandidatePartition(SubGraph(mnist, mnist.all_mask), ORT)
    cost = est.estimate([one])[0]
    whole = SearchResult((PlannedPartition(one, cost, 0.0),), cost.seconds, 1, 1, 1, 1, 0.0)
    assert near_best_single(whole, est) is None
    # the floor is a parameter: at 0.5% the same mix is worth pricing
    assert near_best_single(first, est, floor=0.005) is None


def test_a_mix_within_noise_gives_way_to_the_fastest_whole_model(
        mnist: DataflowGraph) -> None:
    """The campaign goes on with the fastest profiled whole model instead of a mix estimated
    under the noise floor below it (set aside untimed, and said); a mix far faster stays, and
    so does a near one when the user's pins forbid that whole model."""
    from collage_farm.core.pins import Pin, PinSet

    est = _near_estimator(mnist)
    mix = _search(mnist, est)
    best = min(est.profiles, key=lambda t: est.profiles[t].whole_s)
    got, info = single_instead(mnist, mix, est, ZeroTransitionModel(), [ORT, OV])
    assert len(got.partitions) == 1 and got.partitions[0].candidate.mask == mnist.all_mask
    assert got.partitions[0].candidate.target.id == best
    assert got.total_s == pytest.approx(est.profiles[best].whole_s, rel=1e-12)
    assert info is not None and info["instead"] == f"{best} whole"
    assert info["estimated_s"] == mix.total_s < info["instead_estimated_s"]
    assert info["why"] == near_best_single(mix, est)
    assert sum(n for _, n in info["plan"]) == len(mnist.nodes)
    # the same costs set the same mix aside: a re-run, an offline search
    again, _ = single_instead(mnist, _search(mnist, est), est, ZeroTransitionModel(), [ORT, OV])
    assert [p.candidate for p in again.partitions] == [p.candidate for p in got.partitions]
    far = _mix_estimator(mnist)
    far_mix = _search(mnist, far)
    assert single_instead(mnist, far_mix, far, ZeroTransitionModel(), [ORT, OV]) == (far_mix,
                                                                                    None)
    other = OV.name if best == ORT.id else ORT.name
    pinned = PinSet((Pin(op="Conv", target=other),))
    assert single_instead(mnist, mix, est, ZeroTransitionModel(), [ORT, OV], pinned) == (
        mix, None)


def test_pricing_stops_at_rounds_on_errors_and_on_foreign_targets(
        mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    est = _mix_estimator(mnist)
    first = _search(mnist, est)
    builder = PlanBuilder(mnist)

    def again() -> SearchResult:
        return _search(mnist, est)

    result, info, prices = price_best_plans(mnist, est, again, first, builder, rounds=0)
    assert (result, info["plans"], prices, info["stopped_by"]) == (first, 0, [], "rounds")
    targets = {p.candidate.target.id for p in first.partitions}
    result, info, _ = price_best_plans(mnist, est, again, first, builder, foreign=targets)
    assert result is first and info["stopped_by"] == "foreign"

    def broken(*a, **k):  # type: ignore[no-untyped-def]
        raise RuntimeError("the toolchain crashed building p001")
    monkeypatch.setattr(inchain, "time_plan_in_chain", broken)
    result, info, prices = price_best_plans(mnist, est, again, first, builder)
    assert result is first and prices == [] and info["stopped_by"] == "error"
    assert "crashed building p001" in info["error"]
    # no mix to price in a whole-model plan
    one = CandidatePartition(SubGraph(mnist, mnist.all_mask), ORT)
    cost = est.estimate([one])[0]
    whole = SearchResult((PlannedPartition(one, cost, 0.0),), cost.seconds, 1, 1, 1, 1, 0.0)
    _, info, _ = price_best_plans(mnist, est, again, whole, builder)
    assert info["stopped_by"] == "single" and info["plans"] == 0


def test_a_real_plan_timed_in_chain(mnist: DataflowGraph) -> None:
    """mnist cut in two, ONNX Runtime then OpenVINO, timed in chain beside both whole models
    with real sessions."""
    pytest.importorskip("openvino")
    order = [n.index for n in mnist.nodes]
    head = sum(1 << i for i in order[: len(order) // 2])
    parts = [Part(head, ORT), Part(mnist.all_mask & ~head, OV)]
    t = time_plan_in_chain(PlanBuilder(mnist), parts, [ORT, OV], rounds=3, min_round_s=0.01)
    assert len(t.partition_s) == 2 and all(s > 0 for s in t.partition_s)
    assert set(t.whole_s) == {ORT.id, OV.id} and all(s > 0 for s in t.whole_s.values())
    assert t.plan_s >= 0.5 * sum(t.partition_s) and t.rounds == 3


def test_prices_round_trip_through_the_cost_table(mnist: DataflowGraph, tmp_path: Path) -> None:
    cands = [c for c in _candidates(mnist) if len(c.node_names) > 1][:3]
    table = tmp_path / "costs"
    w = CostTableWriter(table)
    for k, c in enumerate(cands):
        w.append(in_chain_row(mnist, c.target, c.mask, (k + 1) * 1e-5, {"in_chain_s": 1e-5},
                              campaign_id="a"))
    # a later price of the first partition, and one timed on another host
    w.append(in_chain_row(mnist, cands[0].target, cands[0].mask, 7e-5, {}, campaign_id="b"))
    other = in_chain_row(mnist, cands[1].target, cands[1].mask, 9.0, {}, campaign_id="c")
    other["device"] = "cpu | another host"
    w.append(other)
    w.close()
    got = stored_in_chain_prices(CostTable(table), mnist, [ORT, OV])
    want = {(c.target.id, c.mask): (k + 1) * 1e-5 for k, c in enumerate(cands)}
    want[(cands[0].target.id, cands[0].mask)] = 7e-5
    assert got == pytest.approx(want)
    only_ort = stored_in_chain_prices(CostTable(table), mnist, [ORT])
    assert set(only_ort) == {k for k in want if k[0] == ORT.id}
    assert stored_in_chain_prices(None, mnist, [ORT, OV]) == {}
    fps = {in_chain_fingerprint(mnist, c.target, c.mask) for c in cands}
    rows = CostTable(table).query(
        "SELECT fingerprint, median FROM costs WHERE fingerprint LIKE 'inchain:%'")
    assert set(rows.column("fingerprint").to_pylist()) == fps and rows.num_rows == 5
    assert statistics.median(rows.column("median").to_pylist()) > 0
    # the report's per-node costs are candidates' measurements: priced partitions are not
    assert node_costs(table, mnist.name, [n.name for n in mnist.nodes]) == {}


def test_the_story_says_what_in_chain_pricing_did() -> None:
    from collage_farm.report.summary import _history

    s = {"dijkstra_plan": "openvino-cpu whole", "dijkstra_estimated_s": 12.3e-3,
         "inchain": {"plans": 1, "priced": 2, "stopped_by": "single",
                     "exit_s": {"openvino-cpu": 2.8e-3, "ort-cpu": 0.0},
                     "log": [{"estimated_s": 19.2e-3, "plan_s": 21.9e-3}]}}
    line = next(x for x in _history(s) if x.startswith("in-chain pricing"))
    assert "estimated 19.2 ms and ran 21.9 ms" in line and "(measured)" in line
    assert "1 mixed plan timed" in line and "2 partitions priced" in line
    assert "openvino-cpu 2.8 ms" in line and "ort-cpu" not in line  # no charge, not said
    assert "stopped: single" in line
    assert not [x for x in _history({**s, "inchain": None}) if x.startswith("in-chain")]
