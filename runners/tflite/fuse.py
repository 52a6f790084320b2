"""Graph simplification before lowering: what folds into the op before it, and fused activations.

Fusions that do not change results are planned over the whole graph before any op is emitted:
a per-channel constant ``Add`` after Conv / Gemm / MatMul folds into the bias; in fp32 a
BatchNormalization after a Conv folds into its weights and bias, and an exact-GELU pattern
(``x * 0.5 * (1 + erf(x / sqrt 2))``) becomes one GELU; Relu / Clip(0, 6) / Clip(-1, 1) after an
op that has a fused-activation field becomes that field. Each fold applies only when the
intermediate tensor has no other reader (and is not a graph output).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from runners.tflite.fold import _init_array, _is_const
from runners.tflite.params import _bn_scale_shift, _fused_act_code, _gelu_chain
from runners.tflite.support import convertible

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node


@dataclass(frozen=True)
class FusionPlan:
    """The folds of one graph, by ONNX node index.

    ``fused``: per node that absorbs others, (the nodes folded into it: BatchNormalization,
    bias Add or the rest of a GELU pattern; the activation node fused into it, or None).
    ``absorbed``: the indices of every node folded into another (they emit nothing).
    ``bias_of`` / ``bn_of`` / ``gelu_of``: the folded bias vector, the BatchNormalization
    (scale, shift), and the GELU input tensor of the node that absorbs them.
    """

    fused: dict[int, tuple[tuple[Node, ...], Node | None]]
    absorbed: frozenset[int]
    bias_of: dict[int, np.ndarray]
    bn_of: dict[int, tuple[np.ndarray, np.ndarray]]
    gelu_of: dict[int, str]


def plan_fusions(graph: DataflowGraph, mode: str) -> FusionPlan:
    """The `FusionPlan` of ``graph`` in ``mode`` ("int8" | "fp32"); nodes are in graph order."""
    return _FusionPlanner(graph, mode).plan()


class _FusionPlanner:
    """Finds the folds and fused activations of one graph (see `FusionPlan`)."""

    def __init__(self, graph: DataflowGraph, mode: str) -> None:
        self.g = graph
        self.mode = mode
        outs = set(graph.graph_outputs)
        self.consumers: dict[str, list[Node]] = {}
        for n in graph.nodes:
            for t in set(n.inputs):
                if t:
                    self.consumers.setdefault(t, []).append(n)
        self.private = {t for t, cs in self.consumers.items() if len(cs) == 1 and t not in outs}

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

    def plan(self) -> FusionPlan:  # one pass in graph order; each fold kind is a few lines
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
        return FusionPlan(plan, frozenset(absorbed), self.bias_of, self.bn_of, self.gelu_of)
