"""The 16x8 variant of the Ethos-U NPU targets (``ethos-u65-256-a16``: ``activations: int16``)
end to end without Ray: calibration records per-channel means beside the ranges, the variant
is a target of its own on its board, its Vela builds are 16x8 with bias correction, and `run`
checks a plan that puts 16x8 NPU partitions next to an int8 host partition.

Real Vela compiles, real LiteRT reference kernels, the campaign's ``local`` estimator.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm.campaign import TuneOptions, run_tune
from collage_farm.config import builtin_system_for, load_config
from collage_farm.core.graph import MAX_IR_VERSION, load_graph, random_inputs
from collage_farm.core.pins import Pin, PinSet
from collage_farm.core.target import A16_VARIANT, BUILTIN_TARGETS, ETHOS_U_CONFIGS, ConfigError
from collage_farm.costtable import CostTable
from collage_farm.execute import PlanExecutor
from collage_farm.execute.numerics import INT8_STEPS, int8_step, reference_outputs
from estimators.int8_ranges import channel_means_provider
from runners.base import BuildInput, Status
from runners.calibration import calibrate, channel_means, clear_memory_cache
from runners.ethosu import A16_SOFTMAX_MAX_ROW, VelaToolchain
from runners.host_model import host_model
from runners.runtime import RuntimeInput
from runners.runtime_sim import SOFTMAX_ABORT_ROW
from runners.tflite import ActivationBits, convert

pytest.importorskip("ethosu.regor")
litert = pytest.importorskip("ai_edge_litert.interpreter")

C = 8
A16 = BUILTIN_TARGETS["ethos-u65-256" + A16_VARIANT]
U65 = BUILTIN_TARGETS["ethos-u65-256"]


def _init(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr, np.float32), name)


def _onnx(nodes: list, inits: list, x: list[int], y: list[int]) -> onnx.ModelProto:
    """Graph input ``x`` and output ``y`` (float, of these shapes), opset 13."""
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("x", x), ("y", y))]
    m = helper.make_model(helper.make_graph(nodes, "a16", io[:1], io[1:], inits),
                          opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = MAX_IR_VERSION
    return m


def _model() -> onnx.ModelProto:
    """Conv -> Relu -> Conv of stride 4 with SAME padding (the U65 leaves it to the host) ->
    Relu -> 1x1 Conv -> Sigmoid; the input is offset by +2 so channel means are not zero."""
    rng = np.random.default_rng(0)
    n = helper.make_node
    nodes = [n("Add", ["x", "two"], ["s"]),
             n("Conv", ["s", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]), n("Relu", ["c0"], ["r0"]),
             n("Conv", ["r0", "w1", "b1"], ["c1"], strides=[4, 4], pads=[0, 0, 1, 1]),
             n("Relu", ["c1"], ["r1"]), n("Conv", ["r1", "w2", "b2"], ["c2"]),
             n("Sigmoid", ["c2"], ["y"])]
    inits = [_init("two", np.array(2.0)),
             _init("w0", rng.standard_normal((C, 3, 3, 3)) * 0.3),
             _init("b0", rng.standard_normal(C) * 0.1),
             _init("w1", rng.standard_normal((C, C, 5, 5)) * 0.1),
             _init("b1", rng.standard_normal(C) * 0.1),
             _init("w2", rng.standard_normal((C, C, 1, 1)) * 0.3),
             _init("b2", rng.standard_normal(C) * 0.1)]
    return _onnx(nodes, inits, [1, 3, 16, 16], [1, C, 4, 4])


def test_calibration_records_channel_means_of_weight_inputs(tmp_path: Path) -> None:
    m = _model()
    g = load_graph(m)
    means = channel_means(g, cache_dir=tmp_path)
    assert set(means) == {"s", "r0", "r1"}  # what the three Convs read, nothing else
    probe = onnx.ModelProto()
    probe.CopyFrom(m)
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in ("s", "r1"))
    outs = [reference_outputs(probe, ["s", "r1"], random_inputs(m, s)) for s in range(8)]
    for t in ("s", "r1"):
        want = np.mean([o[t].astype(np.float64).mean(axis=(0, 2, 3)) for o in outs], axis=0)
        np.testing.assert_allclose(means[t], want, rtol=1e-5, atol=1e-7)
    assert float(means["s"].mean()) == pytest.approx(2.0, abs=0.1)
    # the cache file holds both, and a fresh process reads them back unchanged
    (path,) = tmp_path.glob("ranges-*.json")
    assert set(json.loads(path.read_text())) >= {"ranges", "means"}
    ranges = calibrate(g, cache_dir=tmp_path)
    clear_memory_cache()
    again = channel_means(g, cache_dir=tmp_path)
    assert {k: list(v) for k, v in again.items()} == {k: list(v) for k, v in means.items()}
    assert calibrate(g, cache_dir=tmp_path) == ranges


def test_every_npu_has_an_a16_variant_on_its_board() -> None:
    for accel in ETHOS_U_CONFIGS:
        t = BUILTIN_TARGETS[accel + A16_VARIANT]
        assert t.option("activations") == "int16" and t.toolchain == "vela"
        assert t.measure_key != BUILTIN_TARGETS[accel].measure_key
    board = builtin_system_for([A16, BUILTIN_TARGETS["cortex-m55"]])
    assert board is not None and board.system_name == "ethos-u65-256"
    assert board.with_board_host([A16]) == [A16, BUILTIN_TARGETS["cortex-m55"]]
    assert builtin_system_for([A16, BUILTIN_TARGETS["cortex-m85"]]) is None


def test_a_builtin_system_takes_the_a16_variant_of_its_own_npu() -> None:
    """``--builtin-system ethos-u65-256 --targets ethos-u65-256-a16``: the system's NPU with
    the variant's option (the catalogue's measure key), plus the board's host; another
    board's variant is still an unknown target there."""
    cfg = load_config(builtin_system="ethos-u65-256")
    got = cfg.with_board_host(cfg.resolve_targets("ethos-u65-256-a16"))
    assert [t.id for t in got] == ["ethos-u65-256-a16", "cortex-m55"]
    assert got[0].measure_key == A16.measure_key and got[0].option("activations") == "int16"
    with pytest.raises(ConfigError, match="unknown target 'ethos-u55-128-a16'"):
        cfg.resolve_targets("ethos-u55-128-a16")
    assert cfg.variant_of("ethos-u65-256-size") is None  # not a VARIANT_OPTIONS variant


def test_a16_build_is_16x8_and_its_biases_use_the_channel_means() -> None:
    m = _model()
    g = load_graph(m)
    ranges = tuple((k, lo, hi) for k, (lo, hi) in sorted(calibrate(g).items()))
    cand = onnx.ModelProto()
    cand.CopyFrom(m)
    del cand.graph.node[2:]  # Add -> Conv: the Conv reads "s", of channel means ~2
    cand.graph.output[0].CopyFrom(helper.make_tensor_value_info("c0", TensorProto.FLOAT,
                                                                [1, C, 16, 16]))
    data = cand.SerializeToString()
    means = channel_means_provider(g, [A16])
    assert means is not None and channel_means_provider(g, [U65]) is None
    c_means = tuple((k, tuple(float(x) for x in v)) for k, v in
                    sorted(channel_means(g).items()) if k == "s")
    tc = VelaToolchain()
    int8 = tc.build(BuildInput("f8", U65, data, ranges))
    plain = tc.build(BuildInput("f16", A16, data, ranges))
    fixed = tc.build(BuildInput("f16", A16, data, ranges, channel_means=c_means))
    assert int8.status is plain.status is fixed.status is Status.OK
    it = litert.Interpreter(model_content=fixed.artifact)
    types = {d["name"]: d["dtype"] for d in it.get_tensor_details()}
    assert types["c0"] == np.int16 and types["s"] == np.int16 and np.int64 in types.values()
    assert plain.artifact != fixed.artifact  # the biases moved
    cycles = {b.fingerprint: b.detail("vela")["seconds"] for b in (int8, fixed)}
    assert cycles["f16"] > cycles["f8"]  # int16 activations: twice the bytes
    assert "16x8, 1 channel mean(s)" in fixed.detail("vela")["ranges"]


def test_run_checks_16x8_npu_partitions_beside_an_int8_host_partition(tmp_path: Path) -> None:
    model = tmp_path / "a16.onnx"
    onnx.save(_model(), model)
    board = builtin_system_for([A16])
    assert board is not None
    # pinned: with the host's int8 <-> int16 requantisations priced, this small model's
    # cheapest plan is the host alone, and this test is about a 16x8 / int8 mix
    pins = PinSet((Pin(node="Conv_1", target=A16.id), Pin(node="Conv_5", target=A16.id)))
    opts = TuneOptions(model=str(model), targets=tuple(board.with_board_host([A16])),
                       out=tmp_path / "out", estimator="local", transition=board.transition,
                       report=False, pins=pins)
    run_tune(opts)
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    where = {n: p["target"] for p in plan["partitions"] for n in p["nodes"]}
    assert where["Conv_3"] == "cortex-m55" and where["Conv_1"] == where["Conv_5"] == A16.id
    assert plan["transition"].endswith("+requantise")  # the crossings are priced
    host = host_model("cortex-m55")
    crossing = sum(p["penalty_s"] for p in plan["partitions"] if p["target"] == A16.id)
    assert crossing >= 2 * host.seconds(host.requantise_cycles(0))  # at least in + out
    opts_of = {t["id"]: t["options"] for t in plan["targets"]}
    assert opts_of[A16.id]["activations"] == "int16"
    rows = CostTable(tmp_path / "out" / "costs").rows()
    assert {r.target_key for r in rows if r.toolchain == "vela"} == {A16.measure_key}

    ex = PlanExecutor(tmp_path / "out")
    assert ex.channel_means and set(ex.channel_means) == {"s", "r0", "r1"}
    prec = {rt.target: rt.precision for rt in ex.partitions}
    assert prec == {A16.id: "int16", "cortex-m55": "int8"}
    assert ex.precision == "int8"
    errors = ex.check()
    # the Sigmoid ran 16x8: held to its range's step, not the int8 pin (1/256)
    step = ex.int8_steps["y"]
    assert step == pytest.approx(int8_step(*ex.tensor_ranges["y"])) and step < 1 / 256
    assert errors["y"] <= INT8_STEPS * step
    numerics = {rt.target: rt.numerics for rt in ex.partitions}
    assert numerics[A16.id].startswith("litert 16x8"), numerics


def _softmax(row: int) -> onnx.ModelProto:
    return _onnx([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [], [1, 4, row],
                 [1, 4, row])


def test_long_softmax_rows_leave_a16_for_the_host_and_short_ones_run_int16() -> None:
    """The int16 kernel floors every entry at e^-10 of the row maximum: over 6,625 entries
    the top probability drops by a quarter, so a 16x8 NPU target refuses such rows, and a 16x8
    partition holding one (a 16x8 host builds it in fp32) runs fp32 numerics; LiteRT's int16
    SOFTMAX itself does not abort on >= 512 equal entries as int8's does (`SOFTMAX_ABORT_ROW`:
    an int8 partition gets the fp32 stand-in there)."""
    tc = VelaToolchain()
    for row, refused in ((A16_SOFTMAX_MAX_ROW, False), (6625, True)):
        g = load_graph(_softmax(row))
        why = tc.capabilities_for_target(A16).why_not(g.nodes[0], g)
        assert (why is not None) is refused and tc.capabilities_for_target(U65).why_not(
            g.nodes[0], g) is None
    m = _softmax(SOFTMAX_ABORT_ROW + 88)
    ranges = calibrate(m)
    rt = tc.runtime(RuntimeInput("p0", A16.id, m.SerializeToString(), ("x",), ("y",),
                                 options=A16.options,
                                 tensor_ranges=tuple((k, lo, hi)
                                                     for k, (lo, hi) in sorted(ranges.items()))))
    x = np.zeros((1, 4, SOFTMAX_ABORT_ROW + 88), np.float32)
    y = rt.plain({"x": x})["y"]
    np.testing.assert_allclose(y, 1 / (SOFTMAX_ABORT_ROW + 88), atol=1e-6)
    assert rt.precision == "fp32" and "16x8 SOFTMAX does not resolve rows of 600" in rt.numerics
    conv = convert(m, "int8", ranges, activations=ActivationBits.INT16)  # the kernel alone
    interp = litert.Interpreter(model_content=conv.tflite,
                                experimental_op_resolver_type=litert.OpResolverType.BUILTIN_REF)
    interp.allocate_tensors()
    (i,), (o,) = conv.inputs, conv.outputs
    interp.set_tensor(i.index, i.to_tflite(x))
    interp.invoke()
    np.testing.assert_allclose(o.from_tflite(interp.get_tensor(o.index)),
                               1 / (SOFTMAX_ABORT_ROW + 88), atol=1 / 32768)
