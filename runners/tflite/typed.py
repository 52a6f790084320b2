"""Integer and boolean tensors in fp32 mode: ids, index arithmetic and one-hot masks.

Why: real models do integer work before their first float operator. magika reshapes its int32
byte input, compares it with the table of the 257 byte values (``Equal``: a boolean one-hot
mask) and casts the mask to float before its first MatMul; transformers look token ids up.
TFLite's RESHAPE, BROADCAST_TO, EQUAL, CAST and GATHER take int32 / int64 / bool tensors, so
in fp32 mode (LiteRT, the Cortex-M host's float reference kernels) the converter carries such
tensors with their own TensorType. In int8 mode (Vela) every activation is quantised to int8,
and an integer index or a mask is not a quantity: no integer or boolean tensor is converted
there, so the NPU never takes one and int8 calibration never touches one (the int8 check
refuses the node with the tensor's type in the reason).

Layout: integer and boolean tensors keep the ONNX layout; a rank-4 one is refused (rank-4 float
activations are held NHWC, and an integer tensor meeting them would need the layout decision
made twice).

Public to the converter's modules: `DTYPES`, `dtype_of`, `typed_checked`, `check_expand`,
`check_equal`, `check_cast`, `TypedLowering` (the emitters of Expand, Equal and Cast).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from runners.tflite.attrs import DTYPES
from runners.tflite.fold import _init_array, _is_const
from runners.tflite.ir import _Builder
from runners.tflite.layout import _nhwc, _nhwc_const
from runners.tflite.params import _dyn_rank

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node

#: integer dtypes whose constant data the converter writes as a const of that kind
_INT_KINDS = frozenset({"int32", "int64"})


def dtype_of(graph: DataflowGraph, name: str) -> str | None:
    """The converted dtype of tensor ``name`` ("float32", "int32", "int64", "bool"), or None
    (no static type, or an element type the converter does not write)."""
    info = graph.tensors.get(name)
    return None if info is None else DTYPES.get(info.elem_type)


def _why_tensor(graph: DataflowGraph, name: str, mode: str, role: str) -> str | None:
    info = graph.tensors.get(name)
    if info is None:
        return f"{role} {name!r} has no static shape"
    dt = DTYPES.get(info.elem_type)
    if dt is None:
        return f"{role} {name!r} is {info.dtype}, not float32, int32, int64 or bool"
    if dt != "float32" and mode != "fp32":
        return f"{role} {name!r} is {dt}: integer and boolean tensors are converted in fp32 " \
               "mode only (int8 quantises every activation)"
    if dt != "float32" and len(info.shape) == 4:
        return f"{role} {name!r} is a rank-4 {dt} tensor (only float rank-4 tensors are held " \
               "NHWC)"
    return None


def typed_io(node: Node, graph: DataflowGraph, mode: str,
             inputs: Sequence[int] | None = None) -> str | None:
    """None when the node's inputs (all, or these) and outputs are static tensors of a
    converted dtype (integer and boolean ones in fp32 mode only, never of rank 4), else why."""
    idx = range(len(node.inputs)) if inputs is None else inputs
    for i in idx:
        t = node.inputs[i] if i < len(node.inputs) else ""
        if t and not _is_const(graph, t):
            why = _why_tensor(graph, t, mode, "input")
            if why:
                return why
    outs = [o for o in node.outputs if o]
    if not outs:
        return "no outputs"
    for o in outs:
        why = _why_tensor(graph, o, mode, "output")
        if why:
            return why
        if any(d <= 0 for d in graph.tensors[o].shape):
            return f"output {o!r} has an empty dimension"
    return None


_Check = Callable[..., str | None]


def typed_checked(inputs: Sequence[int] | None = None) -> Callable[[_Check], _Check]:
    """Decorates a check of a type-preserving op (Reshape, Squeeze, ...): `typed_io` first,
    and the output's dtype must be input 0's."""

    def wrap(check: _Check) -> _Check:
        @functools.wraps(check)
        def checked(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
            why = typed_io(node, graph, mode, inputs)
            if why:
                return why
            if dtype_of(graph, node.inputs[0]) != dtype_of(graph, node.outputs[0]):
                return "output dtype differs from the input's"
            return check(node, graph, mode)

        return checked

    return wrap


@typed_checked(inputs=[0])
def check_expand(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    """Expand: to its own shape (an identity, both modes), or a same-rank broadcast (fp32)."""
    if len(node.inputs) < 2 or not _is_const(graph, node.inputs[1]):
        return "shape must be a constant"
    if _is_const(graph, node.inputs[0]):
        return "constant input"
    x, y = graph.tensors[node.inputs[0]].shape, graph.tensors[node.outputs[0]].shape
    if tuple(x) == tuple(y):
        return None
    if mode != "fp32":
        return "a broadcasting Expand is converted in fp32 mode only (BROADCAST_TO)"
    if len(x) != len(y) or len(y) > 5:
        return f"Expand from rank {len(x)} to rank {len(y)} (equal ranks up to 5 converted)"
    return None


def check_equal(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    """Equal of two tensors of one dtype (float or integer), one of them dynamic: EQUAL."""
    why = typed_io(node, graph, mode)
    if why:
        return why
    if len(node.inputs) != 2:
        return "needs two inputs"
    a, b = node.inputs
    if _is_const(graph, a) and _is_const(graph, b):
        return "both operands are constants (fold them first)"
    if dtype_of(graph, a) != dtype_of(graph, b) or dtype_of(graph, a) == "bool":
        return "operands must be float32, int32 or int64 of one type"
    r = _dyn_rank(graph, node.outputs[0])
    for t in (a, b):
        if not _is_const(graph, t) and _dyn_rank(graph, t) != r:
            return f"dynamic operand {t!r} of rank {_dyn_rank(graph, t)} broadcasts to rank {r}"
    return None


def check_cast(node: Node, graph: DataflowGraph, mode: str = "int8") -> str | None:
    """Cast between float32, int32, int64 and bool (CAST; float32 -> float32: an identity)."""
    why = typed_io(node, graph, mode)
    if why:
        return f"Cast: {why}"
    return None


class TypedLowering(_Builder):
    """Emitters of Expand, Equal and Cast (any converted dtype; see the module docstring).

    New activations take their dtype from the ONNX tensor (`_Builder.new_act`); integer and
    boolean constants keep their type (const kinds "int32" / "int64").
    """

    def _typed_operand(self, n: Node, t: str, rank: int, dtype: str) -> int:
        arr = _init_array(self.g, t)
        if arr is None:
            return self.act(t)
        if dtype in _INT_KINDS:
            return self.const(f"{n.name}/{t}", np.ascontiguousarray(arr), dtype)
        arr = _nhwc_const(arr.astype(np.float32), rank)
        return self.const(f"{n.name}/{t}", np.ascontiguousarray(arr), "const")

    def _emit_same(self, n: Node, out: str, nodes: tuple[str, ...]) -> None:
        """An identity of a computed tensor: a RESHAPE to its own (held) shape, the output's
        quantisation tied to the input's."""
        x = self.act(n.inputs[0])
        shape = self.tensors[x].shape
        y = self.new_act(out, self.g.tensors[out].shape)
        self.tie(x, y)
        self.op("RESHAPE", [x, self.const(f"{n.name}/shape", np.array(shape), "int32")], [y],
                nodes, {"NewShape": list(shape)})

    def _emit_expand(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y_shape = self.g.tensors[out].shape
        if tuple(self.g.tensors[n.inputs[0]].shape) == tuple(y_shape):
            self._emit_same(n, out, nodes)
            return
        shape = self.const(f"{n.name}/shape", np.array(_nhwc(y_shape)), "int32")
        y = self.new_act(out, y_shape)
        self.op("BROADCAST_TO", [self.act(n.inputs[0]), shape], [y], nodes)

    def _emit_equal(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        r = len(self.g.tensors[out].shape)
        dtype = dtype_of(self.g, n.inputs[0]) or "float32"
        a, b = (self._typed_operand(n, t, r, dtype) for t in n.inputs)
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("EQUAL", [a, b], [y], nodes)

    def _emit_cast(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        if dtype_of(self.g, n.inputs[0]) == dtype_of(self.g, out):
            self._emit_same(n, out, nodes)
            return
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("CAST", [self.act(n.inputs[0])], [y], nodes)
