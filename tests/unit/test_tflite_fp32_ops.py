"""fp32-only converter mappings (what LiteRT gets beyond the int8 / Ethos-U set), against ORT.

Why: each mapping re-expresses an ONNX op in TFLite terms with the activations held NHWC
(BatchNorm as MUL + ADD or folded into the Conv, HardSigmoid via RELU6, Resize's coordinate
modes, TRANSPOSE_CONV's weight layout, permutations and axes remapped for rank-4 tensors,
LayerNorm decomposed, the exact-GELU pattern as one GELU). A wrong axis or mode still runs, so
every case is a small seeded ONNX model converted in fp32, run in LiteRT and compared with ONNX
Runtime within 1e-4 (abs, scaled by the output magnitude). The real PP-OCR models (when
rapidocr_onnxruntime is installed) must convert whole and match too. int8 mode must keep
refusing these ops, so the Ethos-U capabilities do not grow.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm.core.graph import DataflowGraph, load_graph, random_inputs
from runners.tflite import UnsupportedOp, convert, convertible

Interpreter = pytest.importorskip("ai_edge_litert.interpreter").Interpreter

RNG_SEED = 3


def _model(nodes: list[onnx.NodeProto], inputs: list[tuple[str, list[int]]],
           outputs: list[str], inits: list[onnx.TensorProto] = (), opset: int = 17,
           in_type: int = TensorProto.FLOAT, out_type: int = TensorProto.FLOAT
           ) -> onnx.ModelProto:
    g = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info(n, in_type if i == 0 else TensorProto.FLOAT, s)
                     for i, (n, s) in enumerate(inputs)],
        [helper.make_tensor_value_info(o, out_type, None) for o in outputs],
        list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10 if opset >= 17 else 8
    return m


def _f(name: str, arr: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


def _rand(shape: tuple[int, ...], scale: float = 1.0, seed: int = RNG_SEED) -> np.ndarray:
    return (np.random.default_rng(seed + len(shape) * 7 + sum(shape)).standard_normal(shape)
            * scale).astype(np.float32)


def _ort_and_litert(g: DataflowGraph, seed: int = 0
                    ) -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(the fp32 conversion, ORT's outputs, LiteRT's outputs) on the same seeded inputs; every
    node must be convertible."""
    refused = {(n.op_type, convertible(n, g, "fp32")) for n in g.nodes
               if convertible(n, g, "fp32") is not None}
    assert not refused, refused
    conv = convert(g, "fp32")
    feeds = random_inputs(g, seed)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    s = ort.InferenceSession(g.model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
    it = Interpreter(model_content=conv.tflite, num_threads=1)
    it.allocate_tensors()
    for sp in conv.inputs:
        it.set_tensor(sp.index, sp.to_tflite(feeds[sp.name]))
    it.invoke()
    got = {sp.name: sp.from_tflite(it.get_tensor(sp.index)) for sp in conv.outputs}
    assert set(got) == set(ref)
    return conv, ref, got


def _run_both(model: onnx.ModelProto, seed: int = 0, tol: float = 1e-4
              ) -> tuple[list[str], dict[str, np.ndarray]]:
    conv, ref, got = _ort_and_litert(load_graph(model), seed)
    for k, r in ref.items():
        assert got[k].shape == r.shape, k
        err = float(np.abs(got[k].astype(np.float64) - r).max())
        assert err <= tol * max(1.0, float(np.abs(r).max())), (k, err)
    return [o.op for o in conv.ops], got


N = helper.make_node


def bn_alone() -> onnx.ModelProto:
    c = 5
    inits = [_f("g", _rand((c,))), _f("b", _rand((c,))), _f("m", _rand((c,))),
             _f("v", np.abs(_rand((c,))) + 0.1)]
    return _model([N("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], epsilon=1e-3)],
                  [("x", [1, c, 6, 7])], ["y"], inits)


def bn_after_conv() -> onnx.ModelProto:
    c = 6
    inits = [_f("w", _rand((c, 3, 3, 3), 0.3)), _f("cb", _rand((c,))), _f("g", _rand((c,))),
             _f("b", _rand((c,))), _f("m", _rand((c,))), _f("v", np.abs(_rand((c,))) + 0.1)]
    return _model([N("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
                   N("BatchNormalization", ["c", "g", "b", "m", "v"], ["bn"]),
                   N("Relu", ["bn"], ["y"])], [("x", [1, 3, 8, 8])], ["y"], inits)


def bn_rank3() -> onnx.ModelProto:
    c = 4
    inits = [_f("g", _rand((c,))), _f("b", _rand((c,))), _f("m", _rand((c,))),
             _f("v", np.abs(_rand((c,))) + 0.1)]
    return _model([N("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"])],
                  [("x", [2, c, 9])], ["y"], inits)


def hardsigmoid() -> onnx.ModelProto:
    return _model([N("HardSigmoid", ["x"], ["h"], alpha=1 / 6, beta=0.5),
                   N("Mul", ["x", "h"], ["y"])], [("x", [1, 4, 5, 5])], ["y", "h"])


def _resize(mode: str, ctm: str, nearest: str | None, scales: list[float] | None,
            sizes: list[int] | None, shape: list[int]) -> onnx.ModelProto:
    kw: dict = {"mode": mode, "coordinate_transformation_mode": ctm}
    if nearest:
        kw["nearest_mode"] = nearest
    inits = [_f("roi", np.zeros(0, np.float32))]
    ins = ["x", "roi"]
    if scales is not None:
        inits.append(_f("scales", np.array(scales, np.float32)))
        ins.append("scales")
    else:
        inits.append(_f("sizes", np.array(sizes, np.int64)))
        ins += ["", "sizes"]
    return _model([N("Resize", ins, ["y"], **kw)], [("x", shape)], ["y"], inits)


def convtranspose(bias: bool = True, pads: tuple[int, ...] = (0, 0, 0, 0),
                  k: int = 2, s: int = 2) -> onnx.ModelProto:
    inits = [_f("w", _rand((4, 3, k, k), 0.5))]
    ins = ["x", "w"]
    if bias:
        inits.append(_f("b", _rand((3,))))
        ins.append("b")
    return _model([N("ConvTranspose", ins, ["y"], strides=[s, s], pads=list(pads))],
                  [("x", [1, 4, 5, 6])], ["y"], inits)


def transpose4() -> onnx.ModelProto:
    return _model([N("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]),
                   N("Transpose", ["t"], ["y"], perm=[3, 0, 2, 1])], [("x", [2, 3, 4, 5])],
                  ["y", "t"])


def transpose3() -> onnx.ModelProto:
    return _model([N("Transpose", ["x"], ["y"], perm=[0, 2, 1])], [("x", [2, 3, 4])], ["y"])


def reduce(op: str, axes: list[int], keep: int, shape: list[int], opset: int = 17
           ) -> onnx.ModelProto:
    if opset >= 18 or (op == "ReduceSum" and opset >= 13):
        return _model([N(op, ["x", "axes"], ["y"], keepdims=keep)], [("x", shape)], ["y"],
                      [_f("axes", np.array(axes, np.int64))], opset=opset)
    return _model([N(op, ["x"], ["y"], axes=axes, keepdims=keep)], [("x", shape)], ["y"],
                  opset=opset)


def layernorm_by_hand() -> onnx.ModelProto:
    """The PP-OCR rec pattern: ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div."""
    inits = [_f("two", np.array(2.0, np.float32)), _f("eps", np.array(1e-5, np.float32))]
    return _model([N("ReduceMean", ["x"], ["m"], axes=[-1]), N("Sub", ["x", "m"], ["d"]),
                   N("Pow", ["d", "two"], ["p"]), N("ReduceMean", ["p"], ["v"], axes=[-1]),
                   N("Add", ["v", "eps"], ["ve"]), N("Sqrt", ["ve"], ["s"]),
                   N("Div", ["d", "s"], ["y"])], [("x", [1, 6, 10])], ["y"], inits)


def pow_cases() -> onnx.ModelProto:
    inits = [_f("half", np.array(0.5, np.float32)), _f("three", np.array(3.0, np.float32))]
    return _model([N("Relu", ["x"], ["r"]), N("Pow", ["r", "half"], ["a"]),
                   N("Pow", ["x", "three"], ["b"])], [("x", [1, 3, 4, 4])], ["a", "b"], inits)


def slice_case(shape: list[int], starts: list[int], ends: list[int], axes: list[int],
               steps: list[int]) -> onnx.ModelProto:
    inits = [_f("st", np.array(starts, np.int64)), _f("en", np.array(ends, np.int64)),
             _f("ax", np.array(axes, np.int64)), _f("sp", np.array(steps, np.int64))]
    return _model([N("Slice", ["x", "st", "en", "ax", "sp"], ["y"])], [("x", shape)], ["y"],
                  inits)


def shape_arithmetic() -> onnx.ModelProto:
    """paddle2onnx's Shape -> Cast -> Slice -> Concat -> Reshape (folded at conversion)."""
    inits = [_f("s0", np.array([0], np.int64)), _f("s1", np.array([2], np.int64)),
             _f("minus1", np.array([-1], np.int32))]
    return _model([N("Shape", ["x"], ["shp"]), N("Cast", ["shp"], ["shp32"], to=6),
                   N("Slice", ["shp32", "s0", "s1"], ["nc"]),
                   N("Concat", ["nc", "minus1"], ["new32"], axis=0),
                   N("Cast", ["new32"], ["new"], to=7),
                   N("Reshape", ["x", "new"], ["r"]), N("Transpose", ["r"], ["y"], perm=[0, 2, 1]),
                   N("Cast", ["y"], ["yc"], to=1)], [("x", [1, 6, 3, 4])], ["yc"], inits)


def attention() -> onnx.ModelProto:
    """Q K^T / sqrt(d) -> Softmax(last axis, rank 4) -> x V, all dynamic (BATCH_MATMUL)."""
    inits = [_f("sh", np.array([1, 5, 2, 4], np.int64)), _f("sc", np.array(2.0, np.float32)),
             _f("m", np.array([1, 5, 8], np.int64))]
    return _model([N("Reshape", ["x", "sh"], ["r"]),
                   N("Transpose", ["r"], ["q"], perm=[0, 2, 1, 3]),
                   N("Transpose", ["r"], ["k"], perm=[0, 2, 3, 1]),
                   N("MatMul", ["q", "k"], ["s"]), N("Div", ["s", "sc"], ["ss"]),
                   N("Softmax", ["ss"], ["p"], axis=-1), N("MatMul", ["p", "q"], ["o"]),
                   N("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
                   N("Reshape", ["ot", "m"], ["y"])], [("x", [1, 5, 8])], ["y"], inits)


def gather_embedding() -> onnx.ModelProto:
    inits = [_f("table", _rand((7, 6))), _f("pos", np.array([[0, 2, 1]], np.int64)),
             _f("first", np.array(1, np.int64))]
    return _model([N("Gather", ["table", "ids"], ["e"]), N("Gather", ["table", "pos"], ["p"]),
                   N("Add", ["e", "p"], ["s"]), N("Gather", ["s", "first"], ["y"], axis=1)],
                  [("ids", [1, 3])], ["y", "s"], inits, in_type=TensorProto.INT64)


def gather_rank4() -> onnx.ModelProto:
    return _model([N("Gather", ["x", "i"], ["y"], axis=1)], [("x", [1, 5, 3, 4])], ["y"],
                  [_f("i", np.array([4, 0], np.int64))])


def split_case(rank4: bool) -> onnx.ModelProto:
    if rank4:
        return _model([N("Split", ["x", "sp"], ["a", "b"], axis=1)], [("x", [1, 5, 3, 2])],
                      ["a", "b"], [_f("sp", np.array([2, 3], np.int64))])
    return _model([N("Split", ["x"], ["a", "b", "c"], axis=-1, num_outputs=3)],
                  [("x", [1, 4, 9])], ["a", "b", "c"], opset=18)


def layernorm(bias: bool = True, axis: int = -1) -> onnx.ModelProto:
    shape = [2, 3, 8]
    norm = shape[axis:] if axis != -1 else shape[-1:]
    inits = [_f("g", _rand(tuple(norm))), _f("b", _rand(tuple(norm)))]
    ins = ["x", "g"] + (["b"] if bias else [])
    return _model([N("LayerNormalization", ins, ["y"], axis=axis, epsilon=1e-5)],
                  [("x", shape)], ["y"], inits)


def gelu(half_first: bool = False) -> onnx.ModelProto:
    inits = [_f("sqrt2", np.array(math.sqrt(2.0), np.float32)), _f("one", np.array(1.0,
                                                                                    np.float32)),
             _f("half", np.array(0.5, np.float32))]
    tail = [N("Mul", ["a", "half"], ["h"]), N("Mul", ["x", "h"], ["y"])] if half_first \
        else [N("Mul", ["x", "a"], ["h"]), N("Mul", ["h", "half"], ["y"])]
    return _model([N("Div", ["x", "sqrt2"], ["d"]), N("Erf", ["d"], ["e"]),
                   N("Add", ["e", "one"], ["a"]), *tail], [("x", [1, 4, 16])], ["y"], inits)


def maxpool_after_relu() -> onnx.ModelProto:
    return _model([N("Relu", ["x"], ["r"]),
                   N("MaxPool", ["r"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                     pads=[1, 1, 1, 1])], [("x", [1, 3, 8, 8])], ["y"])


def div_dynamic() -> onnx.ModelProto:
    return _model([N("Sigmoid", ["b"], ["s"]), N("Div", ["a", "s"], ["y"])],
                  [("a", [1, 3, 4, 4]), ("b", [1, 3, 4, 4])], ["y"])


def exp_reciprocal_max_min() -> onnx.ModelProto:
    """magika's softmax and LayerNorm pieces: Exp, Reciprocal, Max with a constant, Min."""
    return _model([N("Exp", ["x"], ["e"]), N("Reciprocal", ["e"], ["r"]),
                   N("Max", ["r", "c"], ["m"]), N("Min", ["m", "x"], ["y"])],
                  [("x", [2, 3, 4])], ["y"], [_f("c", np.array(0.5, np.float32))])


def expand_broadcast() -> onnx.ModelProto:
    return _model([N("Expand", ["x", "shape"], ["y"])], [("x", [1, 1, 4])], ["y"],
                  [_f("shape", np.array([2, 3, 4], np.int64))])


def global_max_pool_rank3() -> onnx.ModelProto:
    return _model([N("GlobalMaxPool", ["x"], ["y"])], [("x", [1, 3, 5])], ["y"])


# case -> (model builder, TFLite ops that must appear)
CASES: dict[str, tuple[Callable[[], onnx.ModelProto], tuple[str, ...]]] = {
    "batchnorm": (bn_alone, ("MUL", "ADD")),
    "batchnorm_folded_into_conv": (bn_after_conv, ("CONV_2D",)),
    "batchnorm_rank3": (bn_rank3, ("MUL", "ADD")),
    "hardsigmoid": (hardsigmoid, ("MUL", "ADD")),
    "resize_nearest_asymmetric_floor": (lambda: _resize(
        "nearest", "asymmetric", "floor", [1, 1, 2, 3], None, [1, 3, 4, 5]),
        ("RESIZE_NEAREST_NEIGHBOR",)),
    "resize_nearest_half_pixel_ceil": (lambda: _resize(
        "nearest", "half_pixel", "round_prefer_ceil", None, [1, 3, 8, 15], [1, 3, 4, 5]),
        ("RESIZE_NEAREST_NEIGHBOR",)),
    "resize_linear_half_pixel": (lambda: _resize(
        "linear", "half_pixel", None, [1, 1, 2, 2], None, [1, 3, 4, 5]), ("RESIZE_BILINEAR",)),
    "resize_linear_align_corners": (lambda: _resize(
        "linear", "align_corners", None, None, [1, 3, 7, 9], [1, 3, 4, 5]),
        ("RESIZE_BILINEAR",)),
    "resize_linear_asymmetric": (lambda: _resize(
        "linear", "asymmetric", None, [1, 1, 3, 2], None, [1, 3, 4, 5]), ("RESIZE_BILINEAR",)),
    "convtranspose_k2s2_bias": (convtranspose, ("TRANSPOSE_CONV", "ADD")),
    "convtranspose_k3s2_same_pads": (lambda: convtranspose(False, (0, 0, 1, 1), 3, 2),
                                     ("TRANSPOSE_CONV",)),
    "transpose_rank4": (transpose4, ("TRANSPOSE",)),
    "transpose_rank3": (transpose3, ("TRANSPOSE",)),
    "reducemean_rank4_keep": (lambda: reduce("ReduceMean", [1, 3], 1, [2, 3, 4, 5]), ("MEAN",)),
    "reducemean_rank4_drop_channel": (lambda: reduce("ReduceMean", [1], 0, [2, 3, 4, 5]),
                                      ("MEAN",)),
    "reducemean_rank4_drop_h": (lambda: reduce("ReduceMean", [2], 0, [2, 3, 4, 5]),
                                ("TRANSPOSE", "MEAN")),
    "reducemean_opset18_axes_input": (lambda: reduce("ReduceMean", [-1], 1, [2, 3, 4], 18),
                                      ("MEAN",)),
    "reducemax": (lambda: reduce("ReduceMax", [0, 2], 0, [3, 4, 5]), ("REDUCE_MAX",)),
    "reducesum": (lambda: reduce("ReduceSum", [2, 3], 1, [1, 3, 4, 5], 13), ("SUM",)),
    "layernorm_by_hand_sub_pow_sqrt_div": (layernorm_by_hand, ("SQRT", "DIV", "SUB")),
    "pow_half_and_three": (pow_cases, ("SQRT", "POW")),
    "slice_rank5_like_pp_ocr": (lambda: slice_case([3, 1, 4, 5, 2], [1], [2], [0], [1]),
                                ("STRIDED_SLICE",)),
    "slice_rank4_steps_negative_bounds": (lambda: slice_case(
        [1, 6, 7, 8], [1, -5, 0], [5, 100, -1], [1, 3, 2], [2, 1, 3]), ("STRIDED_SLICE",)),
    "shape_arithmetic_folded_reshape_cast": (shape_arithmetic, ("RESHAPE",)),
    "attention_batch_matmul_softmax": (attention, ("BATCH_MATMUL", "SOFTMAX")),
    "gather_embedding_int64_ids": (gather_embedding, ("GATHER",)),
    "gather_rank4_const_indices": (gather_rank4, ("GATHER",)),
    "split_rank4_channels": (lambda: split_case(True), ("SPLIT_V",)),
    "split_rank3_num_outputs": (lambda: split_case(False), ("SPLIT_V",)),
    "layernorm": (layernorm, ("MEAN", "RSQRT")),
    "layernorm_no_bias_two_axes": (lambda: layernorm(False, 1), ("MEAN", "RSQRT")),
    "gelu_half_last": (gelu, ("GELU",)),
    "gelu_half_first": (lambda: gelu(True), ("GELU",)),
    "maxpool_after_relu_zero_pad": (maxpool_after_relu, ("PAD", "MAX_POOL_2D")),
    "div_dynamic_divisor": (div_dynamic, ("DIV",)),
    "exp_reciprocal_max_min": (exp_reciprocal_max_min, ("EXP", "DIV", "MAXIMUM", "MINIMUM")),
    "expand_broadcast_rank3": (expand_broadcast, ("BROADCAST_TO",)),
    "global_max_pool_rank3": (global_max_pool_rank3, ("REDUCE_MAX",)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fp32_op_matches_onnxruntime(case: str) -> None:
    make, want = CASES[case]
    model = make()
    for seed in (0, 5):
        ops, _ = _run_both(model, seed)
    for code in want:
        assert code in ops, (code, ops)
    if case == "batchnorm_folded_into_conv":
        assert ops == ["CONV_2D"], ops  # BN and ReLU folded: one operator
    if case == "maxpool_after_relu_zero_pad":
        assert "PADV2" not in ops  # zero padding is exact after a ReLU; XNNPACK takes PAD
    if case == "shape_arithmetic_folded_reshape_cast":
        assert "CAST" not in ops and len(ops) <= 4, ops  # Shape/Slice/Concat emit nothing
        # NHWC [1, 3, 4, 6] -> NCHW -> [1, 6, 12] -> [1, 12, 6] moves no data: one RESHAPE
        assert "TRANSPOSE" not in ops, ops


FP32_ONLY_MODELS = {
    "Transpose": transpose3, "LayerNormalization": layernorm, "Erf": gelu,
    "Gather": gather_rank4, "Exp": exp_reciprocal_max_min,
    "Reciprocal": exp_reciprocal_max_min, "Max": exp_reciprocal_max_min,
}


@pytest.mark.parametrize("op", sorted(FP32_ONLY_MODELS))
def test_fp32_only_ops_stay_refused_in_int8(op: str) -> None:
    """The Ethos-U target asks for int8: its capabilities must not grow with these."""
    model = FP32_ONLY_MODELS[op]()
    g = load_graph(model)
    node = next(n for n in g.nodes if n.op_type == op)
    assert convertible(node, g, "fp32") is None
    why = convertible(node, g)
    assert why is not None and "in int8 mode (fp32 only)" in why
    with pytest.raises(UnsupportedOp):
        convert(model, "int8", {t: (-1.0, 1.0) for t in g.tensors})


REFUSED = {
    "resize_cubic": (lambda: _resize("cubic", "half_pixel", None, [1, 1, 2, 2], None,
                                     [1, 3, 4, 5]), "resize mode 'cubic'"),
    "resize_nearest_half_pixel_floor": (lambda: _resize(
        "nearest", "half_pixel", "floor", [1, 1, 2, 2], None, [1, 3, 4, 5]),
        "no TFLite equivalent"),
    "resize_fractional_scale": (lambda: _resize(
        "linear", "half_pixel", None, [1, 1, 1.5, 1.5], None, [1, 3, 5, 5]), "integral"),
    "erf_alone": (lambda: _model([N("Erf", ["x"], ["y"])], [("x", [1, 4])], ["y"]),
                  "exact GELU"),
    "gelu_intermediate_read_twice": (lambda: _model(
        [N("Div", ["x", "sqrt2"], ["d"]), N("Erf", ["d"], ["e"]), N("Add", ["e", "one"], ["a"]),
         N("Mul", ["x", "a"], ["h"]), N("Mul", ["h", "half"], ["y"])], [("x", [1, 4])],
        ["y", "e"], [_f("sqrt2", np.array(math.sqrt(2.0), np.float32)),
                     _f("one", np.array(1.0, np.float32)),
                     _f("half", np.array(0.5, np.float32))]), "Erf has no TFLite op"),
    "slice_negative_step": (lambda: slice_case([1, 6], [5], [0], [1], [-1]), "positive steps"),
    "layernorm_rank4": (lambda: _model(
        [N("LayerNormalization", ["x", "g"], ["y"], axis=-1)], [("x", [1, 2, 3, 4])], ["y"],
        [_f("g", np.ones(4, np.float32))]), "rank-4"),
    "convtranspose_output_padding": (lambda: _model(
        [N("ConvTranspose", ["x", "w"], ["y"], strides=[2, 2], output_padding=[1, 1])],
        [("x", [1, 2, 3, 3])], ["y"], [_f("w", np.ones((2, 2, 3, 3), np.float32))]),
        "output_padding"),
    "cast_to_half": (lambda: _model([N("Cast", ["x"], ["y"], to=10)], [("x", [1, 4])], ["y"],
                                    out_type=TensorProto.FLOAT16),
                     "not float32, int32, int64 or bool"),
    "matmul_const_a": (lambda: _model([N("MatMul", ["a", "x"], ["y"])], [("x", [4, 3])], ["y"],
                                      [_f("a", np.ones((2, 4), np.float32))]), "constant A"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_fp32_refusals_name_the_reason(case: str) -> None:
    make, fragment = REFUSED[case]
    model = make()
    g = load_graph(model)
    reasons = [convertible(n, g, "fp32") for n in g.nodes]
    why = next(r for r in reasons if r is not None)
    assert fragment in why, why
    with pytest.raises(UnsupportedOp) as ei:
        convert(model, "fp32")
    assert ei.value.reason == why


# --- real models ------------------------------------------------------------------------

_RAPIDOCR = importlib.util.find_spec("rapidocr_onnxruntime")
PP_OCR = {
    "det": ("ch_PP-OCRv4_det_infer.onnx", (1, 3, 256, 256)),
    "rec": ("ch_PP-OCRv4_rec_infer.onnx", (1, 3, 48, 320)),
}


@pytest.mark.skipif(_RAPIDOCR is None, reason="rapidocr_onnxruntime is not installed")
@pytest.mark.parametrize("which", sorted(PP_OCR))
def test_pp_ocr_models_convert_whole_and_match(which: str) -> None:
    fname, shape = PP_OCR[which]
    path = os.path.join(_RAPIDOCR.submodule_search_locations[0], "models", fname)  # type: ignore[index]
    if not os.path.exists(path):
        pytest.skip(f"{fname} is not shipped with this rapidocr_onnxruntime")
    _, ref, got = _ort_and_litert(load_graph(path, shapes={"x": shape}))
    for name, r in ref.items():
        y = got[name]
        assert y.shape == r.shape
        span = max(float(np.ptp(r)), 1e-6)
        assert float(np.abs(y - r).max()) <= 1e-3 * span, (name, float(np.abs(y - r).max()))


# --- layout-transpose peephole (fp32) ---------------------------------------------------


def _flatbuffer_ops(tflite: bytes) -> list[str]:
    """Builtin op names as written in the flatbuffer (not the converter's own bookkeeping)."""
    from ethosu.vela.tflite import BuiltinOperator, Model

    names = {v: k for k, v in vars(BuiltinOperator.BuiltinOperator).items()
             if not k.startswith("_")}
    m = Model.Model.GetRootAs(tflite, 0)
    sg = m.Subgraphs(0)
    return [names[m.OperatorCodes(sg.Operators(i).OpcodeIndex()).BuiltinCode()]
            for i in range(sg.OperatorsLength())]


def _without_peephole(monkeypatch: pytest.MonkeyPatch, model: onnx.ModelProto) -> list[str]:
    from runners.tflite import peephole as tc

    with monkeypatch.context() as mp:
        mp.setattr(tc._TransposeOptimiser, "run", lambda self: None)
        return _flatbuffer_ops(convert(model, "fp32").tflite)


def transpose_round_trip(intermediate_out: bool = False) -> onnx.ModelProto:
    """Transpose, elementwise ops with broadcast constants, then the inverse Transpose.

    ``t`` is [1, 4, 5, 3]: ``scale`` broadcasts over its last axis, ``bias`` is a rank-1
    constant (or, as the first operand, a rank-4 one over H and W).
    """
    bias = _rand((1, 4, 5, 1)) if intermediate_out else _rand((3,))
    add = N("Add", ["bias", "m"], ["a"]) if intermediate_out else N("Add", ["m", "bias"], ["a"])
    nodes = [N("Transpose", ["x"], ["t"], perm=[0, 2, 3, 1]), N("Mul", ["t", "scale"], ["m"]),
             add, N("Sigmoid", ["a"], ["s"]), N("Transpose", ["s"], ["u"], perm=[0, 3, 1, 2]),
             N("Relu", ["u"], ["y"])]
    return _model(nodes, [("x", [1, 3, 4, 5])], ["y", "t"] if intermediate_out else ["y"],
                  [_f("scale", _rand((1, 1, 1, 3))), _f("bias", bias)])


def test_transpose_pair_cancels_in_the_flatbuffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """ONNX Transpose -> Mul/Add (broadcast constants) -> Sigmoid -> inverse Transpose.

    Why: the converter's transposes (its layout ones and the ONNX ones) must meet and cancel
    through elementwise ops, with the constants permuted so the values do not change.
    """
    model = transpose_round_trip()
    before = _without_peephole(monkeypatch, model)
    assert before.count("TRANSPOSE") == 2, before
    conv = convert(model, "fp32")
    after = _flatbuffer_ops(conv.tflite)
    assert "TRANSPOSE" not in after and len(after) == len(before) - 2, (before, after)
    assert after == [o.op for o in conv.ops]
    for seed in (0, 5):
        _run_both(model, seed)
    # every ONNX node still names an operator (Collage attributes costs through them)
    assert {n for o in conv.ops for n in o.nodes} == {n.name for n in load_graph(model).nodes}


def test_transpose_pair_kept_when_the_middle_is_a_graph_output(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph output between the two transposes must still be produced, in its layout."""
    model = transpose_round_trip(intermediate_out=True)
    ops, got = _run_both(model, 0)
    assert "TRANSPOSE" in ops and set(got) == {"y", "t"}
    assert len(ops) <= len(_without_peephole(monkeypatch, model))


def test_attention_block_keeps_only_the_onnx_transposes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The small attention case: layout round trips around BATCH_MATMUL / Softmax are gone."""
    model = attention()
    before = _without_peephole(monkeypatch, model)
    ops, _ = _run_both(model, 0)
    assert ops.count("TRANSPOSE") <= 3 < before.count("TRANSPOSE"), (before, ops)


#: TRANSPOSE ops in zoo bert with 2 layers: 32 before the peephole pass, 8 after (per layer:
#: the Q, K, V head splits and the context merge, which the ONNX model itself asks for)
BERT_2L_MAX_TRANSPOSES = 8


def test_bert_two_layers_whole_fewer_transposes_and_matches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from collage_farm import zoo

    model = zoo.build("bert", layers=2)
    before = _without_peephole(monkeypatch, model).count("TRANSPOSE")
    ops, _ = _run_both(model, 0)
    after = ops.count("TRANSPOSE")
    assert after <= BERT_2L_MAX_TRANSPOSES < before, (before, after)
    assert "BATCH_MATMUL" in ops and "SOFTMAX" in ops
