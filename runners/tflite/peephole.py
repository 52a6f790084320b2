"""fp32: the layout-transpose peephole over the emitted op list."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from runners.tflite.fold import _FOLD_MAX_ELEMENTS
from runners.tflite.ir import _T, _Builder, _Op

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
    rewrites the op list (before serialisation) with these exact rules, repeated until none
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

    def __init__(self, conv: _Builder) -> None:
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
