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
is emitted, unless it is a no-op in memory (e.g. [1, C, 1, 1] after a global pool). fp32 ops
that need the ONNX layout (BATCH_MATMUL, a last-axis SOFTMAX, GATHER) are wrapped the same way.
In fp32 mode a peephole pass (`_TransposeOptimiser`) then removes the layout churn this leaves
between ops (attention would otherwise go NHWC -> NCHW -> NHWC around every op): inverse pairs
cancel, consecutive transposes compose, transposes sink through elementwise ops to meet each
other, transpose/reshape chains that move no data become one RESHAPE, and a last-two-axes
transpose into BATCH_MATMUL becomes ``adj_y``. Interior tensors may therefore end up NCHW; the
graph inputs and outputs stay NHWC. int8 output is untouched by the pass.

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

    from collage_farm.core.graph import DataflowGraph, Node

#: bumped when the TFLite written for the same sub-graph changes (new op mappings, the transpose
#: peephole, ...): part of the LiteRT toolchain version, so cost-table rows of older output are
#: not reused under the default (exact) strictness
CONVERTER_REVISION = 2

__all__ = [
    "SUPPORTED_OPS",
    "SUPPORTED_OPS_FP32",
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
    dtype: str  # "int8" | "float32" | "int32" / "int64" (integer inputs, fp32 mode)
    scale: float = 0.0
    zero_point: int = 0

    @property
    def nhwc(self) -> bool:
        return len(self.onnx_shape) == 4 and self.dtype in ("float32", "int8")

    def to_tflite(self, x: np.ndarray) -> np.ndarray:
        """ONNX-layout float data -> what the TFLite input takes (NHWC, quantised in int8)."""
        if self.dtype in ("int32", "int64"):  # integer ids: ONNX layout, no transpose
            return np.ascontiguousarray(np.asarray(x).astype(self.dtype).reshape(self.onnx_shape))
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
    """An initializer's value, or a value the converter computes at conversion time.

    The loader folds Constant nodes but leaves shape arithmetic (Shape -> Cast -> Slice ->
    Concat -> Reshape, as paddle2onnx writes it) and ops on constants (a Gather of a position
    table by constant ids) in the graph; every shape is static once inputs are bound, so those
    values are constants and consumers may treat them exactly like initializers.
    """
    if not name:
        return None
    t = graph.initializers.get(name)
    if t is not None:
        from onnx import numpy_helper

        return numpy_helper.to_array(t)
    return _static_values(graph).get(name)


def _is_const(graph: DataflowGraph, name: str) -> bool:
    return bool(name) and (name in graph.initializers or name in _static_values(graph))


# ----------------------------------------------------------------------------------------
# conversion-time evaluation (shape arithmetic, ops on constants)

#: ops evaluated in numpy when every input is a constant (Shape: when its input's shape is)
_FOLDABLE = frozenset({"Shape", "Cast", "Slice", "Concat", "Gather", "Squeeze", "Unsqueeze",
                       "Reshape", "Transpose", "Identity", "Add", "Sub", "Mul", "Div"})
#: folded constants larger than this stay nodes (a huge folded table would bloat every model)
_FOLD_MAX_ELEMENTS = 1 << 22


def _fold_node(node: Node, graph: DataflowGraph, vals: Mapping[str, np.ndarray]
               ) -> np.ndarray | None:
    """numpy evaluation of one foldable node, or None (never raises for a foldable case)."""
    from onnx import helper

    op = node.op_type
    if op == "Shape":
        info = graph.tensors.get(node.inputs[0])
        if info is None or any(d <= 0 for d in info.shape):
            return None
        shape = np.array(info.shape, np.int64)
        start = int(_attr(node, "start", 0))  # type: ignore[arg-type]
        end = _attr(node, "end")
        return shape[start:None if end is None else int(end)]  # type: ignore[arg-type]
    ins = [vals.get(t) if t else None for t in node.inputs]
    if not ins or ins[0] is None:
        return None
    x = ins[0]
    if op == "Identity":
        return x
    if op == "Cast":
        return x.astype(helper.tensor_dtype_to_np_dtype(int(_attr(node, "to"))))  # type: ignore[arg-type]
    if op in ("Add", "Sub", "Mul", "Div"):
        if len(ins) != 2 or ins[1] is None:
            return None
        a, b = x, ins[1]
        if op == "Div":
            if a.dtype.kind in "iu":
                return np.trunc(a / b).astype(a.dtype)  # ONNX integer Div truncates
            return (a / b).astype(a.dtype)
        return {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op](a, b).astype(a.dtype)
    if op == "Concat":
        if any(v is None for v in ins):
            return None
        return np.concatenate(ins, axis=int(_attr(node, "axis", 0)))  # type: ignore[arg-type]
    if op == "Gather":
        if len(ins) < 2 or ins[1] is None:
            return None
        return np.take(x, ins[1].astype(np.int64), axis=int(_attr(node, "axis", 0)))  # type: ignore[arg-type]
    if op == "Transpose":
        perm = _attr(node, "perm")
        return np.transpose(x, None if perm is None else _ints(perm))
    if op in ("Squeeze", "Unsqueeze", "Reshape", "Slice"):
        out = graph.tensors.get(node.outputs[0])
        if op == "Slice":
            return _slice_numpy(node, graph, x, ins)
        if out is None:
            return None
        return x.reshape(out.shape)  # the loader inferred the static result shape
    return None


def _slice_numpy(node: Node, graph: DataflowGraph, x: np.ndarray,
                 ins: Sequence[np.ndarray | None]) -> np.ndarray | None:
    spec = _slice_spec(node, graph, x.shape, ins)
    if isinstance(spec, str):
        return None
    idx = tuple(slice(b, e, s) for b, e, s in zip(*spec))
    return x[idx]


def _slice_spec(node: Node, graph: DataflowGraph, shape: Sequence[int],
                ins: Sequence[np.ndarray | None] | None = None
                ) -> tuple[list[int], list[int], list[int]] | str:
    """Per-axis (begin, end, step) of a Slice, clamped like ONNX; or why not."""
    r = len(shape)
    if graph.opset < 10:
        starts, ends = _ints(_attr(node, "starts")), _ints(_attr(node, "ends"))
        axes = _ints(_attr(node, "axes"), range(len(starts)))
        steps: tuple[int, ...] = (1,) * len(starts)
    else:
        vals = list(ins) if ins is not None else [_init_array(graph, t) if t else None
                                                  for t in node.inputs]
        vals += [None] * (5 - len(vals))
        for i, what in ((1, "starts"), (2, "ends")):
            if vals[i] is None:
                return f"{what} must be constant"
        for i, what in ((3, "axes"), (4, "steps")):
            if len(node.inputs) > i and node.inputs[i] and vals[i] is None:
                return f"{what} must be constant"
        starts = tuple(int(v) for v in vals[1].reshape(-1))  # type: ignore[union-attr]
        ends = tuple(int(v) for v in vals[2].reshape(-1))  # type: ignore[union-attr]
        axes = tuple(int(v) for v in vals[3].reshape(-1)) if vals[3] is not None \
            else tuple(range(len(starts)))
        steps = tuple(int(v) for v in vals[4].reshape(-1)) if vals[4] is not None \
            else (1,) * len(starts)
    begin, end, stride = [0] * r, list(shape), [1] * r
    for a, b, e, s in zip(axes, starts, ends, steps):
        a = a + r if a < 0 else a
        if not 0 <= a < r:
            return f"axis {a} out of range"
        if s <= 0:
            return f"step {s} (only positive steps are converted)"
        d = shape[a]
        b = b + d if b < 0 else b
        e = e + d if e < 0 else e
        begin[a] = max(0, min(b, d))
        end[a] = max(0, min(e, d))
        stride[a] = s
    return begin, end, stride


def _static_values(graph: DataflowGraph) -> dict[str, np.ndarray]:
    """Tensors computable at conversion time, by name; once per graph (nodes are in order)."""
    cache = graph.__dict__.get("_tflite_static")  # plain dataclass: a per-graph memo
    if cache is not None:
        return cache
    from onnx import numpy_helper

    vals: dict[str, np.ndarray] = {}
    known: dict[str, np.ndarray] = {}

    def get(t: str) -> np.ndarray | None:
        if t in known:
            return known[t]
        init = graph.initializers.get(t)
        if init is None:
            return None
        known[t] = numpy_helper.to_array(init)
        return known[t]

    for n in graph.nodes:
        if n.op_type not in _FOLDABLE or n.domain not in ("", "ai.onnx") \
                or len(n.outputs) != 1 or not n.outputs[0]:
            continue
        if n.op_type != "Shape" and not all(get(t) is not None for t in n.inputs if t):
            continue
        try:
            v = _fold_node(n, graph, {t: known[t] for t in n.inputs if t in known})
        except Exception:  # a case numpy cannot evaluate stays a node
            v = None
        if v is None or v.size > _FOLD_MAX_ELEMENTS:
            continue
        info = graph.tensors.get(n.outputs[0])
        if info is not None and tuple(v.shape) != tuple(info.shape):
            continue
        if info is not None:
            v = v.astype(info.dtype)
        vals[n.outputs[0]] = known[n.outputs[0]] = np.ascontiguousarray(v)
    graph.__dict__["_tflite_static"] = vals
    return vals


def _folded(node: Node, graph: DataflowGraph) -> bool:
    """True when every output of the node is a conversion-time constant (it emits nothing)."""
    outs = [o for o in node.outputs if o]
    vals = _static_values(graph)
    return bool(outs) and all(o in vals for o in outs)


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


def _check_conv(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
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


def _check_pool(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
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


def _check_binary(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    why = _float_io(node, graph)
    if why:
        return why
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


def _check_reshape(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
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


def _check_softmax(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    why = _float_io(node, graph)
    if why:
        return why
    a = _softmax_axis(node, graph)
    if isinstance(a, str) and mode == "fp32" and _softmax_nchw(node, graph):
        return None
    return a if isinstance(a, str) else None


def _softmax_nchw(node: Node, graph: DataflowGraph) -> bool:
    """A rank-4 softmax over the last ONNX axis (attention scores): run it in NCHW (fp32).

    NHWC holds that axis as W, not innermost, so the input is transposed to NCHW, the softmax
    runs over the innermost axis, and the result is transposed back.
    """
    shape = graph.tensors[node.inputs[0]].shape
    axis = int(_attr(node, "axis", -1 if graph.opset >= 13 else 1))  # type: ignore[arg-type]
    return len(shape) == 4 and axis in (-1, 3)


def _check_unary(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
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


def _check_gemm(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    why = _float_io(node, graph)
    if why:
        return why
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


def _check_concat(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
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


def _check_global_pool(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    why = _float_io(node, graph)
    if why:
        return why
    if _dyn_rank(graph, node.inputs[0]) != 4:
        return "only 2-D global pooling"
    return None


def _check_pad(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
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


# --- fp32-only mappings (LiteRT): no int8 emission is implemented or tested for these -------


def _check_batch_matmul(node: Node, graph: DataflowGraph) -> str | None:
    a = graph.tensors[node.inputs[0]].shape
    b = graph.tensors[node.inputs[1]].shape
    if _is_const(graph, node.inputs[0]):
        return "MatMul with a constant A and a dynamic B is not converted"
    if len(a) != len(b) or not 2 <= len(a) <= 5:
        return f"MatMul of ranks {len(a)} x {len(b)} (equal ranks 2..5 are converted)"
    return None


def _const_vector(graph: DataflowGraph, name: str, size: int) -> np.ndarray | None:
    v = _init_array(graph, name)
    if v is None or v.size != size:
        return None
    return v.astype(np.float64).reshape(-1)


def _check_batchnorm(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    why = _float_io(node, graph, inputs=[0])
    if why:
        return why
    if int(_attr(node, "training_mode", 0)) or any(node.outputs[1:]):  # type: ignore[arg-type]
        return "training-mode BatchNormalization (running statistics outputs)"
    x = graph.tensors[node.inputs[0]].shape
    if len(x) < 2 or len(node.inputs) != 5:
        return "needs an input of rank >= 2 and scale, bias, mean, var"
    for t in node.inputs[1:]:
        if _const_vector(graph, t, x[1]) is None:
            return f"{t!r} must be a constant per-channel vector"
    return None


def _bn_scale_shift(node: Node, graph: DataflowGraph) -> tuple[np.ndarray, np.ndarray]:
    """y = x * scale + shift, per channel (inference form, computed in float64)."""
    c = graph.tensors[node.inputs[0]].shape[1]
    gamma, beta, mean, var = (_const_vector(graph, t, c) for t in node.inputs[1:])
    eps = float(_attr(node, "epsilon", 1e-5))  # type: ignore[arg-type]
    scale = gamma / np.sqrt(var + eps)  # type: ignore[operator]
    return scale.astype(np.float32), (beta - mean * scale).astype(np.float32)  # type: ignore[operator]


def _resize_params(node: Node, graph: DataflowGraph) -> tuple[str, bool, bool] | str:
    """(TFLite op, align_corners, half_pixel_centers) for a Resize, or why not."""
    if graph.opset < 11:
        return "opset < 11 Resize (no coordinate_transformation_mode)"
    x = graph.tensors[node.inputs[0]].shape
    y = graph.tensors[node.outputs[0]].shape
    if len(x) != 4:
        return f"only 2-D (rank-4) resize, not rank {len(x)}"
    if x[:2] != y[:2]:
        return "resizing the batch or channel axis"
    if _attr(node, "axes") is not None or int(_attr(node, "antialias", 0)):  # type: ignore[arg-type]
        return "axes / antialias are not supported"
    scales = _init_array(graph, node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] \
        else None
    sizes = len(node.inputs) > 3 and bool(node.inputs[3])
    if sizes and not _is_const(graph, node.inputs[3]):
        return "sizes must be constant"
    if scales is not None and scales.size == 4 and not sizes:
        # ONNX maps coordinates with the given scale; TFLite with out/in: equal only when
        # the output is exactly in * scale
        for d in (2, 3):
            if abs(x[d] * float(scales[d]) - y[d]) > 1e-6 * y[d]:
                return f"scale {float(scales[d])} does not give an integral output size"
    elif not sizes:
        return "scales or sizes must be constant"
    mode = str(_attr(node, "mode", "nearest"))
    ctm = str(_attr(node, "coordinate_transformation_mode", "half_pixel"))
    if ctm == "pytorch_half_pixel" and min(y[2:]) > 1:
        ctm = "half_pixel"
    if mode == "nearest":
        nm = str(_attr(node, "nearest_mode", "round_prefer_floor"))
        if ctm == "asymmetric" and nm == "floor":
            return "RESIZE_NEAREST_NEIGHBOR", False, False
        if ctm in ("half_pixel", "tf_half_pixel_for_nn") and nm == "round_prefer_ceil":
            return "RESIZE_NEAREST_NEIGHBOR", False, True
        return f"nearest resize with {ctm} / {nm} has no TFLite equivalent"
    if mode == "linear":
        if ctm == "half_pixel":
            return "RESIZE_BILINEAR", False, True
        if ctm == "align_corners":
            return "RESIZE_BILINEAR", True, False
        if ctm == "asymmetric":
            return "RESIZE_BILINEAR", False, False
        return f"linear resize with coordinate_transformation_mode {ctm}"
    return f"resize mode {mode!r} is not converted"


def _check_by_params(params: Callable[[Node, DataflowGraph], object]
                     ) -> Callable[[Node, DataflowGraph, str], str | None]:
    """A check for an op whose emitter derives its parameters with ``params`` (which returns
    the refusal reason as a string): float input 0, then whatever ``params`` refuses."""

    def check(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
        why = _float_io(node, graph, inputs=[0])
        if why:
            return why
        p = params(node, graph)
        return p if isinstance(p, str) else None

    return check


_check_resize = _check_by_params(_resize_params)


def _check_convtranspose(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    why = _float_io(node, graph, inputs=[0])
    if why:
        return why
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


def _perm_nhwc(perm: Sequence[int]) -> tuple[int, ...]:
    """An ONNX rank-4 permutation expressed on NHWC-held tensors (input and output NHWC)."""
    q = (0, 2, 3, 1)  # TFLite axis j holds ONNX axis q[j]
    inv = {a: j for j, a in enumerate(q)}
    return tuple(inv[perm[q[j]]] for j in range(4))


def _check_transpose(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    why = _float_io(node, graph)
    if why:
        return why
    r = _dyn_rank(graph, node.inputs[0])
    perm = _attr(node, "perm")
    if r > 6:
        return "rank > 6"
    if perm is not None and sorted(_ints(perm)) != list(range(r)):
        return f"perm {perm} is not a permutation of rank {r}"
    return None


def _reduce_axes(node: Node, graph: DataflowGraph) -> tuple[int, ...] | str:
    r = _dyn_rank(graph, node.inputs[0])
    axes: Sequence[int] | None = None
    if _attr(node, "axes") is not None:
        axes = _ints(_attr(node, "axes"))
    elif len(node.inputs) > 1 and node.inputs[1]:
        v = _init_array(graph, node.inputs[1])
        if v is None:
            return "axes must be constant"
        axes = tuple(int(a) for a in v.reshape(-1))
    if not axes:
        if int(_attr(node, "noop_with_empty_axes", 0)):  # type: ignore[arg-type]
            return "noop_with_empty_axes (an identity)"
        axes = tuple(range(r))
    out = tuple(sorted({a + r if a < 0 else a for a in axes}))
    if any(not 0 <= a < r for a in out):
        return f"axes {axes} out of range"
    return out


_check_reduce = _check_by_params(_reduce_axes)


def _pow_exponent(node: Node, graph: DataflowGraph) -> float | None:
    v = _init_array(graph, node.inputs[1]) if len(node.inputs) > 1 else None
    if v is None or v.size != 1 or v.dtype.kind != "f":
        return None
    return float(v.reshape(()))


def _check_pow(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    why = _float_io(node, graph, inputs=[0])
    if why:
        return why
    if _is_const(graph, node.inputs[0]):
        return "constant base"
    if _pow_exponent(node, graph) is None:
        return "the exponent must be a constant float scalar"
    return None


def _check_slice(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    why = _float_io(node, graph, inputs=[0])
    if why:
        return why
    shape = graph.tensors[node.inputs[0]].shape
    if len(shape) > 5:
        return "rank > 5 (STRIDED_SLICE)"
    spec = _slice_spec(node, graph, shape)
    return spec if isinstance(spec, str) else None


def _check_cast(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    why = _float_io(node, graph)  # float -> float: an identity
    if why:
        return f"only float32 -> float32 Cast (an identity) is converted: {why}"
    return None


_INT_TYPES = {6: "int32", 7: "int64"}  # onnx.TensorProto.INT32 / INT64


def _check_gather(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    why = _float_io(node, graph, inputs=[0])
    if why:
        return why
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


def _split_sizes(node: Node, graph: DataflowGraph) -> tuple[int, list[int]] | str:
    x = graph.tensors[node.inputs[0]].shape
    r = len(x)
    axis = int(_attr(node, "axis", 0))  # type: ignore[arg-type]
    axis = axis + r if axis < 0 else axis
    if not 0 <= axis < r:
        return f"axis {axis} out of range"
    sizes = [graph.tensors[o].shape[axis] if o in graph.tensors else -1 for o in node.outputs]
    if any(not o for o in node.outputs) or -1 in sizes or sum(sizes) != x[axis]:
        return "every output must be used and have a static shape"
    return axis, sizes


_check_split = _check_by_params(_split_sizes)


def _check_layernorm(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    why = _float_io(node, graph, inputs=[0])
    if why:
        return why
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


_GELU_TOL = 1e-5


def _scalar_of(graph: DataflowGraph, node: Node, dynamic: str) -> float | None:
    """The constant scalar operand of a binary node whose other operand is ``dynamic``."""
    if len(node.inputs) != 2 or dynamic not in node.inputs:
        return None
    other = node.inputs[1] if node.inputs[0] == dynamic else node.inputs[0]
    if other == dynamic or (node.op_type == "Div" and node.inputs[1] != other):
        return None
    v = _init_array(graph, other)
    if v is None or v.size != 1:
        return None
    return float(v.reshape(()))


_ERF = "Erf has no TFLite op; converted only inside an exact GELU x*0.5*(1+erf(x/sqrt2)): "


def _gelu_chain(graph: DataflowGraph, erf: Node) -> list[Node] | str:
    """[Div|Mul, Erf, Add, Mul, Mul]: the exact-GELU pattern around an Erf, or why not.

    ONNX exports exact GELU as ``x * 0.5 * (1 + erf(x / sqrt 2))`` (or with the 0.5 last);
    TFLite has no ERF but has GELU, so the Erf is convertible only as part of the whole
    pattern, with every intermediate read by the next node alone. Accepted orders: Div(x,
    sqrt2) | Mul(x, 1/sqrt2) -> Erf -> Add 1 -> Mul x -> Mul 0.5, and ... -> Add 1 -> Mul 0.5
    -> Mul x.
    """
    outs = set(graph.graph_outputs)

    def only_reader(t: str) -> Node | None:
        cs = graph.consumers.get(t, ())
        if len(cs) != 1 or t in outs:
            return None
        return graph.nodes[cs[0]]

    src = graph.producer.get(erf.inputs[0])
    if src is None:
        return _ERF + "its input is not x / sqrt(2) inside this graph"
    pre = graph.nodes[src]
    if pre.op_type not in ("Div", "Mul") or only_reader(erf.inputs[0]) is not erf:
        return _ERF + "its input is not read by the Erf alone"
    x = next((t for t in pre.inputs if not _is_const(graph, t)), "")
    c = _scalar_of(graph, pre, x)
    want = math.sqrt(2.0) if pre.op_type == "Div" else 1.0 / math.sqrt(2.0)
    if c is None or abs(c - want) > _GELU_TOL:
        return _ERF + "its input is not x / sqrt(2)"
    add = only_reader(erf.outputs[0])
    if add is None or add.op_type != "Add" or _scalar_of(graph, add, erf.outputs[0]) != 1.0:
        return _ERF + "it is not followed by + 1 of an exact GELU"
    m1 = only_reader(add.outputs[0])
    if m1 is None or m1.op_type != "Mul":
        return _ERF + "(1 + erf) is not multiplied as in an exact GELU"
    m2 = only_reader(m1.outputs[0])
    if m2 is None or m2.op_type != "Mul":
        return _ERF + "the exact-GELU pattern ends early"
    half1, half2 = _scalar_of(graph, m1, add.outputs[0]), _scalar_of(graph, m2, m1.outputs[0])
    half_last = sorted(m1.inputs) == sorted([x, add.outputs[0]]) and half2 == 0.5
    half_first = half1 == 0.5 and sorted(m2.inputs) == sorted([x, m1.outputs[0]])
    if not (half_last or half_first):
        return _ERF + "the multiplications are not x * 0.5 * (1 + erf)"
    for n in (pre, m2):
        why = _float_io(n, graph)
        if why:
            return why
    if graph.tensors[m2.outputs[0]].shape != graph.tensors[x].shape:
        return "the GELU pattern broadcasts"
    return [pre, erf, add, m1, m2]


def _check_erf(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    chain = _gelu_chain(graph, node)
    return chain if isinstance(chain, str) else None


#: mapped in fp32 only: no int8 emission is written and tested for these (Ethos-U keeps its set)
_FP32_ONLY = frozenset({
    "BatchNormalization", "HardSigmoid", "Resize", "ConvTranspose", "Transpose", "ReduceMean",
    "ReduceMax", "ReduceSum", "Pow", "Sqrt", "Slice", "Cast", "Gather", "Split",
    "LayerNormalization", "Erf",
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
    "Cast": _check_cast,
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
    dtype: str = "float32"  # act: "int32" / "int64" for integer graph inputs (fp32 mode)


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
    "DIV": "DivOptions",
    "SUM": "ReducerOptions",
    "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions",
    "RESIZE_BILINEAR": "ResizeBilinearOptions",
    "TRANSPOSE_CONV": "TransposeConvOptions",
    "STRIDED_SLICE": "StridedSliceOptions",
    "SPLIT_V": "SplitVOptions",
    "BATCH_MATMUL": "BatchMatMulOptions",
    "GATHER": "GatherOptions",
    "GELU": "GeluOptions",
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
                pin: tuple[float, int] | None = None, dtype: str = "float32") -> int:
        shape = tuple(tfl_shape) if tfl_shape is not None else _nhwc(onnx_shape or ())
        rng = self.ranges.get(name) if calibrated else None
        tid = self._add(_T(name, shape, "act", range=rng, pin=pin, dtype=dtype))
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

    def plan(self) -> dict[int, tuple[tuple[Node, ...], Node | None]]:
        """Per node index: the nodes folded into it (BatchNormalization, bias Add, or a whole
        exact-GELU pattern) and the activation fused into it."""
        plan: dict[int, tuple[tuple[Node, ...], Node | None]] = {}
        absorbed: set[int] = set()
        self.bias_of: dict[int, np.ndarray] = {}
        self.bn_of: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.gelu_of: dict[int, str] = {}  # first node of a GELU pattern -> its input x
        g = self.g
        for n in self.g.nodes:
            if n.index in absorbed:
                continue
            bias_node = act_node = None
            fused: list[Node] = []
            out = n.outputs[0] if n.outputs else ""
            if n.op_type in ("Div", "Mul") and self.mode == "fp32":
                c = self._sole_consumer(out)
                chain = _gelu_chain(g, c) if c is not None and c.op_type == "Erf" else None
                if isinstance(chain, list) and chain[0] is n:
                    self.gelu_of[n.index] = next(t for t in n.inputs if not _is_const(g, t))
                    absorbed.update(x.index for x in chain[1:])
                    plan[n.index] = (tuple(chain[1:]), None)
                    continue
            if n.op_type == "Conv" and self.mode == "fp32":
                c = self._sole_consumer(out)
                if c is not None and c.op_type == "BatchNormalization" \
                        and c.domain in ("", "ai.onnx") and c.inputs[0] == out \
                        and convertible(c, g, "fp32") is None:
                    self.bn_of[n.index] = _bn_scale_shift(c, g)
                    absorbed.add(c.index)
                    fused.append(c)
                    out = c.outputs[0]
            dense = n.op_type in ("Conv", "Gemm") or (
                n.op_type == "MatMul" and _is_const(g, n.inputs[1]))
            if dense:
                c = self._sole_consumer(out)
                shape = self.g.tensors[out].shape
                ch_axis = 1 if n.op_type == "Conv" else len(shape) - 1
                vec = None if c is None else self._per_channel_const(
                    c, out, shape[ch_axis], ch_axis, len(shape))
                if vec is not None:
                    bias_node = c
                    self.bias_of[n.index] = vec
                    absorbed.add(c.index)
                    fused.append(c)
                    out = c.outputs[0]
            if dense or n.op_type in ("Add", "Sub", "Mul", "Div", "MaxPool", "AveragePool",
                                      "Concat"):
                c = self._sole_consumer(out)
                if c is not None and _fused_act_code(c, self.g) is not None \
                        and self.g.tensors[c.outputs[0]].shape == self.g.tensors[out].shape:
                    act_node = c
                    absorbed.add(c.index)
            if bias_node is not None or act_node is not None or fused:
                plan[n.index] = (tuple(fused), act_node)
        self.absorbed = absorbed
        return plan

    # --- the whole conversion --------------------------------------------------------------
    def run(self) -> ConvertedModel:
        g = self.g
        for n in g.nodes:
            why = convertible(n, g, self.mode)
            if why is not None:
                raise UnsupportedOp(n.name, n.op_type, why)
        plan = self.plan()
        for name in g.graph_inputs:
            info = g.tensors.get(name)
            if info is not None and info.elem_type in _INT_TYPES and self.mode == "fp32":
                # integer inputs (token ids) feed GATHER; they keep the ONNX layout
                self.new_act(name, tfl_shape=info.shape, dtype=_INT_TYPES[info.elem_type])
                continue
            if info is None or info.elem_type != FLOAT:
                raise ConversionError(f"graph input {name!r} is not a float32 tensor")
            self.new_act(name, info.shape)
        for n in g.nodes:
            if n.index in self.absorbed or _folded(n, g):
                continue
            fused, act_node = plan.get(n.index, ((), None))
            out = (act_node or (fused[-1] if fused else n)).outputs[0]
            nodes = tuple(x.name for x in (n, *fused, act_node) if x is not None)
            act = _fused_act_code(act_node, g) if act_node is not None else None
            if n.index in self.gelu_of:
                self._emit_gelu(n, out, nodes)
                continue
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
        if n.index in self.bn_of:  # BatchNormalization folded into the weights and bias
            scale, shift = self.bn_of[n.index]
            w = w * scale.reshape(-1, 1, 1, 1)
            bias = bias * scale + shift
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
        if n.op_type == "MatMul" and not _is_const(g, n.inputs[1]):
            self._emit_batch_matmul(n, out, nodes)
            return
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
        dyn_div = n.op_type == "Div" and not _is_const(self.g, n.inputs[1])
        if dyn_div:  # fp32 only (the check refuses it in int8)
            code = "DIV"
        a = self._operand(n, n.inputs[0], r)
        recip = (lambda v: (1.0 / v).astype(np.float32)) if n.op_type == "Div" \
            and not dyn_div else None
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
            # zero padding is exact for a max over non-negative input (after a ReLU) and,
            # unlike PADV2, XNNPACK takes it: the max pool stays in the delegate partition
            zero_ok = self.mode == "fp32" and self._non_negative(n.inputs[0])
            x = self._pad(x, explicit, n, "PAD" if avg or zero_ok else "PADV2")
        y = self.new_act(out, y_shape)
        self.tie(x, y)
        self.op("AVERAGE_POOL_2D" if avg else "MAX_POOL_2D", [x], [y], nodes,
                {"Padding": 0 if padding == "SAME" else 1, "StrideW": s[1], "StrideH": s[0],
                 "FilterWidth": k[1], "FilterHeight": k[0],
                 "FusedActivationFunction": _act_enum(act)})

    _emit_averagepool = _emit_maxpool

    def _non_negative(self, tensor: str) -> bool:
        """True when the tensor is the output of a ReLU or of a Clip with min >= 0."""
        idx = self.g.producer.get(tensor)
        if idx is None:
            return False
        p = self.g.nodes[idx]
        if p.domain not in ("", "ai.onnx"):
            return False
        if p.op_type in ("Relu", "Sigmoid", "HardSigmoid"):
            return True
        if p.op_type == "Clip":
            b = _clip_bounds(p, self.g)
            return not isinstance(b, str) and b[0] is not None and b[0] >= 0.0
        return False

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
        if isinstance(_softmax_axis(n, self.g), str):  # fp32: last ONNX axis of a rank-4 tensor
            t = self._to_nchw(x, n, "in")
            mid = self._tmp(n, "softmax_nchw", self.tensors[t].shape)
            self.op("SOFTMAX", [t], [mid], nodes, {"Beta": 1.0})
            self._from_nchw(mid, out, nodes)
            return
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

    # --- fp32-only emitters ------------------------------------------------------------------
    def _tmp(self, n: Node, tag: str, tfl_shape: Sequence[int]) -> int:
        return self.new_act(f"{n.name}/{tag}", tfl_shape=tfl_shape, calibrated=False)

    def _scalar(self, n: Node, tag: str, value: float, rank: int) -> int:
        return self.const(f"{n.name}/{tag}", np.full((1,) * rank, value, np.float32), "const")

    def _to_nchw(self, x: int, n: Node, tag: str) -> int:
        """TRANSPOSE an NHWC-held rank-4 tensor to the ONNX (NCHW) layout."""
        s = self.tensors[x].shape
        perm = self.const(f"{n.name}/{tag}_to_nchw_perm", np.array([0, 3, 1, 2]), "int32")
        t = self._tmp(n, f"{tag}_nchw", (s[0], s[3], s[1], s[2]))
        self.tie(x, t)
        self.op("TRANSPOSE", [x, perm], [t], (n.name,))
        return t

    def _from_nchw(self, x: int, out: str, nodes: tuple[str, ...]) -> int:
        """TRANSPOSE an NCHW rank-4 result into the NHWC-held tensor ``out``."""
        perm = self.const(f"{out}/to_nhwc_perm", np.array([0, 2, 3, 1]), "int32")
        y = self.new_act(out, self.g.tensors[out].shape)
        self.tie(x, y)
        self.op("TRANSPOSE", [x, perm], [y], nodes)
        return y

    def _emit_batchnormalization(self, n: Node, out: str, nodes: tuple[str, ...],
                                 act: str) -> None:
        shape = self.g.tensors[n.inputs[0]].shape
        r = len(shape)
        scale, shift = _bn_scale_shift(n, self.g)
        cshape = [1] * r
        cshape[3 if r == 4 else 1] = shape[1]  # channels are last in NHWC
        x = self.act(n.inputs[0])
        s = self.const(f"{n.name}/scale", scale.reshape(cshape), "const")
        b = self.const(f"{n.name}/shift", shift.reshape(cshape), "const")
        mid = self._tmp(n, "scaled", self.tensors[x].shape)
        self.op("MUL", [x, s], [mid], nodes, {"FusedActivationFunction": 0})
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("ADD", [mid, b], [y], nodes, {"FusedActivationFunction": _act_enum(act)})

    def _emit_hardsigmoid(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        # max(0, min(1, a*x + b)) = relu6(6a*x + 6b) / 6: MUL, ADD with fused RELU6, MUL
        alpha = float(_attr(n, "alpha", 0.2))  # type: ignore[arg-type]
        beta = float(_attr(n, "beta", 0.5))  # type: ignore[arg-type]
        y_shape = self.g.tensors[out].shape
        r = len(y_shape)
        x = self.act(n.inputs[0])
        t1 = self._tmp(n, "scaled", self.tensors[x].shape)
        self.op("MUL", [x, self._scalar(n, "alpha6", 6.0 * alpha, r)], [t1], nodes,
                {"FusedActivationFunction": 0})
        t2 = self._tmp(n, "shifted", self.tensors[x].shape)
        self.op("ADD", [t1, self._scalar(n, "beta6", 6.0 * beta, r)], [t2], nodes,
                {"FusedActivationFunction": _act_enum("RELU6")})
        y = self.new_act(out, y_shape)
        self.op("MUL", [t2, self._scalar(n, "sixth", 1.0 / 6.0, r)], [y], nodes,
                {"FusedActivationFunction": 0})

    def _emit_sqrt(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("SQRT", [self.act(n.inputs[0])], [y], nodes)

    def _emit_cast(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        x = self.act(n.inputs[0])  # float32 -> float32: an identity, as a RESHAPE
        shape = self.tensors[x].shape
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("RESHAPE", [x, self.const(f"{n.name}/shape", np.array(shape), "int32")], [y],
                nodes, {"NewShape": list(shape)})

    def _emit_pow(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        e = _pow_exponent(n, self.g)
        y_shape = self.g.tensors[out].shape
        x = self.act(n.inputs[0])
        y = self.new_act(out, y_shape)
        if e == 2.0:
            self.op("MUL", [x, x], [y], nodes, {"FusedActivationFunction": 0})
        elif e == 0.5:
            self.op("SQRT", [x], [y], nodes)
        else:
            self.op("POW", [x, self._scalar(n, "exponent", e, len(y_shape))], [y], nodes)  # type: ignore[arg-type]

    def _emit_resize(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        code, align, half = _resize_params(n, self.g)  # type: ignore[misc]
        y_shape = self.g.tensors[out].shape
        size = self.const(f"{n.name}/size", np.array(y_shape[2:]), "int32")
        y = self.new_act(out, y_shape)
        self.op(code, [self.act(n.inputs[0]), size], [y], nodes,
                {"AlignCorners": align, "HalfPixelCenters": half})

    def _emit_convtranspose(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        g = self.g
        x_shape = g.tensors[n.inputs[0]].shape
        y_shape = g.tensors[out].shape
        w = _init_array(g, n.inputs[1]).astype(np.float32)  # type: ignore[union-attr]
        wt = np.ascontiguousarray(w.transpose(1, 2, 3, 0))  # [I, O, kh, kw] -> [O, kh, kw, I]
        s = _ints(_attr(n, "strides"), (1, 1))
        pads = _ints(_attr(n, "pads"), (0, 0, 0, 0))
        x = self.act(n.inputs[0])
        osh = self.const(f"{n.name}/output_shape", np.array(_nhwc(y_shape)), "int32")
        wid = self.const(f"{n.name}/weights", wt, "weight", axis=0)
        has_bias = len(n.inputs) > 2 and bool(n.inputs[2])
        y = self._tmp(n, "conv", _nhwc(y_shape)) if has_bias else self.new_act(out, y_shape)
        macs = int(np.prod(x_shape)) * w.shape[1] * w.shape[2] * w.shape[3]
        self.op("TRANSPOSE_CONV", [osh, wid, x], [y], nodes,
                {"Padding": 1 if not any(pads) else 0, "StrideW": s[1], "StrideH": s[0]}, macs)
        if has_bias:
            bias = _init_array(g, n.inputs[2]).astype(np.float32).reshape(1, 1, 1, -1)  # type: ignore[union-attr]
            b = self.const(f"{n.name}/bias", bias, "const")
            yb = self.new_act(out, y_shape)
            self.op("ADD", [y, b], [yb], nodes, {"FusedActivationFunction": 0})

    def _emit_transpose(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        r = _dyn_rank(self.g, n.inputs[0])
        perm = _ints(_attr(n, "perm"), tuple(reversed(range(r))))
        tperm = _perm_nhwc(perm) if r == 4 else perm
        x = self.act(n.inputs[0])
        y = self.new_act(out, self.g.tensors[out].shape)
        self.tie(x, y)
        self.op("TRANSPOSE", [x, self.const(f"{n.name}/perm", np.array(tperm), "int32")], [y],
                nodes)

    def _emit_reducemean(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        axes = _reduce_axes(n, self.g)
        keep = bool(int(_attr(n, "keepdims", 1)))  # type: ignore[arg-type]
        r = _dyn_rank(self.g, n.inputs[0])
        x = self.act(n.inputs[0])
        taxes: Sequence[int] = axes  # type: ignore[assignment]
        if r == 4:
            remaining = [a for a in (0, 2, 3, 1) if a not in axes]
            if keep or remaining == sorted(remaining):
                taxes = sorted({0: 0, 1: 3, 2: 1, 3: 2}[a] for a in axes)  # type: ignore[union-attr]
            else:  # the kept axes would come out in NHWC order: reduce in NCHW instead
                x = self._to_nchw(x, n, "in")
        code = {"ReduceMean": "MEAN", "ReduceMax": "REDUCE_MAX", "ReduceSum": "SUM"}[n.op_type]
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op(code, [x, self.const(f"{n.name}/axes", np.array(list(taxes)), "int32")], [y],
                nodes, {"KeepDims": keep})

    _emit_reducemax = _emit_reducesum = _emit_reducemean

    def _emit_slice(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        shape = self.g.tensors[n.inputs[0]].shape
        begin, end, stride = _slice_spec(n, self.g, shape)  # type: ignore[misc]
        if len(shape) == 4:
            q = (0, 2, 3, 1)
            begin, end, stride = ([v[a] for a in q] for v in (begin, end, stride))
        ins = [self.act(n.inputs[0])] + [
            self.const(f"{n.name}/{tag}", np.array(v), "int32")
            for tag, v in (("begin", begin), ("end", end), ("strides", stride))]
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("STRIDED_SLICE", ins, [y], nodes,
                {"BeginMask": 0, "EndMask": 0, "EllipsisMask": 0, "NewAxisMask": 0,
                 "ShrinkAxisMask": 0})

    def _emit_gather(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        g = self.g
        x_shape = g.tensors[n.inputs[0]].shape
        axis = int(_attr(n, "axis", 0))  # type: ignore[arg-type]
        axis = axis + len(x_shape) if axis < 0 else axis
        table = _init_array(g, n.inputs[0])
        if table is not None:  # an embedding table: kept in the ONNX layout
            p = self.const(f"{n.name}/params", table.astype(np.float32), "const")
        else:
            p = self.act(n.inputs[0])
            if len(x_shape) == 4:
                p = self._to_nchw(p, n, "params")
        idx = _init_array(g, n.inputs[1])
        i = self.const(f"{n.name}/indices", idx, "int32") if idx is not None \
            else self.act(n.inputs[1])
        y_shape = g.tensors[out].shape
        y = self._tmp(n, "nchw", y_shape) if len(y_shape) == 4 else self.new_act(out, y_shape)
        self.op("GATHER", [p, i], [y], nodes, {"Axis": axis, "BatchDims": 0})
        if len(y_shape) == 4:
            self._from_nchw(y, out, nodes)

    def _emit_split(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        axis, sizes = _split_sizes(n, self.g)  # type: ignore[misc]
        if _dyn_rank(self.g, n.inputs[0]) == 4:
            axis = {0: 0, 1: 3, 2: 1, 3: 2}[axis]
        ys = [self.new_act(o, self.g.tensors[o].shape) for o in n.outputs]
        self.op("SPLIT_V", [self.act(n.inputs[0]),
                            self.const(f"{n.name}/sizes", np.array(sizes), "int32"),
                            self.const(f"{n.name}/axis", np.array(axis), "int32")],
                ys, nodes, {"NumSplits": len(sizes)})

    def _emit_layernormalization(self, n: Node, out: str, nodes: tuple[str, ...],
                                 act: str) -> None:
        # (x - mean) * rsqrt(mean((x - mean)^2) + eps) * scale + bias, over axes axis..r-1
        g = self.g
        shape = g.tensors[n.inputs[0]].shape
        r = len(shape)
        axis = int(_attr(n, "axis", -1))  # type: ignore[arg-type]
        axis = axis + r if axis < 0 else axis
        eps = float(_attr(n, "epsilon", 1e-5))  # type: ignore[arg-type]
        red = tuple(1 if a >= axis else d for a, d in enumerate(shape))
        axes = self.const(f"{n.name}/axes", np.arange(axis, r), "int32")
        x = self.act(n.inputs[0])
        mean = self._tmp(n, "mean", red)
        self.op("MEAN", [x, axes], [mean], nodes, {"KeepDims": True})
        d = self._tmp(n, "centered", shape)
        self.op("SUB", [x, mean], [d], nodes, {"FusedActivationFunction": 0})
        sq = self._tmp(n, "squared", shape)
        self.op("MUL", [d, d], [sq], nodes, {"FusedActivationFunction": 0})
        var = self._tmp(n, "var", red)
        self.op("MEAN", [sq, axes], [var], nodes, {"KeepDims": True})
        ve = self._tmp(n, "var_eps", red)
        self.op("ADD", [var, self._scalar(n, "eps", eps, r)], [ve], nodes,
                {"FusedActivationFunction": 0})
        inv = self._tmp(n, "rstd", red)
        self.op("RSQRT", [ve], [inv], nodes)
        nrm = self._tmp(n, "normalized", shape)
        self.op("MUL", [d, inv], [nrm], nodes, {"FusedActivationFunction": 0})
        bshape = (1,) * axis + tuple(shape[axis:])

        def per_axes(t: str) -> np.ndarray:  # a scale / bias over the normalised axes
            v = _init_array(g, t).astype(np.float32)  # type: ignore[union-attr]
            v = v.reshape(bshape) if v.size > 1 else v.reshape((1,) * r)
            return np.ascontiguousarray(np.broadcast_to(v, bshape))

        has_bias = len(n.inputs) > 2 and bool(n.inputs[2])
        sc = self.const(f"{n.name}/scale", per_axes(n.inputs[1]), "const")
        y = self._tmp(n, "scaled", shape) if has_bias else self.new_act(out, shape)
        self.op("MUL", [nrm, sc], [y], nodes, {"FusedActivationFunction": 0})
        if has_bias:
            b = self.const(f"{n.name}/bias", per_axes(n.inputs[2]), "const")
            yb = self.new_act(out, shape)
            self.op("ADD", [y, b], [yb], nodes, {"FusedActivationFunction": 0})

    def _emit_gelu(self, n: Node, out: str, nodes: tuple[str, ...]) -> None:
        x = self.act(self.gelu_of[n.index])
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("GELU", [x], [y], nodes, {"Approximate": False})

    def _emit_batch_matmul(self, n: Node, out: str, nodes: tuple[str, ...]) -> None:
        a_shape = self.g.tensors[n.inputs[0]].shape
        y_shape = self.g.tensors[out].shape
        a, b = self.act(n.inputs[0]), self.act(n.inputs[1])
        if len(a_shape) == 4:  # attention: both operands back to the ONNX layout
            a, b = self._to_nchw(a, n, "a"), self._to_nchw(b, n, "b")
        y = self._tmp(n, "nchw", y_shape) if len(y_shape) == 4 else self.new_act(out, y_shape)
        self.op("BATCH_MATMUL", [a, b], [y], nodes, {"AdjX": False, "AdjY": False},
                int(np.prod(y_shape)) * a_shape[-1])
        if len(y_shape) == 4:
            self._from_nchw(y, out, nodes)

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
        if self.mode == "fp32":
            _TransposeOptimiser(self).run()
        q = self._resolve_qparams() if self.mode == "int8" else {}
        return _serialise(self, q)


# ----------------------------------------------------------------------------------------
# fp32: layout-transpose peephole over the emitted op list

#: TFLite ops that act element by element: a TRANSPOSE commutes with them (constant operands
#: are permuted with it), so it can move past them to meet and cancel another TRANSPOSE
_ELEMENTWISE = frozenset({
    "ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "POW", "RELU", "RELU6", "RELU_N1_TO_1",
    "LOGISTIC", "TANH", "GELU", "SQRT", "RSQRT", "HARD_SWISH", "LEAKY_RELU",
})


class _TransposeOptimiser:
    """Cancel, compose and sink the TRANSPOSEs the fp32 emitters leave back to back.

    Why: every emitter works on NHWC-held rank-4 tensors and, where an op needs the ONNX
    layout (BATCH_MATMUL, a last-axis SOFTMAX, a rank-changing RESHAPE, an ONNX Transpose),
    wraps it in its own NHWC->NCHW / NCHW->NHWC pair. Emitted one node at a time, a chain of
    such ops (attention: Reshape -> Transpose -> MatMul -> scale -> Softmax -> MatMul ->
    Transpose -> Reshape) pays a layout round trip between every two of them: 16 TRANSPOSEs
    per BERT layer, each a full copy of a [B, heads, S, S] or [B, S, heads, d] tensor. Whether
    a tensor *between* two ops is NHWC or NCHW is invisible outside the model, so the pass
    rewrites the op list (before serialisation) with three exact rules, repeated until none
    applies:

    1. a TRANSPOSE whose perm is the identity goes (its output becomes its input);
    2. a TRANSPOSE whose output feeds only TRANSPOSEs (and is not a graph output) is composed
       into each of them (two inverse perms compose to the identity, which rule 1 removes);
    3. a TRANSPOSE whose output is read only by an elementwise op (`_ELEMENTWISE`) moves past
       it, when that brings it next to another TRANSPOSE (the op's constant operands are
       permuted by the inverse perm; a second dynamic operand must come from a TRANSPOSE with
       the same perm, which merges into the moved one). The op then runs in the other
       layout, with the same values.

    4. a chain of RESHAPEs and TRANSPOSEs through it that leaves the row-major order of the
       data unchanged (checked exactly on an index array) becomes one RESHAPE;
    5. a TRANSPOSE of the last two axes read only as BATCH_MATMUL's B becomes its ``adj_y``
       (XNNPACK takes it; ``adj_x`` it does not, so A is left alone);
    6. two TRANSPOSEs of one tensor with one perm become one (its output read by both).

    A last sweep turns a TRANSPOSE that only moves size-1 axes into a RESHAPE (same memory).
    Graph inputs and outputs keep their NHWC contract (`IOSpec`, and LiteRT reads the layout
    back from the flatbuffer), so transposes at the boundary stay. Run in fp32 mode only:
    int8 ties quantisation parameters through these ops and the Ethos-U output stays as it was.
    Removed ops hand their ONNX node names to a neighbour, so every node stays covered.
    """

    def __init__(self, conv: _Converter) -> None:
        self.c = conv
        g = conv.g
        self.io = {conv.by_name[n] for n in (*g.graph_inputs, *g.graph_outputs)}

    # --- bookkeeping ---------------------------------------------------------------------
    def _index(self) -> None:
        self.producer: dict[int, int] = {}
        self.consumers: dict[int, list[int]] = {}
        for i, op in enumerate(self.c.ops):
            for t in op.outputs:
                self.producer[t] = i
            for t in op.inputs:
                self.consumers.setdefault(t, []).append(i)

    def _perm(self, op: _Op) -> tuple[int, ...]:
        return tuple(int(v) for v in self.c.tensors[op.inputs[1]].data.reshape(-1))  # type: ignore[union-attr]

    def _perm_const(self, op: _Op, perm: Sequence[int]) -> int:
        return self.c.const(f"{self.c.tensors[op.outputs[0]].name}/perm", np.array(perm),
                            "int32")

    def _private(self, t: int) -> bool:
        """Read by exactly one op and not a graph output (so it may change or vanish)."""
        return t not in self.io and len(set(self.consumers.get(t, ()))) == 1

    def _donate(self, nodes: Sequence[str], near: int) -> None:
        """Give a removed op's ONNX node names to the op producing (or else reading) ``near``."""
        i = self.producer.get(near)
        if i is None:
            i = min(self.consumers.get(near, [len(self.c.ops)]))
        if i >= len(self.c.ops):
            return
        op = self.c.ops[i]
        op.nodes = tuple(dict.fromkeys((*op.nodes, *nodes)))

    def _replace(self, old: int, new: int) -> None:
        for op in self.c.ops:
            op.inputs = [new if t == old else t for t in op.inputs]
            op.outputs = [new if t == old else t for t in op.outputs]

    # --- the rules -----------------------------------------------------------------------
    def _drop_identity(self, i: int) -> bool:
        op = self.c.ops[i]
        if self._perm(op) != tuple(range(len(self._perm(op)))):
            return False
        x, y = op.inputs[0], op.outputs[0]
        if x in self.io and y in self.io:
            return False  # a graph input that is also a graph output: keep the copy
        del self.c.ops[i]
        if y in self.io:  # the graph output keeps its tensor; x's producer writes it
            self._replace(x, y)
        else:
            self._replace(y, x)
        self._index()
        self._donate(op.nodes, y if y in self.io else x)
        return True

    def _fold_into_consumers(self, i: int) -> bool:
        op = self.c.ops[i]
        a = op.outputs[0]
        readers = sorted(set(self.consumers.get(a, ())))
        if a in self.io or not readers or any(
                self.c.ops[j].code != "TRANSPOSE" or self.c.ops[j].inputs[0] != a
                for j in readers):
            return False
        p1 = self._perm(op)
        for j in readers:
            t2 = self.c.ops[j]
            p2 = self._perm(t2)
            t2.inputs = [op.inputs[0], self._perm_const(t2, [p1[k] for k in p2])]
            t2.nodes = tuple(dict.fromkeys((*t2.nodes, *op.nodes)))
        del self.c.ops[i]
        self._index()
        return True

    def _merge_duplicate(self, i: int) -> bool:
        """A later TRANSPOSE of the same tensor with the same perm reuses this one's output.

        Once the layout transposes around them are gone, one ONNX tensor read by two attention
        MatMuls (or any two layout-needing ops) is transposed identically twice.
        """
        op = self.c.ops[i]
        perm = self._perm(op)
        for j in sorted(set(self.consumers.get(op.inputs[0], ()))):
            dup = self.c.ops[j]
            if j <= i or dup.code != "TRANSPOSE" or dup.inputs[0] != op.inputs[0] \
                    or self._perm(dup) != perm or dup.outputs[0] in self.io:
                continue
            del self.c.ops[j]
            self._replace(dup.outputs[0], op.outputs[0])
            op.nodes = tuple(dict.fromkeys((*op.nodes, *dup.nodes)))
            self._index()
            return True
        return False

    def _sinkable(self, j: int, a: int, perm: tuple[int, ...]) -> list[int] | None:
        """The other TRANSPOSEs (same perm) that merge if one moves past op j, or None."""
        op = self.c.ops[j]
        if op.code not in _ELEMENTWISE or len(op.outputs) != 1:
            return None
        merged: list[int] = []
        for t in op.inputs:
            if t == a:
                continue
            td = self.c.tensors[t]
            if td.data is not None:
                if td.data.ndim > len(perm):
                    return None
                continue
            k = self.producer.get(t)
            if k is None or self.c.ops[k].code != "TRANSPOSE" or self._perm(self.c.ops[k]) \
                    != perm or not self._private(t):
                return None
            merged.append(k)
        return merged

    def _worth_sinking(self, j: int, a: int, perm: tuple[int, ...]) -> bool:
        """True when moving past op j leads (through elementwise ops) to a TRANSPOSE."""
        seen = 0
        while seen < len(self.c.ops):
            seen += 1
            merged = self._sinkable(j, a, perm)
            if merged is None:
                return False
            if merged:
                return True  # two TRANSPOSEs become one
            y = self.c.ops[j].outputs[0]
            readers = sorted(set(self.consumers.get(y, ())))
            if y in self.io or not readers:
                return False
            if all(self.c.ops[k].code == "TRANSPOSE" and self.c.ops[k].inputs[0] == y
                   for k in readers):
                return True
            if len(readers) != 1:
                return False
            j, a = readers[0], y
        return False

    def _sink(self, i: int) -> bool:
        op = self.c.ops[i]
        x, a = op.inputs[0], op.outputs[0]
        if not self._private(a):
            return False
        j = self.consumers[a][0]
        perm = self._perm(op)
        if not self._worth_sinking(j, a, perm):
            return False
        merged = self._sinkable(j, a, perm)
        assert merged is not None
        e = self.c.ops[j]
        inv = tuple(int(v) for v in np.argsort(perm))
        nodes = [*op.nodes]
        ins = []
        for t in e.inputs:
            td = self.c.tensors[t]
            k = self.producer.get(t)
            if t == a:
                ins.append(x)
            elif td.data is not None:
                d = td.data.reshape((1,) * (len(perm) - td.data.ndim) + td.data.shape)
                ins.append(self.c.const(f"{td.name}/permuted",
                                        np.ascontiguousarray(d.transpose(inv)), td.kind))
            else:
                assert k is not None and k in merged
                ins.append(self.c.ops[k].inputs[0])
                nodes += self.c.ops[k].nodes
        y = e.outputs[0]
        ys = self.c.tensors[y].shape
        y_pre = self.c._add(_T(f"{self.c.tensors[y].name}/pre_transpose",
                               tuple(ys[k] for k in inv), "act"))
        e.inputs, e.outputs = ins, [y_pre]
        moved = _Op("TRANSPOSE", [y_pre, self._perm_const(op, perm)], [y], op.options,
                    tuple(dict.fromkeys(nodes)))
        self.c.ops.insert(j + 1, moved)
        for k in sorted({i, *merged}, reverse=True):
            del self.c.ops[k]
        self._index()
        return True

    def _chain_is_reshape(self, i: int) -> bool:
        """Replace the TRANSPOSE / RESHAPE chain through op i by one RESHAPE when it moves no data.

        A layout transpose next to a rank change (NHWC [1, 1, W, C] -> NCHW -> Reshape [1, C, W]
        -> ONNX Transpose [1, W, C], where a CNN hands over to a sequence model) often undoes
        itself in memory. Whether it does is decided exactly: the chain is applied to an index
        array, and an unchanged row-major order means one RESHAPE computes the same tensor.
        """
        ops = self.c.ops
        chain = [i]
        while True:  # extend backwards over private RESHAPE / TRANSPOSE producers
            t = ops[chain[0]].inputs[0]
            k = self.producer.get(t)
            if k is None or ops[k].code not in ("RESHAPE", "TRANSPOSE") or not self._private(t):
                break
            chain.insert(0, k)
        while True:  # and forwards over private RESHAPE / TRANSPOSE readers
            t = ops[chain[-1]].outputs[0]
            if not self._private(t):
                break
            k = self.consumers[t][0]
            if ops[k].code not in ("RESHAPE", "TRANSPOSE") or ops[k].inputs[0] != t:
                break
            chain.append(k)
        pos = chain.index(i)
        x0 = self.c.tensors[ops[chain[0]].inputs[0]]
        if math.prod(x0.shape) > _FOLD_MAX_ELEMENTS:
            return False
        best: tuple[int, int] | None = None
        for s in range(pos + 1):
            idx = np.arange(math.prod(self.c.tensors[ops[chain[s]].inputs[0]].shape))
            idx = idx.reshape(self.c.tensors[ops[chain[s]].inputs[0]].shape)
            for e in range(s, len(chain)):
                op = ops[chain[e]]
                idx = idx.transpose(self._perm(op)) if op.code == "TRANSPOSE" \
                    else idx.reshape(self.c.tensors[op.outputs[0]].shape)
                if e >= pos and e > s and (best is None or e - s > best[1] - best[0]) \
                        and np.array_equal(idx.reshape(-1), np.arange(idx.size)):
                    best = (s, e)
        if best is None:
            return False
        first, last = ops[chain[best[0]]], ops[chain[best[1]]]
        x, y = first.inputs[0], last.outputs[0]
        nodes = tuple(dict.fromkeys(n for k in chain[best[0]:best[1] + 1] for n in ops[k].nodes))
        ys = self.c.tensors[y].shape
        shape = self.c.const(f"{self.c.tensors[y].name}/shape", np.array(ys), "int32")
        ops[chain[best[1]]] = _Op("RESHAPE", [x, shape], [y],
                                  ("ReshapeOptions", (("NewShape", list(ys)),)), nodes)
        for k in sorted(chain[best[0]:best[1]], reverse=True):
            del ops[k]
        self._index()
        return True

    def _into_batch_matmul(self, i: int) -> bool:
        """A TRANSPOSE of the last two axes feeding BATCH_MATMUL's B becomes its adj_y flag."""
        op = self.c.ops[i]
        perm = self._perm(op)
        r = len(perm)
        if r < 3 or perm != (*range(r - 2), r - 1, r - 2) or not self._private(op.outputs[0]):
            return False
        j = self.consumers[op.outputs[0]][0]
        mm = self.c.ops[j]
        if mm.code != "BATCH_MATMUL" or mm.inputs[1] != op.outputs[0] \
                or mm.inputs[0] == op.outputs[0] or mm.options is None \
                or dict(mm.options[1]).get("AdjY"):
            return False
        mm.inputs = [mm.inputs[0], op.inputs[0]]
        mm.options = (mm.options[0], tuple((k, True if k == "AdjY" else v)
                                           for k, v in mm.options[1]))
        mm.nodes = tuple(dict.fromkeys((*mm.nodes, *op.nodes)))
        del self.c.ops[i]
        self._index()
        return True

    def _to_reshape(self, i: int) -> None:
        op = self.c.ops[i]
        perm = self._perm(op)
        x, y = op.inputs[0], op.outputs[0]
        xs = self.c.tensors[x].shape
        if [a for a in perm if xs[a] != 1] != [a for a in range(len(perm)) if xs[a] != 1]:
            return
        ys = self.c.tensors[y].shape
        shape = self.c.const(f"{self.c.tensors[y].name}/shape", np.array(ys), "int32")
        self.c.ops[i] = _Op("RESHAPE", [x, shape], [y], ("ReshapeOptions",
                                                          (("NewShape", list(ys)),)),
                            op.nodes, op.macs)

    def run(self) -> None:
        self._index()
        for _ in range(4 * len(self.c.ops) + 4):  # each change removes or sinks a TRANSPOSE
            for i, op in enumerate(self.c.ops):
                if op.code == "TRANSPOSE" and (self._drop_identity(i)
                                               or self._fold_into_consumers(i)
                                               or self._merge_duplicate(i)
                                               or self._sink(i)
                                               or self._chain_is_reshape(i)
                                               or self._into_batch_matmul(i)):
                    break
            else:
                break
        for i, op in enumerate(self.c.ops):
            if op.code == "TRANSPOSE":
                self._to_reshape(i)
        self._compact()

    def _compact(self) -> None:
        """Drop tensors no op and no graph boundary uses (dead perms, merged intermediates)."""
        c = self.c
        used = set(self.io)
        for op in c.ops:
            used.update(t for t in (*op.inputs, *op.outputs) if t >= 0)
        remap = {old: new for new, old in enumerate(sorted(used))}
        c.tensors = [c.tensors[old] for old in sorted(used)]
        for t in c.tensors:
            t.refs = tuple(remap[r] for r in t.refs if r in remap)
        for op in c.ops:
            op.inputs = [remap.get(t, t) if t >= 0 else t for t in op.inputs]
            op.outputs = [remap[t] for t in op.outputs]
        c.by_name = {n: remap[t] for n, t in c.by_name.items() if t in remap}
        c.ties = [(remap[a], remap[b], r) for a, b, r in c.ties if a in remap and b in remap]


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
    if t.dtype != "float32":  # integer graph input (fp32 mode): TensorType INT32 / INT64
        return _Encoded(2 if t.dtype == "int32" else 4, None)
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
            dtype="int8" if conv.mode == "int8" else conv.tensors[tid].dtype,
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
    from collage_farm.core.graph import DataflowGraph, load_graph

    graph = model if isinstance(model, DataflowGraph) else load_graph(model)
    ranges: dict[str, tuple[float, float]]
    if tensor_ranges is None:
        ranges = {}
    elif isinstance(tensor_ranges, Mapping):
        ranges = {k: (float(v[0]), float(v[1])) for k, v in tensor_ranges.items()}
    else:
        ranges = {k: (float(lo), float(hi)) for k, lo, hi in tensor_ranges}
    return _Converter(graph, mode, ranges).run()

