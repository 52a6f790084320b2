"""DataflowGraph: an ONNX model as post-DFS indexed nodes.

Everything in Collage speaks in post-DFS indices (RFC 0062, "Util Datatypes"): if index i < j,
node j cannot influence node i. Sub-graphs are bitsets over those indices, candidates are
indexed by their smallest index, and the search always extends a state with a candidate that
contains the first uncovered index. This module builds that indexing once per model, together
with everything later phases ask about nodes over and over (op kind, tensor shapes and dtypes,
producers and consumers, descendant sets for convexity checks), so no later phase has to touch
the protobuf again.

Loading does the per-model work exactly once: parse, check, bind dynamic input dims given by
the user, fold ``Constant`` nodes into initializers, infer shapes (falling back to one
ONNX Runtime probe run when static inference leaves a tensor without a concrete shape), and
order the nodes. A malformed model is reported as a `ModelError` naming what is wrong.
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
from onnx import helper, numpy_helper, shape_inference

log = logging.getLogger(__name__)

# ONNX Runtime 1.31 reads IR <= 13 while onnx 1.23 writes 14; 10 works in ORT and OpenVINO.
MAX_IR_VERSION = 10
#: protobuf refuses to serialise a message of 2 GiB or more
MAX_MODEL_BYTES = 2**31 - 1


class ModelError(ValueError):
    """The model cannot be used: malformed, cyclic, unbound dynamic dimension, ..."""


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

_DTYPE_NAMES = {
    v: np.dtype(helper.tensor_dtype_to_np_dtype(v)).name
    for v in onnx.TensorProto.DataType.values()
    if v not in (0, onnx.TensorProto.STRING)
    and v < 16  # the classic numeric types; exotic float8/int4 stay by number
}


def dtype_name(elem_type: int) -> str:
    return _DTYPE_NAMES.get(elem_type, f"onnx{elem_type}")


def op_kind(op_type: str, domain: str = "") -> OpKind:
    """The pattern kind of an operator. Unknown ops and custom domains are opaque."""
    if domain not in ("", "ai.onnx", "com.microsoft"):
        return OpKind.OPAQUE
    return OP_KINDS.get(op_type, OpKind.OPAQUE)


@dataclass(frozen=True)
class TensorInfo:
    """A tensor's static type: concrete shape and element type (ONNX enum and numpy name)."""

    name: str
    shape: tuple[int, ...]
    elem_type: int

    @property
    def dtype(self) -> str:
        return dtype_name(self.elem_type)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        try:
            item = np.dtype(helper.tensor_dtype_to_np_dtype(self.elem_type)).itemsize
        except (KeyError, TypeError, ValueError):
            item = 4
        return self.size * item


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


def _read_model(source: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, bytes):
        data = source
        where = "<bytes>"
    else:
        path = Path(source)
        if not path.exists():
            raise ModelError(f"{path}: no such file")
        where = str(path)
        try:
            model = onnx.load(str(path), load_external_data=False)
        except Exception as e:  # protobuf DecodeError, truncated files
            raise ModelError(
                f"{where}: not a readable ONNX model ({type(e).__name__}: {e})") from None
        if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
            raise ModelError(f"{where}: parsed, but holds no ONNX graph")
        # Weights stored beside the file are read only once we know they fit: candidates,
        # plan partitions and the shape probe are in-memory protobufs, capped at 2 GB.
        size = _model_bytes(model)
        if size > MAX_MODEL_BYTES:
            raise ModelError(
                f"{where}: model with its external data is {size:,} bytes ({size / 2**30:.3f} "
                f"GiB), over the 2 GiB protobuf limit ({MAX_MODEL_BYTES:,} bytes); "
                f"sub-models, plan partitions and runner messages are in-memory protobufs, "
                f"so models this large are not supported (split or quantise it)")
        try:
            onnx.load_external_data_for_model(model, str(path.parent))
        except Exception as e:  # missing or short data file, a location outside the folder
            raise ModelError(
                f"{where}: cannot read its external data ({type(e).__name__}: {e})") from None
        return model
    try:
        model = onnx.load_from_string(data)
    except Exception as e:
        raise ModelError(f"{where}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    if not model.HasField("graph"):
        raise ModelError(f"{where}: parsed, but holds no ONNX graph")
    return model


def _model_bytes(model: onnx.ModelProto) -> int:
    """Serialised size of ``model`` once its external data is loaded (without loading it)."""
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    total = model.ByteSize()
    for t in _get_all_tensors(model):
        if not uses_external_data(t):
            continue
        info = {e.key: e.value for e in t.external_data}
        try:
            total += int(info["length"])
        except (KeyError, ValueError):
            try:
                item = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
            except (KeyError, TypeError, ValueError):
                item = 4
            total += numel(t) * item
    return total


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse ``input=1x3x224x224`` into (``input``, (1, 3, 224, 224))."""
    if "=" not in text:
        raise ModelError(f"bad --shape {text!r}: expected NAME=DxDx... (e.g. input=1x3x224x224)")
    name, dims = text.rsplit("=", 1)
    try:
        shape = tuple(int(d) for d in dims.lower().split("x")) if dims.strip() else ()
    except ValueError:
        raise ModelError(f"bad --shape {text!r}: dims must be integers separated by 'x'") from None
    if any(d < 0 for d in shape):
        raise ModelError(f"bad --shape {text!r}: negative dimension")
    if any(d == 0 for d in shape):
        raise ModelError(f"bad --shape {text!r}: a zero dimension makes an empty tensor, "
                         f"which has nothing to measure")
    return name.strip(), shape


def _bind_inputs(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> None:
    init_names = {i.name for i in model.graph.initializer}
    runtime_inputs = [i for i in model.graph.input if i.name not in init_names]
    known = {i.name for i in runtime_inputs}
    for name in shapes:
        if name not in known:
            raise ModelError(
                f"--shape names {name!r}, which is not a model input; inputs: {sorted(known)}"
            )
    for inp in runtime_inputs:
        tt = inp.type.tensor_type
        if not inp.type.HasField("tensor_type"):
            raise ModelError(
                f"input {inp.name!r} is not a tensor (sequence/map inputs unsupported)")
        if tt.elem_type == onnx.TensorProto.UNDEFINED:
            raise ModelError(f"input {inp.name!r} has no element type (elem_type 0)")
        if inp.name in shapes:
            want = list(shapes[inp.name])
            if tt.HasField("shape") and len(tt.shape.dim) not in (0, len(want)):
                raise ModelError(
                    f"--shape {inp.name}: rank {len(want)} given, model input has rank "
                    f"{len(tt.shape.dim)}"
                )
            for d_i, (d, w) in enumerate(zip(tt.shape.dim, want)):
                if _fixed_dim(d) and d.dim_value != w:
                    raise ModelError(
                        f"--shape {inp.name}: dim {d_i} is fixed to {d.dim_value} in the model, "
                        f"{w} given"
                    )
            tt.ClearField("shape")
            for w in want:
                tt.shape.dim.add().dim_value = int(w)
            continue
        if not tt.HasField("shape"):
            raise ModelError(
                f"input {inp.name!r} has no shape; bind it with --shape {inp.name}=DxDx..."
            )
        for d_i, d in enumerate(tt.shape.dim):
            if not _fixed_dim(d):
                label = d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?")
                what = (f"dimension {d_i} of size 0 (an empty tensor, or an unknown size "
                        f"written as 0)" if d.HasField("dim_value") and d.dim_value == 0
                        else f"dynamic dimension {d_i} ({label!r})")
                raise ModelError(
                    f"input {inp.name!r} has {what}; bind it with "
                    f"--shape {inp.name}=" + "x".join(
                        str(x.dim_value) if _fixed_dim(x) else "N" for x in tt.shape.dim
                    )
                )


def _fixed_dim(d: onnx.TensorShapeProto.Dimension) -> bool:
    """Whether a dimension has a concrete size.

    Only a positive ``dim_value`` is one: exporters write unknown sizes as ``dim_param``, as
    nothing, as 0, or (PaddlePaddle's paddle2onnx) as -1, and all of those mean dynamic.
    """
    return d.HasField("dim_value") and d.dim_value > 0


def _clear_negative_dims(model: onnx.ModelProto) -> None:
    """Make ``dim_value < 0`` (paddle2onnx's "dynamic") a plain unknown dimension.

    Negative sizes are not valid ONNX, and shape inference, ONNX Runtime's probe run and the
    toolchains would each read -1 differently (as a size, a mismatch, or an error). Rewriting
    them once, as dimensions with neither value nor name, means every later step sees the
    standard spelling of "dynamic". Zero sizes are left as they are: 0 can be a real empty
    tensor, which inference or the probe run then settles.
    """
    g = model.graph
    for vi in [*g.input, *g.output, *g.value_info]:
        if not vi.type.HasField("tensor_type") or not vi.type.tensor_type.HasField("shape"):
            continue
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value < 0:
                d.ClearField("dim_value")


def bind_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> None:
    """Bind ``model``'s runtime inputs to ``shapes`` in place, with `load_graph`'s checks.

    For callers that need the original model, not the loaded graph, with static inputs: a
    plan's reference model run whole on each toolchain. Raises `ModelError` as loading does
    (unknown input, rank or fixed-size mismatch, a dynamic dimension left unbound).
    """
    _clear_negative_dims(model)
    _bind_inputs(model, shapes)


def _fold_constants(model: onnx.ModelProto) -> None:
    """Turn ``Constant`` nodes into initializers: they are data, not work to place."""
    g = model.graph
    keep = []
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1:
            a = n.attribute[0] if n.attribute else None
            if a is None:
                raise ModelError(f"Constant node {n.name or n.output[0]!r} has no value")
            if a.name == "value":
                t = onnx.TensorProto()
                t.CopyFrom(a.t)
            else:
                v = helper.get_attribute_value(a)
                if a.name in ("value_float", "value_int"):
                    arr = np.array(v, dtype=np.float32 if a.name == "value_float" else np.int64)
                elif a.name in ("value_floats", "value_ints"):
                    arr = np.array(v, dtype=np.float32 if a.name == "value_floats" else np.int64)
                else:  # sparse / string constants stay as nodes
                    keep.append(n)
                    continue
                t = numpy_helper.from_array(arr)
            t.name = n.output[0]
            g.initializer.append(t)
        else:
            keep.append(n)
    if len(keep) != len(g.node):
        del g.node[:]
        g.node.extend(keep)


#: ops never folded although their inputs are constant: their outputs differ run to run
_NONDETERMINISTIC = frozenset(
    "RandomNormal RandomUniform RandomNormalLike RandomUniformLike Multinomial Bernoulli".split())
#: largest tensor (elements) a folded node may produce: shape vectors, indices, masks; not
#: weights, which stay work for the toolchains (and would bloat every candidate's file)
MAX_FOLDED_ELEMENTS = 4096


def _fold_shape_computations(model: onnx.ModelProto, tensors: Mapping[str, TensorInfo],
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
    g = model.graph
    const = {t.name for t in g.initializer}
    shape_derived: set[str] = set()
    known: dict[str, np.ndarray] = {}  # Shape/Size outputs, computed here
    fold: list[onnx.NodeProto] = []
    folded_ids: set[int] = set()  # id(): protobuf == compares whole messages
    for n in g.node:
        outs = [o for o in n.output if o]
        ins = [t for t in n.input if t]
        if (n.domain not in ("", "ai.onnx") or not outs or not ins
                or n.op_type in _NONDETERMINISTIC or n.op_type == "Constant"
                or any(o in graph_outputs for o in outs)
                or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                       for a in n.attribute)):
            continue
        if n.op_type in ("Shape", "Size") and len(outs) == 1:
            src = tensors.get(ins[0])
            if src is None or ins[0] in probed:
                continue
            if n.op_type == "Size":
                known[outs[0]] = np.array(src.size, dtype=np.int64)
            else:
                at = {a.name: a.i for a in n.attribute}
                start, end = at.get("start", 0), at.get("end", len(src.shape))
                known[outs[0]] = np.array(src.shape[start:end], dtype=np.int64)
            shape_derived.add(outs[0])
            const.add(outs[0])
            fold.append(n)
            folded_ids.add(id(n))
            continue
        if not all(t in const for t in ins):
            continue
        infos = [tensors.get(o) for o in outs]
        if any(i is None or i.size > MAX_FOLDED_ELEMENTS for i in infos):
            continue
        derived = any(t in shape_derived for t in ins)
        if not derived and not all(np.dtype(dtype_name(i.elem_type)).kind in "iub"
                                   for i in infos if i is not None):
            continue
        fold.append(n)
        folded_ids.add(id(n))
        const.update(outs)
        if derived:
            shape_derived.update(outs)
    if not fold:
        return False
    values = dict(known)
    compute = [n for n in fold if n.op_type not in ("Shape", "Size")]
    if compute:
        values.update(_evaluate_constant_nodes(model, compute, known))
        if not values.keys() >= {o for n in compute for o in n.output if o}:
            return False
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
    return True


def _evaluate_constant_nodes(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto],
                             known: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Outputs of ``nodes`` (inputs: initializers and ``known``), by one ORT run; {} on error."""
    import onnxruntime as ort  # local, as in _probe_shapes

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


def _static_info(vi: onnx.ValueInfoProto) -> TensorInfo | None:
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    if tt.elem_type == 0 or not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        # 0 may be a real empty tensor or an unknown size (see _fixed_dim): either way the
        # probe run settles it, so only positive sizes count as known here
        if not _fixed_dim(d):
            return None
        dims.append(d.dim_value)
    return TensorInfo(vi.name, tuple(dims), tt.elem_type)


def random_inputs(graph_or_model: DataflowGraph | onnx.ModelProto, seed: int = 0
                  ) -> dict[str, np.ndarray]:
    """Seeded random feeds for a model's runtime inputs (small values, valid for indices)."""
    model = graph_or_model.model if isinstance(graph_or_model, DataflowGraph) else graph_or_model
    rng = np.random.default_rng(seed)
    init = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        info = _static_info(vi)
        if info is None:
            raise ModelError(f"input {vi.name!r} has no static shape")
        np_t = np.dtype(helper.tensor_dtype_to_np_dtype(info.elem_type))
        if np_t.kind == "f":
            feeds[vi.name] = rng.standard_normal(info.shape).astype(np_t)
        elif np_t.kind in "iu":
            feeds[vi.name] = rng.integers(0, 4, size=info.shape).astype(np_t)
        elif np_t.kind == "b":
            feeds[vi.name] = rng.integers(0, 2, size=info.shape).astype(bool)
        else:
            feeds[vi.name] = np.zeros(info.shape, dtype=np_t)
    return feeds


def _probe_shapes(model: onnx.ModelProto, missing: list[str]) -> dict[str, TensorInfo]:
    """Run the model once in ONNX Runtime with ``missing`` as extra outputs to learn shapes."""
    import onnxruntime as ort  # local: ORT is heavy and only needed for odd models

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    for name in missing:
        if name not in have:
            probe.graph.output.add().name = name
    probe.ir_version = min(probe.ir_version, MAX_IR_VERSION)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(
            probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
        outs = sess.run(missing, random_inputs(model))
    except Exception as e:
        node = next((n for n in model.graph.node if missing[0] in n.output), None)
        made_by = (f", output of node {node.name!r} ({node.domain + ':' if node.domain else ''}"
                   f"{node.op_type})" if node is not None else "")
        raise ModelError(
            f"could not determine shapes of {len(missing)} tensors (e.g. {missing[0]!r}"
            f"{made_by}) statically or by running the model once; declare them in the "
            f"model's value_info: {e}"
        ) from None
    found = {}
    for name, arr in zip(missing, outs):
        arr = np.asarray(arr)
        found[name] = TensorInfo(name, tuple(arr.shape), helper.np_dtype_to_tensor_dtype(arr.dtype))
    return found


def load_graph(
    source: str | os.PathLike | bytes | onnx.ModelProto,
    shapes: Mapping[str, Sequence[int]] | None = None,
    name: str | None = None,
) -> DataflowGraph:
    """Load an ONNX model into a `DataflowGraph`, raising `ModelError` for anything unusable."""
    try:
        return _load_graph(source, shapes, name)
    except UnicodeDecodeError as e:  # protobuf parses bad UTF-8 in strings; reading them fails
        raise ModelError(f"model holds a name or string that is not valid UTF-8 ({e})") from None


def _load_graph(
    source: str | os.PathLike | bytes | onnx.ModelProto,
    shapes: Mapping[str, Sequence[int]] | None,
    name: str | None,
    *,
    fold_rounds: int = 8,
) -> DataflowGraph:
    model = onnx.ModelProto()
    model.CopyFrom(_read_model(source))
    if name is None:
        name = Path(source).stem if isinstance(source, (str, os.PathLike)) else (
            model.graph.name or "model")
    g = model.graph
    if not g.output:
        raise ModelError("model has no outputs")
    out_names = [o.name for o in g.output]
    dup = {n for n in out_names if out_names.count(n) > 1}
    if dup:
        raise ModelError(f"duplicate graph output names: {sorted(dup)}")
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
    _clear_negative_dims(model)
    _bind_inputs(model, shapes or {})
    _fold_constants(model)
    if not g.node:
        raise ModelError("model has no operator nodes (after folding Constant nodes): "
                         "nothing to partition")

    # give every node a unique, stable name (real exports often have none)
    seen: set[str] = set()
    for i, n in enumerate(g.node):
        nm = n.name or f"{n.op_type}_{i}"
        while nm in seen:
            nm = f"{nm}_{i}"
        seen.add(nm)
        n.name = nm

    # producers, and the checks that need them
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
    for o in out_names:
        if o not in producer_pos and o not in available:
            raise ModelError(f"graph output {o!r} is produced by nothing")

    # post-DFS order from the outputs (iterative: deep models overflow recursion); cycles raise
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

    # reorder the protobuf nodes to the post-DFS order (a valid topological order)
    protos = [g.node[i] for i in order]
    new_nodes = [onnx.NodeProto() for _ in protos]
    for dst, src in zip(new_nodes, protos):
        dst.CopyFrom(src)
    implicit = {new: implicit[old] for new, old in enumerate(order) if old in implicit}
    del g.node[:]
    g.node.extend(new_nodes)

    # shape inference, once per model. Large weights are swapped for data-less stand-ins while
    # it runs: inference needs their dims and types only, and serialising hundreds of MB of
    # weights into the inference call dominated load time on transformer-sized models.
    heavy = [t for t in g.initializer if numel(t) > 4096]
    if heavy:
        keep = [t for t in g.initializer if numel(t) <= 4096]
        stand_ins = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                     for t in heavy]
        light = onnx.ModelProto()
        light.ir_version = model.ir_version
        light.opset_import.extend(model.opset_import)
        light.graph.name = g.name
        light.graph.node.extend(g.node)
        light.graph.initializer.extend(keep)
        light.graph.input.extend(list(g.input) + [
            v for v in stand_ins if v.name not in {i.name for i in g.input}])
        light.graph.output.extend(g.output)
        light.graph.value_info.extend(g.value_info)
    else:
        light = model
    try:
        inferred = shape_inference.infer_shapes(light, check_type=False, strict_mode=False,
                                                data_prop=True)
    except Exception as e:
        raise ModelError(f"shape inference failed: {e}") from None
    if heavy:
        del g.value_info[:]
        g.value_info.extend(inferred.graph.value_info)
        del g.output[:]
        g.output.extend(inferred.graph.output)
        inferred = model
    tensors: dict[str, TensorInfo] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(
        inferred.graph.output
    ):
        info = _static_info(vi)
        if info is not None:
            tensors[vi.name] = info
    for t in inferred.graph.initializer:
        tensors[t.name] = TensorInfo(t.name, tuple(t.dims), t.data_type)
    produced = [o for n in inferred.graph.node for o in n.output if o]
    missing = [t for t in produced if t not in tensors]
    if missing:
        tensors.update(_probe_shapes(inferred, missing))
    model = inferred
    if fold_rounds > 0 and _fold_shape_computations(model, tensors, set(out_names),
                                                    probed=set(missing)):
        # nodes went away: order, infer and index the smaller graph from the start (its
        # inputs are bound and its nodes named already, so this is the same load again).
        # Another round: shapes only the probe knew may now be static and fold in turn.
        return _load_graph(model, None, name, fold_rounds=fold_rounds - 1)

    # nodes
    g = model.graph
    producer = {o: i for i, n in enumerate(g.node) for o in n.output if o}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(g.node):
        for t in set(list(n.input) + list(implicit.get(i, ()))):
            if t:
                consumers.setdefault(t, []).append(i)
    outset = set(out_names)
    nodes = []
    for i, p in enumerate(g.node):
        ins = list(p.input) + list(implicit.get(i, ()))
        preds = sorted({producer[t] for t in ins if t in producer})
        succs = sorted({c for o in p.output if o for c in consumers.get(o, ())})
        nodes.append(
            Node(
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
                implicit_inputs=implicit.get(i, ()),
            )
        )
    desc = [0] * len(nodes)
    for n in reversed(nodes):
        m = 0
        for s in n.succs:
            m |= (1 << s) | desc[s]
        desc[n.index] = m
    return DataflowGraph(
        model=model,
        nodes=nodes,
        tensors=tensors,
        initializers={t.name: t for t in g.initializer},
        graph_inputs=tuple(input_names),
        graph_outputs=tuple(out_names),
        producer=producer,
        consumers={k: tuple(v) for k, v in consumers.items()},
        descendants=desc,
        name=name,
    )


def numel(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n
