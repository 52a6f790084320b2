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
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from collage_farm.core.graph import DataflowGraph, load_graph
from runners.tflite.converter import lowered
from runners.tflite.flatbuffer import _serialise, _write_flatbuffer
from runners.tflite.ir import _Builder
from runners.tflite.layout import _layout_noop, _nhwc
from runners.tflite.result import ConversionError, ConvertedModel

if TYPE_CHECKING:
    import onnx

    from runners.runtime import WholeGraph

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

    @staticmethod
    def of_whole(whole: WholeGraph) -> Lowered:
        """``whole``'s graph lowered once for as long as ``whole`` keeps it (every slice of
        it is cut from this one); raises what `of` raised, on every call."""
        return whole.compiled("tflite-fp32", Lowered.of)

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
        return self._write(keep, [conv.by_name[n] for n in conv.g.graph_inputs], outs)

    def slice(self, inside: Collection[str], inputs: Sequence[str],
              outputs: Sequence[str]) -> bytes:
        """The flatbuffer of the contiguous node set ``inside`` whose ONNX inputs and outputs
        are ``inputs`` and ``outputs`` (module docstring, slices); raises `ConversionError`
        when the whole model's operators cannot be cut there."""
        conv = self.ir
        names = set(inside)
        keep = [i for i, op in enumerate(conv.ops) if op.nodes and op.nodes[0] in names]
        if not keep:
            raise ConversionError("no converted operator lies in the slice")
        made = {t for i in keep for t in conv.ops[i].outputs}
        outs = [self._boundary(n) for n in outputs]
        lost = [n for n, t in zip(outputs, outs) if t not in made]
        if lost:
            raise ConversionError(f"output {lost[0]!r} is not made by the slice's operators")
        read = {t for i in keep for t in conv.ops[i].inputs
                if t >= 0 and t not in made and conv.tensors[t].data is None}
        ins = [t for t in dict.fromkeys(conv.by_name.get(n, -1) for n in inputs) if t in read]
        if len(ins) != len(read):
            t = min(read - set(ins))
            raise ConversionError(f"the slice reads {conv.tensors[t].name!r}, not one of its "
                                  "inputs")
        for t in ins:
            self._boundary(conv.tensors[t].name)
        return self._write(keep, ins, outs)

    def cuts(self) -> frozenset[int]:
        """The positions p (0 < p < nodes, in the graph's node order) where `slice` can cut
        the whole model's operators between node p - 1 and node p: every ONNX tensor made
        before p and read from p on (or a graph output made before p) has a tensor of its own,
        made by an operator of a node before p and held as the boundary reads it, and the
        operators of the nodes from p on read from those before p only such tensors. A slice
        from one such position (or the graph's start) to another (or its end) can be cut."""
        conv, g = self.ir, self.ir.g
        n = len(g.nodes)
        pos = {node.name: i for i, node in enumerate(g.nodes)}
        if any(not op.nodes or op.nodes[0] not in pos for op in conv.ops):
            return frozenset()
        first = [pos[op.nodes[0]] for op in conv.ops]
        producer = {t: i for i, op in enumerate(conv.ops) for t in op.outputs}
        made = {o: i for i, node in enumerate(g.nodes) for o in node.outputs}
        last = {x: i for i, node in enumerate(g.nodes) for x in node.inputs if x in made}
        last.update({o: n for o in g.graph_outputs if o in made})
        bad: set[int] = set()
        for x, a in made.items():  # every ONNX tensor crossing p needs its own tensor
            t = self._held(x)
            ok_from = (first[producer[t]] + 1) if t is not None and t in producer else n + 1
            bad.update(p for p in range(a + 1, min(last.get(x, a), n - 1) + 1) if p < ok_from)
        name_of = {t: x for x, t in conv.by_name.items()}
        for j, op in enumerate(conv.ops):  # reads across p: only of crossing tensors
            for t in op.inputs:
                if t < 0 or t not in producer or conv.tensors[t].data is not None:
                    continue
                x = name_of.get(t)
                bad.update(p for p in range(first[producer[t]] + 1, first[j] + 1)
                           if x is None or self._held(x) != t
                           or not made.get(x, n) < p <= last.get(x, -1))
        return frozenset(range(1, n)) - bad

    def _held(self, name: str) -> int | None:
        """The tensor of ONNX tensor ``name`` when it has one held as the LiteRT runner's
        boundary reads it (float rank 4: NHWC; any other: the ONNX layout), else None."""
        t = self.ir.by_name.get(name)
        info = self.ir.g.tensors.get(name)
        if t is None or info is None:
            return None
        held = self.ir.tensors[t]
        shape = tuple(info.shape)
        if held.shape != (_nhwc(shape) if held.dtype == "float32" else shape):
            return None
        if len(shape) == 4 and held.dtype != "float32" and not _layout_noop(shape):
            return None
        return t

    def _boundary(self, name: str) -> int:
        """`_held`, raising `ConversionError` where it says None."""
        t = self._held(name)
        if t is None:
            raise ConversionError(f"tensor {name!r} has no tensor of its own in the lowering "
                                  "held as the slice's boundary reads it")
        return t

    def _write(self, keep: Sequence[int], ins: Sequence[int], outs: Sequence[int]) -> bytes:
        """The flatbuffer of the operators ``keep`` (whole-model order) with graph inputs
        ``ins`` and outputs ``outs`` (tensor indices); tensors none of them uses are left
        out."""
        conv = self.ir
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
