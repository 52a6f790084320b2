"""ONNX sub-model -> TFLite flatbuffer, without TensorFlow (int8 full-integer or fp32).

Why this exists: two toolchains consume TFLite, not ONNX. Vela (Arm Ethos-U) compiles only
*int8 full-integer* TFLite, and LiteRT (the TFLite runtime, XNNPACK on CPU) runs TFLite. The
usual route (ONNX -> TensorFlow -> TFLiteConverter) drags in TensorFlow (gigabytes, minutes of
import on a device runner) and re-derives what Collage already knows. Candidate sub-graphs are
small and use a small set of CNN operators, so a direct writer is shorter and deterministic: the
flatbuffer is built with `flatbuffers.Builder` and the TFLite schema modules that ethos-u-vela
ships (``ethosu.vela.tflite.*``), and every TFLite tensor keeps its ONNX name.

Layout (the one decision everything else follows): **every rank-4 activation is held NHWC**
inside the TFLite model, converted once for the whole sub-graph; tensors of other ranks keep
their ONNX layout. So no transposes are inserted between ops: Conv weights become OHWI,
depthwise weights [1, H, W, C*M] (quantized_dimension 3), FC weights [out, in], channel-wise
constants are permuted to NHWC at conversion time, and axes (Concat, Softmax, Pad) are remapped.
The TFLite model's *graph inputs and outputs are NHWC too* (for rank 4): the caller transposes
at the boundary (`IOSpec.to_tflite` / `IOSpec.from_tflite` do it, and quantise / dequantise in
int8 mode). The one place where layout is observable is a rank change (Reshape / Flatten /
Squeeze / Unsqueeze of a rank-4 tensor): flattening NHWC memory differs from flattening NCHW,
so exactly there an explicit TRANSPOSE back to NCHW (and, for a rank-4 result, forward to NHWC)
is emitted, unless it is a no-op in memory (e.g. [1, C, 1, 1] after a global pool).

Padding: ONNX pads that TFLite's SAME/VALID express exactly are folded into the op; other pads
become an explicit PAD (zeros; PADV2 with the lowest value in front of a MaxPool). Fusions that
do not change results are applied: a per-channel constant ``Add`` after Conv/Gemm/MatMul folds
into the bias, and Relu / Clip(0, 6) / Clip(-1, 1) following an op that has a fused-activation
field becomes that field, when the intermediate tensor has no other reader.

int8 mode follows the TFLite 8-bit quantization spec: activations per-tensor asymmetric int8
with scale / zero point from the calibrated (min, max) of each ONNX tensor (`tensor_ranges`,
from `runners.calibration`; the range always includes 0); weights per-channel symmetric int8
(zero point 0, values in [-127, 127]); int32 bias with scale = input scale x weight scale and
zero point 0; constant operands of elementwise ops per-tensor asymmetric int8. Operators whose
int8 kernels require equal input/output quantization (pools, reshape, transpose, pad,
concatenation, min/max) share one set of parameters (a union of the ranges of the tensors they
tie together); LOGISTIC/SOFTMAX outputs are pinned to (1/256, -128) and TANH to (1/128, 0). Where
two pinned sets would have to meet (a Concat of a Sigmoid and a Tanh) a QUANTIZE (requantise)
op is inserted.

`convertible(node, graph)` is the per-node capability check; `convert` runs the same check on
every node first and raises `UnsupportedOp` with the same reason, so the two always agree.
`ConvertedModel.op_nodes` maps every TFLite operator index to the ONNX node names it
implements (first name: the node it was emitted for; fused nodes follow).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

    from collage_farm.graph import DataflowGraph, Node

__all__ = [
    "SUPPORTED_OPS",
    "ConversionError",
    "ConvertedModel",
    "IOSpec",
    "MissingRangeError",
    "UnsupportedOp",
    "act_qparams",
    "convert",
    "convertible",
]

FLOAT = 1  # onnx.TensorProto.FLOAT
INT8_MIN, INT8_MAX = -128, 127
MIN_RANGE = 1e-6  # a constant tensor still needs a positive scale


class ConversionError(ValueError):
    """The sub-model cannot be written as TFLite (base class)."""


class UnsupportedOp(ConversionError):
    """An ONNX node the converter does not map (or not with these attributes / shapes)."""

    def __init__(self, node_name: str, op_type: str, reason: str) -> None:
        super().__init__(f"{op_type} node {node_name!r}: {reason}")
        self.node_name = node_name
        self.op_type = op_type
        self.reason = reason

    def __reduce__(self) -> tuple:  # picklable across worker processes
        return (UnsupportedOp, (self.node_name, self.op_type, self.reason))


class MissingRangeError(ConversionError):
    """int8 mode needs a calibrated (min, max) for a tensor that has none."""


# ----------------------------------------------------------------------------------------
# public result types


@dataclass(frozen=True)
class IOSpec:
    """A graph input or output of the TFLite model, and how to cross its boundary.

    ``onnx_shape`` is the ONNX (NCHW for rank 4) shape; ``tflite_shape`` the NHWC one for rank
    4, else equal. int8 tensors carry their ``scale`` / ``zero_point``.
    """

    name: str
    index: int  # tensor index in the TFLite subgraph
    onnx_shape: tuple[int, ...]
    tflite_shape: tuple[int, ...]
    dtype: str  # "int8" | "float32"
    scale: float = 0.0
    zero_point: int = 0

    @property
    def nhwc(self) -> bool:
        return len(self.onnx_shape) == 4

    def to_tflite(self, x: np.ndarray) -> np.ndarray:
        """ONNX-layout float data -> what the TFLite input takes (NHWC, quantised in int8)."""
        a = np.asarray(x, dtype=np.float32).reshape(self.onnx_shape)
        if self.nhwc:
            a = a.transpose(0, 2, 3, 1)
        if self.dtype == "int8":
            q = np.round(a / self.scale) + self.zero_point
            return np.ascontiguousarray(np.clip(q, INT8_MIN, INT8_MAX).astype(np.int8))
        return np.ascontiguousarray(a, dtype=np.float32)

    def from_tflite(self, y: np.ndarray) -> np.ndarray:
        """TFLite output -> float32 in the ONNX layout (dequantised in int8)."""
        a = np.asarray(y)
        if self.dtype == "int8":
            a = (a.astype(np.float32) - self.zero_point) * np.float32(self.scale)
        a = a.astype(np.float32).reshape(self.tflite_shape)
        if self.nhwc:
            a = a.transpose(0, 3, 1, 2)
        return np.ascontiguousarray(a)


@dataclass(frozen=True)
class OpInfo:
    """One TFLite operator: builtin name, the ONNX nodes it implements, and its work."""

    index: int
    op: str  # TFLite builtin name ("CONV_2D", ...)
    nodes: tuple[str, ...]  # ONNX node names; first: the node it was emitted for
    macs: int  # multiply-accumulates (conv / FC), 0 for the others
    bytes: int  # activation bytes read + written, plus constant bytes read


@dataclass(frozen=True)
class ConvertedModel:
    """A TFLite flatbuffer and what a caller needs to feed it and read it back."""

    tflite: bytes
    mode: str  # "int8" | "fp32"
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    ops: tuple[OpInfo, ...]

    @property
    def op_nodes(self) -> dict[int, tuple[str, ...]]:
        """TFLite operator index -> ONNX node names it implements."""
        return {o.index: o.nodes for o in self.ops}

    @property
    def op_to_node(self) -> dict[int, str]:
        """TFLite operator index -> the ONNX node it was emitted for."""
        return {o.index: o.nodes[0] for o in self.ops}

    def feeds(self, onnx_feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """ONNX-layout float feeds -> TFLite inputs by name (NHWC, quantised in int8)."""
        return {s.name: s.to_tflite(onnx_feeds[s.name]) for s in self.inputs}


# ----------------------------------------------------------------------------------------
# small helpers


def _ints(v: object, default: Sequence[int] = ()) -> tuple[int, ...]:
    if v is None:
        return tuple(default)
    if isinstance(v, (list, tuple)):
        return tuple(int(x) for x in v)
    return (int(v),)  # type: ignore[call-overload]


def _attr(node: Node, name: str, default: object = None) -> object:
    v = node.attrs.get(name, default)
    if isinstance(v, bytes):
        return v.decode()
    return v


def _nhwc(shape: Sequence[int]) -> tuple[int, ...]:
    s = tuple(shape)
    return (s[0], s[2], s[3], s[1]) if len(s) == 4 else s


def _layout_noop(onnx_shape: Sequence[int]) -> bool:
    """True when a rank-4 tensor has the same memory order in NCHW and NHWC."""
    nchw = [ax for ax in (0, 1, 2, 3) if onnx_shape[ax] != 1]
    nhwc = [ax for ax in (0, 2, 3, 1) if onnx_shape[ax] != 1]
    return nchw == nhwc


def _init_array(graph: DataflowGraph, name: str) -> np.ndarray | None:
    t = graph.initializers.get(name)
    if t is None:
        return None
    from onnx import numpy_helper

    return numpy_helper.to_array(t)


def _is_const(graph: DataflowGraph, name: str) -> bool:
    return bool(name) and name in graph.initializers


def act_qparams(lo: float, hi: float) -> tuple[float, int]:
    """Per-tensor asymmetric int8 (scale, zero point) for a real range; 0 is always exact."""
    lo = min(float(lo), 0.0)
    hi = max(float(hi), 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ConversionError(f"non-finite calibration range ({lo}, {hi})")
    if hi - lo < MIN_RANGE:
        hi = lo + MIN_RANGE
    scale = (hi - lo) / 255.0
    zp = round(INT8_MIN - lo / scale)
    return scale, max(INT8_MIN, min(INT8_MAX, zp))


_PIN_SIGMOID = (1.0 / 256.0, -128)
_PIN_TANH = (1.0 / 128.0, 0)

# ----------------------------------------------------------------------------------------
# padding


def _axis_modes(i: int, k: int, s: int, pb: int, pa: int, o: int) -> tuple[set[str], tuple]:
    """Which TFLite paddings reproduce this ONNX axis, and the explicit pads otherwise."""
    modes: set[str] = set()
    if pb == 0 and i >= k and (i - k) // s + 1 == o:
        modes.add("VALID")
    same_o = -(-i // s)
    total = max((same_o - 1) * s + k - i, 0)
    if o == same_o and pb == total // 2:
        modes.add("SAME")
    used_after = max(0, (o - 1) * s + k - i - pb)
    return modes, (pb, used_after)


def _resolve_pads(node: Node, in_hw: Sequence[int], k_eff: Sequence[int], strides: Sequence[int],
                  out_hw: Sequence[int]) -> tuple[str, tuple[tuple[int, int], ...] | None]:
    """("SAME"|"VALID", None), or ("VALID", ((top, bottom), (left, right))) for an explicit PAD.

    Raises ValueError when no padding reproduces the declared output size.
    """
    auto = str(_attr(node, "auto_pad", "NOTSET") or "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for i, k, s, o in zip(in_hw, k_eff, strides, out_hw):
            total = max((o - 1) * s + k - i, 0)
            before = total // 2 if auto == "SAME_UPPER" else total - total // 2
            begin.append(before)
            end.append(total - before)
        pads = begin + end
    elif auto == "VALID":
        pads = [0, 0, 0, 0]
    else:
        pads = list(_ints(_attr(node, "pads"), (0, 0, 0, 0)))
        if len(pads) != 4:
            raise ValueError(f"pads {pads} are not 2-D")
    per_axis = [
        _axis_modes(in_hw[d], k_eff[d], strides[d], pads[d], pads[d + 2], out_hw[d])
        for d in range(2)
    ]
    common = per_axis[0][0] & per_axis[1][0]
    if "VALID" in common:
        return "VALID", None
    if "SAME" in common:
        return "SAME", None
    explicit = tuple(p for _, p in per_axis)
    for d, (pb, pa) in enumerate(explicit):
        if (in_hw[d] + pb + pa - k_eff[d]) // strides[d] + 1 != out_hw[d]:
            raise ValueError(f"no padding gives output size {tuple(out_hw)}")
    return "VALID", explicit  # type: ignore[return-value]


def _pool_geometry(node: Node, graph: DataflowGraph) -> tuple:
    x = graph.tensors[node.inputs[0]].shape
    y = graph.tensors[node.outputs[0]].shape
    k = _ints(_attr(node, "kernel_shape"))
    s = _ints(_attr(node, "strides"), (1, 1))
    return x, y, k, s


# ----------------------------------------------------------------------------------------
# the capability check


def _float_io(node: Node, graph: DataflowGraph, inputs: Sequence[int] | None = None) -> str | None:
    idx = range(len(node.inputs)) if inputs is None else inputs
    for i in idx:
        t = node.inputs[i] if i < len(node.inputs) else ""
        if not t:
            continue
        info = graph.tensors.get(t)
        if info is None:
            return f"input {t!r} has no static shape"
        if info.elem_type != FLOAT:
            return f"input {t!r} is {info.dtype}, only float32 is converted"
    outs = [o for o in node.outputs if o]
    if not outs:
        return "no outputs"
    for o in outs:
        info = graph.tensors.get(o)
        if info is None:
            return f"output {o!r} has no static shape"
        if info.elem_type != FLOAT:
            return f"output {o!r} is {info.dtype}, only float32 is converted"
        if any(d <= 0 for d in info.shape):
            return f"output {o!r} has an empty dimension"
    return None


def _dyn_rank(graph: DataflowGraph, name: str) -> int:
    return len(graph.tensors[name].shape)


def _clip_bounds(node: Node, graph: DataflowGraph) -> tuple[float | None, float | None] | str:
    if "min" in node.attrs or "max" in node.attrs:  # opset < 11
        lo = node.attrs.get("min")
        hi = node.attrs.get("max")
        return (None if lo is None else float(lo), None if hi is None else float(hi))  # type: ignore[arg-type]
    out: list[float | None] = []
    for i in (1, 2):
        t = node.inputs[i] if len(node.inputs) > i else ""
        if not t:
            out.append(None)
            continue
        arr = _init_array(graph, t)
        if arr is None or arr.size != 1:
            return "Clip bounds must be constant scalars"
        out.append(float(arr.reshape(())))
    lo, hi = out
    if lo is not None and not math.isfinite(lo):
        lo = None
    if hi is not None and not math.isfinite(hi):
        hi = None
    return lo, hi


def _fused_act_code(node: Node, graph: DataflowGraph) -> str | None:
    """The TFLite fused activation a Relu / Clip node is, or None if it is not one."""
    if node.domain not in ("", "ai.onnx"):
        return None
    if node.op_type == "Relu":
        return "RELU"
    if node.op_type == "Clip":
        b = _clip_bounds(node, graph)
        if isinstance(b, str):
            return None
        if b == (0.0, 6.0):
            return "RELU6"
        if b == (-1.0, 1.0):
            return "RELU_N1_TO_1"
        if b == (0.0, None):
            return "RELU"
    return None


def _check_conv(node: Node, graph: DataflowGraph) -> str | None:
    why = _float_io(node, graph)
    if why:
        return why
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


def _check_pool(node: Node, graph: DataflowGraph) -> str | None:
    why = _float_io(node, graph)
    if why:
        return why
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


def _check_binary(node: Node, graph: DataflowGraph) -> str | None:
    why = _float_io(node, graph)
    if why:
        return why
    if len(node.inputs) != 2:
        return "needs two inputs"
    a, b = node.inputs
    ca, cb = _is_const(graph, a), _is_const(graph, b)
    if ca and cb:
        return "both operands are constants (fold them first)"
    if node.op_type == "Div" and not cb:
        return "Div is converted only with a constant divisor"
    if node.op_type == "Div":
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


def _check_reshape(node: Node, graph: DataflowGraph) -> str | None:
    why = _float_io(node, graph, inputs=[0])
    if why:
        return why
    if node.op_type == "Reshape" and (len(node.inputs) < 2 or not _is_const(graph,
                                                                           node.inputs[1])):
        return "shape must be a constant initializer"
    if node.op_type in ("Squeeze", "Unsqueeze") and len(node.inputs) > 1 and node.inputs[1] \
            and not _is_const(graph, node.inputs[1]):
        return "axes must be a constant initializer"
    if len(graph.tensors[node.outputs[0]].shape) > 6:
        return "rank > 6"
    return None


def _softmax_axis(node: Node, graph: DataflowGraph) -> int | str:
    shape = graph.tensors[node.inputs[0]].shape
    r = len(shape)
    opset = graph.opset
    axis = int(_attr(node, "axis", -1 if opset >= 13 else 1))  # type: ignore[arg-type]
    axis = axis + r if axis < 0 else axis
    if not 0 <= axis < r:
        return f"axis {axis} out of range"
    if opset < 13 and math.prod(shape[axis:-1]) != 1:
        return "opset < 13 Softmax over several trailing axes"
    if r == 4:
        mapped = {0: 0, 1: 3, 2: 1, 3: 2}[axis]
        nhwc = _nhwc(shape)
        if mapped != 3 and math.prod(nhwc[mapped + 1:]) != 1:
            return f"softmax axis {axis} is not the channel axis"
    elif axis != r - 1 and math.prod(shape[axis + 1:]) != 1:
        return f"softmax axis {axis} is not the last axis"
    return axis


def _check_softmax(node: Node, graph: DataflowGraph) -> str | None:
    why = _float_io(node, graph)
    if why:
        return why
    a = _softmax_axis(node, graph)
    return a if isinstance(a, str) else None


def _check_unary(node: Node, graph: DataflowGraph) -> str | None:
    why = _float_io(node, graph, inputs=[0])
    if why:
        return why
    if node.op_type == "Clip":
        b = _clip_bounds(node, graph)
        if isinstance(b, str):
            return b
        if b == (None, None):
            return "Clip without bounds (an identity)"
    return None


def _check_gemm(node: Node, graph: DataflowGraph) -> str | None:
    why = _float_io(node, graph)
    if why:
        return why
    a = graph.tensors[node.inputs[0]].shape
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


def _check_concat(node: Node, graph: DataflowGraph) -> str | None:
    why = _float_io(node, graph)
    if why:
        return why
    r = _dyn_rank(graph, node.outputs[0])
    for t in node.inputs:
        if not t:
            return "empty input"
        if _is_const(graph, t):
            return "constant inputs to Concat are not supported"
        if _dyn_rank(graph, t) != r:
            return "inputs of different rank"
    return None


def _check_global_pool(node: Node, graph: DataflowGraph) -> str | None:
    why = _float_io(node, graph)
    if why:
        return why
    if _dyn_rank(graph, node.inputs[0]) != 4:
        return "only 2-D global pooling"
    return None


def _check_pad(node: Node, graph: DataflowGraph) -> str | None:
    why = _float_io(node, graph, inputs=[0])
    if why:
        return why
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


_CHECKS: dict[str, Callable[[Node, DataflowGraph], str | None]] = {
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
}

#: ONNX op types the converter maps (subject to the per-node checks)
SUPPORTED_OPS: frozenset[str] = frozenset(_CHECKS)


def convertible(node: Node, graph: DataflowGraph) -> str | None:
    """None when `convert` maps this node, else the reason it does not. Never raises."""
    if node.domain not in ("", "ai.onnx"):
        return f"custom domain {node.domain!r}"
    check = _CHECKS.get(node.op_type)
    if check is None:
        return f"no TFLite mapping for {node.op_type}"
    try:
        return check(node, graph)
    except Exception as e:  # a malformed node must read as unsupported, not crash a search
        return f"cannot inspect node ({type(e).__name__}: {e})"


# ----------------------------------------------------------------------------------------
# the converter's own IR: tensors and ops, quantised after everything is emitted


@dataclass
class _T:
    name: str
    shape: tuple[int, ...]
    kind: str  # "act" | "weight" | "bias" | "const" | "like" | "int32"
    data: np.ndarray | None = None
    axis: int = 0  # per-channel axis of a weight
    range: tuple[float, float] | None = None  # calibrated (act)
    pin: tuple[float, int] | None = None  # fixed qparams (act)
    refs: tuple[int, ...] = ()  # bias: (input, weight); like: (act,)


@dataclass
class _Op:
    code: str
    inputs: list[int]
    outputs: list[int]
    options: tuple[str, tuple[tuple[str, Any], ...]] | None
    nodes: tuple[str, ...]
    macs: int = 0


_OPTIONS_FOR = {
    "CONV_2D": "Conv2DOptions",
    "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
    "FULLY_CONNECTED": "FullyConnectedOptions",
    "MAX_POOL_2D": "Pool2DOptions",
    "AVERAGE_POOL_2D": "Pool2DOptions",
    "ADD": "AddOptions",
    "SUB": "SubOptions",
    "MUL": "MulOptions",
    "RESHAPE": "ReshapeOptions",
    "CONCATENATION": "ConcatenationOptions",
    "SOFTMAX": "SoftmaxOptions",
    "MEAN": "ReducerOptions",
    "REDUCE_MAX": "ReducerOptions",
    "PAD": "PadOptions",
    "PADV2": "PadV2Options",
    "TRANSPOSE": "TransposeOptions",
    "MAXIMUM": "MaximumMinimumOptions",
    "MINIMUM": "MaximumMinimumOptions",
    "LEAKY_RELU": "LeakyReluOptions",
    "HARD_SWISH": "HardSwishOptions",
    "QUANTIZE": "QuantizeOptions",
}


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


class _Converter:
    def __init__(self, graph: DataflowGraph, mode: str,
                 ranges: Mapping[str, tuple[float, float]] | None) -> None:
        if mode not in ("int8", "fp32"):
            raise ValueError(f"mode must be 'int8' or 'fp32', not {mode!r}")
        self.g = graph
        self.mode = mode
        self.ranges = dict(ranges or {})
        self.tensors: list[_T] = []
        self.by_name: dict[str, int] = {}
        self.ops: list[_Op] = []
        self.ties: list[tuple[int, int, int | None]] = []  # (a, b, op index allowed to requant)
        outs = set(graph.graph_outputs)
        self.consumers: dict[str, list[Node]] = {}
        for n in graph.nodes:
            for t in set(n.inputs):
                if t:
                    self.consumers.setdefault(t, []).append(n)
        self.private = {t for t, cs in self.consumers.items() if len(cs) == 1 and t not in outs}

    # --- tensors -------------------------------------------------------------------------
    def _add(self, t: _T) -> int:
        self.tensors.append(t)
        return len(self.tensors) - 1

    def act(self, name: str) -> int:
        return self.by_name[name]

    def new_act(self, name: str, onnx_shape: Sequence[int] | None = None,
                tfl_shape: Sequence[int] | None = None, *, calibrated: bool = True,
                pin: tuple[float, int] | None = None) -> int:
        shape = tuple(tfl_shape) if tfl_shape is not None else _nhwc(onnx_shape or ())
        rng = self.ranges.get(name) if calibrated else None
        tid = self._add(_T(name, shape, "act", range=rng, pin=pin))
        if calibrated:
            self.by_name[name] = tid
        return tid

    def const(self, name: str, data: np.ndarray, kind: str, *, axis: int = 0,
              refs: tuple[int, ...] = ()) -> int:
        arr = np.asarray(data)
        arr = arr.astype(np.int32) if kind == "int32" else arr.astype(np.float32)
        return self._add(_T(name, tuple(arr.shape), kind, data=arr, axis=axis, refs=refs))

    def tie(self, a: int, b: int, requant_op: int | None = None) -> None:
        self.ties.append((a, b, requant_op))

    def out_onnx_shape(self, name: str) -> tuple[int, ...]:
        return self.g.tensors[name].shape

    def op(self, code: str, inputs: Sequence[int], outputs: Sequence[int], nodes: Sequence[str],
           options: Mapping[str, Any] | None = None, macs: int = 0) -> int:
        opts = None
        if code in _OPTIONS_FOR:
            opts = (_OPTIONS_FOR[code], tuple((options or {}).items()))
        self.ops.append(_Op(code, list(inputs), list(outputs), opts, tuple(nodes), macs))
        return len(self.ops) - 1

    # --- planning: folds and fused activations --------------------------------------------
    def _sole_consumer(self, tensor: str) -> Node | None:
        if tensor not in self.private:
            return None
        return self.consumers[tensor][0]

    def _per_channel_const(self, add: Node, tensor: str, channels: int, channel_axis: int,
                           out_rank: int) -> np.ndarray | None:
        """The per-channel vector an Add's constant operand is, or None."""
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.inputs) != 2:
            return None
        other = add.inputs[1] if add.inputs[0] == tensor else add.inputs[0]
        if add.inputs[0] == add.inputs[1]:
            return None
        arr = _init_array(self.g, other)
        if arr is None or arr.dtype != np.float32 or arr.ndim > out_rank:
            return None
        if self.g.tensors[add.outputs[0]].shape != self.g.tensors[tensor].shape:
            return None
        full = arr.reshape((1,) * (out_rank - arr.ndim) + arr.shape)
        for ax, d in enumerate(full.shape):
            if ax != channel_axis and d != 1:
                return None
        if full.shape[channel_axis] not in (1, channels):
            return None
        return np.broadcast_to(full.reshape(-1), (channels,)).astype(np.float32)

    def plan(self) -> dict[int, tuple[Node | None, Node | None]]:
        """Per node index: the bias Add folded into it and the activation fused into it."""
        plan: dict[int, tuple[Node | None, Node | None]] = {}
        absorbed: set[int] = set()
        self.bias_of: dict[int, np.ndarray] = {}
        for n in self.g.nodes:
            if n.index in absorbed:
                continue
            bias_node = act_node = None
            out = n.outputs[0] if n.outputs else ""
            if n.op_type in ("Conv", "Gemm", "MatMul"):
                c = self._sole_consumer(out)
                shape = self.g.tensors[out].shape
                ch_axis = 1 if n.op_type == "Conv" else len(shape) - 1
                vec = None if c is None else self._per_channel_const(
                    c, out, shape[ch_axis], ch_axis, len(shape))
                if vec is not None:
                    bias_node = c
                    self.bias_of[n.index] = vec
                    absorbed.add(c.index)
                    out = c.outputs[0]
            if n.op_type in ("Conv", "Gemm", "MatMul", "Add", "Sub", "Mul", "Div", "MaxPool",
                             "AveragePool", "Concat"):
                c = self._sole_consumer(out)
                if c is not None and _fused_act_code(c, self.g) is not None \
                        and self.g.tensors[c.outputs[0]].shape == self.g.tensors[out].shape:
                    act_node = c
                    absorbed.add(c.index)
            if bias_node is not None or act_node is not None:
                plan[n.index] = (bias_node, act_node)
        self.absorbed = absorbed
        return plan

    # --- the whole conversion --------------------------------------------------------------
    def run(self) -> ConvertedModel:
        g = self.g
        for n in g.nodes:
            why = convertible(n, g)
            if why is not None:
                raise UnsupportedOp(n.name, n.op_type, why)
        plan = self.plan()
        for name in g.graph_inputs:
            info = g.tensors.get(name)
            if info is None or info.elem_type != FLOAT:
                raise ConversionError(f"graph input {name!r} is not a float32 tensor")
            self.new_act(name, info.shape)
        for n in g.nodes:
            if n.index in self.absorbed:
                continue
            bias_node, act_node = plan.get(n.index, (None, None))
            out = (act_node or bias_node or n).outputs[0]
            nodes = tuple(x.name for x in (n, bias_node, act_node) if x is not None)
            act = _fused_act_code(act_node, g) if act_node is not None else None
            getattr(self, f"_emit_{n.op_type.lower()}")(n, out, nodes, act or "NONE")
        for o in g.graph_outputs:
            if o not in self.by_name:
                raise ConversionError(f"graph output {o!r} is not produced by a converted node")
        return self.finish()

    # --- emitters --------------------------------------------------------------------------
    def _emit_conv(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        g = self.g
        x_shape = g.tensors[n.inputs[0]].shape
        y_shape = g.tensors[n.outputs[0]].shape
        w = _init_array(g, n.inputs[1]).astype(np.float32)  # type: ignore[union-attr]
        o_ch, _, kh, kw = w.shape
        bias = np.zeros(o_ch, np.float32)
        if len(n.inputs) > 2 and n.inputs[2]:
            bias = bias + _init_array(g, n.inputs[2]).astype(np.float32).reshape(-1)  # type: ignore[union-attr]
        if n.index in self.bias_of:
            bias = bias + self.bias_of[n.index]
        group = int(_attr(n, "group", 1))  # type: ignore[arg-type]
        d = _ints(_attr(n, "dilations"), (1, 1))
        s = _ints(_attr(n, "strides"), (1, 1))
        k_eff = ((kh - 1) * d[0] + 1, (kw - 1) * d[1] + 1)
        padding, explicit = _resolve_pads(n, x_shape[2:], k_eff, s, y_shape[2:])
        x = self.act(n.inputs[0])
        if explicit is not None:
            x = self._pad(x, explicit, n, "PAD")
        y = self.new_act(out, y_shape)
        depthwise = group != 1
        if depthwise:
            wt = w.transpose(1, 2, 3, 0)  # [C*M, 1, kh, kw] -> [1, kh, kw, C*M]
            wid = self.const(f"{n.name}/weights", wt, "weight", axis=3)
        else:
            wt = w.transpose(0, 2, 3, 1)  # OIHW -> OHWI
            wid = self.const(f"{n.name}/weights", wt, "weight", axis=0)
        bid = self.const(f"{n.name}/bias", bias, "bias", refs=(x, wid))
        macs = int(np.prod(y_shape)) * kh * kw * w.shape[1]
        opts: dict[str, Any] = {"Padding": 0 if padding == "SAME" else 1, "StrideW": s[1],
                                "StrideH": s[0], "FusedActivationFunction": _act_enum(act),
                                "DilationWFactor": d[1], "DilationHFactor": d[0]}
        if depthwise:
            opts["DepthMultiplier"] = o_ch // x_shape[1]
        self.op("DEPTHWISE_CONV_2D" if depthwise else "CONV_2D", [x, wid, bid], [y], nodes,
                opts, macs)

    def _pad(self, x: int, explicit: tuple, n: Node, code: str) -> int:
        (pt, pb), (pl, pr) = explicit
        shape = self.tensors[x].shape
        padded_shape = (shape[0], shape[1] + pt + pb, shape[2] + pl + pr, shape[3])
        pads = self.const(f"{n.name}/paddings", np.array([[0, 0], [pt, pb], [pl, pr], [0, 0]]),
                          "int32")
        xp = self.new_act(f"{n.name}/padded", tfl_shape=padded_shape, calibrated=False)
        ins = [x, pads]
        if code == "PADV2":  # MaxPool: pad with the lowest value, never selected
            low = self.const(f"{n.name}/pad_value", np.array([np.finfo(np.float32).min]),
                             "like", refs=(x,))
            ins.append(low)
        self.tie(x, xp)
        self.op(code, ins, [xp], (n.name,))
        return xp

    def _emit_gemm(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        g = self.g
        a_shape = g.tensors[n.inputs[0]].shape
        y_shape = g.tensors[n.outputs[0]].shape
        b = _init_array(g, n.inputs[1]).astype(np.float32)  # type: ignore[union-attr]
        if n.op_type == "Gemm":
            w = b if int(_attr(n, "transB", 0)) else b.T  # type: ignore[arg-type]
            w = w * np.float32(_attr(n, "alpha", 1.0))
        else:
            w = b.T
        n_out = w.shape[0]
        bias = np.zeros(n_out, np.float32)
        if n.op_type == "Gemm" and len(n.inputs) > 2 and n.inputs[2]:
            c = _init_array(g, n.inputs[2]).astype(np.float32).reshape(-1)  # type: ignore[union-attr]
            bias = bias + np.float32(_attr(n, "beta", 1.0)) * np.broadcast_to(c, (n_out,))
        if n.index in self.bias_of:
            bias = bias + self.bias_of[n.index]
        x = self.act(n.inputs[0])
        y = self.new_act(out, y_shape)
        wid = self.const(f"{n.name}/weights", np.ascontiguousarray(w), "weight", axis=0)
        bid = self.const(f"{n.name}/bias", bias, "bias", refs=(x, wid))
        macs = int(np.prod(y_shape)) * w.shape[1]
        self.op("FULLY_CONNECTED", [x, wid, bid], [y], nodes,
                {"FusedActivationFunction": _act_enum(act),
                 "KeepNumDims": len(a_shape) > 2}, macs)

    _emit_matmul = _emit_gemm

    def _operand(self, n: Node, t: str, out_rank: int, kind: str = "const",
                 transform: Callable[[np.ndarray], np.ndarray] | None = None,
                 refs: tuple[int, ...] = ()) -> int:
        arr = _init_array(self.g, t)
        if arr is None:
            return self.act(t)
        arr = arr.astype(np.float32)
        if transform is not None:
            arr = transform(arr)
        arr = arr.reshape((1,) * (out_rank - arr.ndim) + arr.shape)
        if out_rank == 4:
            arr = arr.transpose(0, 2, 3, 1)
        return self.const(f"{n.name}/{t}", np.ascontiguousarray(arr), kind, refs=refs)

    def _emit_binary(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y_shape = self.g.tensors[n.outputs[0]].shape
        r = len(y_shape)
        code = {"Add": "ADD", "Sub": "SUB", "Mul": "MUL", "Div": "MUL"}[n.op_type]
        a = self._operand(n, n.inputs[0], r)
        recip = (lambda v: (1.0 / v).astype(np.float32)) if n.op_type == "Div" else None
        b = self._operand(n, n.inputs[1], r, transform=recip)
        y = self.new_act(out, y_shape)
        self.op(code, [a, b], [y], nodes, {"FusedActivationFunction": _act_enum(act)})

    _emit_add = _emit_sub = _emit_mul = _emit_div = _emit_binary

    def _emit_maxpool(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        x_shape, y_shape, k, s = _pool_geometry(n, self.g)
        padding, explicit = _resolve_pads(n, x_shape[2:], k, s, y_shape[2:])
        avg = n.op_type == "AveragePool"
        if avg:
            pads = _ints(_attr(n, "pads"), (0, 0, 0, 0))
            if int(_attr(n, "count_include_pad", 0)) and padding == "SAME" and any(pads):  # type: ignore[arg-type]
                padding, explicit = "VALID", ((pads[0], pads[2]), (pads[1], pads[3]))
        x = self.act(n.inputs[0])
        if explicit is not None:
            x = self._pad(x, explicit, n, "PAD" if avg else "PADV2")
        y = self.new_act(out, y_shape)
        self.tie(x, y)
        self.op("AVERAGE_POOL_2D" if avg else "MAX_POOL_2D", [x], [y], nodes,
                {"Padding": 0 if padding == "SAME" else 1, "StrideW": s[1], "StrideH": s[0],
                 "FilterWidth": k[1], "FilterHeight": k[0],
                 "FusedActivationFunction": _act_enum(act)})

    _emit_averagepool = _emit_maxpool

    def _emit_globalaveragepool(self, n: Node, out: str, nodes: tuple[str, ...],
                                act: str) -> None:
        x = self.act(n.inputs[0])
        y = self.new_act(out, self.g.tensors[n.outputs[0]].shape)
        axes = self.const(f"{n.name}/axes", np.array([1, 2]), "int32")
        if n.op_type == "GlobalMaxPool":
            self.tie(x, y)
        self.op("REDUCE_MAX" if n.op_type == "GlobalMaxPool" else "MEAN", [x, axes], [y], nodes,
                {"KeepDims": True})

    _emit_globalmaxpool = _emit_globalaveragepool

    def _emit_reshape(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        in_shape = self.g.tensors[n.inputs[0]].shape
        out_shape = self.g.tensors[n.outputs[0]].shape
        x = self.act(n.inputs[0])
        cur = x
        if len(in_shape) == 4 and not _layout_noop(in_shape):
            perm = self.const(f"{n.name}/to_nchw_perm", np.array([0, 3, 1, 2]), "int32")
            t = self.new_act(f"{n.name}/nchw", tfl_shape=in_shape, calibrated=False)
            self.tie(cur, t)
            self.op("TRANSPOSE", [cur, perm], [t], nodes)
            cur = t
        to_nhwc = len(out_shape) == 4 and not _layout_noop(out_shape)
        if to_nhwc:
            mid = self.new_act(f"{n.name}/reshaped", tfl_shape=out_shape, calibrated=False)
            target = out_shape
        else:
            mid = self.new_act(out, out_shape)
            target = _nhwc(out_shape)
        shp = self.const(f"{n.name}/shape", np.array(target), "int32")
        self.tie(cur, mid)
        self.op("RESHAPE", [cur, shp], [mid], nodes, {"NewShape": list(target)})
        if to_nhwc:
            perm = self.const(f"{n.name}/to_nhwc_perm", np.array([0, 2, 3, 1]), "int32")
            y = self.new_act(out, out_shape)
            self.tie(mid, y)
            self.op("TRANSPOSE", [mid, perm], [y], nodes)

    _emit_flatten = _emit_squeeze = _emit_unsqueeze = _emit_reshape

    def _emit_softmax(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        x = self.act(n.inputs[0])
        y = self.new_act(out, self.g.tensors[n.outputs[0]].shape, pin=_PIN_SIGMOID)
        self.op("SOFTMAX", [x], [y], nodes, {"Beta": 1.0})

    def _emit_concat(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y_shape = self.g.tensors[n.outputs[0]].shape
        r = len(y_shape)
        axis = int(_attr(n, "axis", 1))  # type: ignore[arg-type]
        axis = axis + r if axis < 0 else axis
        if r == 4:
            axis = {0: 0, 1: 3, 2: 1, 3: 2}[axis]
        xs = [self.act(t) for t in n.inputs]
        y = self.new_act(out, y_shape)
        idx = len(self.ops)
        for x in xs:
            self.tie(x, y, requant_op=idx)
        self.op("CONCATENATION", xs, [y], nodes,
                {"Axis": axis, "FusedActivationFunction": _act_enum(act)})

    def _emit_unary(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y_shape = self.g.tensors[n.outputs[0]].shape
        x = self.act(n.inputs[0])
        t = n.op_type
        if t == "Sigmoid":
            y = self.new_act(out, y_shape, pin=_PIN_SIGMOID)
            self.op("LOGISTIC", [x], [y], nodes)
        elif t == "Tanh":
            y = self.new_act(out, y_shape, pin=_PIN_TANH)
            self.op("TANH", [x], [y], nodes)
        elif t == "LeakyRelu":
            y = self.new_act(out, y_shape)
            self.op("LEAKY_RELU", [x], [y], nodes, {"Alpha": float(_attr(n, "alpha", 0.01))})  # type: ignore[arg-type]
        elif t == "HardSwish":
            y = self.new_act(out, y_shape)
            self.op("HARD_SWISH", [x], [y], nodes)
        else:
            code = _fused_act_code(n, self.g)
            if code is not None:
                y = self.new_act(out, y_shape)
                self.op(code, [x], [y], nodes)
                return
            lo, hi = _clip_bounds(n, self.g)  # type: ignore[misc]
            cur = x
            for bound, op_code in ((lo, "MAXIMUM"), (hi, "MINIMUM")):
                if bound is None:
                    continue
                last = op_code == "MINIMUM" or hi is None
                c = self.const(f"{n.name}/{op_code.lower()}",
                               np.full((1,) * len(y_shape), bound, np.float32), "like",
                               refs=(cur,))
                y = self.new_act(out, y_shape) if last else self.new_act(
                    f"{n.name}/clipped_low", y_shape, calibrated=False)
                self.tie(cur, y)
                self.op(op_code, [cur, c], [y], nodes)
                cur = y

    _emit_relu = _emit_clip = _emit_sigmoid = _emit_tanh = _emit_unary
    _emit_leakyrelu = _emit_hardswish = _emit_unary

    def _emit_pad(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y_shape = self.g.tensors[n.outputs[0]].shape
        r = len(y_shape)
        pads = _init_array(self.g, n.inputs[1]).astype(np.int64).reshape(-1)  # type: ignore[union-attr]
        pairs = [[int(pads[i]), int(pads[i + r])] for i in range(r)]
        if r == 4:
            pairs = [pairs[0], pairs[2], pairs[3], pairs[1]]
        x = self.act(n.inputs[0])
        p = self.const(f"{n.name}/paddings", np.array(pairs), "int32")
        y = self.new_act(out, y_shape)
        self.tie(x, y)
        self.op("PAD", [x, p], [y], nodes)

    # --- quantisation and serialisation ----------------------------------------------------
    def _resolve_qparams(self) -> dict[int, tuple[float, int]]:
        """Per activation tensor (scale, zero point): ties unioned, pins kept, concat requants.

        Ties without a requantising op (pools, reshapes, pads, min/max) must share parameters;
        two different pins meeting there is an error. A Concat's output is never pinned through
        one of its inputs (a Sigmoid input would otherwise squeeze a ReLU input into [0, 1)):
        its unpinned inputs join the output's group, its pinned inputs join only when every
        input carries that same pin, and otherwise each pinned input is requantised (QUANTIZE)
        into the output's calibrated parameters.
        """
        uf = _UnionFind()
        pins: dict[int, tuple[float, int]] = {}
        for i, t in enumerate(self.tensors):
            if t.kind == "act":
                uf.find(i)
                if t.pin is not None:
                    pins[i] = t.pin

        def union(a: int, b: int) -> None:
            ra, rb = uf.find(a), uf.find(b)
            if ra == rb:
                return
            pa, pb = pins.pop(ra, None), pins.pop(rb, None)
            if pa is not None and pb is not None and pa != pb:
                raise ConversionError(
                    f"tensors {self.tensors[a].name!r} and {self.tensors[b].name!r} need "
                    f"equal quantisation but are pinned differently")
            uf.union(ra, rb)
            if (pa or pb) is not None:
                pins[uf.find(ra)] = pa or pb  # type: ignore[assignment]

        concat: dict[int, list[tuple[int, int]]] = {}
        for a, b, op_idx in self.ties:
            if op_idx is None:
                union(a, b)
            else:
                concat.setdefault(op_idx, []).append((a, b))
        requant: list[tuple[int, int]] = []  # (op index, input tensor)
        for op_idx, pairs in concat.items():
            pinned = [(a, b) for a, b in pairs if uf.find(a) in pins]
            for a, b in pairs:
                if (a, b) not in pinned:
                    union(a, b)
            if not pinned:
                continue
            out = pairs[0][1]
            kinds = {pins[uf.find(a)] for a, _ in pinned}
            if len(pinned) == len(pairs) and len(kinds) == 1 \
                    and pins.get(uf.find(out), next(iter(kinds))) in kinds:
                for a, b in pinned:
                    union(a, b)
                continue
            for a, _ in pinned:
                if (op_idx, a) not in requant:
                    requant.append((op_idx, a))
        groups: dict[int, list[int]] = {}
        for i, t in enumerate(self.tensors):
            if t.kind == "act":
                groups.setdefault(uf.find(i), []).append(i)
        q: dict[int, tuple[float, int]] = {}
        for root, members in groups.items():
            if root in pins:
                qp = pins[root]
            else:
                rs = [self.tensors[m].range for m in members if self.tensors[m].range]
                if not rs:
                    names = ", ".join(self.tensors[m].name for m in members)
                    raise MissingRangeError(f"no calibrated range for tensor(s) {names}")
                qp = act_qparams(min(r[0] for r in rs), max(r[1] for r in rs))  # type: ignore[index]
            for m in members:
                q[m] = qp
        # requantise pinned inputs whose parameters differ from their concat's output
        # (descending op index, so inserting before one op never shifts a later-handled one)
        for op_idx in sorted({i for i, _ in requant}, reverse=True):
            op = self.ops[op_idx]
            inserted: list[_Op] = []
            for tid in (t for i, t in requant if i == op_idx):
                if q[tid] == q[op.outputs[0]]:
                    continue
                src = self.tensors[tid]
                rq = self._add(_T(f"{src.name}/requantized", src.shape, "act"))
                q[rq] = q[op.outputs[0]]
                op.inputs = [rq if i == tid else i for i in op.inputs]
                inserted.append(_Op("QUANTIZE", [tid], [rq], ("QuantizeOptions", ()), op.nodes))
            self.ops[op_idx:op_idx] = inserted
        return q

    def finish(self) -> ConvertedModel:
        q = self._resolve_qparams() if self.mode == "int8" else {}
        return _serialise(self, q)


def _act_enum(name: str) -> int:
    return {"NONE": 0, "RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3, "TANH": 4}[name]


# ----------------------------------------------------------------------------------------
# quantised tensor data


@dataclass
class _Encoded:
    ttype: int  # TensorType
    data: bytes | None
    scale: tuple[float, ...] = ()
    zero_point: tuple[int, ...] = ()
    axis: int = 0


def _encode(conv: _Converter, tid: int, q: Mapping[int, tuple[float, int]],
            weight_scales: dict[int, np.ndarray]) -> _Encoded:
    t = conv.tensors[tid]
    int8 = conv.mode == "int8"
    if t.kind == "int32":
        return _Encoded(2, np.ascontiguousarray(t.data, np.int32).tobytes())  # type: ignore[arg-type]
    if not int8:
        data = None if t.data is None else np.ascontiguousarray(t.data, np.float32).tobytes()
        return _Encoded(0, data)
    if t.kind == "act":
        s, zp = q[tid]
        return _Encoded(9, None, (s,), (zp,))
    assert t.data is not None
    if t.kind == "weight":
        w = t.data
        other = tuple(a for a in range(w.ndim) if a != t.axis)
        maxabs = np.max(np.abs(w), axis=other) if other else np.abs(w)
        scales = np.maximum(maxabs, 1e-12).astype(np.float64) / 127.0
        shape = [1] * w.ndim
        shape[t.axis] = -1
        qw = np.clip(np.round(w / scales.reshape(shape)), -127, 127).astype(np.int8)
        weight_scales[tid] = scales
        return _Encoded(9, qw.tobytes(), tuple(float(x) for x in scales),
                        (0,) * len(scales), t.axis)
    if t.kind == "bias":
        x_tid, w_tid = t.refs
        if w_tid not in weight_scales:
            _encode(conv, w_tid, q, weight_scales)
        s_in = q[x_tid][0]
        scales = s_in * weight_scales[w_tid]
        qb = np.clip(np.round(t.data.astype(np.float64) / scales), -(2**31), 2**31 - 1)
        return _Encoded(2, qb.astype(np.int32).tobytes(), tuple(float(x) for x in scales),
                        (0,) * len(scales), 0)
    if t.kind == "like":
        s, zp = q[t.refs[0]]
    else:  # "const": its own per-tensor asymmetric parameters
        s, zp = act_qparams(float(t.data.min()), float(t.data.max()))
    qc = np.clip(np.round(t.data.astype(np.float64) / s) + zp, INT8_MIN, INT8_MAX)
    return _Encoded(9, qc.astype(np.int8).tobytes(), (s,), (zp,))


def _activation_bytes(conv: _Converter, tid: int) -> int:
    t = conv.tensors[tid]
    item = 1 if conv.mode == "int8" else 4
    if t.kind == "int32":
        return 0
    if t.kind == "bias":
        return int(np.prod(t.shape)) * 4
    return int(np.prod(t.shape)) * item


def _serialise(conv: _Converter, q: Mapping[int, tuple[float, int]]) -> ConvertedModel:
    import flatbuffers
    from ethosu.vela.tflite import (
        Buffer,
        BuiltinOperator,
        BuiltinOptions,
        Model,
        Operator,
        OperatorCode,
        QuantizationParameters,
        SubGraph,
        Tensor,
    )

    # sized once, generously: growing the builder copies every weight byte again
    b = flatbuffers.Builder((1 << 20) + 64 * len(conv.tensors) + sum(
        (t.data.nbytes + 32 if t.data is not None else 0) for t in conv.tensors))
    weight_scales: dict[int, np.ndarray] = {}
    enc = [_encode(conv, i, q, weight_scales) for i in range(len(conv.tensors))]

    def i32_vec(vals: Sequence[int]) -> int:
        return b.CreateNumpyVector(np.asarray(list(vals), dtype=np.int32))

    def byte_vec(data: bytes, align: int = 16) -> int:
        b.StartVector(1, len(data), align)
        b.head = b.head - len(data)
        b.Bytes[b.head:b.head + len(data)] = data
        return b.EndVector()

    # buffers: 0 is the empty sentinel, then one per constant tensor
    buffer_of: dict[int, int] = {}
    buffer_data: list[bytes | None] = [None]
    for i, e in enumerate(enc):
        if e.data is not None:
            buffer_of[i] = len(buffer_data)
            buffer_data.append(e.data)
    buf_offsets = []
    for data in buffer_data:
        dv = byte_vec(data) if data else None
        Buffer.BufferStart(b)
        if dv is not None:
            Buffer.BufferAddData(b, dv)
        buf_offsets.append(Buffer.BufferEnd(b))

    tensor_offsets = []
    for i, (t, e) in enumerate(zip(conv.tensors, enc)):
        name = b.CreateString(t.name)
        shape = i32_vec(t.shape)
        qoff = None
        if e.scale:
            sv = b.CreateNumpyVector(np.asarray(e.scale, dtype=np.float32))
            zv = b.CreateNumpyVector(np.asarray(e.zero_point, dtype=np.int64))
            QuantizationParameters.QuantizationParametersStart(b)
            QuantizationParameters.QuantizationParametersAddScale(b, sv)
            QuantizationParameters.QuantizationParametersAddZeroPoint(b, zv)
            QuantizationParameters.QuantizationParametersAddQuantizedDimension(b, e.axis)
            qoff = QuantizationParameters.QuantizationParametersEnd(b)
        Tensor.TensorStart(b)
        Tensor.TensorAddShape(b, shape)
        Tensor.TensorAddType(b, e.ttype)
        Tensor.TensorAddBuffer(b, buffer_of.get(i, 0))
        Tensor.TensorAddName(b, name)
        if qoff is not None:
            Tensor.TensorAddQuantization(b, qoff)
        tensor_offsets.append(Tensor.TensorEnd(b))

    codes: list[str] = []
    for op in conv.ops:
        if op.code not in codes:
            codes.append(op.code)
    code_offsets = []
    for c in codes:
        num = getattr(BuiltinOperator.BuiltinOperator, c)
        OperatorCode.OperatorCodeStart(b)
        OperatorCode.OperatorCodeAddDeprecatedBuiltinCode(b, min(num, 127))
        OperatorCode.OperatorCodeAddBuiltinCode(b, num)
        OperatorCode.OperatorCodeAddVersion(b, 1)
        code_offsets.append(OperatorCode.OperatorCodeEnd(b))

    op_offsets = []
    for op in conv.ops:
        opt_off = opt_type = None
        if op.options is not None:
            tname, fields = op.options
            mod = __import__(f"ethosu.vela.tflite.{tname}", fromlist=[tname])
            prepared = []
            for key, val in fields:
                if isinstance(val, list):
                    val = i32_vec(val)
                prepared.append((key, val))
            getattr(mod, f"{tname}Start")(b)
            for key, val in prepared:
                getattr(mod, f"{tname}Add{key}")(b, val)
            opt_off = getattr(mod, f"{tname}End")(b)
            opt_type = getattr(BuiltinOptions.BuiltinOptions, tname)
        ins = i32_vec(op.inputs)
        outs = i32_vec(op.outputs)
        Operator.OperatorStart(b)
        Operator.OperatorAddOpcodeIndex(b, codes.index(op.code))
        Operator.OperatorAddInputs(b, ins)
        Operator.OperatorAddOutputs(b, outs)
        if opt_off is not None:
            Operator.OperatorAddBuiltinOptionsType(b, opt_type)
            Operator.OperatorAddBuiltinOptions(b, opt_off)
        op_offsets.append(Operator.OperatorEnd(b))

    g = conv.g
    in_ids = [conv.by_name[n] for n in g.graph_inputs]
    out_ids = [conv.by_name[n] for n in g.graph_outputs]

    def vec_of(offsets: list[int]) -> int:
        b.StartVector(4, len(offsets), 4)
        for off in reversed(offsets):
            b.PrependUOffsetTRelative(off)
        return b.EndVector()

    tv = vec_of(tensor_offsets)
    ov = vec_of(op_offsets)
    iv = i32_vec(in_ids)
    outv = i32_vec(out_ids)
    sg_name = b.CreateString(g.name or "main")
    SubGraph.SubGraphStart(b)
    SubGraph.SubGraphAddTensors(b, tv)
    SubGraph.SubGraphAddInputs(b, iv)
    SubGraph.SubGraphAddOutputs(b, outv)
    SubGraph.SubGraphAddOperators(b, ov)
    SubGraph.SubGraphAddName(b, sg_name)
    sg = SubGraph.SubGraphEnd(b)
    sgv = vec_of([sg])
    cv = vec_of(code_offsets)
    bv = vec_of(buf_offsets)
    desc = b.CreateString(f"collage-farm tflite_convert ({conv.mode})")
    Model.ModelStart(b)
    Model.ModelAddVersion(b, 3)
    Model.ModelAddOperatorCodes(b, cv)
    Model.ModelAddSubgraphs(b, sgv)
    Model.ModelAddDescription(b, desc)
    Model.ModelAddBuffers(b, bv)
    m = Model.ModelEnd(b)
    b.Finish(m, file_identifier=b"TFL3")
    data = bytes(b.Output())

    def io(tid: int, name: str) -> IOSpec:
        e = enc[tid]
        return IOSpec(
            name=name, index=tid, onnx_shape=tuple(g.tensors[name].shape),
            tflite_shape=conv.tensors[tid].shape,
            dtype="int8" if conv.mode == "int8" else "float32",
            scale=float(e.scale[0]) if e.scale else 0.0,
            zero_point=int(e.zero_point[0]) if e.zero_point else 0,
        )

    ops = tuple(
        OpInfo(i, op.code, op.nodes, op.macs,
               sum(_activation_bytes(conv, t) for t in (*op.inputs, *op.outputs)))
        for i, op in enumerate(conv.ops)
    )
    return ConvertedModel(
        tflite=data,
        mode=conv.mode,
        inputs=tuple(io(t, n) for t, n in zip(in_ids, g.graph_inputs)),
        outputs=tuple(io(t, n) for t, n in zip(out_ids, g.graph_outputs)),
        ops=ops,
    )


# ----------------------------------------------------------------------------------------
# entry point


def convert(
    model: bytes | onnx.ModelProto | DataflowGraph,
    mode: str = "int8",
    tensor_ranges: Mapping[str, tuple[float, float]] | Sequence[tuple[str, float, float]]
    | None = None,
) -> ConvertedModel:
    """Convert a standalone ONNX (sub-)model to TFLite.

    ``mode``: ``"int8"`` (full-integer; needs ``tensor_ranges`` for every graph input and every
    node output that survives fusion) or ``"fp32"``. ``tensor_ranges`` maps ONNX tensor names to
    calibrated (min, max), as a mapping or as ``BuildInput.tensor_ranges`` triples.

    Raises `UnsupportedOp` for a node `convertible` refuses, `MissingRangeError` when a range
    is missing, `ConversionError` for anything else the writer cannot express.
    """
    from collage_farm.graph import DataflowGraph, load_graph

    graph = model if isinstance(model, DataflowGraph) else load_graph(model)
    ranges: dict[str, tuple[float, float]]
    if tensor_ranges is None:
        ranges = {}
    elif isinstance(tensor_ranges, Mapping):
        ranges = {k: (float(v[0]), float(v[1])) for k, v in tensor_ranges.items()}
    else:
        ranges = {k: (float(lo), float(hi)) for k, lo, hi in tensor_ranges}
    return _Converter(graph, mode, ranges).run()

