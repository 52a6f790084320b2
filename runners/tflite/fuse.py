"""Graph simplification before lowering: what folds into the op before it, and fused activations.

Fusions that do not change results are planned over the whole graph before any op is emitted:
a per-channel constant ``Add`` after Gemm / MatMul folds into the bias; after a Conv or a
ConvTranspose, any chain
of BatchNormalization, per-channel constant ``Mul`` and per-channel constant ``Add`` folds into
its weights and bias (one per-channel affine map, in both modes); the HardSwish pattern
``x * Clip(x + 3, 0, 6) / 6`` becomes one HARD_SWISH; in fp32 an exact-GELU pattern
(``x * 0.5 * (1 + erf(x / sqrt 2))``) becomes one GELU; Relu / Clip(0, 6) / Clip(-1, 1) after an
op that has a fused-activation field becomes that field. Each fold applies only when the
intermediate tensor has no other reader (and is not a graph output).

Why the folds matter in int8 most: every tensor an op writes is rounded to 256 levels of its
calibrated range. A Conv followed by a separate per-channel MUL quantises the product's
constant per tensor (one scale for channels whose factors differ by orders of magnitude) and
rounds the Conv's output before scaling it; folded, the factors land in the Conv's per-channel
weights. The decomposed HardSwish rounds ``x * relu6(x + 3)``, whose range is six times the
output's and quadratic in ``x``, before dividing by 6; HARD_SWISH rounds once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from runners.tflite.fold import _init_array, _is_const
from runners.tflite.params import _bn_scale_shift, _fused_act_code, _gelu_chain, _hardswish_chain
from runners.tflite.result import ActivationBits
from runners.tflite.support import convertible

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node


@dataclass(frozen=True)
class FusionPlan:
    """The folds of one graph, by ONNX node index.

    ``fused``: per node that absorbs others, (the nodes folded into it: BatchNormalization,
    bias Add or the rest of a GELU pattern; the activation node fused into it, or None).
    ``absorbed``: the indices of every node folded into another (they emit nothing).
    ``bias_of`` / ``bn_of`` / ``gelu_of``: the folded bias vector (Gemm / MatMul), the
    per-channel affine map (scale, shift) applied to a Conv's or ConvTranspose's output (its
    BatchNormalization, constant Mul and Add folds composed), and the GELU input tensor of the
    node that absorbs them. ``hardswish_of``: the input tensor of a HardSwish pattern, by its
    first node.
    """

    fused: dict[int, tuple[tuple[Node, ...], Node | None]]
    absorbed: frozenset[int]
    bias_of: dict[int, np.ndarray]
    bn_of: dict[int, tuple[np.ndarray, np.ndarray]]
    gelu_of: dict[int, str]
    hardswish_of: dict[int, str] = field(default_factory=dict)


def plan_fusions(graph: DataflowGraph, mode: str,
                 activations: ActivationBits = ActivationBits.INT8) -> FusionPlan:
    """The `FusionPlan` of ``graph`` in ``mode`` ("int8" | "fp32"); nodes are in graph order.
    With int16 ``activations`` the HardSwish pattern stays op by op (neither Vela nor LiteRT's
    reference kernels take an int16 HARD_SWISH)."""
    return _FusionPlanner(graph, mode, activations is ActivationBits.INT8).plan()


class _FusionPlanner:
    """Finds the folds and fused activations of one graph (see `FusionPlan`)."""

    def __init__(self, graph: DataflowGraph, mode: str, hard_swish: bool = True) -> None:
        self.g = graph
        self.mode = mode
        self.hard_swish = hard_swish
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

    def _per_channel_const(self, node: Node, tensor: str, channels: int, channel_axis: int,
                           out_rank: int, op_type: str = "Add") -> np.ndarray | None:
        """The per-channel vector the constant operand of an ``op_type`` (Add / Mul) is, or
        None."""
        if node.op_type != op_type or node.domain not in ("", "ai.onnx") \
                or len(node.inputs) != 2:
            return None
        other = node.inputs[1] if node.inputs[0] == tensor else node.inputs[0]
        if node.inputs[0] == node.inputs[1]:
            return None
        arr = _init_array(self.g, other)
        if arr is None or arr.dtype != np.float32 or arr.ndim > out_rank:
            return None
        if self.g.tensors[node.outputs[0]].shape != self.g.tensors[tensor].shape:
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
        self.hardswish_of: dict[int, str] = {}  # first node of a HardSwish pattern -> its x
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
            if n.op_type == "Add" and self.hard_swish:
                chain = _hardswish_chain(g, n, self.private)
                if chain is not None:
                    self.hardswish_of[n.index] = chain[0]
                    absorbed.update(x.index for x in chain[1])
                    plan[n.index] = (chain[1], None)
                    continue
            if n.op_type in ("Conv", "ConvTranspose"):
                out = self._fold_affine(n, fused, absorbed)
            dense = n.op_type in ("Conv", "Gemm") or (
                n.op_type == "MatMul" and _is_const(g, n.inputs[1]))
            if dense and n.op_type != "Conv":
                c = self._sole_consumer(out)
                shape = self.g.tensors[out].shape
                ch_axis = len(shape) - 1
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
        return FusionPlan(plan, frozenset(absorbed), self.bias_of, self.bn_of, self.gelu_of,
                          self.hardswish_of)

    def _fold_affine(self, conv: Node, fused: list[Node], absorbed: set[int]) -> str:
        """Folds the chain of BatchNormalization / per-channel constant Mul / Add after
        ``conv`` (a Conv or ConvTranspose: output channels on axis 1) into ``bn_of`` (one
        composed (scale, shift)); the chain's last output."""
        g, out = self.g, conv.outputs[0]
        shape = g.tensors[out].shape
        scale = np.ones(shape[1], np.float32)
        shift = np.zeros(shape[1], np.float32)
        while (c := self._sole_consumer(out)) is not None:
            if c.op_type == "BatchNormalization" and c.domain in ("", "ai.onnx") \
                    and c.inputs[0] == out and convertible(c, g, self.mode) is None:
                s, t = _bn_scale_shift(c, g)
                scale, shift = scale * s, shift * s + t
            elif (v := self._per_channel_const(c, out, shape[1], 1, len(shape), "Mul")) \
                    is not None:
                scale, shift = scale * v, shift * v
            elif (v := self._per_channel_const(c, out, shape[1], 1, len(shape))) is not None:
                shift = shift + v
            else:
                break
            absorbed.add(c.index)
            fused.append(c)
            out = c.outputs[0]
        if fused:
            self.bn_of[conv.index] = (scale, shift)
        return out
