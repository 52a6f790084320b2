"""The simulated Ethos-U toolchain ("vela"): capabilities confirmed by compiling, cycle accounting,
configurations, the host model, and failures as rows (a Vela segfault included).

Why these tests: Vela's estimate is only worth something if (1) the candidate the search costs is
what Vela compiles (the converter is checked in test_tflite_convert), (2) what the capabilities
promise is what Vela really puts on the NPU, in both directions, (3) the per-operator cycles add
up to the total and name the right ONNX nodes, and (4) the configuration the target names is the
one Vela uses. Everything here runs Vela for real; it is fast (milliseconds per compile).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm import zoo
from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import BUILTIN_TARGETS, ETHOS_U_CONFIGS, Target, VirtualDevice
from runners.base import BuildInput, BuildResult, Kind, MeasureConfig, MeasureInput, Status
from runners.calibration import calibrate
from runners.registry import get_toolchain
from runners.tflite import SUPPORTED_OPS, convert, convertible
from runners.tflite.fold import _folded

regor = pytest.importorskip("ethosu.regor")

from runners.ethosu import (  # noqa: E402 - after the importorskip
    HOST_MODEL,
    ONNX_TO_TFLITE,
    VELA_TFLITE_OPS,
    VelaCapabilities,
    VelaToolchain,
    vela_config,
    vela_estimate,
    vela_why_not,
)

U55_128 = BUILTIN_TARGETS["ethos-u55-128"]
CFG = MeasureConfig()


def _ranges(g: DataflowGraph) -> tuple[tuple[str, float, float], ...]:
    return tuple((k, lo, hi) for k, (lo, hi) in sorted(calibrate(g).items()))


@pytest.fixture(scope="module")
def tc() -> VelaToolchain:
    t = get_toolchain("vela")
    assert isinstance(t, VelaToolchain) and t.available() is None, t.available()
    return t


@pytest.fixture(scope="module")
def mnist() -> DataflowGraph:
    return load_graph(zoo.build("mnist"), name="mnist")


def _one_node(node: onnx.NodeProto, x_shape: list[int], y_shape: list[int],
              inits: tuple[onnx.TensorProto, ...] = ()) -> onnx.ModelProto:
    g = helper.make_graph([node], "one",
                          [helper.make_tensor_value_info(node.input[0], TensorProto.FLOAT,
                                                         x_shape)],
                          [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT,
                                                         y_shape)], list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def _w(name: str, shape: tuple[int, ...], seed: int = 0, scale: float = 0.2) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def _estimate(model: onnx.ModelProto | DataflowGraph, target: Target = U55_128) -> dict:
    g = model if isinstance(model, DataflowGraph) else load_graph(model)
    conv = convert(g, "int8", calibrate(g))
    return vela_estimate(conv.tflite, vela_config(target), conv)


# --- tables and capabilities ----------------------------------------------------------------


def test_op_tables_match_installed_vela_and_converter() -> None:
    installed = {op.replace("ARGMAX", "ARG_MAX")
                 for op in regor.tflite_operator_constraints("EthosU55")}
    assert installed == VELA_TFLITE_OPS  # a Vela upgrade that changes the list shows up here
    assert set(ONNX_TO_TFLITE) == set(SUPPORTED_OPS)
    for onnx_op, codes in ONNX_TO_TFLITE.items():
        assert set(codes) <= VELA_TFLITE_OPS, onnx_op


def test_capabilities_import_nothing_heavy() -> None:
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from collage_farm import zoo\n"
        "from collage_farm.core.graph import load_graph\n"
        "from runners.registry import capabilities_for\n"
        "g = load_graph(zoo.build('mnist'))\n"
        "caps = capabilities_for('vela')\n"
        "assert all(caps.supports(n, g) for n in g.nodes)\n"
        "heavy = [m for m in ('ethosu', 'flatbuffers', 'ai_edge_litert') if m in sys.modules]\n"
        "print(heavy)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


@pytest.fixture(scope="module")
def zoo_graphs() -> dict[str, DataflowGraph]:
    return {
        "mnist": load_graph(zoo.build("mnist"), name="mnist"),
        "resnet18": load_graph(zoo.build("resnet18", image_size=32, num_classes=10),
                               name="resnet18"),
        "mobilenet_v2": load_graph(zoo.build("mobilenet_v2", image_size=32, width_mult=0.5,
                                             num_classes=10), name="mobilenet_v2"),
        "gpt2": load_graph(zoo.build("gpt2", layers=1, width=64, heads=2, vocab=100,
                                     seq_len=16), name="gpt2"),
    }


def test_every_zoo_node_the_capabilities_take_lands_on_the_npu(
        zoo_graphs: dict[str, DataflowGraph]) -> None:
    """Confirm the capabilities by compiling: every accepted node, alone, runs on the NPU (a node
    folded into a constant emits nothing: it is accepted, and compiled only with a reader)."""
    caps = VelaCapabilities()
    cfg = vela_config(U55_128)
    taken: dict[str, int] = {}
    for name, g in zoo_graphs.items():
        ranges = calibrate(g)
        seen: set[str] = set()
        for node in g.nodes:
            if not caps.supports(node, g) or _folded(node, g):
                continue
            sg = SubGraph.of(g, [node.index])
            if sg.structural_hash in seen:
                continue
            seen.add(sg.structural_hash)
            conv = convert(sg.extract(), "int8", ranges)
            est = vela_estimate(conv.tflite, cfg, conv)
            assert est["cpu_ops"] == 0, (name, node, est["ops"])
            assert all(op["target"] == "npu" for op in est["ops"]), (name, node)
            taken[name] = taken.get(name, 0) + 1
    # the CNNs are taken whole; the transformer's MatMuls, Adds and activations are taken
    for name in ("mnist", "resnet18", "mobilenet_v2"):
        g = zoo_graphs[name]
        assert all(caps.supports(n, g) for n in g.nodes), name
    assert taken.get("gpt2", 0) >= 3
    gpt2 = zoo_graphs["gpt2"]
    refused = {n.op_type for n in gpt2.nodes if not caps.supports(n, gpt2)}
    assert refused  # LayerNorm pieces, Gather, ... are not converted
    assert any(_folded(n, gpt2) and caps.supports(n, gpt2) for n in gpt2.nodes)  # positions


# constraint -> (model on the accepted side, model on the refused side, reason fragment)
def _dw(stride: int) -> onnx.ModelProto:
    out = (30 - 3) // stride + 1
    return _one_node(helper.make_node("Conv", ["x", "w"], ["y"], group=8,
                                      strides=[stride, stride]),
                     [1, 8, 30, 30], [1, 8, out, out], (_w("w", (8, 1, 3, 3)),))


def _avg(k: int) -> onnx.ModelProto:
    return _one_node(helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[k, k],
                                      auto_pad="SAME_UPPER", count_include_pad=0),
                     [1, 8, 16, 16], [1, 8, 16, 16])


def _mean(h: int) -> onnx.ModelProto:
    return _one_node(helper.make_node("GlobalAveragePool", ["x"], ["y"]), [1, 2, h, 1],
                     [1, 2, 1, 1])


def _pool1d(op: str, length: int) -> onnx.ModelProto:
    """A global pool of a rank-3 input [1, C, L] (magika's GlobalMaxPool): reduced over L."""
    return _one_node(helper.make_node(op, ["x"], ["y"]), [1, 16, length], [1, 16, 1])


def _fc(n_in: int) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.full((n_in, 2), 0.01, np.float32), "w")
    return _one_node(helper.make_node("MatMul", ["x", "w"], ["y"]), [1, n_in], [1, 2], (w,))


def _conv_s4(auto_pad: str) -> onnx.ModelProto:
    return _one_node(helper.make_node("Conv", ["x", "w"], ["y"], strides=[4, 4], auto_pad=auto_pad),
                     [1, 4, 18, 18], [1, 4, 5 if auto_pad == "SAME_UPPER" else 4,
                                      5 if auto_pad == "SAME_UPPER" else 4],
                     (_w("w", (4, 4, 5, 5)),))


def _softmax(h: int, w: int) -> onnx.ModelProto:
    return _one_node(helper.make_node("Softmax", ["x"], ["y"], axis=1), [1, 2, h, w], [1, 2, h, w])


def _resize(factor: int) -> onnx.ModelProto:
    scales = numpy_helper.from_array(np.array([1, 1, factor, factor], np.float32), "s")
    return _one_node(helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest",
                                      coordinate_transformation_mode="asymmetric",
                                      nearest_mode="floor"),
                     [1, 4, 4, 4], [1, 4, 4 * factor, 4 * factor], (scales,))


def _tconv(stride: int) -> onnx.ModelProto:
    return _one_node(helper.make_node("ConvTranspose", ["x", "w"], ["y"],
                                      strides=[stride, stride]),
                     [1, 4, 8, 8], [1, 4, 8 * stride, 8 * stride],
                     (_w("w", (4, 4, stride, stride)),))


BOUNDARIES = {
    "resize_factor": (_resize(8), _resize(3), "2x / 4x / 8x"),
    "transpose_conv_stride": (_tconv(2), _tconv(3), "transposed convolution stride"),
    "depthwise_stride": (_dw(3), _dw(4), "depthwise stride"),
    "same_avgpool_kernel": (_avg(8), _avg(9), "SAME padding exceeds"),
    "mean_axis": (_mean(4096), _mean(4097), "reduced axis"),
    "mean_axis_rank3": (_pool1d("GlobalAveragePool", 4096),
                        _pool1d("GlobalAveragePool", 4097), "reduced axis"),
    "fc_weight_sum": (_fc(65536), _fc(65537), "sum of absolute int8 weights"),
    "conv_stride_gt3_same": (_conv_s4("VALID"), _conv_s4("SAME_UPPER"), "needs dilation 1 and"),
    "softmax_hw": (_softmax(256, 256), _softmax(256, 257), "H*W"),
}


@pytest.mark.parametrize("case", sorted(BOUNDARIES))
def test_vela_constraints_match_what_vela_does(case: str) -> None:
    """Each restated constraint, both sides: accepted -> NPU; refused -> Vela's Passthrough."""
    ok_model, bad_model, fragment = BOUNDARIES[case]
    caps = VelaCapabilities()
    g_ok, g_bad = load_graph(ok_model), load_graph(bad_model)
    assert convertible(g_ok.nodes[0], g_ok) is None and convertible(g_bad.nodes[0], g_bad) is None
    assert caps.why_not(g_ok.nodes[0], g_ok) is None
    why = caps.why_not(g_bad.nodes[0], g_bad)
    assert why is not None and fragment in why, why
    assert vela_why_not(g_bad.nodes[0], g_bad) == why
    ok, bad = _estimate(g_ok), _estimate(g_bad)
    assert ok["cpu_ops"] == 0 and ok["npu_ops"] >= 1, ok["ops"]
    assert bad["cpu_ops"] >= 1, bad["ops"]
    assert any(op["target"] == "cpu" for op in bad["ops"])


def test_rank3_global_max_pool_lands_on_the_npu() -> None:
    """REDUCE_MAX has no shape rule in Vela: a 1-D global max pool of any length is taken (the
    capability check refused every rank-3 global pool until a whole-model compile of magika
    put its GlobalMaxPool on the NPU)."""
    for length in (64, 4097):
        g = load_graph(_pool1d("GlobalMaxPool", length))
        assert VelaCapabilities().why_not(g.nodes[0], g) is None
        est = _estimate(g)
        assert est["cpu_ops"] == 0 and [o["target"] for o in est["ops"]] == ["npu"], est["ops"]


# --- estimates -------------------------------------------------------------------------------


def test_per_op_cycles_sum_to_total_and_name_onnx_nodes(mnist: DataflowGraph) -> None:
    blocks = []
    for name, kw, prefix in (
            ("resnet18", {"image_size": 32, "num_classes": 10}, "layer2.0/"),
            ("mobilenet_v2", {"image_size": 32, "width_mult": 0.5, "num_classes": 10},
             "features.3/")):
        g = load_graph(zoo.build(name, **kw))
        sg = SubGraph.of(g, [n.index for n in g.nodes if n.name.startswith(prefix)])
        blocks.append(load_graph(sg.extract()))
    for model in (mnist, *blocks):
        est = _estimate(model)
        assert sum(op["cycles"] for op in est["ops"]) == est["total_cycles"] > 0
        assert sum(est["node_cycles"].values()) == est["total_cycles"]
        assert est["seconds"] == pytest.approx(est["total_cycles"] / 500e6)
        assert est["npu_s"] == est["seconds"] and est["host_s"] == 0 and not est["analytic"]
        names = {n.name for n in model.nodes}
        assert set(est["node_cycles"]) == names
        assert {nm for op in est["ops"] for nm in op["nodes"]} == names
        assert all(op["index"] >= 0 for op in est["ops"])  # every Vela row found its operator
        heavy = [op for op in est["ops"] if op["op"] in ("CONV_2D", "FULLY_CONNECTED")]
        assert heavy and all(op["cycles"] > 0 and op["macs"] > 0 for op in heavy)


def test_more_macs_per_cycle_fewer_cycles(mnist: DataflowGraph) -> None:
    cycles = {a: _estimate(mnist, BUILTIN_TARGETS[a])["npu_cycles"] for a in ETHOS_U_CONFIGS}
    assert cycles["ethos-u55-32"] > cycles["ethos-u55-64"] > cycles["ethos-u55-128"] \
        > cycles["ethos-u55-256"]
    assert cycles["ethos-u65-256"] > cycles["ethos-u65-512"]
    secs = {a: _estimate(mnist, BUILTIN_TARGETS[a])["seconds"] for a in
            ("ethos-u55-128", "ethos-u55-256")}
    assert secs["ethos-u55-128"] > secs["ethos-u55-256"]


def test_configurations_and_defaults() -> None:
    c55 = vela_config(U55_128)
    assert (c55.system_config, c55.memory_mode, c55.clock_hz, c55.macs, c55.cores) == (
        "Ethos_U55_High_End_Embedded", "Shared_Sram", 500e6, 128, 1)
    assert c55.regor_accelerator == "EthosU55"
    c65 = vela_config(BUILTIN_TARGETS["ethos-u65-512"])
    assert (c65.system_config, c65.memory_mode, c65.clock_hz, c65.macs, c65.cores) == (
        "Ethos_U65_Client_Server", "Dedicated_Sram_384KB", 1e9, 256, 2)
    deep = Target.make("deep", "vela", VirtualDevice("ethos-u"),
                       {"accelerator_config": "ethos-u55-128",
                        "system_config": "Ethos_U55_Deep_Embedded", "memory_mode": "Shared_Sram"})
    cd = vela_config(deep)
    assert cd.system_config == "Ethos_U55_Deep_Embedded" and cd.clock_hz != c55.clock_hz
    # the built-in system files name exactly what the defaults give, at the clock they state
    from collage_farm.config import load_config

    for name in ("ethos-u55-128", "ethos-u55-256", "ethos-u65-256", "ethos-u85-256"):
        conf = load_config(builtin_system=name)
        cfg = vela_config(conf.targets[name])
        assert cfg == vela_config(BUILTIN_TARGETS[name])
        assert conf.devices["npu"].clock_hz == cfg.clock_hz


def test_host_model_costs_what_vela_leaves_on_the_cpu() -> None:
    m = _avg(9)  # SAME average pool 9x9: Vela leaves it on the CPU
    g = load_graph(m)
    conv = convert(g, "int8", calibrate(g))
    est = vela_estimate(conv.tflite, vela_config(U55_128), conv)
    (op,) = est["ops"]
    assert op["target"] == "cpu" and op["cycles"] == 0 and op["cost_source"] == "analytic"
    info = conv.ops[0]
    cost = HOST_MODEL.op_cost(info.op, "int8", info.macs, info.bytes, info.out_bytes)
    assert op["host_s"] == pytest.approx(HOST_MODEL.seconds(cost.cycles))
    assert op["host_kernel"] == "cmsis-nn"  # AVERAGE_POOL_2D has a CMSIS-NN kernel
    assert est["host_s"] == pytest.approx(op["host_s"]) and est["host_s"] > 0
    assert est["seconds"] == pytest.approx(est["npu_s"] + est["host_s"])
    assert est["analytic"]["ops"] == [0] and "Cortex-M55" in est["analytic"]["host"]
    assert "Passthrough" in op["vela_ops"] and "kernel width" in est["vela_log"]


# --- the toolchain: rows, not exceptions ----------------------------------------------------


def test_build_and_measure_is_one_simulated_sample(tc: VelaToolchain,
                                                   mnist: DataflowGraph) -> None:
    inp = BuildInput("f1", U55_128, mnist.model.SerializeToString(), _ranges(mnist), "mnist")
    b = tc.build(inp)
    assert b.status is Status.OK, b.error
    assert b.artifact_kind == "tflite" and b.artifact[4:8] == b"TFL3"
    est = b.detail("vela")
    assert est["ranges"] == "whole model"
    r = tc.measure(MeasureInput(b, MeasureConfig(rounds=7, min_round_runs=9)))
    assert r.status is Status.OK and r.kind is Kind.SIMULATED
    assert r.samples == (est["seconds"],) and r.summary.n == 1 and r.seconds == est["seconds"]
    d = dict(r.details)
    assert d["total_cycles"] == est["total_cycles"] and "simulated" in d["estimate"]
    assert r.toolchain_version.startswith("ethos-u-vela 5.")
    assert "tflite_convert" in r.toolchain_version
    dev = r.device
    assert dev.kind == "ethos-u" and dev.name == "ethos-u55-128"
    assert "Ethos_U55_High_End_Embedded" in dev.config and "500 MHz" in dev.config
    # deterministic: a second build gives the same estimate
    assert tc.build(inp).detail("vela")["total_cycles"] == est["total_cycles"]
    # without ranges the sub-model is calibrated on its own, and the details say so
    nb = tc.build(BuildInput("f2", U55_128, mnist.model.SerializeToString()))
    assert nb.status is Status.OK and "calibrated on the sub-model" in nb.detail("vela")["ranges"]
    # the artifact alone is enough to re-measure (no cached estimate)
    bare = BuildResult(b.fingerprint, b.target, Status.OK, artifact=b.artifact,
                       artifact_kind="tflite")
    assert tc.measure(MeasureInput(bare, CFG)).seconds == pytest.approx(est["npu_s"])


def test_unsupported_and_failed_builds_are_rows(tc: VelaToolchain) -> None:
    erf = _one_node(helper.make_node("Erf", ["x"], ["y"], name="erf"), [1, 4], [1, 4])
    cases = {
        "not converted": (erf, U55_128, Status.UNSUPPORTED, "no TFLite mapping for Erf"),
        "vela refuses": (_dw(4), U55_128, Status.UNSUPPORTED, "depthwise stride"),
        "bad memory mode": (
            _dw(3), Target.make("bad", "vela", VirtualDevice("ethos-u"),
                                {"accelerator_config": "ethos-u55-128",
                                 "memory_mode": "Dedicated_Sram"}),
            Status.BUILD_FAILED, "arena_mem_area"),
    }
    for what, (model, target, status, fragment) in cases.items():
        g = load_graph(model)
        b = tc.build(BuildInput("x", target, model.SerializeToString(), _ranges(g)))
        assert b.status is status and fragment in b.error, (what, b)
        r = tc.measure(MeasureInput(b, CFG))
        assert r.status is status and not r.samples and math.isinf(r.seconds), what
    garbage = tc.build(BuildInput("y", U55_128, b"\x08\x01garbage"))
    assert garbage.status is Status.BUILD_FAILED and "cannot load" in garbage.error


@pytest.fixture(scope="module")
def runner() -> Iterator[object]:
    from runners.local import LocalRunner

    r = LocalRunner(["vela"], device_kind="ethos-u", build_timeout_s=120)
    yield r
    r.close()


def test_malformed_tflite_crashes_the_worker_not_the_runner(runner: object,
                                                            mnist: DataflowGraph) -> None:
    """Vela segfaults on a malformed flatbuffer: that is a crashed row, and service goes on."""
    assert runner.resources() == {"ethosu_sim": 1}
    good = runner.build(BuildInput("good", U55_128, mnist.model.SerializeToString(),
                                   _ranges(mnist)))
    assert good.status is Status.OK, good.error
    broken = bytearray(good.artifact)
    for i in range(40, len(broken), 7):
        broken[i] ^= 0xFF
    bad = BuildResult("bad", U55_128, Status.OK, artifact=bytes(broken), artifact_kind="tflite")
    res = runner.measure(MeasureInput(bad, CFG))
    assert res.status in (Status.CRASHED, Status.RUNTIME_ERROR), res
    assert res.error and not res.samples
    if res.status is Status.CRASHED:
        assert runner.stats()["crashes"] >= 1
    # the runner keeps serving: the good candidate still measures, in a (new) worker
    again = runner.measure(MeasureInput(good, CFG))
    assert again.status is Status.OK and again.kind is Kind.SIMULATED
    assert again.seconds == pytest.approx(good.detail("vela")["seconds"])
    assert runner.device_description(U55_128).name == "ethos-u55-128"
