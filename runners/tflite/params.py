"""TFLite parameters of ONNX nodes: padding, clip bounds, axes, patterns; or why none exist."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from runners.tflite.attrs import FLOAT, _attr, _ints
from runners.tflite.fold import _init_array, _is_const
from runners.tflite.layout import _NHWC_AXIS, _nhwc

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node


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
        mapped = _NHWC_AXIS[axis]
        nhwc = _nhwc(shape)
        if mapped != 3 and math.prod(nhwc[mapped + 1:]) != 1:
            return f"softmax axis {axis} is not the channel axis"
    elif axis != r - 1 and math.prod(shape[axis + 1:]) != 1:
        return f"softmax axis {axis} is not the last axis"
    return axis


def _softmax_nchw(node: Node, graph: DataflowGraph) -> bool:
    """A rank-4 softmax over the last ONNX axis (attention scores): run it in NCHW (fp32).

    NHWC holds that axis as W, not innermost, so the input is transposed to NCHW, the softmax
    runs over the innermost axis, and the result is transposed back.
    """
    shape = graph.tensors[node.inputs[0]].shape
    axis = int(_attr(node, "axis", -1 if graph.opset >= 13 else 1))  # type: ignore[arg-type]
    return len(shape) == 4 and axis in (-1, 3)


def _const_vector(graph: DataflowGraph, name: str, size: int) -> np.ndarray | None:
    v = _init_array(graph, name)
    if v is None or v.size != size:
        return None
    return v.astype(np.float64).reshape(-1)


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


def _pow_exponent(node: Node, graph: DataflowGraph) -> float | None:
    v = _init_array(graph, node.inputs[1]) if len(node.inputs) > 1 else None
    if v is None or v.size != 1 or v.dtype.kind != "f":
        return None
    return float(v.reshape(()))


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


_HARDSWISH_TOL = 1e-6


def _hardswish_chain(graph: DataflowGraph, add: Node, private: set[str]
                     ) -> tuple[str, tuple[Node, ...]] | None:
    """(x, (Clip, Mul, Div | Mul)) when ``add`` starts ``x * Clip(x + 3, 0, 6) / 6`` (the
    HardSwish exporters write; the division may be a Mul by 1/6), else None.

    ``private``: the tensors read by one node alone and not graph outputs; every
    intermediate of the pattern must be one (``x`` itself is read twice).
    """
    def reader(t: str) -> Node | None:
        if t not in private:
            return None
        cs = graph.consumers.get(t, ())
        return graph.nodes[cs[0]] if len(cs) == 1 else None

    x = next((t for t in add.inputs if not _is_const(graph, t)), "")
    if not x or x not in graph.tensors or _scalar_of(graph, add, x) != 3.0:
        return None
    clip = reader(add.outputs[0])
    if clip is None or clip.op_type != "Clip" or clip.inputs[0] != add.outputs[0] \
            or _clip_bounds(clip, graph) != (0.0, 6.0):
        return None
    mul = reader(clip.outputs[0])
    if mul is None or mul.op_type != "Mul" or sorted(mul.inputs) != sorted([x, clip.outputs[0]]):
        return None
    last = reader(mul.outputs[0])
    if last is None or last.op_type not in ("Div", "Mul"):
        return None
    c = _scalar_of(graph, last, mul.outputs[0])
    want = 6.0 if last.op_type == "Div" else 1.0 / 6.0
    if c is None or abs(c - want) > _HARDSWISH_TOL * want:
        return None
    if any(n.domain not in ("", "ai.onnx") for n in (add, clip, mul, last)) \
            or graph.tensors[last.outputs[0]].shape != graph.tensors[x].shape:
        return None
    return x, (clip, mul, last)
