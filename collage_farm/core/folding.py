"""Constant folding at load time: ``Constant`` nodes and shape computations become initializers.

Both are data, not work to place: a ``Constant`` node holds a value, and a shape computation
(``Shape -> Gather/Slice -> Concat -> Reshape``) is fixed once the inputs are bound. As
initializers they travel with every sub-graph that reads them instead of being cut into
candidates of their own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from collage_farm.core.tensors import MAX_IR_VERSION, ModelError, TensorInfo, dtype_name

#: ops never folded although their inputs are constant: their outputs differ run to run
_NONDETERMINISTIC = frozenset(
    "RandomNormal RandomUniform RandomNormalLike RandomUniformLike Multinomial Bernoulli".split())
#: largest tensor (elements) a folded node may produce: shape vectors, indices, masks; not
#: weights, which stay work for the toolchains (and would bloat every candidate's file)
MAX_FOLDED_ELEMENTS = 4096


def fold_constants(model: onnx.ModelProto) -> None:
    """Turn ``Constant`` nodes into initializers: they are data, not work to place."""
    g = model.graph
    keep = []
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1:
            t = _constant_tensor(n)
            if t is None:  # sparse / string constants stay as nodes
                keep.append(n)
                continue
            t.name = n.output[0]
            g.initializer.append(t)
        else:
            keep.append(n)
    if len(keep) != len(g.node):
        del g.node[:]
        g.node.extend(keep)


def _constant_tensor(n: onnx.NodeProto) -> onnx.TensorProto | None:
    """The value of a ``Constant`` node as a tensor; None for sparse and string values."""
    a = n.attribute[0] if n.attribute else None
    if a is None:
        raise ModelError(f"Constant node {n.name or n.output[0]!r} has no value")
    if a.name == "value":
        t = onnx.TensorProto()
        t.CopyFrom(a.t)
        return t
    v = helper.get_attribute_value(a)
    if a.name in ("value_float", "value_int"):
        arr = np.array(v, dtype=np.float32 if a.name == "value_float" else np.int64)
    elif a.name in ("value_floats", "value_ints"):
        arr = np.array(v, dtype=np.float32 if a.name == "value_floats" else np.int64)
    else:
        return None
    return numpy_helper.from_array(arr)


def fold_shape_computations(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo],
                            graph_outputs: set[str], probed: set[str]) -> bool:
    """Replace shape computations, constant once inputs are bound, by initializers.

    Why: exporters that keep dynamic dims (jax2tf, paddle2onnx, torch with dynamic axes) compute
    Reshape/Expand/Slice arguments at run time, ``Shape -> Gather/Slice -> Concat -> Reshape``.
    Once the inputs are bound those values are fixed, but as nodes they are cut into
    candidates like any other: a candidate whose Reshape reads a shape vector produced outside
    it receives that vector as a runtime input, which the runners fill with random integers,
    and the measurement fails ("cannot reshape", "invalid expand shape"). Folded, the vector is
    an initializer that travels with every sub-graph reading it.

    A node folds when it is a deterministic default-domain op without sub-graphs, produces no
    graph output, produces at most `MAX_FOLDED_ELEMENTS` elements per output, reads only
    constants (initializers, earlier folded tensors) and either reads a shape (``Shape``/``Size``
    of a statically shaped tensor, or a value derived from one) or produces integers or
    booleans only. Pure float computations on initializers (an embedding ``Gather`` at fixed
    positions) are left alone: they are real work, and the zoo's models keep their nodes.
    Shapes learnt by the probe run (``probed``) are data dependent (NonZero, ...) and never
    folded. Values are computed by one ONNX Runtime run; if that fails nothing is folded.
    Returns whether anything was.
    """
    plan = _FoldPlan({t.name for t in model.graph.initializer})
    for n in model.graph.node:
        plan.consider(n, tensors, graph_outputs, probed)
    if not plan.fold:
        return False
    values = dict(plan.known)
    compute = [n for n in plan.fold if n.op_type not in ("Shape", "Size")]
    if compute:
        values.update(evaluate_constant_nodes(model, compute, plan.known))
        if not values.keys() >= {o for n in compute for o in n.output if o}:
            return False
    _replace_by_initializers(model.graph, plan.folded_ids, values)
    return True


@dataclass
class _FoldPlan:
    """The nodes `fold_shape_computations` folds, chosen in graph order."""

    const: set[str]  # initializers and outputs of nodes chosen so far
    shape_derived: set[str] = field(default_factory=set)
    known: dict[str, np.ndarray] = field(default_factory=dict)  # Shape/Size outputs
    fold: list[onnx.NodeProto] = field(default_factory=list)
    folded_ids: set[int] = field(default_factory=set)  # id(): protobuf == compares whole messages

    def consider(self, n: onnx.NodeProto, tensors: Mapping[str, TensorInfo],
                 graph_outputs: set[str], probed: set[str]) -> None:
        """Add ``n`` to the plan if it folds, given the nodes before it."""
        outs = [o for o in n.output if o]
        ins = [t for t in n.input if t]
        if (n.domain not in ("", "ai.onnx") or not outs or not ins
                or n.op_type in _NONDETERMINISTIC or n.op_type == "Constant"
                or any(o in graph_outputs for o in outs)
                or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                       for a in n.attribute)):
            return
        if n.op_type in ("Shape", "Size") and len(outs) == 1:
            src = tensors.get(ins[0])
            if src is None or ins[0] in probed:
                return
            self.known[outs[0]] = _shape_value(n, src)
            self.shape_derived.add(outs[0])
            self.const.add(outs[0])
            self._add(n)
            return
        if not all(t in self.const for t in ins):
            return
        infos = [tensors.get(o) for o in outs]
        if any(i is None or i.size > MAX_FOLDED_ELEMENTS for i in infos):
            return
        derived = any(t in self.shape_derived for t in ins)
        if not derived and not all(np.dtype(dtype_name(i.elem_type)).kind in "iub"
                                   for i in infos if i is not None):
            return
        self._add(n)
        self.const.update(outs)
        if derived:
            self.shape_derived.update(outs)

    def _add(self, n: onnx.NodeProto) -> None:
        self.fold.append(n)
        self.folded_ids.add(id(n))


def _shape_value(n: onnx.NodeProto, src: TensorInfo) -> np.ndarray:
    """What a ``Shape`` (with its ``start``/``end``) or ``Size`` node outputs for ``src``."""
    if n.op_type == "Size":
        return np.array(src.size, dtype=np.int64)
    at = {a.name: a.i for a in n.attribute}
    start, end = at.get("start", 0), at.get("end", len(src.shape))
    return np.array(src.shape[start:end], dtype=np.int64)


def _replace_by_initializers(g: onnx.GraphProto, folded_ids: set[int],
                             values: Mapping[str, np.ndarray]) -> None:
    """Drop the folded nodes; their outputs still read become initializers."""
    keep = [n for n in g.node if id(n) not in folded_ids]
    consumed = {t for n in keep for t in n.input if t}
    del g.node[:]
    g.node.extend(keep)
    for name, arr in values.items():
        if name in consumed:
            g.initializer.append(numpy_helper.from_array(np.asarray(arr), name))
    folded = set(values)
    vis = [vi for vi in g.value_info if vi.name not in folded]
    del g.value_info[:]
    g.value_info.extend(vis)


def evaluate_constant_nodes(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto],
                            known: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of ``nodes`` (inputs: initializers and ``known``), by one ORT run; {} on error."""
    import onnxruntime as ort  # local: ORT is heavy and only needed for models that fold

    needed = {t for n in nodes for t in n.input if t}
    sub = onnx.ModelProto()
    sub.ir_version = min(model.ir_version, MAX_IR_VERSION)
    sub.opset_import.extend(model.opset_import)
    sub.graph.name = "fold"
    sub.graph.node.extend(nodes)
    sub.graph.initializer.extend(t for t in model.graph.initializer if t.name in needed)
    for name, arr in known.items():
        if name in needed:
            sub.graph.initializer.append(numpy_helper.from_array(arr, name))
    outs = [o for n in nodes for o in n.output if o]
    for o in outs:
        sub.graph.output.add().name = o
    so = ort.SessionOptions()
    so.log_severity_level = 4
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(sub.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])
        return dict(zip(outs, sess.run(outs, {})))
    except Exception:  # an op ORT cannot run standalone: keep the nodes, nothing is lost
        return {}
