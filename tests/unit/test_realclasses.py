"""Classes of real exports (`collage_farm.zoo.realclasses`): tuned, run and verified, or refused.

Each class model is tuned on the three CPU toolchains with real costs from the toolchains' own
runners in this process's reach (`estimators.local.LocalService`, one shared for the module,
a short measurement config: these tests are about what runs, not how fast), its plan written,
then run on the real runtimes and checked against the whole model (`PlanExecutor.check`). A
candidate a toolchain cannot build or run is a failed row the search avoids, never a crash.
The QDQ model's measured campaign runs on the Ray farm (tests/ray/test_realclasses_farm.py);
here it is tuned with mock costs and its plan checked the same way.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import redirect_stderr
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from collage_farm import zoo
from collage_farm.campaign import TuneOptions, load_source, run_tune
from collage_farm.cli import main
from collage_farm.core.graph import OpKind, load_graph, random_inputs
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import parse_targets
from collage_farm.costtable import TableStore
from collage_farm.execute import PlanExecutor
from collage_farm.zoo.realclasses import CLASSES
from estimators.local import LocalService
from estimators.measured import FarmEstimator
from runners.base import MeasureConfig

pytest.importorskip("openvino")
pytest.importorskip("ai_edge_litert")

TARGETS = tuple(parse_targets("ort-cpu,openvino-cpu,litert-cpu"))
QUICK = MeasureConfig(warmup_runs=1, rounds=1, min_round_runs=2, min_round_s=0.0, mode="warm")
LOCAL = sorted(n for n in CLASSES if n != "qdq_mnist")


def _ops(model: onnx.ModelProto) -> set[str]:
    return {n.op_type for n in model.graph.node}


@pytest.fixture(scope="module")
def service() -> Iterator[LocalService]:
    svc = LocalService(sorted({t.toolchain for t in TARGETS}))
    yield svc
    svc.close()


def _tune(name: str, tmp_path: Path, est: object = None) -> dict:
    opts = TuneOptions(model=f"zoo:{name}", targets=TARGETS, out=tmp_path / "out",
                       shapes=dict(CLASSES[name].shapes), estimator="mock", report=False,
                       verify=False, refine_trials=0, confirm_rounds=0, cut_costs=False)
    return run_tune(opts, estimator=est)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", LOCAL)
def test_class_is_tuned_measured_and_its_plan_verified(name: str, service: LocalService,
                                                       tmp_path: Path) -> None:
    est = FarmEstimator(service, TableStore(tmp_path / "costs"), model=name,
                        measure_config=QUICK, close_farm=False)
    try:
        s = _tune(name, tmp_path, est)
    finally:
        est.close()
    assert s["measured"] > 0 and s["partitions"] >= 1
    # failures are rows with a status (the search avoided them), never a crash
    assert set(s["failed_by_status"]) <= {"unsupported", "build_failed", "runtime_error"}
    errors = PlanExecutor(tmp_path / "out", shapes=dict(CLASSES[name].shapes)).check()
    assert set(errors) == {o.name for o in zoo.build(name).graph.output}


def test_qdq_plan_from_mock_costs_verifies(tmp_path: Path) -> None:
    s = _tune("qdq_mnist", tmp_path)
    assert s["estimator"] == "mock"
    ex = PlanExecutor(tmp_path / "out")
    assert ex.precision == "int8"  # a model that quantizes itself: a cut moves a rounding
    assert set(ex.check()) == {"Plus214_Output_0"}


def test_each_class_has_what_it_stands_for() -> None:
    m = {name: zoo.build(name) for name in CLASSES}
    qdq = m["qdq_mnist"]
    assert {"QuantizeLinear", "DequantizeLinear", "Conv", "MatMul"} <= _ops(qdq)
    conv_in = {n.input[0] for n in qdq.graph.node if n.op_type == "Conv"}
    dq_out = {n.output[0] for n in qdq.graph.node if n.op_type == "DequantizeLinear"}
    assert conv_in <= dq_out  # every Conv reads a dequantized tensor
    assert {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"} <= _ops(m["dynquant_mnist"])
    assert {"QLinearConv", "QLinearMatMul", "QLinearAdd"} <= _ops(m["qlinear_mnist"])
    for name, op in (("if_gate", "If"), ("loop_rnn", "Loop"), ("scan_cumsum", "Scan")):
        node = next(n for n in m[name].graph.node if n.op_type == op)
        assert any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute)
    for name, op, states in (("lstm_tagger", "LSTM", {"initial_h", "initial_c"}),
                             ("gru_speech", "GRU", {"initial_h"})):
        node = next(n for n in m[name].graph.node if n.op_type == op)
        assert states <= set(node.input) & {i.name for i in m[name].graph.input}
    det = m["detector_fpn"]
    assert det.opset_import[0].version == 11 and len(det.graph.output) == 6
    assert "Resize" in _ops(det)
    assert [d.dim_param for d in det.graph.input[0].type.tensor_type.shape.dim][2:] == [
        "height", "width"]
    assert m["old_ir"].ir_version == 6 and m["old_ir"].opset_import[0].version == 12
    used = {n.domain for n in m["unused_domains"].graph.node}
    assert {o.domain for o in m["unused_domains"].opset_import} - used >= {
        "ai.onnx.ml", "com.microsoft", "ai.onnx.training", "org.pytorch.aten"}


def test_detector_opsets_11_to_17_load_and_run() -> None:
    for opset in (11, 13, 17):
        model = zoo.build("detector_fpn", opset=opset)
        g = load_graph(model, {"image": (1, 3, 32, 48)})
        assert len(g.graph_outputs) == 6
        assert g.tensors["scores_p1"].shape == (1, 3, 16, 24)
    with pytest.raises(ValueError, match="opset"):
        zoo.build("detector_fpn", opset=10)


def test_control_flow_node_is_one_opaque_node_cut_with_its_outer_scope(tmp_path: Path) -> None:
    """An If cut out alone keeps the outer-scope tensors its bodies read: the initializer as an
    initializer, the node output as an input; it computes what it computes in the model."""
    g = load_source("zoo:if_gate")
    node = next(n for n in g.nodes if n.op_type == "If")
    assert node.kind is OpKind.OPAQUE
    assert {"h", "gate/bias", "gate/scale"} <= set(node.implicit_inputs)
    sub = SubGraph.of(g, [node.index]).extract()
    assert {"h", "gate/cond"} == {i.name for i in sub.graph.input}
    assert {"gate/bias", "gate/scale"} <= {t.name for t in sub.graph.initializer}
    whole = g.model
    feeds = random_inputs(whole, 3)
    full = onnx.ModelProto()
    full.CopyFrom(whole)
    full.graph.output.extend([onnx.helper.make_tensor_value_info(
        t, g.tensors[t].elem_type, g.tensors[t].shape) for t in ("h", "gate/cond", "gated")])
    so = ort.SessionOptions()
    so.log_severity_level = 3
    run = ort.InferenceSession(full.SerializeToString(), so,
                               providers=["CPUExecutionProvider"]).run
    h, cond, gated = run(["h", "gate/cond", "gated"], feeds)
    alone = ort.InferenceSession(sub.SerializeToString(), so,
                                 providers=["CPUExecutionProvider"]).run(
        None, {"h": h, "gate/cond": cond})[0]
    np.testing.assert_allclose(alone, gated, rtol=1e-6)


def test_no_target_takes_an_operator_one_line_names_it(tmp_path: Path) -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        rc = main(["tune", "zoo:qlinear_mnist", "--mock", "--targets", "openvino-cpu,litert-cpu",
                   "--out", str(tmp_path / "out"), "--no-report"])
    lines = [x for x in err.getvalue().splitlines() if "error" in x]
    assert rc == 2 and len(lines) == 1
    assert "QLinearAdd" in lines[0] and "no target supports it" in lines[0]


def test_detector_needs_its_dynamic_dims_bound(tmp_path: Path) -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        rc = main(["tune", "zoo:detector_fpn", "--mock", "--out", str(tmp_path / "a"),
                   "--no-report"])
    assert rc == 2 and "--shape image=" in err.getvalue() and "height" in err.getvalue()
    assert main(["tune", "zoo:detector_fpn", "--mock", "--shape", "image=1x3x32x64",
                 "--out", str(tmp_path / "b"), "--no-report", "--json"]) == 0
    ex = PlanExecutor(tmp_path / "b")
    assert len(ex.check()) == 6


def test_old_ir_is_read_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        g = load_source("zoo:old_ir")
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and "IR version 6" in lines[0] and "IR 7" in lines[0]
    assert g.model.ir_version == 7
