"""Profile mode on an Ethos-U board: profile builds, estimates, exact confirmation (no Ray).

Real Vela compiles and host conversions in local isolated workers (the ``local`` estimator) on
the built-in ethos-u55-128 board, on a five-node model that the board splits between the host
(an embedding Gather and a LayerNorm, float32) and the NPU (MatMul, Relu, MatMul): the profile
estimate of each of Vela's own partitions equals its build exactly; a candidate that splits a
fused operator by two or more nodes, or holds a node its target's profile does not account
for, is
built, never estimated (a node split alone from its fused group is priced by its own
single-node build); a profile campaign writes exact figures only (each plan partition's
figure is its isolated build's, read from an exhaustive campaign's table), agrees with the
exhaustive campaign, and an offline campaign on its table writes the same plan and builds nothing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("ethosu.regor")

from collage_farm.campaign import TuneOptions, run_tune
from collage_farm.config import load_config
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.core.subgraph import SubGraph
from collage_farm.costtable import CostTable, TableStore
from collage_farm.postsearch.vela_whole import profile_candidates
from collage_farm.probes.board_profiles import _renamed, board_profiled
from estimators.analytic import AnalyticEstimator
from estimators.board_profiled import BoardProfile, BoardProfiledEstimator, ProfileBuild
from estimators.local import LocalService
from estimators.measured import FarmEstimator
from tests.unit.test_ethos_board import _gather_layernorm, _model, _w

BOARD = "ethos-u55-128"


def _targets() -> tuple:
    return tuple(load_config(builtin_system=BOARD).selected_targets)


def _campaign(out: Path, model: Path, measure: str, **kw: object) -> tuple[dict, dict]:
    cfg = load_config(builtin_system=BOARD)
    s = run_tune(TuneOptions(model=str(model), targets=tuple(cfg.selected_targets), out=out,
                             estimator=kw.pop("estimator", "local"), transition=cfg.transition,
                             report=False, measure=measure, **kw))  # type: ignore[arg-type]
    return s, json.loads((out / "plan.json").read_text())


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The model, and a profile and an exhaustive campaign on it (fresh tables)."""
    tmp = tmp_path_factory.mktemp("board_profile")
    model = tmp / "gln.onnx"
    onnx.save(_gather_layernorm(), model)
    return {"model": model, "tmp": tmp,
            "profile": _campaign(tmp / "profile", model, "profile"),
            "exhaustive": _campaign(tmp / "exhaustive", model, "exhaustive")}


def _estimator(graph: DataflowGraph, campaigns: dict, tmp: Path) -> BoardProfiledEstimator:
    """The estimator over a copy of the profile campaign's table (its profile builds are
    there: nothing is built again)."""
    table = tmp / "costs"
    shutil.copytree(campaigns["tmp"] / "profile" / "costs", table)
    targets = _targets()
    exact = FarmEstimator(LocalService(sorted({t.toolchain for t in targets}), parallel=1),
                          TableStore(table), model=graph.name)
    est, _ = board_profiled(graph, profile_candidates(graph, targets), exact, table)
    return est


def test_profile_estimate_of_vela_split_equals_its_builds(campaigns: dict,
                                                          tmp_path: Path) -> None:
    graph = load_graph(onnx.load(campaigns["model"]))
    est = _estimator(graph, campaigns, tmp_path)
    try:
        parts = profile_candidates(graph, _targets())
        assert {c.target.id for c in parts} == {BOARD, f"{BOARD}-size", "cortex-m55"}
        built = est.exact.estimate(parts)  # memo of the profile builds: their exact figures
        checked = 0
        for c, cost in zip(parts, built):
            p = est.profiles[c.target.id]
            assert p.why_not(c) is None, c.label()
            # Vela's figure is its operators' cycles (no per-compile cycles); the host's is
            # its operators' plus its float boundary: the estimate is the build, exactly
            assert p.seconds(c) == cost.seconds, c.label()
            checked += 1
        assert checked == len(parts) >= 4
        assert est.stats().measured == 0  # profile builds are not counted as exact builds
    finally:
        est.close()


def test_a_split_or_unaccounted_candidate_is_built_not_estimated(campaigns: dict,
                                                                 tmp_path: Path) -> None:
    graph = load_graph(onnx.load(campaigns["model"]))
    table_est = _estimator(graph, campaigns, tmp_path)
    # exact where the profile builds are, whatever else the copied table holds
    parts = profile_candidates(graph, _targets())
    est = BoardProfiledEstimator(table_est.profiles, table_est.exact,
                                 known={(c.fingerprint, c.target.measure_key) for c in parts})
    by_id = {t.id: t for t in _targets()}
    idx = {n.name: n.index for n in graph.nodes}

    def cand(names: list[str], target: str) -> CandidatePartition:
        return CandidatePartition(SubGraph(graph, sum(1 << idx[n] for n in names)),
                                  by_id[target])
    try:
        split = cand(["fc1"], "cortex-m55")  # the host fuses its Relu into the FULLY_CONNECTED
        assert "fused" in str(est.why_built(split))
        gather = cand(["embed"], BOARD)  # the NPU profile has no Gather
        assert "no profile build" in str(est.why_built(gather))
        whole_fc = cand(["fc1", "relu"], BOARD)
        assert est.why_built(whole_fc) is None and est.provisional(whole_fc)
        # on the NPU, a Relu without its MatMul is priced by its own single-node build
        relu_fc2 = cand(["relu", "fc2"], BOARD)
        assert "fused" in str(est.why_built(relu_fc2)) and est.provisional(relu_fc2)
        costs = est.estimate([split, gather, whole_fc, relu_fc2])
        # the first two answer their builds (the exhaustive campaign's table built every
        # candidate in isolation)
        rows = {(r.fingerprint, r.target): r for r in
                CostTable(campaigns["tmp"] / "exhaustive" / "costs").rows()}
        assert costs[0].seconds == rows[split.fingerprint, "cortex-m55"].median
        assert est.is_confirmed(split) and not est.provisional(split)
        assert not costs[1].is_known  # Vela refuses a Gather: invalid exactly as when built
        assert est.is_confirmed(gather) and "Gather" in str(est.why_invalid(gather))
        assert costs[2].is_known and not est.is_confirmed(whole_fc)
        relu = cand(["relu"], BOARD)
        assert est.is_confirmed(relu) and not est.is_confirmed(relu_fc2)  # built: the Relu
        fc2 = est.profiles[BOARD].seconds(cand(["fc2"], BOARD))
        assert costs[3].seconds == pytest.approx(est.exact.estimate([relu])[0].seconds + fc2,
                                                 rel=1e-12)
        (exact,) = est.build([whole_fc])  # built now: answers its exact figure from now on
        assert est.estimate([whole_fc]) == [exact] and not est.provisional(whole_fc)
    finally:
        est.close()


def test_lower_bound_never_exceeds_the_profile_estimate() -> None:
    """A lazy search prices an edge at its bound until it is popped: a bound above the
    estimate the candidate will answer would prune it wrongly. A profile prices an operator
    Vela folded at 0 cycles, below the analytic floor, so the bound is capped there."""
    graph = load_graph(_gather_layernorm())
    target = {t.id: t for t in _targets()}[BOARD]
    build = ProfileBuild(("fc1", "relu", "fc2"), {"clock_hz": 500e6, "ops": [
        {"nodes": ["fc1"], "cycles": 300}, {"nodes": ["relu"], "cycles": 0},
        {"nodes": ["fc2"], "cycles": 100}]})
    est = BoardProfiledEstimator({BOARD: BoardProfile.of(BOARD, [build])}, AnalyticEstimator())
    idx = {n.name: n.index for n in graph.nodes}
    cands = [CandidatePartition(SubGraph(graph, sum(1 << idx[n] for n in names)), target)
             for names in (["fc1"], ["relu"], ["fc2"], ["fc1", "relu"], ["relu", "fc2"])]
    costs = est.estimate(cands)
    assert costs[1].seconds == 0.0 < est.exact.lower_bound(cands[1]).seconds
    for c, cost in zip(cands, costs):
        assert est.lower_bound(c).seconds <= cost.seconds, c.label()
    assert est.lower_bound(cands[0]) == est.exact.lower_bound(cands[0])  # below: kept


def test_profile_campaign_writes_exact_figures_and_agrees_with_exhaustive(
        campaigns: dict) -> None:
    (sp, plan_p), (se, plan_e) = campaigns["profile"], campaigns["exhaustive"]
    assert sp["measure"] == "profile" and se["measure"] == "exhaustive"
    assert sp["profiled"] >= 4 and sp["measured"] < se["measured"]
    assert sp["profile"]["board"] and "simulated" in sp["profile"]["figures"]
    assert sp["confirm"]["exact"] and "simulated" in sp["figures"]
    # every partition of the written plan: its figure is its isolated build's (the exhaustive
    # campaign's table built every candidate in isolation)
    rows = {(r.fingerprint, r.target): r.median
            for r in CostTable(campaigns["tmp"] / "exhaustive" / "costs").rows() if r.ok}
    for p in plan_p["partitions"]:
        assert p["estimated_s"] == rows[(p["fingerprint"], p["target"])], p["id"]
    # the exact comparison with Vela whole used exact figures: equal to the exhaustive one's
    assert sp["vela_whole_estimated_s"] == se["vela_whole_estimated_s"]
    assert sp["estimated_total_s"] <= sp["vela_whole_estimated_s"]
    # on this model both modes write the same plan with the same exact figure
    assert [(p["target"], p["nodes"]) for p in plan_p["partitions"]] == \
        [(p["target"], p["nodes"]) for p in plan_e["partitions"]]
    assert sp["estimated_total_s"] == se["estimated_total_s"]


def test_offline_on_a_profile_campaign_table_writes_its_plan(campaigns: dict) -> None:
    tmp = campaigns["tmp"]
    sp, plan_p = campaigns["profile"]
    so, plan_o = _campaign(tmp / "offline", campaigns["model"], "", estimator="offline",
                           cost_table=tmp / "profile" / "costs")
    assert so["measure"] == "profile" and so["measured"] == 0 and so["profiled"] == 0
    assert [(p["target"], p["nodes"]) for p in plan_o["partitions"]] == \
        [(p["target"], p["nodes"]) for p in plan_p["partitions"]]
    assert so["estimated_total_s"] == sp["estimated_total_s"]


def test_profile_groups_operators_that_share_a_node_and_drops_passthrough() -> None:
    graph = load_graph(_gather_layernorm())
    by_id = {t.id: t for t in _targets()}
    idx = {n.name: n.index for n in graph.nodes}
    build = ProfileBuild(("fc1", "relu", "fc2"), {"clock_hz": 500e6, "ops": [
        {"nodes": ["fc1", "relu"], "cycles": 300},
        {"nodes": ["fc2"], "cycles": 100, "target": "cpu"},  # Vela left it to the CPU
    ]})
    p = BoardProfile.of(BOARD, [build])

    def cand(names: list[str]) -> CandidatePartition:
        return CandidatePartition(SubGraph(graph, sum(1 << idx[n] for n in names)),
                                  by_id[BOARD])
    assert p.why_not(cand(["fc1", "relu"])) is None
    assert p.seconds(cand(["fc1", "relu"])) == 300 / 500e6
    assert "CPU" in str(p.why_not(cand(["fc2"])))
    # one group of three: a node split alone is priced by its own build, two are built
    three = BoardProfile.of(BOARD, [ProfileBuild(("norm", "fc1", "relu"), {
        "clock_hz": 500e6, "ops": [{"nodes": ["norm", "fc1", "relu"], "cycles": 900}]})])
    assert three.fragments(cand(["relu"])) == [("relu",)]
    # two nodes of the group (a folded chain cut in two): priced by a build of those two
    assert three.fragments(cand(["fc1", "relu"])) == [("fc1", "relu")]
    assert three.seconds(cand(["relu"]), {"relu": 1e-6}) == 1e-6
    assert three.seconds(cand(["fc1", "relu"]), {"fc1": 2e-6, "relu": 0.0}) == 2e-6


def test_a_repeated_layers_row_is_read_with_its_own_node_names() -> None:
    # two structurally equal partitions share a fingerprint, so one row answers both: its
    # operators name the first one's nodes and are mapped by position onto the second's
    d = {"ops": [{"nodes": ["l0/mm", "l0/add"], "cycles": 7}]}
    got = _renamed(d, ("l0/mm", "l0/add"), ("l1/mm", "l1/add"))
    assert got["ops"] == [{"nodes": ["l1/mm", "l1/add"], "cycles": 7}]
    assert _renamed(d, ("l0/mm", "l0/add"), ("l0/mm", "l0/add")) is d


def _folded_chain() -> onnx.ModelProto:
    """x -> conv0 -> relu0 -> conv1 -> bn -> relu1 -> conv2: the converter folds the
    BatchNormalization into conv1, and Vela fuses each Relu into its Conv."""
    rng = np.random.default_rng(0)
    c = 8
    bn = [numpy_helper.from_array(v.astype(np.float32), n) for n, v in (
        ("g", 1 + 0.1 * rng.standard_normal(c)), ("b", 0.1 * rng.standard_normal(c)),
        ("m", 0.1 * rng.standard_normal(c)), ("v", 1 + 0.1 * rng.random(c)))]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["a"], pads=[1, 1, 1, 1], name="conv0"),
             helper.make_node("Relu", ["a"], ["ar"], name="relu0"),
             helper.make_node("Conv", ["ar", "w1"], ["b1"], pads=[1, 1, 1, 1], name="conv1"),
             helper.make_node("BatchNormalization", ["b1", "g", "b", "m", "v"], ["bb"],
                              name="bn"),
             helper.make_node("Relu", ["bb"], ["br"], name="relu1"),
             helper.make_node("Conv", ["br", "w2"], ["y"], pads=[1, 1, 1, 1], name="conv2")]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 8, 8])],
                  [_w("w0", (c, c, 3, 3)), _w("w1", (c, c, 3, 3), 1),
                   _w("w2", (c, c, 3, 3), 2), *bn])


def test_a_folded_chain_cut_in_two_is_priced_by_a_build_of_its_part(tmp_path: Path) -> None:
    """A candidate that cuts a folded Conv -> BatchNormalization -> Relu group after the
    BatchNormalization pays the profile's cycles of the groups it holds whole plus one build
    of its part of the cut group; the part's build is shared, the candidate is not built."""
    graph = load_graph(_folded_chain())
    targets = _targets()
    exact = FarmEstimator(LocalService(sorted({t.toolchain for t in targets}), parallel=1),
                          TableStore(tmp_path / "costs"), model=graph.name)
    est, _ = board_profiled(graph, profile_candidates(graph, targets), exact,
                            tmp_path / "costs")
    npu = {t.id: t for t in targets}[BOARD]
    idx = {n.name: n.index for n in graph.nodes}

    def cand(names: list[str]) -> CandidatePartition:
        return CandidatePartition(SubGraph(graph, sum(1 << idx[n] for n in names)), npu)
    try:
        p = est.profiles[BOARD]
        head = cand(["conv0", "relu0", "conv1", "bn"])
        assert "fused" in str(est.why_built(head))  # splits {conv1, bn, relu1}
        assert p.fragments(head) == [("conv1", "bn")]
        (cost,) = est.estimate([head])
        part = cand(["conv1", "bn"])
        assert est.is_confirmed(part) and not est.is_confirmed(head)  # the part was built
        (part_s,) = est.estimate([part])
        whole_s = p.seconds(cand(["conv0", "relu0"]))
        assert cost.seconds == pytest.approx(whole_s + part_s.seconds, rel=1e-12)
        built = est.stats().measured
        est.estimate([cand(["relu0", "conv1", "bn"])])  # the same part again: no new build
        assert est.stats().measured == built + 1  # only relu0 alone (a single-node part)
    finally:
        est.close()
