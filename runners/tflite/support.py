"""The capability check: which ONNX nodes the converter maps, in int8 and in fp32 mode."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from runners.tflite.attrs import _INT_TYPES, _attr, _ints
from runners.tflite.fold import _folded, _init_array, _is_const, _slice_spec
from runners.tflite.params import (
    _clip_bounds,
    _const_vector,
    _dyn_rank,
    _float_io,
    _gelu_chain,
    _pool_geometry,
    _pow_exponent,
    _reduce_axes,
    _resize_params,
    _resolve_pads,
    _softmax_axis,
    _softmax_nchw,
    _split_sizes,
)
from runners.tflite.typed import check_cast, check_equal, check_expand, typed_checked

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node


#: a per-op check: (node, graph, mode) -> None, or why the node is not converted
_Check = Callable[..., str | None]


def _float_checked(inputs: Sequence[int] | None = None) -> Callable[[_Check], _Check]:
    """Decorates a check: the node's inputs (all, or these) and outputs must be static float32
    tensors (`_float_io`) before the check itself runs."""

    def wrap(check: _Check) -> _Check:
        @functools.wraps(check)
        def checked(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
            return _float_io(node, graph, inputs) or check(node, graph, mode)

        return checked

    return wrap


@_float_checked()
def _check_conv(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    x = graph.tensors[node.inputs[0]].shape
    if len(x) != 4:
        return f"only 2-D convolution (input rank {len(x)})"
    if len(node.inputs) < 2 or not _is_const(graph, node.inputs[1]):
        return "weights must be a constant initializer"
    if len(node.inputs) > 2 and node.inputs[2] and not _is_const(graph, node.inputs[2]):
        return "bias must be a constant initializer"
    w = graph.tensors[node.inputs[1]].shape
    group = int(_attr(node, "group", 1))  # type: ignore[arg-type]
    c_in = x[1]
    if group != 1 and not (group == c_in and w[0] % c_in == 0 and w[1] == 1):
        return f"grouped convolution (group={group}, {c_in} channels) is neither dense nor " \
               "depthwise"
    y = graph.tensors[node.outputs[0]].shape
    k = tuple(w[2:])
    d = _ints(_attr(node, "dilations"), (1, 1))
    s = _ints(_attr(node, "strides"), (1, 1))
    if len(k) != 2 or len(d) != 2 or len(s) != 2:
        return "kernel, dilations and strides must be 2-D"
    k_eff = tuple((k[i] - 1) * d[i] + 1 for i in range(2))
    try:
        _resolve_pads(node, x[2:], k_eff, s, y[2:])
    except ValueError as e:
        return f"padding: {e}"
    return None


@_float_checked()
def _check_pool(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    if len(node.outputs) > 1 and node.outputs[1]:
        return "MaxPool indices output is not supported"
    x, y, k, s = _pool_geometry(node, graph)
    if len(x) != 4 or len(k) != 2 or len(s) != 2:
        return "only 2-D pooling"
    if any(v != 1 for v in _ints(_attr(node, "dilations"), (1, 1))):
        return "dilated pooling is not supported"
    try:
        padding, explicit = _resolve_pads(node, x[2:], k, s, y[2:])
    except ValueError as e:
        return f"padding: {e}"
    if node.op_type == "AveragePool":
        include = int(_attr(node, "count_include_pad", 0))  # type: ignore[arg-type]
        pads = _ints(_attr(node, "pads"), (0, 0, 0, 0))
        if include and padding == "SAME" and any(pads):
            padding, explicit = "VALID", ((pads[0], pads[2]), (pads[1], pads[3]))
        if explicit is not None and not include:
            return "AveragePool padding that excludes pads (count_include_pad=0) is not " \
                   "expressible as SAME"
    return None


@_float_checked()
def _check_binary(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    if len(node.inputs) != 2:
        return "needs two inputs"
    a, b = node.inputs
    ca, cb = _is_const(graph, a), _is_const(graph, b)
    if ca and cb:
        return "both operands are constants (fold them first)"
    if node.op_type == "Div" and not cb and mode != "fp32":
        return "Div is converted only with a constant divisor (a dynamic one in fp32 only)"
    if node.op_type == "Div" and cb:
        arr = _init_array(graph, b)
        if arr is None or not np.all(arr != 0):
            return "Div by a constant containing zero"
    r = _dyn_rank(graph, node.outputs[0])
    if r > 6:
        return f"rank {r} is beyond TFLite broadcasting"
    for t, c in ((a, ca), (b, cb)):
        if not c and _dyn_rank(graph, t) != r:
            return f"dynamic operand {t!r} of rank {_dyn_rank(graph, t)} broadcasts to rank {r}"
    return None


@typed_checked(inputs=[0])
def _check_reshape(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    if node.op_type == "Reshape" and (len(node.inputs) < 2 or not _is_const(graph,
                                                                           node.inputs[1])):
        return "shape must be a constant initializer"
    if node.op_type in ("Squeeze", "Unsqueeze") and len(node.inputs) > 1 and node.inputs[1] \
            and not _is_const(graph, node.inputs[1]):
        return "axes must be a constant initializer"
    if len(graph.tensors[node.outputs[0]].shape) > 6:
        return "rank > 6"
    return None


@_float_checked()
def _check_softmax(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    a = _softmax_axis(node, graph)
    if isinstance(a, str) and mode == "fp32" and _softmax_nchw(node, graph):
        return None
    return a if isinstance(a, str) else None


@_float_checked(inputs=[0])
def _check_unary(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    if node.op_type == "Clip":
        b = _clip_bounds(node, graph)
        if isinstance(b, str):
            return b
        if b == (None, None):
            return "Clip without bounds (an identity)"
    return None


@_float_checked()
def _check_gemm(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    a = graph.tensors[node.inputs[0]].shape
    if node.op_type == "MatMul" and len(node.inputs) == 2 and not _is_const(graph, node.inputs[1]):
        if mode != "fp32":
            return "weights (B) must be a constant initializer (a dynamic B in fp32 only)"
        return _check_batch_matmul(node, graph)
    if len(node.inputs) < 2 or not _is_const(graph, node.inputs[1]):
        return "weights (B) must be a constant initializer"
    if _is_const(graph, node.inputs[0]):
        return "A must be dynamic"
    bshape = graph.tensors[node.inputs[1]].shape
    if len(bshape) != 2:
        return "weights must be 2-D"
    y = graph.tensors[node.outputs[0]].shape
    n = y[-1]
    if node.op_type == "Gemm":
        if int(_attr(node, "transA", 0)):  # type: ignore[arg-type]
            return "transA=1 is not supported"
        if len(node.inputs) > 2 and node.inputs[2]:
            if not _is_const(graph, node.inputs[2]):
                return "C must be a constant initializer"
            c = graph.tensors[node.inputs[2]].shape
            if math.prod(c) not in (1, n) or (len(c) == 2 and c[0] != 1):
                return f"C of shape {c} is not a per-output bias"
        if len(a) != 2:
            return "Gemm A must be 2-D"
    else:
        if len(a) not in (2, 3):
            return f"MatMul A of rank {len(a)} (2 or 3 supported)"
    return None


@_float_checked()
def _check_concat(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    r = _dyn_rank(graph, node.outputs[0])
    for t in node.inputs:
        if not t:
            return "empty input"
        if _is_const(graph, t):
            return "constant inputs to Concat are not supported"
        if _dyn_rank(graph, t) != r:
            return "inputs of different rank"
    return None


@_float_checked()
def _check_global_pool(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    if _dyn_rank(graph, node.inputs[0]) not in (3, 4):
        return "only 1-D and 2-D global pooling"
    return None


@_float_checked(inputs=[0])
def _check_pad(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    if str(_attr(node, "mode", "constant")) != "constant":
        return "only constant padding"
    if len(node.inputs) < 2 or not _is_const(graph, node.inputs[1]):
        return "pads must be a constant initializer"
    if len(node.inputs) > 2 and node.inputs[2]:
        v = _init_array(graph, node.inputs[2])
        if v is None or v.size != 1 or float(v.reshape(())) != 0.0:
            return "only zero constant_value"
    if len(node.inputs) > 3 and node.inputs[3]:
        return "pads with axes are not supported"
    pads = _init_array(graph, node.inputs[1])
    if pads is None or np.any(pads < 0):
        return "negative pads (cropping) are not supported"
    return None


def _check_batch_matmul(node: Node, graph: DataflowGraph) -> str | None:
    a = graph.tensors[node.inputs[0]].shape
    b = graph.tensors[node.inputs[1]].shape
    if _is_const(graph, node.inputs[0]):
        return "MatMul with a constant A and a dynamic B is not converted"
    if len(a) != len(b) or not 2 <= len(a) <= 5:
        return f"MatMul of ranks {len(a)} x {len(b)} (equal ranks 2..5 are converted)"
    return None


@_float_checked(inputs=[0])
def _check_batchnorm(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    if int(_attr(node, "training_mode", 0)) or any(node.outputs[1:]):  # type: ignore[arg-type]
        return "training-mode BatchNormalization (running statistics outputs)"
    x = graph.tensors[node.inputs[0]].shape
    if len(x) < 2 or len(node.inputs) != 5:
        return "needs an input of rank >= 2 and scale, bias, mean, var"
    if mode != "fp32" and len(x) != 4:
        return f"int8 BatchNormalization of rank {len(x)} (rank 4 only: a 1x1 depthwise " \
               "convolution)"
    for t in node.inputs[1:]:
        if _const_vector(graph, t, x[1]) is None:
            return f"{t!r} must be a constant per-channel vector"
    return None


def _check_by_params(params: Callable[[Node, DataflowGraph], object]) -> _Check:
    """A check for an op whose emitter derives its parameters with ``params`` (which returns
    the refusal reason as a string): float input 0, then whatever ``params`` refuses."""

    @_float_checked(inputs=[0])
    def check(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
        p = params(node, graph)
        return p if isinstance(p, str) else None

    return check


_check_resize = _check_by_params(_resize_params)
_check_reduce = _check_by_params(_reduce_axes)
_check_split = _check_by_params(_split_sizes)


@_float_checked(inputs=[0])
def _check_convtranspose(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    x = graph.tensors[node.inputs[0]].shape
    y = graph.tensors[node.outputs[0]].shape
    if len(x) != 4:
        return "only 2-D transposed convolution"
    if len(node.inputs) < 2 or not _is_const(graph, node.inputs[1]):
        return "weights must be a constant initializer"
    if len(node.inputs) > 2 and node.inputs[2] \
            and _const_vector(graph, node.inputs[2], y[1]) is None:
        return "bias must be a constant per-channel vector"
    if int(_attr(node, "group", 1)) != 1:  # type: ignore[arg-type]
        return "grouped transposed convolution"
    if any(d != 1 for d in _ints(_attr(node, "dilations"), (1, 1))):
        return "dilated transposed convolution"
    if str(_attr(node, "auto_pad", "NOTSET") or "NOTSET") != "NOTSET" \
            or _attr(node, "output_shape") is not None:
        return "auto_pad / output_shape are not supported (explicit pads only)"
    if any(_ints(_attr(node, "output_padding"), (0, 0))):
        return "output_padding is not supported"
    w = graph.tensors[node.inputs[1]].shape
    s = _ints(_attr(node, "strides"), (1, 1))
    p = _ints(_attr(node, "pads"), (0, 0, 0, 0))
    for d in range(2):
        pb, pe = p[d], p[d + 2]
        if pb != (pb + pe) // 2 or (any(p) and -(-y[2 + d] // s[d]) != x[2 + d]):
            return f"pads {p} are not TFLite's SAME padding for this size"
        if (x[2 + d] - 1) * s[d] + w[2 + d] - pb - pe != y[2 + d]:
            return "pads do not give the declared output size"
    return None


@_float_checked()
def _check_transpose(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    r = _dyn_rank(graph, node.inputs[0])
    perm = _attr(node, "perm")
    if r > 6:
        return "rank > 6"
    if perm is not None and sorted(_ints(perm)) != list(range(r)):
        return f"perm {perm} is not a permutation of rank {r}"
    return None


@_float_checked(inputs=[0])
def _check_pow(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    if _is_const(graph, node.inputs[0]):
        return "constant base"
    if _pow_exponent(node, graph) is None:
        return "the exponent must be a constant float scalar"
    return None


@_float_checked(inputs=[0])
def _check_slice(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    shape = graph.tensors[node.inputs[0]].shape
    if len(shape) > 5:
        return "rank > 5 (STRIDED_SLICE)"
    spec = _slice_spec(node, graph, shape)
    return spec if isinstance(spec, str) else None


@_float_checked(inputs=[0])
def _check_gather(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    idx = node.inputs[1] if len(node.inputs) > 1 else ""
    info = graph.tensors.get(idx)
    if info is None or info.elem_type not in _INT_TYPES:
        return "indices must be a static int32 / int64 tensor"
    x = graph.tensors[node.inputs[0]].shape
    y = graph.tensors[node.outputs[0]].shape
    if len(x) > 5 or len(y) > 5:
        return "rank > 5"
    v = _init_array(graph, idx)
    if v is not None and (np.any(v < -x[int(_attr(node, "axis", 0))])  # type: ignore[arg-type]
                          or np.any(v >= x[int(_attr(node, "axis", 0))])):  # type: ignore[arg-type]
        return "constant indices out of range"
    if v is not None and np.any(v < 0):
        return "negative constant indices"
    return None


@_float_checked(inputs=[0])
def _check_layernorm(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    if any(node.outputs[1:]):
        return "Mean / InvStdDev outputs are not converted"
    x = graph.tensors[node.inputs[0]].shape
    r = len(x)
    if r == 4:
        return "rank-4 LayerNormalization (held NHWC) is not converted"
    axis = int(_attr(node, "axis", -1))  # type: ignore[arg-type]
    axis = axis + r if axis < 0 else axis
    if not 0 <= axis < r:
        return f"axis {axis} out of range"
    n = math.prod(x[axis:])
    for i in (1, 2):
        t = node.inputs[i] if len(node.inputs) > i else ""
        if i == 1 and not t:
            return "needs a scale"
        if t:
            v = _init_array(graph, t)
            if v is None or v.size not in (1, n):
                return f"{t!r} must be a constant over the normalised axes"
    return None


def _check_erf(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    chain = _gelu_chain(graph, node)
    return chain if isinstance(chain, str) else None


#: mapped in fp32 only: no int8 emission is written and tested for these (Ethos-U keeps its set)
_FP32_ONLY = frozenset({
    "Transpose", "ReduceMean",
    "ReduceMax", "ReduceSum", "Pow", "Sqrt", "Slice", "Cast", "Gather", "Split",
    "LayerNormalization", "Erf", "Equal", "Max", "Min", "Exp", "Reciprocal",
})


_CHECKS: dict[str, Callable[..., str | None]] = {
    "Conv": _check_conv,
    "MaxPool": _check_pool,
    "AveragePool": _check_pool,
    "GlobalAveragePool": _check_global_pool,
    "GlobalMaxPool": _check_global_pool,
    "Add": _check_binary,
    "Sub": _check_binary,
    "Mul": _check_binary,
    "Div": _check_binary,
    "Reshape": _check_reshape,
    "Identity": _check_unary,
    "Flatten": _check_reshape,
    "Squeeze": _check_reshape,
    "Unsqueeze": _check_reshape,
    "Gemm": _check_gemm,
    "MatMul": _check_gemm,
    "Softmax": _check_softmax,
    "Concat": _check_concat,
    "Relu": _check_unary,
    "Clip": _check_unary,
    "Sigmoid": _check_unary,
    "Tanh": _check_unary,
    "LeakyRelu": _check_unary,
    "HardSwish": _check_unary,
    "Pad": _check_pad,
    "BatchNormalization": _check_batchnorm,
    "HardSigmoid": _check_unary,
    "Resize": _check_resize,
    "ConvTranspose": _check_convtranspose,
    "Transpose": _check_transpose,
    "ReduceMean": _check_reduce,
    "ReduceMax": _check_reduce,
    "ReduceSum": _check_reduce,
    "Pow": _check_pow,
    "Sqrt": _check_unary,
    "Slice": _check_slice,
    "Cast": check_cast,
    "Expand": check_expand,
    "Equal": check_equal,
    "Max": _check_binary,
    "Min": _check_binary,
    "Exp": _check_unary,
    "Reciprocal": _check_unary,
    "Gather": _check_gather,
    "Split": _check_split,
    "LayerNormalization": _check_layernorm,
    "Erf": _check_erf,
}


#: ONNX op types the converter maps in int8 mode (subject to the per-node checks)
SUPPORTED_OPS: frozenset[str] = frozenset(_CHECKS) - _FP32_ONLY


#: ONNX op types the converter maps in fp32 mode (subject to the per-node checks)
SUPPORTED_OPS_FP32: frozenset[str] = frozenset(_CHECKS)


def convertible(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    """None when `convert` maps this node in ``mode``, else the reason it does not.

    Never raises. ``mode`` defaults to int8 (what the Ethos-U capabilities ask); LiteRT asks
    for fp32, which maps more. A node whose outputs are conversion-time constants (shape
    arithmetic) is convertible in both modes: it emits nothing.
    """
    if node.domain not in ("", "ai.onnx"):
        return f"custom domain {node.domain!r}"
    try:
        if _folded(node, graph):
            if any(o in graph.graph_outputs for o in node.outputs):
                return "a conversion-time constant cannot be a graph output"
            return None
    except Exception as e:
        return f"cannot inspect node ({type(e).__name__}: {e})"
    check = _CHECKS.get(node.op_type)
    if check is None:
        return f"no TFLite mapping for {node.op_type}"
    if mode != "fp32" and node.op_type in _FP32_ONLY:
        return f"no TFLite mapping for {node.op_type} in int8 mode (fp32 only)"
    try:
        return check(node, graph, mode)
    except Exception as e:  # a malformed node must read as unsupported, not crash a search
        return f"cannot inspect node ({type(e).__name__}: {e})"
