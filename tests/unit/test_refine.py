"""Plan refinement with measured moves, and the validity rules every move must keep.

Real ORT and OpenVINO sessions on zoo models; invariants are asserted (every node once,
convex partitions, acyclic order, numerics, never slower than the start beyond noise), never
a speed-up figure.
"""

from __future__ import annotations

import dataclasses
import math

import onnx
import pytest
from onnx import TensorProto, helper

from collage_farm import zoo
from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.core.search import SearchResult
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import parse_targets
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.postsearch.moves import (
    order_parts,
    propose_moves,
    to_search_result,
    why_invalid,
)
from collage_farm.postsearch.never_worse import verify
from collage_farm.postsearch.noise import NOISE_FLOOR, noise_threshold
from collage_farm.postsearch.refine import refine
from runners.base import MeasureConfig, Summary

pytest.importorskip("openvino")
ORT, OV = parse_targets("ort-cpu,openvino-cpu")
FAST = MeasureConfig(warmup_runs=2, rounds=3, min_round_s=0.005, min_round_runs=5)


@pytest.fixture(scope="module")
def mnist() -> DataflowGraph:
    return load_graph(zoo.build("mnist"), name="mnist")


def _cross() -> DataflowGraph:
    """x1=Relu(X), y1=Relu(Y), x2=x1+y1, y2=y1*x1: {x1, y2} and {y1, x2} are each convex but
    need each other's outputs (a cycle between partitions)."""
    v = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in "XY"]
    nodes = [
        helper.make_node("Relu", ["X"], ["x1"], name="x1"),
        helper.make_node("Relu", ["Y"], ["y1"], name="y1"),
        helper.make_node("Add", ["x1", "y1"], ["x2"], name="x2"),
        helper.make_node("Mul", ["y1", "x1"], ["y2"], name="y2"),
    ]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x2", "y2")]
    m = helper.make_model(helper.make_graph(nodes, "cross", v, outs),
                          opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    onnx.checker.check_model(m)
    return load_graph(m, name="cross")


def _idx(g: DataflowGraph, *names: str) -> int:
    return sum(1 << g.node_by_name(n).index for n in names)


def alternating(g: DataflowGraph) -> list[Part]:
    return [Part(1 << i, (ORT, OV)[i % 2]) for i in range(len(g.nodes))]


def test_validity_rules() -> None:
    g = _cross()
    ok = [Part(_idx(g, "x1", "y1"), ORT), Part(_idx(g, "x2", "y2"), OV)]
    assert why_invalid(g, ok) is None
    assert order_parts(g, list(reversed(ok))) == ok  # reordered to producers first
    cyc = [Part(_idx(g, "x1", "y2"), ORT), Part(_idx(g, "y1", "x2"), OV)]
    assert all(SubGraph(g, p.mask).is_convex for p in cyc)
    assert "cycle" in (why_invalid(g, cyc) or "")
    assert order_parts(g, cyc) is None
    assert "two partitions" in (why_invalid(g, [*ok, Part(_idx(g, "x1"), OV)]) or "")
    assert "no partition" in (why_invalid(g, ok[:1]) or "")


def test_non_convex_and_pins_rejected(mnist: DataflowGraph) -> None:
    from collage_farm.core.pins import Pin, PinSet

    n = len(mnist.nodes)
    # first and last node together, the middle elsewhere: a path leaves and re-enters
    parts = [Part(1 | 1 << (n - 1), ORT), Part(mnist.all_mask & ~(1 | 1 << (n - 1)), OV)]
    assert "not convex" in (why_invalid(mnist, parts) or "")
    whole_ov = [Part(mnist.all_mask, OV)]
    assert why_invalid(mnist, whole_ov) is None
    pins = PinSet.of([Pin(op="MaxPool", target="ort-cpu")])
    assert "pins" in (why_invalid(mnist, whole_ov, pins) or "")


def test_every_proposed_move_keeps_the_cover(mnist: DataflowGraph) -> None:
    # three runs of the node order: boundary nodes can move without emptying a partition
    n = len(mnist.nodes)
    runs = [Part(sum(1 << j for j in range(a, b)), t)
            for a, b, t in ((0, 4, ORT), (4, 8, OV), (8, n, ORT))]
    kinds = {m.kind for m in propose_moves(mnist, runs, [ORT, OV])}
    assert {"merge", "switch", "move-node"} <= kinds
    start = alternating(mnist)  # single-node partitions: a node move equals a merge (deduped)
    moves = list(propose_moves(mnist, start, [ORT, OV]))
    assert len({frozenset(m.parts) for m in moves}) == len(moves)
    valid = 0
    for m in moves:
        covered = 0
        for p in m.parts:
            assert not covered & p.mask
            covered |= p.mask
        assert covered == mnist.all_mask
        valid += why_invalid(mnist, m.parts) is None
    assert valid > 0
    # merges of different-target neighbours come first (they remove cuts)
    assert moves[0].kind == "merge"


def test_noise_threshold() -> None:
    quiet = Summary(1e-3, 1e-3, 0, 1e-3, 1e-3, 1e-3, 10, 0.0)
    assert noise_threshold(quiet, quiet, 5) == NOISE_FLOOR
    noisy = Summary(1e-3, 1e-3, 0, 1e-3, 1e-3, 1e-3, 10, 0.10)
    t = noise_threshold(noisy, noisy, 4)
    assert t == pytest.approx(2.5 * math.hypot(0.1, 0.1) / 2)
    assert noise_threshold(noisy, noisy, 16) < t


def test_refine_real_sessions_keeps_invariants(mnist: DataflowGraph) -> None:
    start = alternating(mnist)  # 11 partitions, a cut between every two nodes
    b = PlanBuilder(mnist)
    r = refine(mnist, start, [ORT, OV], trials=4, time_budget_s=60, config=FAST, builder=b)
    assert r.stopped_by in ("trials", "exhausted", "time")
    assert 0 < len(r.trials) <= 4
    assert why_invalid(mnist, r.parts) is None
    assert order_parts(mnist, r.parts) == list(r.parts)
    b.check(b.executor(list(r.parts)))  # numerics of the refined plan
    for t in r.trials:
        assert t.status in ("accepted", "rejected", "failed")
        if t.status == "accepted":  # kept only beyond noise, round by round
            assert t.ratio is not None and t.ratio < 1 - t.threshold
    assert r.changed == (r.accepted > 0)
    if r.changed:  # never slower than the start beyond noise, re-measured side by side
        v = verify(mnist, {"start": start, "refined": r.parts}, [], config=FAST, builder=b)
        assert not v.errors
        assert not v.beats("start", "refined")
    assert refine(mnist, start, [ORT, OV], trials=0).stopped_by == "disabled"


def test_verify_and_to_search_result(mnist: DataflowGraph) -> None:
    from collage_farm.core.candidate import CandidatePartition
    from collage_farm.core.cost import Cost
    from collage_farm.core.search import PlannedPartition

    start = alternating(mnist)
    b = PlanBuilder(mnist)
    v = verify(mnist, {"plan": start, "same": list(start)}, [ORT, OV], config=FAST, builder=b)
    assert set(v.summaries) == {"plan", "same", "ort-cpu", "openvino-cpu"}
    assert v.summaries["same"] is v.summaries["plan"]  # identical plans timed once
    assert v.round_medians["same"] == v.round_medians["plan"]
    assert all(len(r) == FAST.rounds for r in v.round_medians.values())
    assert v.compare("plan", "ort-cpu").pairs == FAST.rounds  # decided round by round
    assert v.best_single in ("ort-cpu", "openvino-cpu")
    base = SearchResult(tuple(PlannedPartition(CandidatePartition(SubGraph(mnist, p.mask),
                                                                  p.target), Cost(2e-6), 1e-6)
                              for p in start), 3e-6 * len(start), 1, 1, 1, 1, 0.1)
    merged = [Part(start[0].mask | start[1].mask, ORT), *start[2:]]
    res = to_search_result(mnist, merged, base,
                           estimate=lambda cs: [Cost(5e-6) for _ in cs])
    assert len(res.partitions) == len(merged)
    assert res.partitions[0].cost.seconds == 5e-6 and res.partitions[0].penalty_s > 0
    assert res.partitions[1] is base.partitions[2]  # untouched partitions keep their cost
    assert res.total_s == pytest.approx(sum(p.cost.seconds + p.penalty_s
                                            for p in res.partitions))
    assert res.search_s == base.search_s


def test_search_alternatives_explain_the_choice(mnist: DataflowGraph) -> None:
    """Runner-ups: the same nodes on another target never beat the chosen partition."""
    from collage_farm.campaign import build_specs
    from collage_farm.core.rules import RuleOptions, all_candidates
    from collage_farm.core.search import search
    from estimators.mock import MockEstimator

    cands = all_candidates(mnist, build_specs([ORT, OV], RuleOptions(max_depth=3)))
    res = search(mnist, cands, MockEstimator(), lazy=False)
    assert len(res.alternatives) == len(res.partitions)
    seen_same = 0
    for pp, alts in zip(res.partitions, res.alternatives):
        assert len(alts) <= 3
        same = [a for a in alts if a.same_nodes]
        assert alts[:len(same)] == tuple(same)  # like-for-like first
        for a in same:
            seen_same += 1
            assert a.target != pp.candidate.target.id
            assert a.nodes == len(pp.candidate.sub_graph)
            if a.status == "estimated":
                assert a.cost_s + a.penalty_s >= pp.cost.seconds + pp.penalty_s - 1e-12
    assert seen_same > 0


def test_a_move_is_kept_only_when_a_second_run_confirms_it(
        mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    """One interleaved run's win can be drift: the move must win again in a second run."""
    import collage_farm.execute as executor

    def summary(ms: float) -> Summary:
        return Summary(ms * 1e-3, ms * 1e-3, 0, ms * 1e-3, ms * 1e-3, ms * 1e-3, 10, 0.0)

    script: list[dict[str, Summary]] = []

    def scripted(fns, config):
        assert set(fns) == {"current", "candidate"}
        run = script.pop(0)  # no round medians: the unpaired rule decides
        return executor.Interleaved(run, {})

    monkeypatch.setattr(executor, "measure_interleaved_rounds", scripted)
    start = alternating(mnist)
    b = PlanBuilder(mnist)
    # the first run says 20% faster, the second run says equal: rejected
    script[:] = [{"current": summary(1.0), "candidate": summary(0.8)},
                 {"current": summary(1.0), "candidate": summary(1.0)}]
    r = refine(mnist, start, [ORT, OV], trials=1, time_budget_s=60, config=FAST, builder=b)
    assert [t.status for t in r.trials] == ["rejected"] and not r.changed and not script
    assert r.trials[0].candidate_s == pytest.approx(1e-3)  # the run that decided is logged
    # both runs say faster: accepted
    script[:] = [{"current": summary(1.0), "candidate": summary(0.8)},
                 {"current": summary(1.0), "candidate": summary(0.8)}]
    r = refine(mnist, start, [ORT, OV], trials=1, time_budget_s=60, config=FAST, builder=b)
    assert [t.status for t in r.trials] == ["accepted"] and r.changed and not script


def test_an_undecided_move_gets_more_rounds_before_it_is_decided(
        mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    """A move 15% faster inside a 3-round run's noise: with extend_rounds its pooled pairs
    decide it (and a second run as long must agree); without, it is rejected."""
    import collage_farm.execute as executor

    def summary(ms: float) -> Summary:
        return Summary(ms * 1e-3, ms * 1e-3, 0, ms * 1e-3, ms * 1e-3, ms * 1e-3, 10, 0.0)

    # per-round log ratios candidate/current: median log(0.85), sample sd 0.2
    noisy = [-0.1625, -0.4125, 0.0375, -0.3625, 0.0875, -0.2125, -0.1125, -0.3625, 0.0375]

    def run(n: int) -> executor.Interleaved:
        cur = [1e-3] * n
        cand = [1e-3 * math.exp(x) for x in (noisy * 4)[:n]]
        return executor.Interleaved({"current": summary(1.0), "candidate": summary(0.85)},
                                    {"current": tuple(cur), "candidate": tuple(cand)})

    calls: list[int] = []

    def scripted(fns, config):
        assert set(fns) == {"current", "candidate"}
        calls.append(config.rounds)
        return run(config.rounds)

    monkeypatch.setattr(executor, "measure_interleaved_rounds", scripted)
    start = alternating(mnist)
    b = PlanBuilder(mnist)
    r = refine(mnist, start, [ORT, OV], trials=1, time_budget_s=60, config=FAST, builder=b)
    assert [t.status for t in r.trials] == ["rejected"] and calls == [3]  # 3 rounds: noise
    calls.clear()
    r = refine(mnist, start, [ORT, OV], trials=1, time_budget_s=60, config=FAST, builder=b,
               extend_rounds=15)
    assert calls == [3, 15, 18]  # first run, extension, second run as long as both
    assert [t.status for t in r.trials] == ["accepted"] and r.changed
    assert r.trials[0].ratio < 1 - r.trials[0].threshold and r.trials[0].pairs == 18


def test_a_move_the_estimate_rules_out_is_not_run(
        mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    """``skip`` (profile mode: a move estimated far slower) keeps a move from being built or
    timed, and it is not a trial; a move it lets through is measured as before."""
    import collage_farm.execute as executor

    calls: list[int] = []

    def scripted(fns, config):
        calls.append(config.rounds)
        s = Summary(1e-3, 1e-3, 0, 1e-3, 1e-3, 1e-3, 10, 0.0)
        return executor.Interleaved({"current": s, "candidate": s}, {})

    monkeypatch.setattr(executor, "measure_interleaved_rounds", scripted)
    start = alternating(mnist)
    b = PlanBuilder(mnist)
    seen: list[int] = []

    def never(cur, move) -> str:
        seen.append(len(move))
        return "estimated +40% slower"

    r = refine(mnist, start, [ORT, OV], trials=2, time_budget_s=60, config=FAST, builder=b,
               skip=never)
    assert not r.trials and not calls and r.skipped_by_estimate == len(seen) > 0
    assert r.to_json()["skipped_by_estimate"] == r.skipped_by_estimate
    r = refine(mnist, start, [ORT, OV], trials=2, time_budget_s=60, config=FAST, builder=b,
               skip=lambda cur, move: None)
    assert len(r.trials) == 2 and len(calls) == 2 and r.skipped_by_estimate == 0


def _scripted(ms: dict[str, float], timed: list[set[str]] | None = None):  # type: ignore[no-untyped-def]
    """An interleaved run's stand-in: each callable ``ms[name]`` ms, 1-2% apart per round;
    the names of each run go into ``timed``."""
    from collage_farm import execute as executor

    def scripted(fns, config, stop=None):  # type: ignore[no-untyped-def]
        if timed is not None:
            timed.append(set(fns))
        rounds = {n: tuple(ms[n] * 1e-3 * (1 + 0.01 * (k % 3)) for k in range(config.rounds))
                  for n in fns}
        return executor.Interleaved(
            {n: Summary(ms[n] * 1e-3, ms[n] * 1e-3, 0, ms[n] * 1e-3, ms[n] * 1e-3,
                        ms[n] * 1e-3, 10, 0.0) for n in fns}, rounds)
    return scripted


def _pinned_post_search(mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch,
                        ms: dict[str, float], pins: object) -> object:
    """`post_search` on a plan that honours ``pins``, with the interleaved timings scripted
    (``ms`` per entry; the numerical checks and builds are real)."""
    from collage_farm import execute as executor
    from collage_farm.core.candidate import CandidatePartition
    from collage_farm.core.cost import Cost
    from collage_farm.core.search import PlannedPartition
    from collage_farm.core.transition import AnalyticTransitionModel
    from collage_farm.postsearch.decide import PostSearchOptions, post_search
    from estimators.mock import MockEstimator

    monkeypatch.setattr(executor, "measure_interleaved_rounds", _scripted(ms))
    plan = [Part(1 << n.index, OV if n.op_type == "MaxPool" else ORT) for n in mnist.nodes]
    assert why_invalid(mnist, plan, pins) is None
    result = SearchResult(tuple(PlannedPartition(CandidatePartition(SubGraph(mnist, p.mask),
                                                                    p.target), Cost(2e-6), 1e-6)
                                for p in plan), 3e-6 * len(plan), 1, 1, 1, 1, 0.1)
    opts = PostSearchOptions(targets=(ORT, OV), pins=pins, verify=True,  # type: ignore[arg-type]
                             refine_trials=0, refine_time_s=120.0, verify_rounds=3,
                             verify_extend_rounds=0, report=False)
    return post_search(opts, mnist, result, MockEstimator(), AnalyticTransitionModel())


def test_never_worse_falls_back_only_to_a_single_toolchain_the_pins_allow(
        mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user pinned MaxPool to OpenVINO; ORT's whole model is the fastest, the mix loses:
    the written plan must be OpenVINO's whole model, not ORT's (which breaks the pin)."""
    from collage_farm.core.pins import Pin, PinSet
    from collage_farm.postsearch.moves import parts_of

    pins = PinSet((Pin(op="MaxPool", target="openvino-cpu"),))
    out = _pinned_post_search(mnist, monkeypatch,
                              {"dijkstra": 3.0, "ort-cpu": 1.0, "openvino-cpu": 2.0}, pins)
    info = out.info  # type: ignore[attr-defined]
    assert info["plan_is"] == "best_single" and info["best_single_target"] == "openvino-cpu"
    assert "ort-cpu" in info["singles_ineligible"]
    assert info["singles_measured_s"]["ort-cpu"] == pytest.approx(1e-3)  # timed, for information
    est = info["singles_estimated_s"]  # the search's belief is against what the pins allow
    assert info["estimated_gain_vs_best_single"] == pytest.approx(
        est["openvino-cpu"] / (3e-6 * len(mnist.nodes)))
    written = parts_of(out.result)  # type: ignore[attr-defined]
    assert [p.target.id for p in written] == ["openvino-cpu"]
    assert why_invalid(mnist, written, pins) is None


def test_never_worse_keeps_the_plan_when_pins_allow_no_single_toolchain(
        mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    from collage_farm.core.pins import Pin, PinSet
    from collage_farm.postsearch.moves import parts_of

    pins = PinSet((Pin(op="MaxPool", target="openvino-cpu"), Pin(op="Conv", target="ort-cpu")))
    out = _pinned_post_search(mnist, monkeypatch,
                              {"dijkstra": 3.0, "ort-cpu": 1.0, "openvino-cpu": 2.0}, pins)
    info = out.info  # type: ignore[attr-defined]
    assert info["plan_is"] == "dijkstra" and info["best_single_target"] is None
    assert set(info["singles_ineligible"]) == {"ort-cpu", "openvino-cpu"}
    assert "pins allow" in info["never_worse"]
    assert why_invalid(mnist, parts_of(out.result), pins) is None  # type: ignore[attr-defined]


def test_profile_mode_skips_only_moves_priced_far_slower(mnist: DataflowGraph) -> None:
    """`decide._estimated_loser` prices a move's whole plan with the profile estimator: a
    move >15% slower is not run, one within it is, and one touching a target without a
    profile is run (pricing it would measure)."""
    from collage_farm.core.candidate import CandidatePartition
    from collage_farm.core.search import PlannedPartition
    from collage_farm.core.transition import AnalyticTransitionModel
    from collage_farm.postsearch.decide import PROFILE_REFINE_SKIP_LOSS, _estimated_loser
    from estimators.mock import MockEstimator
    from estimators.profiled import ProfiledEstimator, TargetProfile

    names = [n.name for n in mnist.nodes]

    def prof(us: float) -> TargetProfile:
        return TargetProfile({n: us * 1e-6 for n in names}, {n: k for k, n in enumerate(names)},
                             dict.fromkeys(range(len(names)), 1), 1.0, us * 1e-6 * len(names))

    lite = parse_targets("litert-cpu")[0]
    est = ProfiledEstimator({"ort-cpu": prof(10.0), "openvino-cpu": prof(20.0)}, MockEstimator())
    whole = CandidatePartition(SubGraph(mnist, mnist.all_mask), ORT)
    cost = est.estimate([whole])[0]
    result = SearchResult((PlannedPartition(whole, cost, 0.0),), cost.seconds, 1, 1, 1, 1, 0.1)
    skip = _estimated_loser(mnist, result, est, AnalyticTransitionModel(),
                            PROFILE_REFINE_SKIP_LOSS)
    assert skip is not None
    start = [Part(mnist.all_mask, ORT)]
    why = skip(start, [Part(mnist.all_mask, OV)])  # twice as slow
    assert why and "more than 15%" in why
    assert skip(start, list(start)) is None  # the same plan: no loss
    assert skip(start, [Part(mnist.all_mask, lite)]) is None  # no profile: run it
    assert _estimated_loser(mnist, result, MockEstimator(), AnalyticTransitionModel(),
                            PROFILE_REFINE_SKIP_LOSS) is None  # exhaustive: every move runs
    assert _estimated_loser(mnist, result, est, AnalyticTransitionModel(), 0.0) is None


def test_whole_model_moves_are_left_to_the_never_worse_run(
        mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1-partition Dijkstra plan's moves are switches to another target's whole model,
    which the never-worse run times anyway: refinement runs none of them (counted as
    ``skipped_timed_later``), and the never-worse run still writes the faster whole model.
    Without a never-worse run (no verify) the same move is run as a trial."""
    from collage_farm import execute as executor
    from collage_farm.core.transition import AnalyticTransitionModel
    from collage_farm.postsearch.decide import post_search
    from estimators.mock import MockEstimator

    ms = {"dijkstra": 2.0, "ort-cpu": 2.0, "openvino-cpu": 1.0, "current": 2.0,
          "candidate": 1.0}
    timed: list[set[str]] = []
    monkeypatch.setattr(executor, "measure_interleaved_rounds", _scripted(ms, timed))
    result, opts = _ort_whole_plan(mnist, refine_trials=2, verify_rounds=3)
    b = PlanBuilder(mnist)
    out = post_search(opts, mnist, result, MockEstimator(), AnalyticTransitionModel(), b)
    ref = out.info["refine"]
    assert ref["trials"] == 0 and ref["skipped_timed_later"] == 1 and not ref["changed"]
    assert timed == [{"dijkstra", "openvino-cpu"}] or timed == [{"ort-cpu", "openvino-cpu"}]
    assert out.info["plan_is"] == "best_single"
    assert out.info["best_single_target"] == "openvino-cpu"
    timed.clear()
    out = post_search(dataclasses.replace(opts, verify=False), mnist, result, MockEstimator(),
                      AnalyticTransitionModel(), b)
    ref = out.info["refine"]
    assert ref["trials"] >= 1 and ref["skipped_timed_later"] == 0
    assert {"current", "candidate"} in timed


def test_the_start_plan_is_built_only_when_a_move_is_timed(
        mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plan whose every move is skipped builds nothing (a one-partition plan's moves are all
    left to the never-worse run); one whose start cannot be built says so once a move would
    be timed against it."""
    from collage_farm.postsearch import refine as refine_mod

    built: list[int] = []

    def broken(builder, parts):  # type: ignore[no-untyped-def]
        built.append(len(parts))
        raise RuntimeError("the toolchain crashed building p000")
    monkeypatch.setattr(refine_mod, "_timed", broken)
    start = alternating(mnist)
    b = PlanBuilder(mnist)
    r = refine(mnist, start, [ORT, OV], trials=2, time_budget_s=60, config=FAST, builder=b,
               skip=lambda cur, move: "estimated far slower")
    assert not built and r.stopped_by == "exhausted" and r.skipped_by_estimate > 0
    r = refine(mnist, start, [ORT, OV], trials=2, time_budget_s=60, config=FAST, builder=b)
    assert built == [len(start)] and not r.trials
    assert r.stopped_by.startswith("start failed: RuntimeError: the toolchain crashed")


def test_a_whole_model_plan_gives_way_only_to_one_faster_beyond_noise(
        mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Dijkstra plan is ORT's whole model; OpenVINO's has the faster median but within
    noise of it: ORT's is written (no swap on one run's ordering), and the decision says so.
    OpenVINO 2x faster: its whole model is written, as before."""
    from collage_farm import execute as executor
    from collage_farm.core.transition import AnalyticTransitionModel
    from collage_farm.postsearch.decide import post_search
    from collage_farm.report.summary import story_keys, story_text
    from estimators.mock import MockEstimator

    result, opts = _ort_whole_plan(mnist, refine_trials=0, verify_rounds=5)
    b = PlanBuilder(mnist)
    monkeypatch.setattr(executor, "measure_interleaved_rounds",
                        _scripted({"dijkstra": 2.0, "ort-cpu": 2.0, "openvino-cpu": 1.99}))
    out = post_search(opts, mnist, result, MockEstimator(), AnalyticTransitionModel(), b)
    assert out.info["best_single_target"] == "openvino-cpu"  # the faster median...
    assert out.info["plan_is"] == "dijkstra" and out.info["within_noise_of_best_single"]
    assert out.result.partitions[0].candidate.target.id == "ort-cpu"  # ...is not written
    assert "gives way only to one faster beyond noise" in out.info["never_worse"]
    summary = {**out.info, "dijkstra_estimated_s": 2e-3, "estimated_total_s": 2e-3}
    text = story_text(story_keys(summary, out.result, result, len(mnist.nodes)))
    assert any(t.startswith("decision: ") and "within noise" in t for t in text), text
    monkeypatch.setattr(executor, "measure_interleaved_rounds",
                        _scripted({"dijkstra": 2.0, "ort-cpu": 2.0, "openvino-cpu": 1.0}))
    out = post_search(opts, mnist, result, MockEstimator(), AnalyticTransitionModel(), b)
    assert out.info["plan_is"] == "best_single" and "within_noise_of_best_single" not in out.info
    assert out.result.partitions[0].candidate.target.id == "openvino-cpu"


def _ort_whole_plan(mnist: DataflowGraph, *, refine_trials: int, verify_rounds: int
                    ) -> tuple[SearchResult, object]:
    """A Dijkstra plan that is ORT's whole model (estimated 2 ms), and post-search options
    that verify it against ORT's and OpenVINO's whole models."""
    from collage_farm.core.candidate import CandidatePartition
    from collage_farm.core.cost import Cost
    from collage_farm.core.search import PlannedPartition
    from collage_farm.postsearch.decide import PostSearchOptions

    whole = CandidatePartition(SubGraph(mnist, mnist.all_mask), ORT)
    result = SearchResult((PlannedPartition(whole, Cost(2e-3), 0.0),), 2e-3, 1, 1, 1, 1, 0.1)
    return result, PostSearchOptions(targets=(ORT, OV), pins=None, verify=True,
                                     refine_trials=refine_trials, refine_time_s=120.0,
                                     verify_rounds=verify_rounds, verify_extend_rounds=0,
                                     report=False)
