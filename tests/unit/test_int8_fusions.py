"""int8 folds that keep PP-OCR's backbone within `run`'s tolerance (runners.tflite.fuse).

PP-LCNetV3 blocks (PP-OCRv4's backbone) are Conv -> per-channel Mul -> per-channel Add ->
HardSwish written as ``x * Clip(x + 3, 0, 6) / 6``, and its stem is Conv -> BatchNormalization.
Converted op by op to int8, the Conv's output is rounded per tensor before the Mul scales its
channels back into line (a network trains depthwise weights large where the following factor is
small, so that tensor's range is set by one channel and the others get a few levels), the Mul's
constant is quantised per tensor too (factors 1000-fold apart share one scale), and the
HardSwish rounds ``x * relu6(x + 3)``, six times its output's range, before dividing. The
converter folds the affine chain into the Conv's per-channel weights and writes one HARD_SWISH:
these tests run the int8 model in LiteRT's reference kernels (as `collage-farm run` does)
against ONNX Runtime, with and without the folds.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm.core.graph import MAX_IR_VERSION, load_graph
from collage_farm.execute.numerics import int8_step
from runners.calibration import calibrate
from runners.tflite import PINNED_SCALES, convert, convertible, fuse, params
from runners.tflite.fuse import _FusionPlanner

C = 8
#: per-channel factors of the block's Mul, 1000-fold apart (PP-LCNetV3's learnt scales span
#: 0.01-10 in PP-OCRv4)
SCALES = np.array([0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 5.0, 10.0], np.float32)


def _block_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def init(name: str, arr: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(arr, np.float32), name)

    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1], name="stem"),
        n("BatchNormalization", ["c0", "g", "b", "m", "v"], ["bn"], name="bn"),
        n("Conv", ["bn", "w1"], ["c1"], pads=[1, 1, 1, 1], group=C, name="dw"),
        n("Mul", ["c1", "s"], ["scaled"], name="scale"),
        n("Add", ["scaled", "t"], ["shifted"], name="shift"),
        n("Add", ["shifted", "three"], ["p3"], name="hs_add"),
        n("Clip", ["p3", "zero", "six"], ["r6"], name="hs_clip"),
        n("Mul", ["shifted", "r6"], ["prod"], name="hs_mul"),
        n("Div", ["prod", "six"], ["y"], name="hs_div"),
    ]
    inits = [init("w0", rng.standard_normal((C, 3, 3, 3)) * 0.3),
             init("g", rng.uniform(0.5, 2.0, C)), init("b", rng.standard_normal(C) * 0.1),
             init("m", rng.standard_normal(C) * 0.1), init("v", rng.uniform(0.5, 2.0, C)),
             # the learnt pair: a channel's depthwise weights large where its factor is small
             init("w1", rng.standard_normal((C, 1, 3, 3)) * 0.5 / SCALES.reshape(C, 1, 1, 1)),
             init("s", SCALES.reshape(1, C, 1, 1)),
             init("t", (rng.standard_normal(C) * 0.5).reshape(1, C, 1, 1)),
             init("three", np.array(3.0)), init("zero", np.array(0.0)), init("six", np.array(6.0))]
    g = helper.make_graph(nodes, "lcnet_block",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, C, 16, 16])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = MAX_IR_VERSION
    return m


def _int8_error_steps(model: onnx.ModelProto) -> tuple[float, list[str]]:
    """Max |int8 - fp32| of ``y`` in int8 steps of its calibrated range, on calibration sample
    0, and the TFLite operators written."""
    import onnxruntime as ort
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    g = load_graph(model)
    ranges = calibrate(g)
    conv = convert(model, "int8", ranges)
    interp = Interpreter(model_content=conv.tflite,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    interp.allocate_tensors()
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    (spec_in,), (spec_out,) = conv.inputs, conv.outputs
    interp.set_tensor(spec_in.index, spec_in.to_tflite(x))
    interp.invoke()
    got = spec_out.from_tflite(interp.get_tensor(spec_out.index))
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(["y"], {"x": x})[0]
    return float(np.abs(got - ref).max()) / int8_step(*ranges["y"]), [o.op for o in conv.ops]


def test_folded_block_is_within_tolerance_and_the_unfolded_one_is_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ai_edge_litert")
    model = _block_model()
    steps, ops = _int8_error_steps(model)
    assert ops == ["CONV_2D", "DEPTHWISE_CONV_2D", "HARD_SWISH"], ops
    assert steps <= 6.0, steps  # measured 3.4
    # the same model op by op: BN as a 1x1 depthwise, MUL / ADD with per-tensor constants,
    # the HardSwish decomposed
    monkeypatch.setattr(_FusionPlanner, "_fold_affine", lambda self, conv, f, a: conv.outputs[0])
    monkeypatch.setattr(fuse, "_hardswish_chain", lambda g, n, private: None)
    steps_op_by_op, ops = _int8_error_steps(model)
    assert ops.count("MUL") == 3 and "HARD_SWISH" not in ops, ops
    assert steps_op_by_op > 12.0, steps_op_by_op  # run's tolerance; measured 93.9


def test_hardswish_pattern_needs_every_piece() -> None:
    model = _block_model()
    g = load_graph(model)
    private = _FusionPlanner(g, "int8").private
    add = next(n for n in g.nodes if n.name == "hs_add")
    x, chain = params._hardswish_chain(g, add, private)  # type: ignore[misc]
    assert x == "shifted" and [n.name for n in chain] == ["hs_clip", "hs_mul", "hs_div"]
    # Clip(0, 6) read by another node too: not a HardSwish's private intermediate
    assert params._hardswish_chain(g, add, private - {"r6"}) is None
    scale = next(n for n in g.nodes if n.name == "scale")
    assert params._hardswish_chain(g, scale, private) is None  # not x + 3


def test_int8_batchnorm_is_rank4_only() -> None:
    c = 4
    inits = [numpy_helper.from_array(np.ones(c, np.float32), k) for k in "gbmv"]
    bn = helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"])
    for shape in ([1, c, 5, 5], [2, c, 9]):
        g = helper.make_graph([bn], "bn", [helper.make_tensor_value_info(
            "x", TensorProto.FLOAT, shape)], [helper.make_tensor_value_info(
                "y", TensorProto.FLOAT, shape)], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
        m.ir_version = MAX_IR_VERSION
        graph = load_graph(m)
        why = convertible(graph.nodes[0], graph)
        assert (why is None) == (len(shape) == 4), why


def test_a_pinned_output_step_is_its_int8_scale_when_coarser() -> None:
    """A Sigmoid map calibrated over [0, 0.324] (PP-OCRv4 det on random images) is carried by
    an int8 tensor of scale 1/256: its step is that, not 0.324 / 255; a wide range keeps its
    own step."""
    assert int8_step(0.0, 0.324, PINNED_SCALES["Sigmoid"]) == 1.0 / 256.0
    assert int8_step(-10.0, 10.0, PINNED_SCALES["Tanh"]) == pytest.approx(20.0 / 255.0)
    assert int8_step(0.0, 0.324) == pytest.approx(0.324 / 255.0)


def _head_model() -> onnx.ModelProto:
    """PP-OCRv4 det's head in small: Conv -> HardSigmoid gate (SE), nearest 2x Resize,
    ConvTranspose -> bias Add -> BatchNormalization -> Relu -> ConvTranspose -> Sigmoid."""
    rng = np.random.default_rng(1)

    def init(name: str, arr: np.ndarray) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(arr, np.float32), name)

    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        n("HardSigmoid", ["c0"], ["gate"], alpha=1 / 6, beta=0.5),
        n("Mul", ["c0", "gate"], ["se"]),
        n("Resize", ["se", "", "scales"], ["up"], mode="nearest",
          coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
        n("ConvTranspose", ["up", "wt"], ["t0"], strides=[2, 2]),
        n("Add", ["t0", "tb"], ["t1"]),
        n("BatchNormalization", ["t1", "g", "b", "m", "v"], ["bn"]),
        n("Relu", ["bn"], ["r"]),
        n("ConvTranspose", ["r", "wt2"], ["t2"], strides=[2, 2]),
        n("Sigmoid", ["t2"], ["y"]),
    ]
    inits = [init("w0", rng.standard_normal((C, 3, 3, 3)) * 0.3),
             init("scales", np.array([1, 1, 2, 2])),
             init("wt", rng.standard_normal((C, C, 2, 2)) * 0.3),
             init("tb", (rng.standard_normal(C) * 0.1).reshape(1, C, 1, 1)),
             init("g", rng.uniform(0.5, 2.0, C)), init("b", rng.standard_normal(C) * 0.1),
             init("m", rng.standard_normal(C) * 0.1), init("v", rng.uniform(0.5, 2.0, C)),
             init("wt2", rng.standard_normal((C, 1, 2, 2)) * 0.3)]
    g = helper.make_graph(nodes, "db_head",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 64, 64])],
                          inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = MAX_IR_VERSION
    return m


def test_det_head_converts_to_int8_within_tolerance() -> None:
    """HardSigmoid, Resize and ConvTranspose (with its bias Add and BatchNormalization folded)
    are written in int8, so Vela keeps the head on the NPU; the int8 head stays within a few
    steps of the fp32 model."""
    pytest.importorskip("ai_edge_litert")
    steps, ops = _int8_error_steps(_head_model())
    assert ops == ["CONV_2D", "ADD", "MUL", "MUL", "RESIZE_NEAREST_NEIGHBOR", "TRANSPOSE_CONV",
                   "RELU", "TRANSPOSE_CONV", "LOGISTIC"], ops
    assert steps <= 5.0, steps  # measured 3.4 (of the calibrated range, not the 1/256 pin)
