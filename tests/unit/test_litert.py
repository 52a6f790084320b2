"""LiteRT + XNNPACK (``litert-cpu``): build, measure, numerics against ORT, plans that mix it.

The toolchain converts ONNX to fp32 TFLite with NHWC activations, so the things that can go
wrong are layout at the boundary (rank-4 inputs and outputs, several of them), delegation
(XNNPACK must really run the model), unsupported nodes (a row, not an exception) and the
hand-over between LiteRT and another toolchain inside a plan. Models are zoo blocks at small
image sizes so the file stays within its time budget.
"""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm import zoo
from collage_farm.core.graph import load_graph, random_inputs
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import BUILTIN_TARGETS
from runners.base import BuildInput, Kind, MeasureConfig, MeasureInput, Status
from runners.registry import available_toolchains, capabilities_for, get_toolchain

WHY = available_toolchains().get("litert")
pytestmark = pytest.mark.skipif(WHY is not None, reason=f"litert unavailable: {WHY}")

LT_T = BUILTIN_TARGETS["litert-cpu"]
ORT_T = BUILTIN_TARGETS["ort-cpu"]
CFG = MeasureConfig(warmup_runs=2, rounds=3, min_round_runs=5, min_round_s=0.002)
RTOL, ATOL = 1e-4, 1e-4  # fp32: XNNPACK and ORT sum in different orders


def _block(name: str, prefix: str, **kw: object) -> onnx.ModelProto:
    """The nodes of a zoo model whose names start with ``prefix``, as a standalone model."""
    g = load_graph(zoo.build(name, **kw))
    idx = [n.index for n in g.nodes if n.name.startswith(prefix)]
    assert idx, prefix
    return SubGraph.of(g, idx).extract()


CASES = {
    "mnist": lambda: zoo.build("mnist"),
    "resnet18-layer2.0": lambda: _block("resnet18", "layer2.0/", image_size=32),
    "mobilenet_v2-features.3": lambda: _block("mobilenet_v2", "features.3/", image_size=32,
                                              width_mult=0.5),
    # int64 token ids cross the boundary, Gather / LayerNorm / attention / GELU in fp32
    "bert-tiny": lambda: zoo.build("bert", layers=1, seq_len=8, width=32, heads=2, vocab=64),
}


def _ort_outputs(model: onnx.ModelProto, feeds: dict) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


@pytest.fixture(scope="module")
def tc():
    return get_toolchain("litert")


@pytest.mark.parametrize("case", sorted(CASES))
def test_build_measure_and_numerics_match_onnxruntime(tc, case: str) -> None:
    model = CASES[case]()
    g = load_graph(model)
    caps = capabilities_for("litert")
    assert all(caps.why_not(n, g) is None for n in g.nodes), case
    fp = "1234abcd5678ef90"
    build = tc.build(BuildInput(fp, LT_T, model.SerializeToString(), label=case))
    assert build.status is Status.OK, build.error
    assert build.artifact_kind == "tflite" and build.artifact[4:8] == b"TFL3"
    details = dict(build.details)
    # XNNPACK really takes the model: at least one delegate partition
    assert details["xnnpack_partitions"] >= 1, details

    res = tc.measure(MeasureInput(build, CFG))
    assert res.status is Status.OK, res.error
    assert res.kind is Kind.MEASURED and res.config == CFG
    assert res.summary is not None and res.summary.n >= CFG.rounds * CFG.min_round_runs
    assert 0 < res.seconds < 1
    rd = dict(res.details)
    # the plan pays the layout crossing every run: it is in every sample, so in the cost
    assert rd["boundary_in_cost"] is True and rd["layout_boundary_s"] > 0
    assert min(res.samples) >= rd["layout_boundary_s"]
    assert rd["threads"] == 1

    # the measured inputs are the ones ORT/OpenVINO get for this fingerprint
    handle, reused = tc.handle_for(fp, build.artifact, LT_T, 1)
    assert reused
    want = random_inputs(model, int(fp[:8], 16))
    got = tc.feeds(handle, int(fp[:8], 16))
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)

    feeds = random_inputs(model, 7)
    ref = _ort_outputs(model, feeds)
    out = tc.run_outputs(build, feeds)
    assert set(out) == set(ref)
    for k, r in ref.items():
        assert out[k].shape == r.shape and out[k].dtype == np.float32
        np.testing.assert_allclose(out[k], r, rtol=RTOL, atol=ATOL, err_msg=f"{case}:{k}")


def _two_in_two_out() -> onnx.ModelProto:
    """Two rank-4 inputs (Add), two outputs of different rank: layout at every boundary."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array((rng.standard_normal((6, 4, 3, 3)) * 0.3).astype(np.float32),
                                "w")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"], name="add"),
        helper.make_node("Conv", ["s", "w"], ["c"], name="conv", pads=[1, 1, 1, 1],
                         strides=[2, 2]),
        helper.make_node("Relu", ["c"], ["y4"], name="relu"),
        helper.make_node("Reshape", ["y4", "shape"], ["y2"], name="flat"),
    ]
    vi = helper.make_tensor_value_info
    g = helper.make_graph(
        nodes, "two",
        [vi("a", TensorProto.FLOAT, [1, 4, 10, 7]), vi("b", TensorProto.FLOAT, [1, 4, 10, 7])],
        [vi("y4", TensorProto.FLOAT, [1, 6, 5, 4]), vi("y2", TensorProto.FLOAT, [1, 120])],
        [w, shape])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def test_several_inputs_and_outputs_cross_the_layout_boundary(tc) -> None:
    model = _two_in_two_out()
    build = tc.build(BuildInput("feedf00d", LT_T, model.SerializeToString()))
    assert build.ok, build.error
    feeds = random_inputs(model, 1)
    out = tc.run_outputs(build, feeds)
    ref = _ort_outputs(model, feeds)
    for k in ("y4", "y2"):
        np.testing.assert_allclose(out[k], ref[k], rtol=RTOL, atol=ATOL, err_msg=k)


def _one_node(op: str, **attrs: object) -> onnx.ModelProto:
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node(op, ["x"], ["y"], name=f"the_{op.lower()}",
                                            **attrs)],
                          "one", [vi("x", TensorProto.FLOAT, [1, 8])],
                          [vi("y", TensorProto.FLOAT, [1, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def _grouped_conv() -> onnx.ModelProto:
    """group=2 over 4 channels: neither dense nor depthwise; the converter refuses it."""
    w = numpy_helper.from_array(np.ones((4, 2, 1, 1), np.float32), "w")
    vi = helper.make_tensor_value_info
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"], name="gconv", group=2)],
                          "g", [vi("x", TensorProto.FLOAT, [1, 4, 5, 5])],
                          [vi("y", TensorProto.FLOAT, [1, 4, 5, 5])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("make", [lambda: _one_node("Log"), _grouped_conv],
                         ids=["no-mapping", "bad-attributes"])
def test_unsupported_node_is_an_unsupported_row(tc, make) -> None:
    model = make()
    g = load_graph(model)
    why = capabilities_for("litert").why_not(g.nodes[0], g)
    assert why is not None and why.startswith("litert: ")
    build = tc.build(BuildInput("0badc0de", LT_T, model.SerializeToString()))
    assert build.status is Status.UNSUPPORTED
    assert g.nodes[0].name in build.error  # the converter names the node it refused
    res = tc.measure(MeasureInput(build, CFG))
    assert res.status is Status.UNSUPPORTED and not res.samples and res.error
    assert res.seconds == math.inf


def test_capabilities_agree_with_the_converter_on_the_zoo() -> None:
    """litert asks for fp32: a whole transformer converts; Ethos-U (int8) still refuses it."""
    caps = capabilities_for("litert")
    g = load_graph(zoo.build("gpt2", layers=1, seq_len=8, width=32, heads=2, vocab=64))
    refused = {n.op_type for n in g.nodes if caps.why_not(n, g) is not None}
    assert not refused, refused
    from runners.tflite import convert, convertible

    assert convert(g, mode="fp32").mode == "fp32"
    int8_refused = {n.op_type for n in g.nodes if convertible(n, g) is not None}
    assert {"Gather", "LayerNormalization", "Transpose", "Split", "Erf"} <= int8_refused

    g2 = load_graph(zoo.build("mobilenet_v2", image_size=32, width_mult=0.35))
    assert all(caps.why_not(n, g2) is None for n in g2.nodes)
    assert convert(g2, mode="fp32").mode == "fp32"


def test_interpreters_are_cached_per_artifact(tc) -> None:
    """The executor alternates partitions; each keeps its interpreter (no rebuild per run)."""
    a = tc.build(BuildInput("aaaa0001", LT_T, _two_in_two_out().SerializeToString()))
    b = tc.build(BuildInput("bbbb0002", LT_T, zoo.build("mnist").SerializeToString()))
    assert a.ok and b.ok
    ha, _ = tc.handle_for(a.fingerprint, a.artifact, LT_T, 1)
    hb, _ = tc.handle_for(b.fingerprint, b.artifact, LT_T, 1)
    for _ in range(3):
        assert tc.handle_for(a.fingerprint, a.artifact, LT_T, 1) == (ha, True)
        assert tc.handle_for(b.fingerprint, b.artifact, LT_T, 1) == (hb, True)


def test_a_timer_keys_only_artifacts_it_has_seen(tc, monkeypatch) -> None:
    """A timer of a build this process made reuses its cached interpreter; a timer of bytes
    never keyed here (a profile's prefix, written just now) makes its own interpreter and
    hashes nothing."""
    import dataclasses

    from runners import onnx_base

    a = tc.build(BuildInput("aaaa0003", LT_T, zoo.build("mnist").SerializeToString()))
    assert a.ok
    hashed = mock.Mock(side_effect=onnx_base.artifact_digest)
    monkeypatch.setattr(onnx_base, "artifact_digest", hashed)
    made = mock.Mock(side_effect=type(tc)._make)
    monkeypatch.setattr(type(tc), "_make", lambda self, d, n: made(self, d, n))
    cfg = MeasureConfig(rounds=1, min_round_runs=2, warmup_runs=1)
    assert len(tc.timer(a, cfg)(cfg)) >= 1
    assert hashed.call_count == 0 and made.call_count == 0  # the build's own interpreter
    fresh = dataclasses.replace(a, artifact=bytes(bytearray(a.artifact)))
    assert len(tc.timer(fresh, cfg)(cfg)) >= 1
    assert hashed.call_count == 0 and made.call_count == 1  # its own, not keyed


def test_plan_partitions_hold_their_interpreters_past_the_cache_bound(tc, monkeypatch) -> None:
    """A plan's LiteRT partitions never remake an interpreter inside a run, however small the
    handle cache's byte bound: each holds its own (`LiteRTToolchain.runner_for`). With the
    bound evicting (as 2 x 164 MB gpt2-2L chunks did), runs used to make them again."""
    from collage_farm.execute.builder import Part, PlanBuilder
    from collage_farm.probes.cutcost import chunk_masks
    from runners import litert

    made: list[int] = []
    make = litert.LiteRTToolchain._make

    def counted(self, data: bytes, threads: int):  # type: ignore[no-untyped-def]
        made.append(len(data))
        return make(self, data, threads)

    monkeypatch.setattr(litert, "MAX_HANDLE_BYTES", 1)  # every new interpreter evicts the rest
    monkeypatch.setattr(litert.LiteRTToolchain, "_make", counted)
    model = zoo.build("mnist")
    g = load_graph(model)
    ex = PlanBuilder(g).executor([Part(m, LT_T) for m in chunk_masks(g, 2)])
    feeds = random_inputs(model, seed=3)
    want = _ort_outputs(model, feeds)
    for _ in range(4):
        got = ex.run(feeds)
    assert len(made) == 2, made  # one interpreter per partition, made when the plan was built
    for name, ref in want.items():
        np.testing.assert_allclose(got[name], ref, rtol=RTOL, atol=ATOL)
    step = ex.timed_callable(feeds)
    step()
    step()
    assert len(made) == 2, made


def test_delegation_parsing() -> None:
    from runners.litert import _delegation

    ops = [  # t0 -A-> t1 -B-> t2 -C-> t3 ; a delegate took A and C, not B
        {"op_name": "CONV_2D", "inputs": [0, 10], "outputs": [1]},
        {"op_name": "PADV2", "inputs": [1, 11, 12], "outputs": [2]},
        {"op_name": "ADD", "inputs": [2, 13], "outputs": [3]},
        {"op_name": "DELEGATE", "inputs": [0, 10], "outputs": [1]},
        {"op_name": "DELEGATE", "inputs": [2, 13], "outputs": [3]},
    ]
    assert _delegation(ops) == (2, ("PADV2",))
    assert _delegation(ops[:3]) == (0, ("CONV_2D", "PADV2", "ADD"))


def test_executor_runs_a_mixed_ort_litert_plan(tmp_path) -> None:
    """A plan with LiteRT and ORT partitions (pinned so both appear) runs and matches."""
    from collage_farm.campaign import TuneOptions, run_tune
    from collage_farm.core.pins import Pin, PinSet
    from collage_farm.core.target import parse_targets
    from collage_farm.execute import PlanExecutor
    from estimators.mock import MockEstimator

    pins = PinSet((Pin(node="features.2/*", target="ort-cpu"),
                   Pin(node="features.3/*", target="litert-cpu"),
                   Pin(op="Gemm", target="ort-cpu")))
    model_path = tmp_path / "mobilenet_v2-32.onnx"  # the zoo's default is 224x224
    onnx.save(zoo.build("mobilenet_v2", image_size=32, width_mult=0.5), str(model_path))
    opts = TuneOptions(model=str(model_path), targets=tuple(parse_targets(
        "ort-cpu,litert-cpu")), out=tmp_path / "plan", estimator="mock", pins=pins)
    summary = run_tune(opts, MockEstimator())
    per = summary["partitions_per_target"]
    assert per.get("litert-cpu", 0) >= 1 and per.get("ort-cpu", 0) >= 1, per
    ex = PlanExecutor(tmp_path / "plan")  # the reference model: plan.json's source
    assert {rt.toolchain for rt in ex.partitions} == {"ort-cpu", "litert"}
    errors = ex.check()  # raises ExecutionMismatch outside fp32 tolerance
    assert errors and all(e < 1e-3 for e in errors.values())
    t = ex.measure(MeasureConfig(warmup_runs=1, rounds=2, min_round_runs=3, min_round_s=0.0))
    assert t.summary.n >= 6 and 0 < t.total_s < 1


@pytest.mark.parametrize("mode", ["flush", "network"])
def test_cache_modes_measure_and_leave_the_interpreter_usable(tc, mode: str) -> None:
    """``network`` touches the interpreter's own input buffers without holding views."""
    import runners.base as base

    if mode not in getattr(base, "MEASURE_MODES", ("isolated", "cache_flush")):
        pytest.skip(f"measure mode {mode!r} not in this tree")
    model = _two_in_two_out()
    build = tc.build(BuildInput("c0c0a000", LT_T, model.SerializeToString()))
    cfg = MeasureConfig(warmup_runs=1, rounds=2, min_round_runs=3, min_round_s=0.0, mode=mode,
                        flush_bytes=1 << 20)
    res = tc.measure(MeasureInput(build, cfg))
    assert res.status is Status.OK, res.error
    feeds = random_inputs(model, 2)
    np.testing.assert_allclose(tc.run_outputs(build, feeds)["y2"],
                               _ort_outputs(model, feeds)["y2"], rtol=RTOL, atol=ATOL)


def test_stderr_keeps_everything_but_the_xnnpack_note() -> None:
    """LiteRT's C++ "Created TensorFlow Lite XNNPACK delegate" line (once per process, on fd 2)
    is dropped; anything else written to fd 2 meanwhile comes through. A fresh interpreter
    process, since the line is printed once per process."""
    import subprocess
    import sys
    from pathlib import Path

    code = """
import os
from collage_farm import zoo
from runners import litert
from runners.tflite import convert
data = convert(zoo.build("mnist").SerializeToString(), mode="fp32").tflite
with litert._without_xnnpack_note():
    os.write(2, b"kept while captured\\n")
    h = litert.LiteRTToolchain()._make(data, 1)
print("delegated", h.xnnpack_partitions)
"""
    repo = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True,
                       timeout=120, env={**__import__("os").environ, "PYTHONPATH": str(repo)})
    assert r.returncode == 0, r.stderr
    assert "delegated" in r.stdout
    assert "XNNPACK" not in r.stderr, r.stderr
    assert "kept while captured" in r.stderr


def test_sliced_partitions_come_from_one_lowering_or_are_converted_alone(tc, monkeypatch) -> None:
    """A sliced executor's LiteRT partitions are cut from the whole graph's one lowering where
    it can be cut at both ends, and converted alone (a build of their own) where not; either
    way the plan gives ONNX Runtime's outputs. The whole graph's lowering is made once per
    builder."""
    from collage_farm.execute.builder import Part, PlanBuilder
    from collage_farm.probes.cutcost import chunk_masks
    from runners.tflite.prefix import Lowered

    built: list[str] = []
    build = type(tc).build

    def counted(self, inp):  # type: ignore[no-untyped-def]
        built.append(inp.label)
        return build(self, inp)
    monkeypatch.setattr(type(tc), "build", counted)
    model = zoo.build("mnist")
    g = load_graph(model)
    b = PlanBuilder(g)
    cuts = Lowered.of_whole(b.whole).cuts()
    masks = chunk_masks(g, 4)  # bounds 3, 6, 8: 6 lies inside a fusion
    bounds = [m.bit_count() for m in masks]
    assert bounds[0] in cuts and bounds[0] + bounds[1] not in cuts
    ex = b.executor([Part(m, LT_T) for m in masks], sliced=True)
    assert sorted(built) == ["p001", "p002"]  # the two chunks that touch position 6
    feeds = random_inputs(model, seed=5)
    for name, ref in _ort_outputs(model, feeds).items():
        np.testing.assert_allclose(ex.run(feeds)[name], ref, rtol=RTOL, atol=ATOL)
    b.executor([Part(g.all_mask, LT_T)], sliced=True)
    assert len(built) == 2  # the whole model is the lowering itself
    b.executor([Part(masks[0], LT_T)])
    assert built[2:] == ["p000"]  # unsliced: its own conversion, cached apart from the slice
