"""Prefixes of one conversion: the TFLite model of a graph's first nodes, cut from the
converter's IR of the whole graph instead of converting each prefix on its own.

Why: a prefix profile (`runners.profile.PrefixProfiler`) times a model's prefixes. Converting
each prefix as a model of its own parses, folds and lowers every weight it holds again (a
transformer's embedding table, 154 MB in gpt2, is in every prefix), and a prefix converted on
its own may be fused or laid out differently from the same nodes inside the whole model.

`Lowered.of` lowers a whole graph once in fp32 mode (the lowering and the layout peephole, as
`runners.tflite.convert` does); `Lowered.whole` writes it (the same bytes `convert` writes).
`Lowered.prefix` writes the flatbuffer of the operators emitted for the ONNX nodes of a given
set (an operator's first node; a fusion that reaches past the cut, a Conv with the Relu after
it, counts with the node it was emitted for), with the operators they read from, in the whole
model's order: exactly the kernels the whole model runs up to the cut, after its own fusions
and peephole. A set whose nodes were all folded away has no operator: `prefix` raises. The
prefix's inputs are the whole model's (same feeds); its outputs are the tensors its operators
make that a later operator or the graph's output reads. Tensors and buffers nothing in the
prefix uses are left out.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collage_farm.core.graph import DataflowGraph, load_graph
from runners.tflite.converter import lowered
from runners.tflite.flatbuffer import _serialise, _write_flatbuffer
from runners.tflite.ir import _Builder
from runners.tflite.result import ConversionError, ConvertedModel

if TYPE_CHECKING:
    import onnx

__all__ = ["Lowered"]


@dataclass(frozen=True)
class Lowered:
    """The converter's fp32 IR of one whole graph (module docstring)."""

    ir: _Builder

    @staticmethod
    def of(model: bytes | onnx.ModelProto | DataflowGraph) -> Lowered:
        """``model`` lowered in fp32 mode; raises what `runners.tflite.convert` raises."""
        graph = model if isinstance(model, DataflowGraph) else load_graph(model)
        return Lowered(lowered(graph, "fp32", {}))

    def whole(self) -> ConvertedModel:
        """The whole model, as `runners.tflite.convert(model, "fp32")` returns it."""
        return _serialise(self.ir, {})

    def prefix_ops(self, inside: Collection[str]) -> list[int]:
        """The operators of the prefix of the nodes ``inside``: those emitted for a node in it
        (their first node), and every operator they read from (transitively), in the model's
        order."""
        ops = self.ir.ops
        names = set(inside)
        producer = {t: i for i, op in enumerate(ops) for t in op.outputs}
        keep: set[int] = set()
        todo = [i for i, op in enumerate(ops) if op.nodes and op.nodes[0] in names]
        while todo:
            i = todo.pop()
            if i in keep:
                continue
            keep.add(i)
            todo += [producer[t] for t in ops[i].inputs if t in producer]
        return sorted(keep)

    def prefix(self, inside: Collection[str]) -> bytes:
        """The flatbuffer of the prefix of the nodes ``inside`` (module docstring); raises
        `ConversionError` when no operator belongs to it or it gives no output."""
        conv = self.ir
        keep = self.prefix_ops(inside)
        if not keep:
            raise ConversionError("no converted operator lies in the prefix")
        kept = set(keep)
        graph_out = {conv.by_name[n] for n in conv.g.graph_outputs}
        read_later = graph_out | {t for i, op in enumerate(conv.ops) if i not in kept
                                  for t in op.inputs}
        outs = list(dict.fromkeys(t for i in keep for t in conv.ops[i].outputs
                                  if t in read_later))
        if not outs:
            raise ConversionError("the prefix gives no tensor a later operator reads")
        ins = [conv.by_name[n] for n in conv.g.graph_inputs]
        used = sorted({*ins, *(t for i in keep for t in (*conv.ops[i].inputs,
                                                          *conv.ops[i].outputs) if t >= 0)})
        new = {old: k for k, old in enumerate(used)}
        new[-1] = -1  # an omitted optional input stays omitted
        sub = copy.copy(conv)
        sub.tensors = [conv.tensors[t] for t in used]
        sub.ops = [dataclasses.replace(conv.ops[i], inputs=[new[t] for t in conv.ops[i].inputs],
                                       outputs=[new[t] for t in conv.ops[i].outputs])
                   for i in keep]
        data, _ = _write_flatbuffer(sub, {}, [new[t] for t in ins], [new[t] for t in outs])
        return data
