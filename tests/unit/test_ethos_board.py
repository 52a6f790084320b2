"""Ethos-U boards end to end without Ray: the Cortex-M host as a target, Vela whole, exactness.

The host's cycle model is checked against cycles computed by hand from its documented figures;
a campaign on the built-in ethos-u55-128 board (real Vela compiles and host builds, in local
isolated workers: the campaign's ``local`` estimator) plans a Gather/LayerNorm model onto NPU +
host and is compared exactly with Vela's own partitioning; two campaigns on fresh cost tables
give identical costs and plans; the CLI refuses targets that are on no one board.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("ethosu.regor")

from collage_farm.campaign import TuneOptions, run_tune
from collage_farm.cli.main import main
from collage_farm.cli.tune import print_summary
from collage_farm.config import ConfigError, load_config
from collage_farm.core.graph import MAX_IR_VERSION, load_graph
from collage_farm.core.target import BUILTIN_TARGETS, board_conflict
from collage_farm.costtable import CostTable
from collage_farm.postsearch.vela_whole import ethos_u_board, vela_whole_parts
from runners.base import BuildInput, MeasureInput, Status
from runners.cortex_m import CortexMToolchain

M55 = BUILTIN_TARGETS["cortex-m55"]


def _model(nodes: list, inputs: list, outputs: list, inits: list) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "m", inputs, outputs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = MAX_IR_VERSION
    return m


def _w(name: str, shape: tuple[int, ...], seed: int = 0) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)


def _host_ops(model: onnx.ModelProto) -> tuple[dict, float]:
    tc = CortexMToolchain()
    b = tc.build(BuildInput("fp", M55, model.SerializeToString()))
    assert b.ok, b.error
    r = tc.measure(MeasureInput(b))
    assert r.ok and r.kind.value == "analytic" and r.summary is not None and r.summary.n == 1
    est = b.detail("host")
    assert isinstance(est, dict) and est["mode"] == "int8"
    return est, r.seconds


def test_host_model_prices_conv_and_fully_connected_as_computed_by_hand() -> None:
    # Conv 8 -> 16 channels, 3x3, pad 1, on 16x16: 16*16*16 outputs x 9 x 8 = 294,912 MACs;
    # bytes: input 2,048 + output 4,096 + int8 weights 1,152 + int32 bias 16 x 4 = 7,360
    conv = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])],
                  [_w("w", (16, 8, 3, 3)), _w("b", (16,), 1)])
    est, seconds = _host_ops(conv)
    (op,) = est["ops"]
    assert (op["op"], op["kernel"], op["macs"], op["bytes"]) == ("CONV_2D", "cmsis-nn",
                                                                294_912, 7_360)
    # 2,000 per operator + 0.25 per MAC + 0.25 per byte (CMSIS-NN on a Cortex-M55)
    assert op["cycles"] == 2000 + 294_912 * 0.25 + 7_360 * 0.25 == 77_568
    assert seconds == pytest.approx(77_568 / 400e6)
    # FullyConnected 64 -> 32: 2,048 MACs; bytes 64 in + 32 out + 2,048 weights + 32 x 4 bias
    fc = _model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
                [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32])],
                [_w("w", (32, 64)), _w("b", (32,), 1)])
    est, seconds = _host_ops(fc)
    (op,) = est["ops"]
    assert (op["op"], op["macs"], op["bytes"]) == ("FULLY_CONNECTED", 2_048, 2_272)
    assert op["cycles"] == 2000 + 2_048 * 0.25 + 2_272 * 0.25 == 3_080
    assert seconds == pytest.approx(3_080 / 400e6)


def test_the_16x8_host_prices_cmsis_nn_s16_at_twice_the_int8_mac_cost() -> None:
    """``cortex-m55-a16``: the same Conv written 16x8 runs CMSIS-NN's s16 kernel, 0.5 cycles
    per MAC (Helium's 4 x 16-bit MACs a cycle against 8 x 8-bit) and the int8 rate per byte on
    its int16 activations' bytes."""
    conv = _model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 16, 16])],
                  [_w("w", (16, 8, 3, 3)), _w("b", (16,), 1)])
    tc = CortexMToolchain()
    b = tc.build(BuildInput("fp16", BUILTIN_TARGETS["cortex-m55-a16"], conv.SerializeToString()))
    assert b.ok, b.error
    est = b.detail("host")
    assert isinstance(est, dict) and est["mode"] == "int16"
    (op,) = est["ops"]
    assert (op["op"], op["kernel"], op["macs"]) == ("CONV_2D", "cmsis-nn", 294_912)
    assert op["bytes"] > 7_360  # int16 activations: more bytes than the int8 build's
    assert op["cycles"] == 2000 + 294_912 * 0.5 + op["bytes"] * 0.25


def test_an_operator_the_converter_cannot_map_is_one_line_naming_it() -> None:
    m = _model([helper.make_node("Det", ["x"], ["y"], name="the_det")],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 3])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], [])
    g = load_graph(m)
    assert CortexMToolchain().capabilities().why_not(g.nodes[0], g)
    b = CortexMToolchain().build(BuildInput("fp", M55, m.SerializeToString()))
    assert b.status is Status.UNSUPPORTED
    assert "\n" not in b.error and "Det node 'the_det'" in b.error and "cortex-m55" in b.error


def _gather_layernorm() -> onnx.ModelProto:
    """ids -> embedding Gather -> LayerNorm -> MatMul(const) -> Relu -> MatMul(const)."""
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("LayerNormalization", ["e", "gamma", "beta"], ["n"], axis=-1,
                              name="norm"),
             helper.make_node("MatMul", ["n", "w1"], ["h"], name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="fc2")]
    inits = [_w("table", (64, 32)), numpy_helper.from_array(np.ones(32, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(32, np.float32), "beta"),
             _w("w1", (32, 64), 2), _w("w2", (64, 32), 3)]
    return _model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32])], inits)


def _campaign(tmp: Path, model: Path) -> tuple[dict, dict, dict[str, float]]:
    cfg = load_config(builtin_system="ethos-u55-128")
    opts = TuneOptions(model=str(model), targets=tuple(cfg.selected_targets), out=tmp / "out",
                       estimator="local", transition=cfg.transition, report=False)
    summary = run_tune(opts)
    plan = json.loads((tmp / "out" / "plan.json").read_text())
    costs = {r.fingerprint: r.median for r in CostTable(tmp / "out" / "costs").rows()}
    return summary, plan, costs


def test_gather_layernorm_model_plans_onto_npu_and_host_exactly(tmp_path: Path) -> None:
    model = tmp_path / "gln.onnx"
    onnx.save(_gather_layernorm(), model)
    s1, plan1, costs1 = _campaign(tmp_path / "a", model)
    where = {n: p["target"] for p in plan1["partitions"] for n in p["nodes"]}
    assert where["embed"] == where["norm"] == "cortex-m55"  # the NPU takes neither
    assert where["fc1"] == "ethos-u55-128"
    assert set(s1["partitions_per_target"]) == {"cortex-m55", "ethos-u55-128"}
    # never worse against Vela's own split, exactly, and the figures say they are simulated
    assert s1["vela_whole_estimated_s"] is not None
    assert s1["estimated_total_s"] <= s1["vela_whole_estimated_s"]
    assert "exact" in s1["never_worse"] and "simulated" in s1["figures"]
    assert s1.get("plan_measured_s") is None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_summary(s1)
    assert "built (simulated)" in printed.getvalue()  # builds, never called measurements
    assert " measured, " not in printed.getvalue()
    assert "costs (simulated: Vela cycles" in printed.getvalue()  # the estimate line says so
    rows = CostTable(tmp_path / "a" / "out" / "costs").rows()
    assert {r.kind for r in rows if r.toolchain == "cortex-m"} == {"analytic"}
    assert {r.kind for r in rows if r.toolchain == "vela"} == {"simulated"}
    # a second campaign on a fresh table measures everything again: identical costs and plan
    s2, plan2, costs2 = _campaign(tmp_path / "b", model)
    assert costs2 == costs1
    assert s2["estimated_total_s"] == s1["estimated_total_s"]
    assert [(p["target"], p["nodes"]) for p in plan2["partitions"]] == \
        [(p["target"], p["nodes"]) for p in plan1["partitions"]]


def test_vela_whole_splits_gpt2_where_vela_would() -> None:
    from collage_farm.zoo import build

    g = load_graph(build("gpt2", layers=1), name="gpt2")
    board = ethos_u_board(load_config(builtin_system="ethos-u55-128").selected_targets)
    assert board is not None
    parts = vela_whole_parts(g, board)
    assert sum(p.mask for p in parts) == g.all_mask  # a cover, in execution order
    assert all(a.target != b.target for a, b in itertools.pairwise(parts))  # maximal runs
    host = {g.nodes[i].op_type for p in parts if p.target == board.host
            for i in range(len(g.nodes)) if p.mask >> i & 1}
    assert {"Gather", "LayerNormalization", "Erf"} <= host


def test_targets_on_no_one_board_are_refused(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    for targets in ("ort-cpu,ethos-u55-128", "ethos-u55-128,ethos-u65-256",
                    "cortex-m55,cortex-m85"):
        rc = main(["tune", "zoo:mnist", "--targets", targets, "--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert "board" in err
    assert not out.exists()  # refused before anything ran or was written
    assert board_conflict([BUILTIN_TARGETS["ethos-u85-256"], BUILTIN_TARGETS["cortex-m85"]]) \
        is None


def test_board_files_hold_npu_and_host_with_a_shared_memory_hand_over(tmp_path: Path) -> None:
    for name, host in (("ethos-u55-128", "cortex-m55"), ("ethos-u55-256", "cortex-m55"),
                       ("ethos-u65-256", "cortex-m55"), ("ethos-u85-256", "cortex-m85")):
        cfg = load_config(builtin_system=name)
        size = {f"{name}-size"} if name.startswith("ethos-u55") else set()  # Shared_Sram boards
        assert set(cfg.selected) == {name, host} | size
        assert cfg.targets[host] == BUILTIN_TARGETS[host]
        npu, mcu = cfg.targets[name], cfg.targets[host]
        tr = cfg.transition
        assert tr.transfer_s(mcu.device, npu.device, 1 << 20) == pytest.approx(2e-6)  # no copy
        assert tr.handoff_s(mcu, 1 << 20) == 0.0 and tr.launch_s(mcu) == 0.0
        assert tr.launch_s(npu) == pytest.approx(10e-6)  # one NPU invocation per partition
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: 1\ndevices:\n  a: {kind: cpu}\n  b: {kind: ethos-u}\n"
                   "links:\n  - {from: a, to: b, latency_us: 1, gb_per_s: 4, "
                   "shared_memory: true}\n")
    with pytest.raises(ConfigError, match="shared_memory"):
        load_config(bad)


def test_an_npu_named_alone_comes_with_its_board_host() -> None:
    from collage_farm.cli.tune import _board

    cfg = load_config(builtin_system="ethos-u55-128")
    named = cfg.resolve_targets("ethos-u55-128")
    assert [t.id for t in cfg.with_board_host(named)] == ["ethos-u55-128", "cortex-m55"]
    targets, transition = _board([BUILTIN_TARGETS["ethos-u85-256"]])
    assert [t.id for t in targets] == ["ethos-u85-256", "cortex-m85"]
    assert transition is not None and transition.label == "analytic:ethos-u85-256"
    assert _board([BUILTIN_TARGETS["ort-cpu"]]) == ([BUILTIN_TARGETS["ort-cpu"]], None)
