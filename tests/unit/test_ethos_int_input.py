"""Integer inputs on an Ethos-U board, and the calibration in int8 rows' keys.

A model whose input is int32 (as magika's bytes): Reshape -> Equal against an int table (a
one-hot mask) -> Cast to float -> MatMul -> Relu -> MatMul. The converter carries the integer
and boolean tensors in fp32 mode only, so the Cortex-M host takes the integer front and the NPU
the float work; a campaign on the built-in ethos-u65-256 board (real Vela compiles, local
workers) plans it, every partition converts, and `run`'s check passes. Then the calibration:
int8 rows built on one calibration never serve a campaign on another, the default's keys are
the ones tables already hold, and CPU targets' keys never change.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("ethosu.regor")
pytest.importorskip("ai_edge_litert")

from collage_farm.campaign import TuneOptions, run_tune
from collage_farm.config import load_config
from collage_farm.core.calibration_data import CalibrationData
from collage_farm.core.graph import MAX_IR_VERSION, load_graph
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import BUILTIN_TARGETS
from collage_farm.costtable import CostTable
from collage_farm.execute import PlanExecutor
from estimators.int8_ranges import calibrated_targets
from runners.tflite import convert, convertible

N, V = 16, 8  # sequence length, vocabulary


def _one_hot_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Reshape", ["ids", "shape"], ["col"], name="reshape"),
             helper.make_node("Equal", ["col", "vocab"], ["mask"], name="equal"),
             helper.make_node("Cast", ["mask"], ["onehot"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("MatMul", ["onehot", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    inits = [numpy_helper.from_array(np.array([1, N, 1], np.int64), "shape"),
             numpy_helper.from_array(np.arange(V, dtype=np.int32).reshape(1, 1, V), "vocab"),
             numpy_helper.from_array(rng.standard_normal((V, 32)).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((32, 16)) * 0.2).astype(np.float32),
                                     "w2")]
    ids = helper.make_tensor_value_info("ids", TensorProto.INT32, [1, N])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, N, 16])
    return helper.make_model(helper.make_graph(nodes, "onehot", [ids], [y], inits),
                             opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=MAX_IR_VERSION)


def _saved(tmp: Path) -> Path:
    """The model as the file a campaign reads."""
    onnx.save(_one_hot_model(), tmp / "onehot.onnx")
    return tmp / "onehot.onnx"


def test_integer_front_converts_in_fp32_only_and_runs_exactly() -> None:
    import onnxruntime as ort
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    m = _one_hot_model()
    g = load_graph(m)
    front = [n for n in g.nodes if n.name in ("reshape", "equal", "cast")]
    for n in front:  # int8 (the NPU) never takes an integer or boolean tensor
        assert convertible(n, g, "fp32") is None
        why = convertible(n, g, "int8")
        assert why is not None and ("int32" in why or "bool" in why or "fp32" in why), why
    conv = convert(m, "fp32")
    assert [o.op for o in conv.ops][:3] == ["RESHAPE", "EQUAL", "CAST"]
    assert conv.inputs[0].dtype == "int32" and conv.inputs[0].tflite_shape == (1, N)
    ids = np.random.default_rng(1).integers(0, V + 2, (1, N)).astype(np.int32)  # some miss
    it = Interpreter(model_content=conv.tflite,
                     experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    it.set_tensor(conv.inputs[0].index, conv.inputs[0].to_tflite(ids))
    it.invoke()
    got = conv.outputs[0].from_tflite(it.get_tensor(conv.outputs[0].index))
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]
                                ).run(None, {"ids": ids})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # a partition cut after Equal hands a boolean tensor over: it is an input of the next
    tail = SubGraph(g, sum(1 << n.index for n in g.nodes if n.name != "reshape"
                           and n.name != "equal")).extract()
    assert convert(tail, "fp32").inputs[0].dtype == "bool"


def _campaign(model: Path, out: Path, table: Path | None = None,
              calibration: CalibrationData | None = None) -> tuple[dict, dict]:
    cfg = load_config(builtin_system="ethos-u65-256")
    s = run_tune(TuneOptions(model=str(model), targets=tuple(cfg.selected_targets), out=out,
                             estimator="local", transition=cfg.transition, report=False,
                             cost_table=str(table) if table else None,
                             calibration=calibration))
    return s, json.loads((out / "plan.json").read_text())


def test_int32_input_model_plans_onto_the_board_and_runs(tmp_path: Path) -> None:
    model_file = _saved(tmp_path)
    s, plan = _campaign(model_file, tmp_path / "out")
    where = {n: p["target"] for p in plan["partitions"] for n in p["nodes"]}
    assert {where[n] for n in ("reshape", "equal")} == {"cortex-m55"}  # integer: the host
    assert "ethos-u65-256" in where.values()  # the float work: on the NPU (Vela accepts it)
    assert s["vela_whole_estimated_s"] is not None
    assert s["estimated_total_s"] <= s["vela_whole_estimated_s"]
    g = load_graph(model_file)
    idx = {n.name: n.index for n in g.nodes}
    ex = PlanExecutor(tmp_path / "out")
    for p in plan["partitions"]:  # every partition converts as its toolchain builds it
        sub = SubGraph(g, sum(1 << idx[n] for n in p["nodes"])).extract()
        if p["target"] == "cortex-m55":
            assert convert(sub, "fp32", write=False).ops
        else:
            assert convert(sub, "int8", ex.tensor_ranges).tflite
    err = ex.check(ex.check_feeds())
    assert set(err) == {"y"}


def test_calibration_keys_int8_rows_and_leaves_cpu_and_default_keys(tmp_path: Path) -> None:
    model_file = _saved(tmp_path)
    cpu, npu, host = (BUILTIN_TARGETS[n] for n in ("ort-cpu", "ethos-u65-256", "cortex-m55"))
    default = CalibrationData.random()
    assert default.row_key == ""
    assert calibrated_targets((cpu, npu, host), default) == (cpu, npu, host)
    npz = tmp_path / "ids.npz"
    np.savez(npz, ids=np.random.default_rng(2).integers(0, V, (4, 1, N)).astype(np.int32))
    data = CalibrationData.load(npz).validated(load_graph(model_file))
    assert data.sha256 and data.sha256 in data.row_key
    c_cpu, c_npu, c_host = calibrated_targets((cpu, npu, host), data)
    assert c_cpu.measure_key == cpu.measure_key  # float rows keep their keys
    assert c_npu.measure_key != npu.measure_key and c_host.measure_key != host.measure_key
    assert c_npu.options == npu.options and c_npu.name == npu.name  # runners see no change
    # one table, three campaigns: default, real data, default again
    table = tmp_path / "costs"
    s1, _ = _campaign(model_file, tmp_path / "a", table)
    s2, _ = _campaign(model_file, tmp_path / "b", table, CalibrationData.load(npz))
    s3, _ = _campaign(model_file, tmp_path / "c", table)
    assert s1["measured"] > 0 and s1["cache_hits"] == 0
    assert s2["cache_hits"] == 0  # random-calibrated rows never serve real data
    assert s2["measured"] == s1["measured"]
    # the default's rows serve the default again, under the keys they always had (the lazy
    # search may build a few candidates it pruned the first time)
    assert s3["cache_hits"] > 0 and s3["measured"] < s1["measured"]
    keys = {r.target_key for r in CostTable(table).rows() if r.toolchain == "vela"}
    assert keys == {npu.measure_key, c_npu.measure_key}
