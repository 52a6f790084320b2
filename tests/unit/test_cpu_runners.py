"""ORT-CPU and OpenVINO specifics: same outputs, IOBinding floor, capability tables, reuse."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm.core.graph import load_graph, random_inputs
from collage_farm.core.target import CPU0, Target
from runners.base import BuildInput, MeasureConfig, MeasureInput, Status
from runners.cpu import (
    OPENVINO_OPS,
    ORT_CPU_KERNELS,
    ORT_CPU_KERNELS_RAW,
    OpenVinoToolchain,
    OrtCpuToolchain,
    classify_build_error,
    ort_cpu_kernel_table,
    probe_openvino_ops,
)
from runners.local import LocalRunner

ORT = OrtCpuToolchain()
OV = OpenVinoToolchain()
ORT_T = Target.make("ort-cpu", "ort-cpu", CPU0)
OV_T = Target.make("openvino-cpu", "openvino", CPU0)
FAST = MeasureConfig(warmup_runs=5, rounds=5, min_round_runs=50, min_round_s=0.005)


def _model(nodes: list, inputs: list, outputs: list, inits: list = (), opset: int = 17,
           extra_opsets: tuple = ()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset),
                                            *[helper.make_opsetid(d, v) for d, v in
                                              extra_opsets]])
    m.ir_version = 10
    return m


def classifier() -> onnx.ModelProto:
    """conv -> relu -> global pool -> flatten -> gemm -> softmax, plus a second output."""
    rng = np.random.default_rng(1)

    def init(name: str, shape: tuple, scale: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)

    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("GlobalAveragePool", ["p1"], ["g1"]),
        helper.make_node("Flatten", ["g1"], ["f1"]),
        helper.make_node("Gemm", ["f1", "w2", "b2"], ["logits"], transB=1),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [2, 10]),
         helper.make_tensor_value_info("p1", TensorProto.FLOAT, [2, 16, 8, 8])],
        [init("w1", (16, 3, 3, 3)), init("b1", (16,), 0.1), init("w2", (10, 16)),
         init("b2", (10,), 0.1)],
    )


def relu_tiny() -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])],
                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])


def test_ort_and_openvino_agree_on_outputs() -> None:
    m = classifier()
    data = m.SerializeToString()
    feeds = random_inputs(m, seed=3)
    b_ort = ORT.build(BuildInput("cafe0001", ORT_T, data))
    b_ov = OV.build(BuildInput("cafe0002", OV_T, data))
    assert b_ort.ok and b_ov.ok, (b_ort.error, b_ov.error)
    out_ort = ORT.run_outputs(b_ort, feeds)
    out_ov = OV.run_outputs(b_ov, feeds)
    assert set(out_ort) == set(out_ov) == {"probs", "p1"}
    for k in out_ort:
        assert out_ort[k].shape == out_ov[k].shape
        np.testing.assert_allclose(out_ort[k], out_ov[k], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out_ort["probs"].sum(axis=-1), 1.0, rtol=1e-5)


def test_run_outputs_through_the_runner_matches_in_process() -> None:
    m = classifier()
    feeds = random_inputs(m, seed=4)
    with LocalRunner(["ort-cpu", "openvino"]) as r:
        for tc, t in ((ORT, ORT_T), (OV, OV_T)):
            b = r.build(BuildInput("cafe0003", t, m.SerializeToString()))
            assert b.ok, b.error
            remote = r.invoke(t.toolchain, "run_outputs", b, feeds)
            local = tc.run_outputs(b, feeds)
            for k in local:
                np.testing.assert_allclose(remote[k], local[k], rtol=1e-6)


def test_iobinding_floor_is_below_plain_run() -> None:
    data = relu_tiny().SerializeToString()
    plain_t = Target.make("ort-plain", "ort-cpu", CPU0, {"iobinding": False})
    b_io = ORT.build(BuildInput("f1004001", ORT_T, data))
    b_plain = ORT.build(BuildInput("f1004002", plain_t, data))
    m_io = ORT.measure(MeasureInput(b_io, FAST))
    m_plain = ORT.measure(MeasureInput(b_plain, FAST))
    assert m_io.ok and m_plain.ok
    assert dict(m_io.details)["iobinding"] is True
    assert dict(m_plain.details)["iobinding"] is False
    assert m_io.seconds < m_plain.seconds, (m_io.seconds, m_plain.seconds)
    m_ov = OV.measure(MeasureInput(OV.build(BuildInput("f1004003", OV_T, data)), FAST))
    assert m_ov.ok and m_ov.seconds < 1e-3  # pre-bound infer(): microseconds, not 100s of us


def test_build_then_measure_compiles_once_and_threads_recompile() -> None:
    data = classifier().SerializeToString()
    b = ORT.build(BuildInput("5e550001", ORT_T, data))
    m = ORT.measure(MeasureInput(b, FAST))
    assert dict(m.details)["handle_reused"] is True
    m2 = ORT.measure(MeasureInput(b, MeasureConfig(warmup_runs=1, rounds=2, min_round_runs=2,
                                                   min_round_s=0.0, threads=2)))
    assert m2.ok and dict(m2.details)["handle_reused"] is False


def test_cache_flush_mode_measures_slower_or_equal() -> None:
    data = classifier().SerializeToString()
    b = ORT.build(BuildInput("f1a50001", ORT_T, data))
    cfg = MeasureConfig(warmup_runs=1, rounds=3, min_round_runs=5, min_round_s=0.0,
                        mode="cache_flush")
    m = ORT.measure(MeasureInput(b, cfg))
    assert m.ok and m.config.mode == "cache_flush" and m.summary.n == 15


def _conv(elem: int, dtype: type) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.ones((2, 1, 1, 1), dtype), "w")
    return _model([helper.make_node("Conv", ["x", "w"], ["y"])],
                  [helper.make_tensor_value_info("x", elem, [1, 1, 4, 4])],
                  [helper.make_tensor_value_info("y", elem, [1, 2, 4, 4])], [w])


def test_unsupported_dtype_is_classified_unsupported() -> None:
    # ORT's CPU EP has no float64 Conv kernel: the table says so and the build agrees;
    # OpenVINO runs it (in f32)
    m = _conv(TensorProto.DOUBLE, np.float64)
    g = load_graph(m)
    assert "double" in ORT.capabilities().why_not(g.nodes[0], g)
    b = ORT.build(BuildInput("f6400001", ORT_T, m.SerializeToString()))
    assert b.status is Status.UNSUPPORTED, b.error
    assert OV.capabilities().why_not(g.nodes[0], g) is None
    assert OV.build(BuildInput("f6400002", OV_T, m.SerializeToString())).ok


def test_float16_runs_on_ort_cpu_behind_inserted_casts() -> None:
    m = _conv(TensorProto.FLOAT16, np.float16)
    g = load_graph(m)
    assert ORT.capabilities().why_not(g.nodes[0], g) is None
    assert ORT.build(BuildInput("f1600001", ORT_T, m.SerializeToString())).ok


def test_capability_tables() -> None:
    assert ORT_CPU_KERNELS_RAW[("", "Conv")] == frozenset({"float"})
    assert ORT_CPU_KERNELS[("", "Conv")] == frozenset({"float", "float16"})
    assert ("ai.onnx.ml", "LinearClassifier") in ORT_CPU_KERNELS
    assert ("ai.onnx.ml", "LinearClassifier") not in OPENVINO_OPS
    assert ("com.microsoft", "FusedConv") in ORT_CPU_KERNELS
    assert ("", "Mish") in ORT_CPU_KERNELS  # runs through its ONNX function body
    assert ("", "Relu") in OPENVINO_OPS and ("", "Det") not in OPENVINO_OPS
    node = helper.make_node("LinearClassifier", ["x"], ["label", "score"],
                            domain="ai.onnx.ml", classlabels_ints=[0, 1],
                            coefficients=[1.0, -1.0, 0.5, 0.5], intercepts=[0.0, 0.1])
    m = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
               [helper.make_tensor_value_info("label", TensorProto.INT64, [1]),
                helper.make_tensor_value_info("score", TensorProto.FLOAT, [1, 2])],
               extra_opsets=(("ai.onnx.ml", 1),))
    g = load_graph(m)
    assert ORT.capabilities().why_not(g.nodes[0], g) is None
    assert "LinearClassifier" in OV.capabilities().why_not(g.nodes[0], g)
    assert OV.build(BuildInput("11ea0001", OV_T, m.SerializeToString())).status is (
        Status.UNSUPPORTED)
    assert ORT.build(BuildInput("11ea0002", ORT_T, m.SerializeToString())).ok


def test_embedded_ort_table_matches_installed_onnxruntime() -> None:
    import onnxruntime as ort

    if ort.__version__ != "1.31.1":
        pytest.skip(f"table generated for 1.31.1, installed {ort.__version__}")
    live = ort_cpu_kernel_table()
    assert set(live) == set(ORT_CPU_KERNELS_RAW)
    for key, types in live.items():
        assert (types or None) == ORT_CPU_KERNELS_RAW[key], key


def test_embedded_openvino_table_matches_probe_on_a_sample() -> None:
    sample = [("", "Relu"), ("", "Conv"), ("", "Det"), ("", "StringNormalizer"),
              ("ai.onnx.ml", "Normalizer"), ("ai.onnx.ml", "TreeEnsembleClassifier")]
    probed = probe_openvino_ops(sample)
    for key, ok in probed.items():
        assert (key in OPENVINO_OPS) == ok, key


def test_error_classification() -> None:
    assert classify_build_error("Fatal error: x:Foo(-1) is not a registered function/op") is (
        Status.UNSUPPORTED)
    assert classify_build_error("No conversion rule found for operations: x.Foo") is (
        Status.UNSUPPORTED)
    assert classify_build_error("Could not find an implementation for Conv(11)") is (
        Status.UNSUPPORTED)
    assert classify_build_error("Protobuf parsing failed") is Status.BUILD_FAILED


@pytest.mark.parametrize("threads", [1, 2])
def test_every_ort_session_blocks_instead_of_spinning(threads: int) -> None:
    # candidates and plan partitions (`_compile`) and the whole-model reference (`ort_session`)
    # run in sessions whose pool threads do not spin-wait after a run (runners.ort "Threads")
    from runners.ort import NO_SPINNING, ort_session, session_options

    assert NO_SPINNING == {"session.intra_op.allow_spinning": "0",
                           "session.inter_op.allow_spinning": "0"}
    data = relu_tiny().SerializeToString()
    sessions = [ORT._compile(data, ORT_T, threads),
                ort_session(data, ["CPUExecutionProvider"], threads)]
    for so in [session_options(threads), *(s.get_session_options() for s in sessions)]:
        assert so.intra_op_num_threads == threads
        for key, value in NO_SPINNING.items():
            assert so.get_session_config_entry(key) == value
