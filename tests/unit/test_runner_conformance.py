"""One conformance suite for every toolchain available on this machine.

Parametrised by `runners.registry.available_toolchains()`, so toolchains written later (Vela,
LiteRT) and GPU toolchains on a GPU machine join automatically. Each contract is checked twice:
calling the toolchain in this process, and through a `LocalRunner` (the isolated worker the farm
uses); the runners are shared per device kind for the whole module (a spawn costs ~1 s).
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm.core.graph import load_graph
from collage_farm.core.target import BUILTIN_TARGETS, Target, VirtualDevice
from runners.base import (
    BuildInput,
    BuildResult,
    Capabilities,
    Kind,
    MeasureConfig,
    MeasureInput,
    MeasureResult,
    Status,
)
from runners.local import LocalRunner
from runners.registry import available_toolchains, capabilities_for, get_toolchain

AVAILABLE = available_toolchains()
TOOLCHAINS = sorted(name for name, why in AVAILABLE.items() if why is None)
VIAS = ("direct", "runner")

CFG = MeasureConfig(warmup_runs=1, rounds=3, min_round_runs=5, min_round_s=0.002,
                    timeout_s=120.0)


def tiny_model() -> onnx.ModelProto:
    """Conv 3x3 (3->8 channels) + Relu on 1x3x16x16: every toolchain takes this."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32),
                                "conv_w")
    b = numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), "conv_b")
    nodes = [
        helper.make_node("Conv", ["x", "conv_w", "conv_b"], ["c"], name="conv",
                         pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    g = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        [w, b],
        value_info=[helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 8, 16, 16])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def custom_model() -> onnx.ModelProto:
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="frob", domain="example.custom")
    g = helper.make_graph(
        [node], "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("example.custom", 1)])
    m.ir_version = 10
    return m


def tensor_ranges(model: onnx.ModelProto) -> tuple[tuple[str, float, float], ...]:
    """Calibrated (min, max) of every tensor, for toolchains that quantise."""
    import onnxruntime as ort

    from collage_farm.core.graph import random_inputs

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    names = [o for n in probe.graph.node for o in n.output]
    have = {o.name for o in probe.graph.output}
    for t in names:
        if t not in have:
            probe.graph.output.add().name = t
    feeds = random_inputs(model, 0)
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    outs = sess.run(names, feeds)
    ranges = [(k, float(v.min()), float(v.max())) for k, v in feeds.items()]
    ranges += [(k, float(v.min()), float(v.max())) for k, v in zip(names, outs)]
    return tuple(ranges)


def target_for(name: str) -> Target:
    for t in BUILTIN_TARGETS.values():
        if t.toolchain == name:
            return t
    tc = get_toolchain(name)
    return Target.make(name, name, VirtualDevice(tc.device_kind, 0))


@pytest.fixture(scope="module")
def runners() -> Iterator[dict[str, LocalRunner]]:
    made: dict[str, LocalRunner] = {}
    yield made
    for r in made.values():
        r.close()


def _runner_for(runners: dict[str, LocalRunner], name: str) -> LocalRunner:
    kind = get_toolchain(name).device_kind
    if kind not in runners:
        served = [t for t in TOOLCHAINS if get_toolchain(t).device_kind == kind]
        runners[kind] = LocalRunner(served, device_kind=kind, build_timeout_s=120)
    return runners[kind]


class Via:
    def __init__(self, how: str, name: str, runners: dict[str, LocalRunner]) -> None:
        self.how = how
        self.tc = get_toolchain(name)
        self.runner = _runner_for(runners, name) if how == "runner" else None

    def build(self, inp: BuildInput) -> BuildResult:
        return self.runner.build(inp) if self.runner else self.tc.build(inp)

    def measure(self, inp: MeasureInput) -> MeasureResult:
        return self.runner.measure(inp) if self.runner else self.tc.measure(inp)


@pytest.fixture(scope="module")
def tiny_input_ranges() -> tuple[tuple[str, float, float], ...]:
    return tensor_ranges(tiny_model())


def test_every_known_toolchain_reports_availability() -> None:
    assert {"ort-cpu", "openvino", "ort-cuda", "ort-tensorrt", "vela", "litert",
            "null"} <= set(AVAILABLE)
    for name in ("ort-cpu", "openvino", "null"):
        assert AVAILABLE[name] is None, AVAILABLE[name]
    for name, why in AVAILABLE.items():
        assert why is None or (isinstance(why, str) and why), name


@pytest.mark.parametrize("name", TOOLCHAINS)
def test_identity_and_capabilities(name: str) -> None:
    tc = get_toolchain(name)
    assert tc.name == name
    assert tc.version().strip()
    caps = capabilities_for(name)
    assert isinstance(caps, Capabilities)
    assert caps.style in ("graph", "library", "fuseops")
    g = load_graph(tiny_model())
    for node in g.nodes:  # the tiny model is the common denominator
        assert caps.why_not(node, g) is None, (name, node)
    desc = tc.device_description(target_for(name))
    assert desc.kind == tc.device_kind and desc.name.strip() and desc.describe()


@pytest.mark.parametrize("via", VIAS)
@pytest.mark.parametrize("name", TOOLCHAINS)
def test_build_and_measure_tiny_model(name: str, via: str, runners: dict[str, LocalRunner],
                                      tiny_input_ranges: tuple) -> None:
    v = Via(via, name, runners)
    target = target_for(name)
    inp = BuildInput("c0ffee0123456789", target, tiny_model().SerializeToString(),
                     tensor_ranges=tiny_input_ranges, label="tiny:conv..relu")
    build = v.build(inp)
    assert build.status is Status.OK, build.error
    assert build.fingerprint == inp.fingerprint and build.target == target
    assert build.artifact and build.artifact_kind
    assert build.build_s >= 0
    res = v.measure(MeasureInput(build, CFG))
    assert res.status is Status.OK, res.error
    assert res.config == CFG
    assert res.fingerprint == inp.fingerprint and res.target == target
    assert res.summary is not None
    if res.kind is Kind.MEASURED:
        assert res.summary.n >= CFG.rounds * CFG.min_round_runs
    else:
        assert res.summary.n >= 1
    assert res.summary.n == len(res.samples)
    assert 0 < res.seconds < 1 and math.isfinite(res.seconds)
    assert res.device is not None and res.device.name.strip()
    assert res.toolchain_version.strip()
    for r in (build, res):
        assert pickle.loads(pickle.dumps(r)) == r


@pytest.mark.parametrize("via", VIAS)
@pytest.mark.parametrize("name", TOOLCHAINS)
def test_unsupported_model_is_a_result_not_an_exception(name: str, via: str,
                                                        runners: dict[str, LocalRunner]) -> None:
    v = Via(via, name, runners)
    model = custom_model()
    g = load_graph(model)
    claims = capabilities_for(name).why_not(g.nodes[0], g)
    inp = BuildInput("badc0de0badc0de0", target_for(name), model.SerializeToString(),
                     tensor_ranges=(("x", -1.0, 1.0), ("y", -1.0, 1.0)), label="custom")
    build = v.build(inp)
    assert isinstance(build, BuildResult)
    assert pickle.loads(pickle.dumps(build)) == build
    if claims is not None:  # the toolchain says it cannot: the build must agree
        assert build.status in (Status.UNSUPPORTED, Status.BUILD_FAILED), build
        assert build.error.strip()
    res = v.measure(MeasureInput(build, CFG))
    assert isinstance(res, MeasureResult)
    assert pickle.loads(pickle.dumps(res)) == res
    if not build.ok:
        assert res.status is build.status and not res.samples and res.error
        assert res.seconds == math.inf


@pytest.mark.parametrize("name", TOOLCHAINS)
def test_garbage_bytes_fail_cleanly(name: str) -> None:
    tc = get_toolchain(name)
    build = tc.build(BuildInput("0000aaaa", target_for(name), b"\x08\x01garbage"))
    assert build.status in (Status.BUILD_FAILED, Status.UNSUPPORTED), build
    assert build.error


def test_runner_rejects_toolchains_it_does_not_serve(runners: dict[str, LocalRunner]) -> None:
    r = _runner_for(runners, "null")
    t = Target.make("x", "ort-tensorrt", VirtualDevice("cuda"))
    b = r.build(BuildInput("f00d", t, tiny_model().SerializeToString()))
    assert b.status is Status.UNSUPPORTED and "not served" in b.error
    assert r.resources() == {"CPU": 1}
    assert LocalRunner(["null"], cores=[0], start=False).resources() == {
        "CPU": 1, "cpu_slot_0": 1}
    assert LocalRunner(["ort-cuda"], device_kind="cuda", start=False).resources() == {"GPU": 1}
    with pytest.raises(ValueError):
        LocalRunner(["ort-cpu"], device_kind="cuda", start=False)
