"""Profile measure mode without Ray: kernel mapping, the estimator against hand-computed profile
sums, real profiles of a small model, and the fallback when a profiler lies."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from collage_farm.campaign import TuneOptions, build_specs, load_source, profiled_estimator
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.rules import RuleOptions, all_candidates
from collage_farm.core.search import search, static_penalty_s
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import parse_targets
from collage_farm.core.transition import (
    AnalyticTransitionModel,
    CallsIncluded,
    MeasuredTransitionModel,
)
from collage_farm.costtable import CostTable, CostTableWriter, TableStore, row_from_result
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.probes.cutcost import cached_cut_costs
from collage_farm.probes.profiles import collect_profiles, profile_fingerprint
from estimators.analytic import AnalyticEstimator
from estimators.local import LocalService
from estimators.profiled import (
    ProfiledEstimator,
    ProfileRejected,
    SplitPricing,
    TargetProfile,
    fed_by_partition,
    node_weights,
)
from estimators.table import TableEstimator
from runners.base import BuildInput, MeasureConfig, MeasureInput, Status
from runners.measure import time_callable
from runners.ort import OrtCpuToolchain
from runners.profile import (
    PROFILE_DETAIL,
    OperatorProfile,
    ProfileMethod,
    profile_config,
    profile_measure,
)
from runners.profilers import Kernel, OrtTraceProfiler, kernel_groups, thin_cuts
from runners.topology import OnnxTopology

ORT = parse_targets("ort-cpu")[0]
OV = parse_targets("openvino-cpu")[0]


@pytest.fixture(scope="module")
def mnist():  # type: ignore[no-untyped-def]
    graph = load_source("zoo:mnist")
    data = SubGraph(graph, graph.all_mask).extract("mnist_whole").SerializeToString()
    return graph, data


def _hand_profile(graph) -> tuple[OperatorProfile, dict[str, float]]:  # type: ignore[no-untyped-def]
    """A profile with one fused group (the first two nodes) and the rest one node each, the
    i-th group taking (i + 1) * 10 us; whole model 10% faster than the profiled sum."""
    names = [n.name for n in graph.nodes]
    groups = [((names[0], names[1]), 10e-6)]
    groups += [((n,), (i + 2) * 10e-6) for i, n in enumerate(names[2:])]
    total = sum(s for _, s in groups)
    prof = OperatorProfile(ProfileMethod.ORT_TRACE, tuple(groups), 0.0, 20, whole_s=total / 1.1)
    per_node = {names[0]: 5e-6, names[1]: 5e-6}
    per_node.update({n: s for (ns, s) in groups[1:] for n in ns})
    return prof, per_node


def test_estimator_matches_hand_computed_profile_sums(mnist) -> None:  # type: ignore[no-untyped-def]
    graph, _ = mnist
    prof, per_node = _hand_profile(graph)
    tp = TargetProfile.of(prof, cut_s=3e-6, split=SplitPricing.WORK_SHARE)
    assert tp.scale == pytest.approx(1 / 1.1)
    whole_group = TargetProfile.of(prof, cut_s=3e-6)  # the default: a split pays the group
    cands = all_candidates(graph, build_specs([ORT], RuleOptions(max_depth=4)))
    est = ProfiledEstimator({ORT.id: tp}, AnalyticEstimator())
    costs = est.estimate(cands)
    names = {n.name for n in graph.nodes}
    first_two = {graph.nodes[0].name, graph.nodes[1].name}
    seen_uncertain = seen_certain = 0
    for c, cost in zip(cands, costs):
        fed = any(t not in graph.graph_inputs for t in c.sub_graph.input_tensors)
        want = sum(per_node[n] for n in c.node_names) / 1.1 + (3e-6 if fed else 0.0)
        assert cost.seconds == pytest.approx(want, rel=1e-9), c.label()
        splits = len(first_two & set(c.node_names)) == 1
        assert est.uncertain(c) is splits
        extra = 5e-6 / 1.1 if splits else 0.0  # the other half of the 10 us group
        assert whole_group.cost_s(c.node_names, fed) == pytest.approx(want + extra, rel=1e-9)
        seen_uncertain += splits
        seen_certain += not splits
    assert seen_uncertain and seen_certain
    whole = CandidatePartition(SubGraph(graph, graph.all_mask), ORT, rule="whole")
    assert est.estimate([whole])[0].seconds == pytest.approx(prof.whole_s)  # the unprofiled run
    assert set(tp.node_s) == names


def test_uncertain_candidates_answer_isolated_costs_once_measured(mnist) -> None:  # type: ignore[no-untyped-def]
    graph, _ = mnist
    prof, _ = _hand_profile(graph)
    iso = AnalyticEstimator()
    est = ProfiledEstimator({ORT.id: TargetProfile.of(prof)}, iso)
    cands = all_candidates(graph, build_specs([ORT], RuleOptions(max_depth=4)))
    unc = [c for c in cands if est.uncertain(c)]
    assert unc
    c = unc[0]
    before = est.estimate([c])[0]
    est.measure_isolated([c])
    assert est.measured_isolated(c) and not est.uncertain(c)
    assert est.estimate([c])[0] == iso.estimate([c])[0] != before


def test_lower_bound_is_capped_by_the_profile_estimate(mnist) -> None:  # type: ignore[no-untyped-def]
    """A lazy search prices an edge at its bound until popped, so the bound must not exceed
    the cost the candidate answers: a node's share of an in-network run (here 0.5 us) is
    below the analytic bound's 1 us per-call floor."""
    graph, _ = mnist
    names = [n.name for n in graph.nodes]
    prof = OperatorProfile(ProfileMethod.ORT_TRACE, tuple(((n,), 0.5e-6) for n in names),
                           0.0, 20, whole_s=0.5e-6 * len(names))
    iso = AnalyticEstimator()
    est = ProfiledEstimator({ORT.id: TargetProfile.of(prof)}, iso)
    cands = all_candidates(graph, build_specs([ORT], RuleOptions(max_depth=4)))
    below = 0
    for c, cost in zip(cands, est.estimate(cands)):
        assert est.lower_bound(c).seconds <= cost.seconds, c.label()
        below += iso.lower_bound(c).seconds > cost.seconds
    assert below  # the isolated bound alone would have been above these estimates
    c = cands[0]
    est.measure_isolated([c])  # answers its isolated cost now: the isolated bound again
    assert est.lower_bound(c) == iso.lower_bound(c)


def test_a_whole_model_plan_is_estimated_at_its_whole_model_time(mnist) -> None:  # type: ignore[no-untyped-def]
    """The shares of a profile add up to a run of the whole model, which made its call and
    handed its graph inputs and outputs over; a split pays the measured same-toolchain cut
    cost, itself a chain of calls less the whole model. `CallsIncluded` keeps the search from
    charging launches and hand-offs on top (a 60 us mnist was estimated 6 us above the
    whole-model time its plan is made of); a target without a profile keeps them."""
    graph, _ = mnist
    prof, _ = _hand_profile(graph)
    cut = 3e-6
    tp = TargetProfile.of(prof, cut_s=cut)
    cands = all_candidates(graph, build_specs([ORT], RuleOptions(max_depth=4)))
    est = ProfiledEstimator({ORT.id: tp}, AnalyticEstimator())
    calls = MeasuredTransitionModel(AnalyticTransitionModel(),
                                    launches={("ort-cpu", "cpu"): 5e-6},
                                    handoffs={("ort-cpu", "cpu"): (5e-6, 1e-9)})
    assert calls.launch_s(ORT) == 5e-6 and calls.handoff_s(ORT, 4000) > 0
    whole = next(c for c in cands if c.mask == graph.all_mask)
    # the whole model alone: exactly the time base the shares add up to
    got = search(graph, [whole], est, CallsIncluded(calls, frozenset({ORT.id})))
    assert got.total_s == pytest.approx(tp.whole_s, rel=1e-9)
    assert search(graph, [whole], est, calls).total_s > tp.whole_s + 5e-6  # counted twice
    # any cover: the whole model plus one measured cut per partition fed by another one
    included = CallsIncluded(calls, frozenset({ORT.id}))
    for c in cands:
        assert static_penalty_s(graph, c, included) == 0.0, c.label()
    best = search(graph, cands, est, included, lazy=False)
    fed = sum(fed_by_partition(p.candidate) for p in best.partitions)
    assert best.total_s == pytest.approx(tp.whole_s + fed * cut, rel=1e-6)
    # a target whose costs are not profile shares is charged as before
    assert included.launch_s(OV) == calls.launch_s(OV)
    assert included.handoff_s(OV, 4000) == calls.handoff_s(OV, 4000)


def test_a_target_timed_here_is_profiled_in_this_process(mnist, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A target this process times on its runner's device is profiled here: its unprofiled
    rounds run on the session the caller holds (no whole model sent, none compiled again),
    and the row carries the runner's device and version, so a later campaign finds it."""
    graph, _ = mnist
    service = LocalService(["ort-cpu"], parallel=1)
    sent: list = []
    real_measure = service.measure
    service.measure = lambda reqs: real_measure(sent.extend(reqs) or reqs)  # type: ignore[method-assign]
    builder = PlanBuilder(graph)
    ex = builder.executor([Part(graph.all_mask, ORT)])
    fn = ex.timed_callable(builder.feeds(ex))
    rounds: list[MeasureConfig] = []

    def timer(cfg: MeasureConfig) -> list[float]:
        rounds.append(cfg)
        return time_callable(fn, cfg)[0]
    store = TableStore(tmp_path / "costs", campaign_id="c")
    try:
        out = collect_profiles(graph, [ORT], table=None, farm=service, store=store,
                               here={ORT.id: timer})
    finally:
        store.close()
    got = out[ORT.id]
    assert got.ran and got.here and got.profile is not None and got.error == ""
    assert not sent and len(rounds) >= 3  # the warm-up and a round between profiled runs
    assert got.to_json()["where"] == "campaign process"
    assert got.steps_s["build_s"] == 0.0  # nothing built for the unprofiled rounds
    row = CostTable(tmp_path / "costs").rows({"kind": "profiled"})[0]
    device, version = service.describe(ORT)  # type: ignore[misc]
    assert (row.device, row.toolchain_version) == (device.describe(), version)
    again = collect_profiles(graph, [ORT], table=CostTable(tmp_path / "costs"), farm=service)
    assert again[ORT.id].cached and again[ORT.id].profile is not None
    assert again[ORT.id].profile.groups == got.profile.groups and not sent


def test_profile_rejected_when_far_from_the_whole_model(mnist) -> None:  # type: ignore[no-untyped-def]
    graph, _ = mnist
    prof, _ = _hand_profile(graph)
    with pytest.raises(ProfileRejected, match="more than 20% or 2.0 us x 10 kernels off"):
        TargetProfile.of(dataclasses.replace(prof, whole_s=prof.profiled_total_s / 1.5))
    with pytest.raises(ProfileRejected, match="on ONNX nodes"):
        TargetProfile.of(dataclasses.replace(prof, unattributed_s=prof.profiled_total_s,
                                             whole_s=2 * prof.profiled_total_s))
    TargetProfile.of(dataclasses.replace(prof, whole_s=prof.profiled_total_s / 1.15))


def test_tiny_profiles_may_be_off_by_a_fixed_time_per_kernel() -> None:
    """~1-2 us of a profiler's bookkeeping per kernel is a large ratio on a 30 us model, not a
    wrong share: 10 kernels may be 20 us off, whatever the ratio; 21 us is not."""
    groups = tuple(((f"n{i}",), 2e-6) for i in range(10))  # 20 us profiled
    tiny = OperatorProfile(ProfileMethod.OPENVINO_COUNTERS, groups, kernels=10, whole_s=39e-6)
    assert tiny.ratio == pytest.approx(20 / 39) and tiny.problem() is None
    tp = TargetProfile.of(tiny)
    assert tp.cost_s([f"n{i}" for i in range(10)], False) == pytest.approx(39e-6)  # exact
    assert "0.49x" in (dataclasses.replace(tiny, whole_s=41e-6 + 1e-12).problem() or "")
    assert dataclasses.replace(tiny, whole_s=1000e-6).problem()  # far off in both senses


def test_group_time_is_split_by_the_nodes_work(mnist) -> None:  # type: ignore[no-untyped-def]
    """A fused Conv+Add+Relu's time goes to its nodes by their work, not evenly."""
    graph, _ = mnist
    w = node_weights(graph)
    conv, add, relu = (n.name for n in graph.nodes[:3])
    prof = OperatorProfile(ProfileMethod.ORT_TRACE, (((conv, add, relu), 30e-6),),
                           whole_s=30e-6)
    tp = TargetProfile.of(prof, weights=w)
    assert tp.node_s[conv] > tp.node_s[relu] > 0
    assert sum(tp.node_s.values()) == pytest.approx(30e-6)
    assert tp.node_s[conv] / tp.node_s[add] == pytest.approx(w[conv] / w[add])


def test_kernel_groups_maps_fused_and_renamed_kernels_back() -> None:
    from onnx import TensorProto, helper

    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("ReduceMean", ["r"], ["m"], name="mean"),
             helper.make_node("Sub", ["r", "m"], ["s"], name="sub"),
             helper.make_node("Mul", ["s", "s"], ["y"], name="mul")]
    g = helper.make_graph(nodes, "g", [vi("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                          [vi("y", TensorProto.FLOAT, None)],
                          [helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 1, 1], [1.0])])
    topo = OnnxTopology.of(helper.make_model(g).SerializeToString())
    kernels = [Kernel("relu_nchwc", 5e-6, ("relu",), ("x",), ("tok1",)),  # conv+relu, renamed
               Kernel("ReorderOutput", 1e-6, (), ("tok1",), ("r",)),  # no node of its own
               Kernel("LayerNormish", 3e-6, (), ("r",), ("y",))]  # new name, ONNX tensors
    groups, unattributed = kernel_groups(topo, kernels)
    assert dict(groups) == {("conv", "relu"): pytest.approx(6e-6),
                            ("mean", "sub", "mul"): pytest.approx(3e-6)}
    assert unattributed == 0
    assert thin_cuts(topo, 3) and all(0 < p < len(topo.names) for p in thin_cuts(topo, 3))


def test_real_ort_profile_accounts_for_every_node(mnist) -> None:  # type: ignore[no-untyped-def]
    graph, data = mnist
    tc = OrtCpuToolchain()
    b = tc.build(BuildInput(profile_fingerprint(graph), ORT, data))
    cfg = dataclasses.replace(profile_config(rounds=2, runs=10), mode="warm")
    prof = OrtTraceProfiler(tc).profile(b, data, cfg, 10)
    assert prof.method is ProfileMethod.ORT_TRACE and prof.kernels >= 5
    covered = [n for ns, _ in prof.groups for n in ns]
    assert sorted(covered) == sorted(n.name for n in graph.nodes)  # each node once
    assert any(len(ns) > 1 for ns, _ in prof.groups)  # ORT fuses (Conv+Relu at least)
    assert prof.profiled_total_s > 0 and prof.unattributed_s == 0
    # the worker's answer: this profile, or (not trusted against the unprofiled time on a
    # loaded machine) prefix differences that say why
    res = profile_measure(tc, MeasureInput(b, profile_config(rounds=2, runs=10)), data)
    assert res.ok and res.kind.value == "profiled", res.error
    got = OperatorProfile.from_json(dict(res.details)[PROFILE_DETAIL])
    assert got.whole_s == res.seconds or got.method is ProfileMethod.PREFIXES
    assert (got.method is ProfileMethod.ORT_TRACE) == (not got.rejected)
    assert sorted(n for ns, _ in got.groups for n in ns) == sorted(covered)


class _LyingProfiler(OrtTraceProfiler):
    """A real ORT profile whose kernel times are reported 3x."""

    def profile(self, build, onnx_bytes, config, runs, between=None):  # type: ignore[no-untyped-def]
        p = super().profile(build, onnx_bytes, config, runs, between)
        return dataclasses.replace(p, groups=tuple((n, 3 * s) for n, s in p.groups))


class _LyingOrt(OrtCpuToolchain):
    def profiler(self) -> OrtTraceProfiler:
        return _LyingProfiler(self)


def test_a_lying_profiler_makes_its_target_fall_back(mnist, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A real ORT profile reported 3x is not trusted on the worker: the profile row holds
    prefix differences instead and says why. A profile row that lies anyway (a fake one) or a
    failed profile run makes its target fall back to isolated measurement; each is one
    warning line."""
    graph, data = mnist
    tc = _LyingOrt()
    fp = profile_fingerprint(graph)
    b = tc.build(BuildInput(fp, ORT, data))
    res = profile_measure(tc, MeasureInput(b, profile_config(rounds=2, runs=10)), data)
    assert res.ok
    prof = OperatorProfile.from_json(dict(res.details)[PROFILE_DETAIL])
    assert prof.method is ProfileMethod.PREFIXES
    assert prof.rejected.startswith("ort-trace per-operator sum")
    # its whole-model time set to its own sum: the prefix timing and the bracket timing of the
    # same model may differ by more than the tolerance on a loaded machine
    prof = dataclasses.replace(prof, whole_s=prof.profiled_total_s)
    res = dataclasses.replace(res, details=((PROFILE_DETAIL, prof.to_json()),))
    lite = parse_targets("litert-cpu")[0]
    liar = dataclasses.replace(prof, groups=tuple((n, 3 * s) for n, s in prof.groups),
                               rejected="")
    lying = dataclasses.replace(res, target=lite,
                                details=((PROFILE_DETAIL, liar.to_json()),))
    failed = dataclasses.replace(res, target=parse_targets("openvino-cpu")[0],
                                 status=Status.RUNTIME_ERROR, samples=(), summary=None,
                                 error="profiler openvino-counters failed: boom")
    with CostTableWriter(tmp_path / "costs", background=False) as w:
        for r in (res, failed, lying):
            w.append(row_from_result(r, campaign_id="c", model=graph.name, nodes=(),
                                     op_types=("profile",)))
    targets = tuple(parse_targets("ort-cpu,openvino-cpu,litert-cpu"))
    opts = TuneOptions(model="zoo:mnist", targets=targets, out=tmp_path / "out",
                       estimator="offline", cost_table=tmp_path / "costs", strictness="any")
    iso = TableEstimator(TableStore.existing(tmp_path / "costs"), strictness="any")
    est, info = profiled_estimator(opts, graph, iso, None)
    assert set(est.profiles) == {"ort-cpu"}, info["warnings"]
    assert info["runs"] == 0  # read back, nothing profiled now
    lie, fail, swapped = sorted(info["warnings"])
    assert lie.startswith("warning: litert-cpu: no usable profile (prefixes per-operator sum")
    assert "measured in isolation" in lie
    assert fail.startswith("warning: openvino-cpu: no usable profile (profile run runtime_error")
    assert swapped.startswith("warning: ort-cpu: its profiler's profile was not used "
                              "(ort-trace per-operator sum")
    assert swapped.endswith("its costs come from prefix differences at thin cuts instead")
    whole = CandidatePartition(SubGraph(graph, graph.all_mask), ORT, rule="whole")
    assert est.estimate([whole])[0].seconds == pytest.approx(prof.whole_s)  # exact
    assert est.is_confirmed(whole) and not est.uncertain(whole)
    on_lite = CandidatePartition(SubGraph(graph, graph.all_mask), lite, rule="whole")
    assert est.uncertain(on_lite) is False
    with pytest.raises(Exception, match="not in the cost table"):
        est.estimate([on_lite])  # answered by the isolated (table) estimator: no row, no cost


def test_measure_config_profile_mode_round_trips() -> None:
    cfg = profile_config(rounds=3, runs=7)
    assert MeasureConfig.from_json(cfg.to_json()) == cfg and cfg.measure_mode == "profile"
    assert Cost(1.0).seconds == 1.0


def test_tune_refuses_an_unknown_measure_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    from collage_farm.cli import main

    with pytest.raises(SystemExit) as e:
        main(["tune", "zoo:mnist", "--mock", "--measure", "everything"])
    assert e.value.code == 2
    assert "--measure: invalid choice: 'everything'" in capsys.readouterr().err


def test_the_probes_whole_model_times_are_kept_and_read_back(mnist, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Profile mode's time base (every target's whole model in the cut-cost probe's rounds)
    is stored with the probe's rows, so a re-run and an offline search price alike."""
    graph, _ = mnist
    targets = parse_targets("ort-cpu,openvino-cpu")
    with CostTableWriter(tmp_path / "costs") as w:
        first = cached_cut_costs(CostTable(tmp_path / "costs"), graph, targets, writer=w,
                                 chunks=3, rounds=1, runs_per_round=2, wholes=True)
    assert first is not None and set(first.wholes_s) == {"ort-cpu", "openvino-cpu"}
    again = cached_cut_costs(CostTable(tmp_path / "costs"), graph, targets, chunks=3,
                             measure=False, wholes=True)
    assert again is not None and again.cached
    assert again.wholes_s == first.wholes_s and again.same_cuts == first.same_cuts
    assert again.to_json()["wholes_s"] == first.wholes_s
