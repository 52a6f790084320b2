"""Estimators without Ray: analytic bound vs real ORT timings, table misses, mock determinism."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm import zoo
from collage_farm.campaign import CostSource, TuneOptions, measure_strategy
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.estimator import EstimatorKind
from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import BUILTIN_TARGETS, CPU0, Target
from collage_farm.costtable import CostTable, CostTableWriter, TableStore, row_from_result
from estimators.analytic import FAST_CONV_FACTOR, AnalyticEstimator, node_flops, sub_graph_work
from estimators.measured import FarmEstimator
from estimators.mock import MockEstimator
from estimators.profiled import MeasureStrategy
from estimators.sources import Strictness
from estimators.table import MissingCostsError, TableEstimator
from runners.base import (
    DeviceDescription,
    MeasureConfig,
    MeasureResult,
    Status,
    Summary,
)
from tests.helpers import SCRIPTED_DEVICE, ScriptedService

ORT = BUILTIN_TARGETS["ort-cpu"]


def _zoo():
    return pytest.importorskip("collage_farm.zoo", reason="model zoo not installed")


def _conv_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((16, 8, 3, 3)).astype(np.float32), "w")
    wm = numpy_helper.from_array(rng.standard_normal((16 * 8 * 8, 10)).astype(np.float32), "wm")
    shape = numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "wm"], ["y"], name="fc"),
    ]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 8, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])], [w, wm, shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


@pytest.fixture(scope="module")
def tiny() -> DataflowGraph:
    return load_graph(_conv_model(), name="tiny")


def _cand(g: DataflowGraph, names: list[str], target: Target = ORT) -> CandidatePartition:
    idx = [g.node_by_name(n).index for n in names]
    return CandidatePartition(SubGraph.of(g, idx), target)


# ------------------------------------------------------------------------------------------
# analytic


def test_flop_formulas(tiny: DataflowGraph) -> None:
    conv = tiny.node_by_name("conv")
    # 2 x out(1*16*8*8) x Cin*k*k (8*3*3), over the Winograd allowance for k > 1
    assert node_flops(conv, tiny) == 2 * 16 * 8 * 8 * 8 * 3 * 3 / FAST_CONV_FACTOR
    fc = tiny.node_by_name("fc")
    assert node_flops(fc, tiny) == 2 * 10 * 1024
    assert node_flops(tiny.node_by_name("relu"), tiny) == 16 * 8 * 8
    assert node_flops(tiny.node_by_name("flat"), tiny) == 0
    w = sub_graph_work(_cand(tiny, ["conv", "relu"]).sub_graph)
    assert w.boundary_bytes == 4 * (8 * 8 * 8 + 16 * 8 * 8)  # x in, r out
    assert w.weight_bytes == 4 * 16 * 8 * 9


def test_analytic_bound_is_monotone_and_labelled(tiny: DataflowGraph) -> None:
    est = AnalyticEstimator()
    small = _cand(tiny, ["conv"])
    big = _cand(tiny, ["conv", "relu", "flat", "fc"])
    assert 0 < est.lower_bound(small).seconds <= est.lower_bound(big).seconds
    assert est.estimate([small])[0] == est.lower_bound(small)
    assert est.label == "analytic" and est.stats().analytic == 1
    # devices differ; the null toolchain's synthetic costs get no physical bound
    cuda = _cand(tiny, ["conv"], BUILTIN_TARGETS["ort-cuda"])
    assert est.lower_bound(cuda).seconds < est.lower_bound(small).seconds
    null = _cand(tiny, ["conv"], Target.make("null", "null", CPU0))
    assert est.lower_bound(null) == Cost.zero()
    # overridable peaks: a slower CPU peak raises the bound
    from estimators.analytic import DevicePeak

    slow = AnalyticEstimator({"cpu": DevicePeak(1e9, 1e9, 0.0)})
    assert slow.lower_bound(small).seconds > est.lower_bound(small).seconds


def _zoo_candidates() -> list[CandidatePartition]:
    zoo = _zoo()
    out: list[CandidatePartition] = []
    picks = {
        "mnist": ({}, [["Conv"], ["Conv", "Add", "Relu"], ["MatMul"], ["MaxPool"]]),
        "resnet18": ({"image_size": 64}, [["Conv"], ["Conv", "Relu"], ["GlobalAveragePool"],
                                          ["Gemm"]]),
        "mobilenet_v2": ({"image_size": 64, "width_mult": 0.5}, [["Conv"], ["Conv", "Clip"]]),
        "bert": ({"layers": 1, "width": 128, "heads": 2, "vocab": 1000, "seq_len": 32},
                 [["MatMul"], ["Softmax"], ["LayerNormalization"], ["MatMul", "Add"]]),
    }
    for name, (kw, patterns) in picks.items():
        g = load_graph(zoo.build(name, **kw), name=name)
        for pat in patterns:
            found = _first_chain(g, pat)
            if found is not None:
                out.append(CandidatePartition(SubGraph.of(g, found), ORT))
    return out


def _first_chain(g: DataflowGraph, ops: list[str]) -> list[int] | None:
    """The first path of nodes with these op types, each feeding the next."""
    for n in g.nodes:
        if n.op_type != ops[0]:
            continue
        chain = [n.index]
        cur = n
        for op in ops[1:]:
            nxt = next((g.nodes[s] for s in cur.succs if g.nodes[s].op_type == op), None)
            if nxt is None:
                break
            chain.append(nxt.index)
            cur = nxt
        else:
            return chain
    return None


def test_analytic_bound_below_real_ort_measurements() -> None:
    from runners.base import BuildInput, MeasureConfig, MeasureInput
    from runners.registry import get_toolchain

    tc = get_toolchain("ort-cpu")
    if tc.available() is not None:
        pytest.skip(f"ort-cpu unavailable: {tc.available()}")
    cands = _zoo_candidates()
    assert len(cands) >= 8
    est = AnalyticEstimator()
    cfg = MeasureConfig(warmup_runs=2, rounds=3, min_round_runs=3, min_round_s=0.002)
    checked = 0
    for c in cands:
        b = tc.build(BuildInput(c.fingerprint, c.target, c.sub_graph.extract().SerializeToString()))
        assert b.ok, b.error
        m = tc.measure(MeasureInput(b, cfg))
        assert m.ok, m.error
        bound = est.lower_bound(c).seconds
        fastest = min(m.samples)
        assert 0 < bound <= fastest, (c.label(), bound, fastest)
        checked += 1
    assert checked == len(cands)


# ------------------------------------------------------------------------------------------
# mock


def test_mock_is_deterministic_and_structural(tiny: DataflowGraph) -> None:
    c1 = _cand(tiny, ["conv", "relu"])
    again = load_graph(_conv_model(), name="other-name")
    c2 = _cand(again, ["conv", "relu"])
    assert c1.fingerprint == c2.fingerprint
    a, b = MockEstimator(), MockEstimator()
    assert a.estimate([c1]) == b.estimate([c2])
    assert MockEstimator(seed=1).estimate([c1]) != a.estimate([c1])
    other = _cand(tiny, ["conv", "relu"], BUILTIN_TARGETS["openvino-cpu"])
    assert a.estimate([other]) != a.estimate([c1])
    assert a.lower_bound(c1).seconds <= a.estimate([c1])[0].seconds
    assert a.label == "mock"
    bad = MockEstimator(invalid_ops=[("ort-cpu", "Relu")])
    assert bad.estimate([c1])[0].is_invalid and bad.stats().failed == 1
    # fusion pays: two nodes in one partition cost less than apart (one launch saved)
    apart = a.estimate([_cand(tiny, ["conv"])])[0] + a.estimate([_cand(tiny, ["relu"])])[0]
    assert a.estimate([c1])[0] < apart


def test_mock_drives_a_search() -> None:
    zoo = _zoo()
    from collage_farm.core.rules import RuleOptions, all_candidates, default_spec
    from collage_farm.core.search import search
    from runners.registry import capabilities_for

    g = load_graph(zoo.build("mnist"), name="mnist")
    targets = [BUILTIN_TARGETS["ort-cpu"], BUILTIN_TARGETS["openvino-cpu"]]
    specs = []
    for t in targets:
        caps = capabilities_for(t.toolchain)
        specs.append(default_spec(t, caps.supports, caps.style, RuleOptions(max_depth=3)))
    cands = all_candidates(g, specs)
    r1 = search(g, cands, MockEstimator(), lazy=True)
    r2 = search(g, cands, MockEstimator(), lazy=False)
    assert math.isclose(r1.total_s, r2.total_s, rel_tol=1e-12)


# ------------------------------------------------------------------------------------------
# table


def _write_rows(path: Path, cands: list[CandidatePartition], seconds: float = 1e-4,
                status: str = "ok") -> None:
    from collage_farm.costtable import CostTableWriter, row_from_result
    from runners.base import MeasureConfig, MeasureResult, Status, Summary

    with CostTableWriter(path, campaign_id="t", background=False) as w:
        for c in cands:
            if status == "ok":
                samples = (seconds, seconds * 1.01, seconds * 0.99)
                res = MeasureResult(c.fingerprint, c.target, Status.OK, MeasureConfig(),
                                    samples=samples, summary=Summary.of(samples))
            else:
                res = MeasureResult.failed(
                    type("B", (), {"fingerprint": c.fingerprint, "target": c.target})(),
                    Status(status), "boom", MeasureConfig())
            w.append(row_from_result(res, campaign_id="t", model="tiny", nodes=c.node_names,
                                     op_types=c.op_types))


def test_table_estimator_hits_misses_and_analytic(tmp_path: Path, tiny: DataflowGraph) -> None:
    pytest.importorskip("collage_farm.costtable")
    have = [_cand(tiny, ["conv"]), _cand(tiny, ["relu"])]
    failed = [_cand(tiny, ["flat"])]
    missing = [_cand(tiny, ["fc"]), _cand(tiny, ["conv", "relu"])]
    table = tmp_path / "costs"
    _write_rows(table, have, 2e-4)
    _write_rows(table, failed, status="build_failed")

    est = TableEstimator(TableStore.existing(table))
    got = est.estimate(have + failed)
    assert [c.seconds for c in got[:2]] == [pytest.approx(2e-4)] * 2
    assert got[2].is_invalid
    with pytest.raises(MissingCostsError) as info:
        est.estimate(have + missing)
    err = info.value
    assert {m.fingerprint for m in err.missing} == {c.fingerprint for c in missing}
    text = str(err)
    assert "2 candidate cost(s) are not in the cost table" in text
    assert "--allow-analytic" in text and missing[0].label() in text

    coll = TableEstimator(TableStore.existing(table), on_missing="collect")
    out = coll.estimate(have + missing)
    assert out[2].is_unknown and len(coll.missing) == 2
    with pytest.raises(MissingCostsError):
        coll.check()

    an = TableEstimator(TableStore.existing(table), allow_analytic=True)
    out = an.estimate(have + missing)
    assert all(c.is_known for c in out)
    assert an.label == "table+analytic"
    assert an.source(missing[0]) == "analytic" and an.source(have[0]) == "table"
    st = an.stats()
    assert st.analytic == 2 and st.cache_hits == 2
    assert out[2] == AnalyticEstimator().lower_bound(missing[0])


def test_table_estimator_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        TableEstimator(TableStore.existing(tmp_path / "nope"))


# ------------------------------------------------------------------------------------------
# in-network measurement: what the rest of the network touches


def test_rest_of_network_bytes_adds_up(tiny: DataflowGraph) -> None:
    total = sum(t.nbytes for t in tiny.tensors.values())
    whole = SubGraph.of(tiny, range(len(tiny.nodes)))
    assert whole.rest_of_network_bytes() == 0 and whole.own_bytes() == total
    conv = _cand(tiny, ["conv"]).sub_graph
    fc = _cand(tiny, ["fc"]).sub_graph
    t = tiny.tensors
    assert conv.own_bytes() == t["x"].nbytes + t["w"].nbytes + t["c"].nbytes
    assert fc.own_bytes() == t["f"].nbytes + t["wm"].nbytes + t["y"].nbytes
    assert conv.rest_of_network_bytes() == total - conv.own_bytes()
    # the big FC weight is the conv's neighbour: the conv's network is mostly that weight
    assert conv.rest_of_network_bytes() > t["wm"].nbytes > fc.rest_of_network_bytes()


def test_candidate_config_sizes_network_mode_per_candidate(tiny: DataflowGraph) -> None:
    from estimators.measured import candidate_config
    from runners.base import MeasureConfig

    c = _cand(tiny, ["conv", "relu"])
    net = candidate_config(MeasureConfig(mode="network"), c)
    assert net.network_bytes == c.sub_graph.rest_of_network_bytes() > 0
    assert net.mode == "network" and net.rounds == MeasureConfig().rounds
    warm = MeasureConfig(mode="warm")
    assert candidate_config(warm, c) is warm  # other modes: untouched
    fixed = MeasureConfig(mode="network", network_bytes=123)
    assert candidate_config(fixed, c) is fixed  # an explicit size wins
    flushed = MeasureConfig(mode="network", flush_bytes=4 << 20)
    assert candidate_config(flushed, c) is flushed


def test_offline_campaign_filters_rows_by_mode_only_when_asked(tmp_path: Path,
                                                               tiny: DataflowGraph) -> None:
    """``tune --offline --measure-mode M`` uses only rows taken in M; without it, any mode."""
    from collage_farm.campaign import TuneOptions, make_estimator
    from collage_farm.costtable import CostTableWriter, row_from_result
    from runners.base import MeasureConfig, MeasureResult, Status, Summary

    c = _cand(tiny, ["conv"])
    res = MeasureResult(c.fingerprint, ORT, Status.OK, MeasureConfig(mode="warm"),
                        samples=(1e-3,), summary=Summary.of((1e-3,)),
                        device=DeviceDescription("cpu", "x", 2), toolchain_version="1")
    with CostTableWriter(tmp_path / "t", background=False) as w:
        w.append(row_from_result(res, campaign_id="c", model="tiny", nodes=["conv"],
                                 op_types=["Conv"]))
    base = dict(model="unused", targets=(ORT,), out=tmp_path / "o", estimator="offline",
                cost_table=tmp_path / "t", strictness="any")
    est, writer = make_estimator(TuneOptions(**base), tiny)
    assert isinstance(est, TableEstimator) and est.mode is None and writer is None
    assert est.estimate([c])[0].seconds == pytest.approx(1e-3)
    est, _ = make_estimator(TuneOptions(**base, measure_mode="network"), tiny)
    assert isinstance(est, TableEstimator) and est.mode == "network"
    with pytest.raises(MissingCostsError):
        est.estimate([c])
        est.check()


def test_no_cover_names_the_failures_of_the_node_it_stopped_at(tmp_path: Path) -> None:
    """'no valid cover ... failed to build' used to hide the cause (a runner that cannot feed
    string tensors, a type error in the model): the error now quotes the rows' own words, one
    per target, from an offline table whose rows for one node failed."""
    from collage_farm.campaign import TuneOptions, run_tune
    from collage_farm.core.rules import RuleOptions, all_candidates
    from collage_farm.core.search import NoCoverError
    from collage_farm.core.target import parse_targets
    from collage_farm.costtable import CostTableWriter, row_from_result
    from runners.base import MeasureConfig, MeasureResult, Status, Summary

    zoo = _zoo()
    graph = load_graph(zoo.build("mnist"), name="mnist")
    targets = parse_targets("ort-cpu")
    from collage_farm.campaign import build_specs

    opts = RuleOptions(max_depth=1)
    cands = all_candidates(graph, build_specs(targets, opts))
    dev = DeviceDescription("cpu", "test", 1)
    with CostTableWriter(tmp_path / "t", background=False) as w:
        for c in cands:
            if "pool1" in c.node_names:
                r = MeasureResult(c.fingerprint, c.target, Status.BUILD_FAILED, MeasureConfig(),
                                  error="TypeError: pool1 wants float", device=dev)
            else:
                samples = (1e-5,) * 3
                r = MeasureResult(c.fingerprint, c.target, Status.OK, MeasureConfig(),
                                  samples=samples, summary=Summary.of(samples), device=dev)
            w.append(row_from_result(r, campaign_id="t", model="mnist",
                                     nodes=c.node_names, op_types=c.op_types))
    with pytest.raises(NoCoverError, match=r"pool1.*e\.g\. ort-cpu: build_failed: TypeError: "
                                           r"pool1 wants float"):
        run_tune(TuneOptions(model="zoo:mnist", targets=tuple(targets), out=tmp_path / "o",
                             estimator="offline", cost_table=tmp_path / "t", rule_options=opts,
                             strictness="any", cut_costs=False))


# ------------------------------------------------------------------------------------------
# the farm estimator on its contracts: a scripted measurement service, a real cost table




def test_farm_estimator_records_in_the_store_and_confirms_through_it(
        tmp_path: Path, tiny: DataflowGraph) -> None:
    """Misses are measured by the service and recorded in the store; a steady re-measurement
    is recorded as a confirmation, which a later estimator on the same table reads back."""
    conv, relu = _cand(tiny, ["conv"]), _cand(tiny, ["relu"])
    service = ScriptedService()
    est = FarmEstimator(service, TableStore(tmp_path / "t", campaign_id="one"), model="tiny",
                        close_farm=False)
    assert est.kind is EstimatorKind.FARM and est.measure_mode == "network"
    assert [c.seconds for c in est.estimate([conv, relu, conv])] == [pytest.approx(1e-3)] * 3
    assert sorted(service.measured) == sorted([conv.fingerprint, relu.fingerprint])
    assert service.progress == [("expect", 2, 0, {"cpu": 2}), ("settle",)]
    assert not est.is_confirmed(conv)
    est.remeasure([conv])
    assert est.is_confirmed(conv) and not est.is_confirmed(relu)
    est.close()
    assert service.progress[-1] == ("finish",) and not service.closed
    assert est.stats().measured == 3

    again = FarmEstimator(service, TableStore(tmp_path / "t", campaign_id="two"), model="tiny",
                          close_farm=True)
    again.estimate([conv, relu])
    assert again.stats().cache_hits == 2 and again.stats().measured == 0
    assert again.is_confirmed(conv) and not again.is_confirmed(relu)
    again.close()
    assert service.closed
    rows = CostTable(tmp_path / "t").rows()
    assert {r.campaign_id for r in rows} == {"one"} and len(rows) == 3


def test_table_store_answers_the_cost_store_contract(tmp_path: Path, tiny: DataflowGraph) -> None:
    """Lookups answer `StoredCost`s under the `Strictness` enum; a store without a writer opens
    its own on the first record and closes it; a shared writer is only flushed."""
    conv = _cand(tiny, ["conv"])
    samples = (2e-3,) * 3
    res = MeasureResult(conv.fingerprint, ORT, Status.OK, MeasureConfig(), samples=samples,
                        summary=Summary.of(samples), device=SCRIPTED_DEVICE,
                        toolchain_version="1")
    store = TableStore(tmp_path / "t", campaign_id="c")
    assert not (tmp_path / "t").exists()  # nothing recorded, nothing created
    store.record(res, model="tiny", nodes=conv.node_names, op_types=conv.op_types)
    store.flush()
    key = (conv.fingerprint, ORT.measure_key)
    got = store.lookup([key], device="another machine", strictness=Strictness.ANY)[key]
    assert got.ok and got.cost.seconds == pytest.approx(2e-3) and not got.confirmed
    assert store.lookup([key], device="another machine") == {}  # EXACT by default
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.record(res)
    with CostTableWriter(tmp_path / "t", campaign_id="w", background=False) as w:
        shared = TableStore(tmp_path / "t", w)
        shared.record(res, confirmation=True)
        shared.close()  # flushed, still open for its owner
        assert w.rows_written == 1
        w.append(row_from_result(res, campaign_id="w", model="", nodes=(), op_types=()))
    assert shared.lookup([key])[key].confirmed is False  # the newest row is no confirmation
    with pytest.raises(ValueError, match="strictness must be one of"):
        store.lookup([key], strictness="fuzzy")


def test_cost_source_is_an_enum_parsed_from_its_value(tmp_path: Path) -> None:
    """`TuneOptions.estimator` is a `CostSource`: its value spelling is accepted, anything else
    is refused with the spellings named."""
    opts = TuneOptions(model="zoo:mnist", targets=(ORT,), out=tmp_path, estimator="mock")
    assert opts.estimator is CostSource.MOCK and not opts.estimator.measures
    assert TuneOptions(model="m", targets=(ORT,), out=tmp_path).estimator is CostSource.FARM
    assert CostSource.LOCAL.measures and not CostSource.OFFLINE.measures
    with pytest.raises(ValueError, match="farm, local, offline, mock"):
        TuneOptions(model="m", targets=(ORT,), out=tmp_path, estimator="bogus")


def test_measure_strategy_defaults_by_cost_source(tmp_path: Path) -> None:
    """Unset ``measure``: profile for a farm campaign, exhaustive for simulated-only targets,
    offline tables without profile rows and mock costs; a given value always wins."""
    g = load_graph(zoo.build("mnist"), name="mnist")
    vela = BUILTIN_TARGETS["ethos-u55-128"]

    def strategy(**kw: object) -> MeasureStrategy:
        return measure_strategy(TuneOptions(model="m", out=tmp_path, **kw), g)

    assert strategy(targets=(ORT,)) is MeasureStrategy.PROFILE
    assert strategy(targets=(ORT,), measure="exhaustive") is MeasureStrategy.EXHAUSTIVE
    assert strategy(targets=(vela,)) is MeasureStrategy.EXHAUSTIVE
    assert strategy(targets=(ORT,), estimator="mock") is MeasureStrategy.EXHAUSTIVE
    assert strategy(targets=(ORT,), estimator="offline",
                    cost_table=tmp_path / "none") is MeasureStrategy.EXHAUSTIVE
