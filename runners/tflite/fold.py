"""Conversion-time constants: initializers, and shape arithmetic / ops on constants folded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from onnx import helper, numpy_helper

from runners.tflite.attrs import _attr, _ints

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node


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
        return numpy_helper.to_array(t)
    return _static_values(graph).get(name)


def _is_const(graph: DataflowGraph, name: str) -> bool:
    return bool(name) and (name in graph.initializers or name in _static_values(graph))


#: ops evaluated in numpy when every input is a constant (Shape: when its input's shape is)
_FOLDABLE = frozenset({"Shape", "Cast", "Slice", "Concat", "Gather", "Squeeze", "Unsqueeze",
                       "Reshape", "Transpose", "Identity", "Add", "Sub", "Mul", "Div"})


#: folded constants larger than this stay nodes (a huge folded table would bloat every model)
_FOLD_MAX_ELEMENTS = 1 << 22


def _fold_node(node: Node, graph: DataflowGraph, vals: Mapping[str, np.ndarray]
               ) -> np.ndarray | None:
    """numpy evaluation of one foldable node, or None (never raises for a foldable case)."""
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
