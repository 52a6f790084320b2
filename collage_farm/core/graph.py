"""DataflowGraph: an ONNX model as post-DFS indexed nodes.

Everything in Collage speaks in post-DFS indices (RFC 0062, "Util Datatypes"): if index i < j,
node j cannot influence node i. Sub-graphs are bitsets over those indices, candidates are
indexed by their smallest index, and the search always extends a state with a candidate that
contains the first uncovered index. This module builds that indexing once per model, together
with everything later phases ask about nodes over and over (op kind, tensor shapes and dtypes,
producers and consumers, descendant sets for convexity checks), so no later phase has to touch
the protobuf again.

Loading does the per-model work exactly once: parse (`collage_farm.core.modelprep`), check,
bind dynamic input dims given by the user, fold ``Constant`` nodes into initializers
(`collage_farm.core.folding`), order the nodes, infer shapes (falling back to one ONNX Runtime
probe run when static inference leaves a tensor without a concrete shape:
`collage_farm.core.shapes`), and fold shape computations the bound inputs made constant. A
malformed model is reported as a `ModelError` naming what is wrong.

The names those modules define that callers use with the graph (`ModelError`, `TensorInfo`,
`parse_shape`, `bind_input_shapes`, `MAX_IR_VERSION`, `numel`, ...) are re-exported here.
"""

from __future__ import annotations

import enum
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from collage_farm.core.feeds import attach_input_values, random_feeds
from collage_farm.core.folding import fold_constants, fold_shape_computations
from collage_farm.core.modelprep import (
    bind_input_shapes,
    bind_inputs,
    clear_negative_dims,
    parse_shape,
    read_model,
)
from collage_farm.core.shapes import infer_tensors
from collage_farm.core.tensors import (
    MAX_IR_VERSION,
    MAX_MODEL_BYTES,
    ModelError,
    TensorInfo,
    dtype_name,
    numel,
)

__all__ = [
    "MAX_IR_VERSION",
    "MAX_MODEL_BYTES",
    "OP_KINDS",
    "DataflowGraph",
    "ModelError",
    "Node",
    "OpKind",
    "TensorInfo",
    "bind_input_shapes",
    "dtype_name",
    "load_graph",
    "numel",
    "op_kind",
    "parse_shape",
    "random_inputs",
]

log = logging.getLogger(__name__)


class OpKind(enum.IntEnum):
    """TVM's operator pattern kinds (TOpPattern), ordered as in TVM."""

    ELEMWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    COMM_REDUCE = 3
    OUT_ELEMWISE_FUSABLE = 4
    TUPLE = 7
    OPAQUE = 8


_K = OpKind
OP_KINDS: dict[str, OpKind] = {}


def _kinds(kind: OpKind, names: str) -> None:
    for n in names.split():
        OP_KINDS[n] = kind


_kinds(
    _K.ELEMWISE,
    "Relu LeakyRelu PRelu Sigmoid HardSigmoid HardSwish Tanh Exp Log Sqrt Reciprocal Neg Abs "
    "Erf Gelu FastGelu Softplus Softsign Elu Selu Celu Mish Swish SiLU Clip Cast CastLike Identity "
    "Floor Ceil Round Sign Sin Cos Tan Asin Acos Atan Sinh Cosh Not IsNaN IsInf ThresholdedRelu "
    "Dropout QuantizeLinear DequantizeLinear BitwiseNot",
)
_kinds(
    _K.BROADCAST,
    "Add Sub Mul Div Pow Max Min Mean Sum Where Equal Less Greater LessOrEqual GreaterOrEqual "
    "And Or Xor Mod BitShift BitwiseAnd BitwiseOr BitwiseXor BiasGelu",
)
_kinds(
    _K.INJECTIVE,
    "Reshape Transpose Flatten Squeeze Unsqueeze Concat Split Slice Gather GatherElements "
    "GatherND Expand Tile Pad Shape Size ConstantOfShape Range DepthToSpace SpaceToDepth "
    "Resize Upsample ScatterND ScatterElements Trilu OneHot EyeLike",
)
_kinds(
    _K.COMM_REDUCE,
    "ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum "
    "ReduceLogSumExp ReduceSumSquare ArgMax ArgMin GlobalAveragePool GlobalMaxPool GlobalLpPool "
    "Softmax LogSoftmax Hardmax CumSum TopK",
)
_kinds(
    _K.OUT_ELEMWISE_FUSABLE,
    "Conv ConvTranspose MatMul Gemm MatMulInteger ConvInteger QLinearConv QLinearMatMul "
    "AveragePool MaxPool LpPool BatchNormalization InstanceNormalization LayerNormalization "
    "GroupNormalization SimplifiedLayerNormalization RMSNormalization LRN Einsum "
    "Attention MultiHeadAttention SkipLayerNormalization EmbedLayerNormalization "
    "RotaryEmbedding",
)
_kinds(_K.OPAQUE, "NonZero NonMaxSuppression Loop If Scan RoiAlign Unique")

def op_kind(op_type: str, domain: str = "") -> OpKind:
    """The pattern kind of an operator. Unknown ops and custom domains are opaque."""
    if domain not in ("", "ai.onnx", "com.microsoft"):
        return OpKind.OPAQUE
    return OP_KINDS.get(op_type, OpKind.OPAQUE)


@dataclass(eq=False)
class Node:
    """One ONNX operator in the dataflow graph, at post-DFS index ``index``."""

    index: int
    name: str
    op_type: str
    domain: str
    inputs: tuple[str, ...]  # tensor names ("" for an omitted optional input)
    outputs: tuple[str, ...]
    attrs: dict[str, object]
    kind: OpKind
    proto: onnx.NodeProto
    preds: tuple[int, ...] = ()  # producer node indices (dedup, sorted)
    succs: tuple[int, ...] = ()  # consumer node indices (dedup, sorted)
    is_external: bool = False  # produces a graph output
    implicit_inputs: tuple[str, ...] = ()  # outer-scope tensors used by If/Loop/Scan bodies

    def __repr__(self) -> str:
        return f"Node({self.index}, {self.op_type}, {self.name!r})"


@dataclass(eq=False)
class DataflowGraph:
    """An ONNX model's nodes in post-DFS order with types, kinds and reachability."""

    model: onnx.ModelProto  # shape-inferred, Constant-folded, inputs bound
    nodes: list[Node]
    tensors: dict[str, TensorInfo]  # every non-empty tensor name with a known type
    initializers: dict[str, onnx.TensorProto]
    graph_inputs: tuple[str, ...]  # runtime inputs (initializers excluded)
    graph_outputs: tuple[str, ...]
    producer: dict[str, int]  # tensor -> node index
    consumers: dict[str, tuple[int, ...]]  # tensor -> node indices
    descendants: list[int] = field(repr=False, default_factory=list)  # bitsets, strict
    name: str = "model"

    def __len__(self) -> int:
        return len(self.nodes)

    @property
    def all_mask(self) -> int:
        return (1 << len(self.nodes)) - 1

    @cached_property
    def total_bytes(self) -> int:
        """Bytes one run of the whole model touches: every weight, input and activation."""
        return sum(t.nbytes for t in self.tensors.values())

    def node_by_name(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def input_infos(self, node: Node) -> list[TensorInfo | None]:
        return [self.tensors.get(t) if t else None for t in node.inputs]

    def output_infos(self, node: Node) -> list[TensorInfo | None]:
        return [self.tensors.get(t) if t else None for t in node.outputs]

    def is_initializer(self, tensor: str) -> bool:
        return tensor in self.initializers

    @property
    def opset(self) -> int:
        for imp in self.model.opset_import:
            if imp.domain in ("", "ai.onnx"):
                return imp.version
        return 0


# ----------------------------------------------------------------------------------------
# loading


def random_inputs(graph_or_model: DataflowGraph | onnx.ModelProto, seed: int = 0
                  ) -> dict[str, np.ndarray]:
    """Seeded feeds for a model's runtime inputs: indices in range, fixed values as stored
    (`collage_farm.core.feeds`)."""
    model = graph_or_model.model if isinstance(graph_or_model, DataflowGraph) else graph_or_model
    return random_feeds(model, seed)


def _attr_value(a: onnx.AttributeProto) -> object:
    if a.type == onnx.AttributeProto.GRAPH:
        return ("graph", a.g.name, len(a.g.node))
    if a.type == onnx.AttributeProto.GRAPHS:
        return ("graphs", len(a.graphs))
    if a.type == onnx.AttributeProto.TENSOR:
        arr = numpy_helper.to_array(a.t)
        small = arr.tobytes() if arr.size <= 64 else b""
        return ("tensor", arr.dtype.name, tuple(arr.shape), small)
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, list):
        return tuple(x.decode("utf-8", "replace") if isinstance(x, bytes) else x for x in v)
    return v


def _subgraph_free_names(g: onnx.GraphProto) -> set[str]:
    """Names a (nested) body graph reads from its enclosing scope."""
    defined = {i.name for i in g.input} | {i.name for i in g.initializer}
    used: set[str] = set()
    for n in g.node:
        used.update(x for x in n.input if x)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                used |= _subgraph_free_names(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    used |= _subgraph_free_names(sg)
        defined.update(x for x in n.output if x)
    used.update(o.name for o in g.output)
    return used - defined


def load_graph(
    source: str | os.PathLike | bytes | onnx.ModelProto,
    shapes: Mapping[str, Sequence[int]] | None = None,
    name: str | None = None,
    inputs: Mapping[str, np.ndarray] | None = None,
) -> DataflowGraph:
    """Load an ONNX model into a `DataflowGraph`, raising `ModelError` for anything unusable.

    ``shapes`` binds dynamic input dimensions; ``inputs`` fixes input values (every feed made
    for the model, and for any model cut from it, uses them: `collage_farm.core.feeds`).
    """
    try:
        return _load_graph(source, shapes, name, inputs=inputs)
    except UnicodeDecodeError as e:  # protobuf parses bad UTF-8 in strings; reading them fails
        raise ModelError(f"model holds a name or string that is not valid UTF-8 ({e})") from None


def _load_graph(
    source: str | os.PathLike | bytes | onnx.ModelProto,
    shapes: Mapping[str, Sequence[int]] | None,
    name: str | None,
    *,
    fold_rounds: int = 8,
    inputs: Mapping[str, np.ndarray] | None = None,
) -> DataflowGraph:
    """`load_graph`'s steps, in the order their checks must run; recursive after folding."""
    model = onnx.ModelProto()
    model.CopyFrom(read_model(source))
    if name is None:
        name = Path(source).stem if isinstance(source, (str, os.PathLike)) else (
            model.graph.name or "model")
    out_names = _check_outputs(model.graph)
    _check_versions(model, name)
    clear_negative_dims(model)
    bind_inputs(model, shapes or {})
    attach_input_values(model, inputs or {})
    fold_constants(model)
    g = model.graph
    if not g.node:
        raise ModelError("model has no operator nodes (after folding Constant nodes): "
                         "nothing to partition")
    _name_nodes(g)
    producer_pos, available, input_names = _index_producers(g)
    implicit = _outer_scope_reads(g, producer_pos, available)
    for o in out_names:
        if o not in producer_pos and o not in available:
            raise ModelError(f"graph output {o!r} is produced by nothing")
    order = _post_dfs_order(g, out_names, producer_pos, implicit)
    implicit = _reorder_nodes(g, order, implicit)
    model, tensors, probed = infer_tensors(model)
    if fold_rounds > 0 and fold_shape_computations(model, tensors, set(out_names),
                                                   probed=set(probed)):
        # nodes went away: order, infer and index the smaller graph from the start (its
        # inputs are bound and its nodes named already, so this is the same load again).
        # Another round: shapes only the probe knew may now be static and fold in turn.
        return _load_graph(model, None, name, fold_rounds=fold_rounds - 1)
    return _build_graph(model, tensors, implicit, input_names, out_names, name)


def _check_outputs(g: onnx.GraphProto) -> list[str]:
    """The graph's output names, which must exist and be distinct."""
    if not g.output:
        raise ModelError("model has no outputs")
    out_names = [o.name for o in g.output]
    dup = {n for n in out_names if out_names.count(n) > 1}
    if dup:
        raise ModelError(f"duplicate graph output names: {sorted(dup)}")
    return out_names


def _check_versions(model: onnx.ModelProto, name: str) -> None:
    """Refuse IR versions and opsets this onnx cannot handle; lift a too-low IR version."""
    if model.ir_version < 3:
        raise ModelError(f"IR version {model.ir_version} is too old (need >= 3)")
    if model.ir_version > onnx.IR_VERSION:
        raise ModelError(
            f"IR version {model.ir_version} is newer than this onnx ({onnx.IR_VERSION}) supports"
        )
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx") and imp.version > onnx.defs.onnx_opset_version():
            raise ModelError(
                f"opset {imp.version} is newer than supported ({onnx.defs.onnx_opset_version()})"
            )
        if imp.domain in ("", "ai.onnx") and imp.version < 1:
            raise ModelError(f"opset {imp.version} is not a valid ONNX opset")
    try:
        need_ir = helper.find_min_ir_version_for(
            [i for i in model.opset_import if i.domain in ("", "ai.onnx", "ai.onnx.ml")],
            ignore_unknown=True)
    except Exception:  # an opset the table does not know: the checks above decide
        need_ir = 0
    if model.ir_version < need_ir:
        # ONNX Runtime and OpenVINO run such exports (IR and opset versions disagree, the
        # operators are what the opsets say): lift the IR version of the in-memory copy, which
        # is what shape inference and the extracted sub-models need, and say so once
        ops = ", ".join(f"{i.domain or 'ai.onnx'} {i.version}" for i in model.opset_import)
        log.warning("%s: IR version %d is below what its opsets (%s) need; read as IR %d "
                    "(the file is not changed)", name, model.ir_version, ops, need_ir)
        model.ir_version = need_ir


def _name_nodes(g: onnx.GraphProto) -> None:
    """Give every node a unique, stable name (real exports often have none)."""
    seen: set[str] = set()
    for i, n in enumerate(g.node):
        nm = n.name or f"{n.op_type}_{i}"
        while nm in seen:
            nm = f"{nm}_{i}"
        seen.add(nm)
        n.name = nm


def _index_producers(g: onnx.GraphProto) -> tuple[dict[str, int], set[str], list[str]]:
    """Producer position of every node output, the tensors available without a node (inputs
    and initializers), and the runtime input names; each tensor must be produced once."""
    init_names = {t.name for t in g.initializer}
    const_out = [o.name for o in g.output if o.name in init_names]
    if const_out:  # legal ONNX, but no partition computes it and no runner returns it
        raise ModelError(f"graph output(s) {const_out} are constants (initializers or folded "
                         "Constant nodes) that no node computes: remove them from the model's "
                         "outputs (their values are fixed) and tune the rest")
    input_names = [i.name for i in g.input if i.name not in init_names]
    available = set(init_names) | set(input_names)
    producer_pos: dict[str, int] = {}
    for i, n in enumerate(g.node):
        for o in n.output:
            if not o:
                continue
            if o in producer_pos or o in available:
                raise ModelError(f"tensor {o!r} is produced twice (node {n.name!r})")
            producer_pos[o] = i
    return producer_pos, available, input_names


def _outer_scope_reads(g: onnx.GraphProto, producer_pos: Mapping[str, int],
                       available: set[str]) -> dict[int, tuple[str, ...]]:
    """Node position -> tensors its If/Loop/Scan bodies read from this graph (sorted).

    Checks, node by node, that every tensor a node reads, directly or through its bodies, is
    produced by a node or is an input or initializer.
    """
    implicit: dict[int, tuple[str, ...]] = {}
    for i, n in enumerate(g.node):
        free: set[str] = set()
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                free |= _subgraph_free_names(a.g)
            elif a.type == onnx.AttributeProto.GRAPHS:
                for sg in a.graphs:
                    free |= _subgraph_free_names(sg)
        if free:
            implicit[i] = tuple(sorted(x for x in free if x in producer_pos or x in available))
        for t in list(n.input) + list(implicit.get(i, ())):
            if t and t not in producer_pos and t not in available:
                raise ModelError(
                    f"node {n.name!r} reads tensor {t!r}, which no node, input or initializer "
                    f"provides (missing initializer?)"
                )
    return implicit


def _post_dfs_order(g: onnx.GraphProto, out_names: Sequence[str],
                    producer_pos: Mapping[str, int],
                    implicit: Mapping[int, tuple[str, ...]]) -> list[int]:
    """Node positions in post-DFS order from the outputs, dead nodes after the live ones.

    Iterative, as deep models overflow recursion; a cycle raises `ModelError`.
    """
    order: list[int] = []
    state = [0] * len(g.node)  # 0 new, 1 on stack, 2 done

    def preds_of(i: int) -> list[int]:
        ts = list(g.node[i].input) + list(implicit.get(i, ()))
        return [producer_pos[t] for t in ts if t in producer_pos]

    roots = [producer_pos[o] for o in out_names if o in producer_pos]
    roots += list(range(len(g.node)))  # dead nodes too, after the live ones
    for r in roots:
        if state[r]:
            continue
        stack = [(r, iter(preds_of(r)))]
        state[r] = 1
        while stack:
            cur, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                state[cur] = 2
                order.append(cur)
            elif state[nxt] == 1:
                raise ModelError(
                    f"the graph has a cycle through node {g.node[nxt].name!r} "
                    f"({g.node[nxt].op_type})"
                )
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(preds_of(nxt))))
    return order


def _reorder_nodes(g: onnx.GraphProto, order: Sequence[int],
                   implicit: Mapping[int, tuple[str, ...]]) -> dict[int, tuple[str, ...]]:
    """Put the protobuf nodes in ``order`` (a valid topological order); ``implicit`` re-keyed."""
    protos = [g.node[i] for i in order]
    new_nodes = [onnx.NodeProto() for _ in protos]
    for dst, src in zip(new_nodes, protos):
        dst.CopyFrom(src)
    del g.node[:]
    g.node.extend(new_nodes)
    return {new: implicit[old] for new, old in enumerate(order) if old in implicit}


def _build_graph(model: onnx.ModelProto, tensors: dict[str, TensorInfo],
                 implicit: Mapping[int, tuple[str, ...]], input_names: Sequence[str],
                 out_names: Sequence[str], name: str) -> DataflowGraph:
    """The `DataflowGraph` of a model whose nodes are in post-DFS order and fully typed."""
    g = model.graph
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(g.node):
        for t in set(list(n.input) + list(implicit.get(i, ()))):
            if t:
                consumers.setdefault(t, []).append(i)
    outset = set(out_names)
    nodes = [_make_node(i, p, producer, consumers, implicit.get(i, ()), outset)
             for i, p in enumerate(g.node)]
    return DataflowGraph(
        model=model,
        nodes=nodes,
        tensors=tensors,
        initializers={t.name: t for t in g.initializer},
        graph_inputs=tuple(input_names),
        graph_outputs=tuple(out_names),
        producer=producer,
        consumers={k: tuple(v) for k, v in consumers.items()},
        descendants=_descendants(nodes),
        name=name,
    )


def _make_node(i: int, p: onnx.NodeProto, producer: Mapping[str, int],
               consumers: Mapping[str, list[int]], implicit: tuple[str, ...],
               outset: set[str]) -> Node:
    """Node ``i`` of the graph, from its proto and the graph's producer/consumer maps."""
    ins = list(p.input) + list(implicit)
    preds = sorted({producer[t] for t in ins if t in producer})
    succs = sorted({c for o in p.output if o for c in consumers.get(o, ())})
    return Node(
        index=i,
        name=p.name,
        op_type=p.op_type,
        domain=p.domain,
        inputs=tuple(p.input),
        outputs=tuple(p.output),
        attrs={a.name: _attr_value(a) for a in p.attribute},
        kind=op_kind(p.op_type, p.domain),
        proto=p,
        preds=tuple(preds),
        succs=tuple(succs),
        is_external=any(o in outset for o in p.output),
        implicit_inputs=implicit,
    )


def _descendants(nodes: Sequence[Node]) -> list[int]:
    """Each node's strict descendants as a bitset over post-DFS indices."""
    desc = [0] * len(nodes)
    for n in reversed(nodes):
        m = 0
        for s in n.succs:
            m |= (1 << s) | desc[s]
        desc[n.index] = m
    return desc
