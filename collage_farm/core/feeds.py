"""Seeded input values for a model's runtime inputs, valid for what the model does with them.

Every check and every timing runs a model (or a candidate cut out of one) on generated inputs,
and those inputs must be values the model accepts: a float gets a standard normal draw, but an
integer that indexes (a ``Gather`` index, an embedding id, a ``TopK`` k) must lie inside the
axis it indexes, or ONNX Runtime refuses the run and the candidate looks broken when the data
was. So `feed_specs` reads, for each runtime input, what consumes it (through ``Cast``,
``Reshape`` and the like) and bounds integer draws by the indexed dimension. Integers are drawn
in ``[0, 4)`` (``[1, 4)`` for a ``TopK`` k) cut down to that bound, so inputs that index
nothing, or index an axis of 4 or more, get exactly the values they always had.

Some inputs need one particular value (a sample rate, a number of detections): a user gives
it (``--input NAME=VALUE``), `attach_input_values` checks it against the input and stores it in
the model's metadata (`INPUT_VALUES_KEY`), and every model cut from that one carries the values
of the inputs it still has (`collage_farm.core.subgraph.SubGraph.extract`), so a runner on
another machine feeds them without being told.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from collage_farm.core.tensors import ModelError, static_info

__all__ = [
    "INPUT_VALUES_KEY",
    "FeedSpec",
    "attach_input_values",
    "copy_input_values",
    "feed_specs",
    "feeds_from_specs",
    "fit_value",
    "input_values",
    "merge_specs",
    "parse_input_value",
    "random_feeds",
]

#: the model metadata key holding fixed input values (JSON: name -> nested list)
INPUT_VALUES_KEY = "collage_farm.input_values"
#: integers are drawn in [0, INT_HIGH) unless what consumes them needs less
INT_HIGH = 4
#: ops that pass an integer tensor's values through unchanged (bounds follow them)
_PASS_THROUGH = frozenset({"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten",
                           "Transpose", "Expand", "Tile"})


@dataclass(frozen=True)
class FeedSpec:
    """How one runtime input is fed: its shape and dtype, the integer range, a fixed value."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    low: int = 0
    high: int = INT_HIGH  # exclusive; integer draws only
    value: np.ndarray | None = None  # given by the user: broadcast to ``shape``

    def bounded(self, low: int, high: int) -> FeedSpec:
        """This spec with the integer range narrowed to ``[low, high)`` as well."""
        return FeedSpec(self.name, self.shape, self.dtype, max(self.low, low),
                        min(self.high, high), self.value)


def _shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Static shapes the model declares: inputs, value infos, outputs and initializers."""
    g = model.graph
    out = {t.name: tuple(t.dims) for t in g.initializer}
    for vi in (*g.input, *g.value_info, *g.output):
        info = static_info(vi)
        if info is not None:
            out[vi.name] = info.shape
    return out


def _index_range(node: onnx.NodeProto, slot: int, shapes: Mapping[str, tuple[int, ...]],
                 consts: Mapping[str, np.ndarray]) -> tuple[int, int] | None:
    """The valid ``[low, high)`` of input ``slot`` of ``node`` when it is an index, else None."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    data = shapes.get(node.input[0]) if node.input else None
    op = node.op_type
    if op in ("Gather", "GatherElements", "ScatterElements") and slot == 1 and data:
        axis = int(attrs.get("axis", 0))
        if -len(data) <= axis < len(data):
            return 0, data[axis]
    if op in ("GatherND", "ScatterND") and slot == 1 and data:
        return 0, min(data)
    if op == "OneHot" and slot == 0 and len(node.input) > 1 and node.input[1] in consts:
        return 0, int(np.asarray(consts[node.input[1]]).reshape(-1)[0])
    if op == "TopK" and slot == 1 and data:
        axis = int(attrs.get("axis", -1))
        if -len(data) <= axis < len(data):
            return 1, data[axis] + 1
    return None


def _index_ranges(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """Runtime inputs used as indices -> the range every use accepts."""
    g = model.graph
    uses: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for n in g.node:
        for k, t in enumerate(n.input):
            if t:
                uses.setdefault(t, []).append((n, k))
    shapes = _shapes(model)
    consts = {t.name: onnx.numpy_helper.to_array(t) for t in g.initializer
              if t.data_type != onnx.TensorProto.FLOAT and len(t.dims) <= 1}
    out: dict[str, tuple[int, int]] = {}
    for vi in g.input:
        lo, hi, seen, todo = 0, None, {vi.name}, [vi.name]
        while todo:
            for node, slot in uses.get(todo.pop(), ()):
                r = _index_range(node, slot, shapes, consts)
                if r is not None:
                    lo, hi = max(lo, r[0]), r[1] if hi is None else min(hi, r[1])
                elif node.op_type in _PASS_THROUGH and slot == 0:
                    todo.extend(o for o in node.output[:1] if o and o not in seen)
                    seen.update(node.output[:1])
        if hi is not None:
            out[vi.name] = (lo, hi)
    return out


def input_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """The fixed input values stored in ``model``'s metadata (empty when none)."""
    for p in model.metadata_props:
        if p.key == INPUT_VALUES_KEY:
            return {k: np.asarray(v) for k, v in json.loads(p.value).items()}
    return {}


def _shape_of(vi: onnx.ValueInfoProto, dynamic_as: int | None) -> tuple[int, ...] | None:
    info = static_info(vi)
    if info is not None:
        return info.shape
    tt = vi.type.tensor_type
    if dynamic_as is None or not vi.type.HasField("tensor_type") or not tt.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else dynamic_as
                 for d in tt.shape.dim)


def feed_specs(model: onnx.ModelProto, *, dynamic_as: int | None = None
               ) -> dict[str, FeedSpec]:
    """Each runtime input's `FeedSpec`, in input order.

    An input of unknown shape raises `ModelError`, unless ``dynamic_as`` gives its dynamic
    dimensions a size (an input with no shape at all is then left out).
    """
    init = {i.name for i in model.graph.initializer}
    ranges = _index_ranges(model)
    values = input_values(model)
    specs = {}
    for vi in model.graph.input:
        if vi.name in init:
            continue
        shape = _shape_of(vi, dynamic_as)
        if shape is None:
            if dynamic_as is not None:
                continue
            raise ModelError(f"input {vi.name!r} has no static shape")
        spec = FeedSpec(vi.name, shape,
                        np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)),
                        value=values.get(vi.name))
        if vi.name in ranges:
            spec = spec.bounded(*ranges[vi.name])
        specs[vi.name] = spec
    return specs


def merge_specs(groups: Iterable[Mapping[str, FeedSpec]]) -> dict[str, FeedSpec]:
    """One spec per input over several models reading it (a plan's partitions): the ranges
    every model accepts, the first fixed value; first-seen order."""
    out: dict[str, FeedSpec] = {}
    for specs in groups:
        for name, s in specs.items():
            have = out.get(name)
            if have is None:
                out[name] = s
                continue
            merged = have.bounded(s.low, s.high)
            if merged.value is None and s.value is not None:
                merged = FeedSpec(name, merged.shape, merged.dtype, merged.low, merged.high,
                                  s.value)
            out[name] = merged
    return out


def feeds_from_specs(specs: Iterable[FeedSpec], seed: int = 0,
                     shapes: Mapping[str, Sequence[int]] | None = None
                     ) -> dict[str, np.ndarray]:
    """Seeded feeds: floats standard normal, integers in their range, bools 0/1, fixed values
    broadcast; ``shapes`` overrides a spec's shape. One generator draws in spec order."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for s in specs:
        shape = tuple((shapes or {}).get(s.name, s.shape))
        if s.value is not None:
            feeds[s.name] = np.broadcast_to(s.value, shape).astype(s.dtype)
        elif s.dtype.kind == "f":
            feeds[s.name] = rng.standard_normal(shape).astype(s.dtype)
        elif s.dtype.kind in "iu":
            if s.high > s.low:
                feeds[s.name] = rng.integers(s.low, s.high, size=shape).astype(s.dtype)
            else:  # an empty axis: no index is valid, keep the lowest
                feeds[s.name] = np.full(shape, s.low, dtype=s.dtype)
        elif s.dtype.kind == "b":
            feeds[s.name] = rng.integers(0, 2, size=shape).astype(bool)
        else:
            feeds[s.name] = np.zeros(shape, dtype=s.dtype)
    # a scalar draw is a numpy scalar: 0-d arrays, so runners bind a tensor of shape []
    return {k: np.asarray(v) for k, v in feeds.items()}


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded feeds for a model's runtime inputs (`feed_specs`, `feeds_from_specs`)."""
    return feeds_from_specs(feed_specs(model).values(), seed)


def parse_input_value(text: str) -> tuple[str, np.ndarray]:
    """``NAME=VALUE`` (``VALUE``: a number or comma-separated numbers) -> (name, array).

    Raises `ModelError` with the expected form for anything else.
    """
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name or not value:
        raise ModelError(f"--input {text!r}: expected NAME=VALUE, e.g. sample_rate=16000 or "
                         "ids=1,5,7")
    try:
        nums = [float(v) for v in value.split(",")]
    except ValueError:
        raise ModelError(f"--input {text!r}: VALUE must be a number or comma-separated "
                         "numbers") from None
    arr = np.asarray(nums if len(nums) > 1 else nums[0])
    return name, arr


def attach_input_values(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> None:
    """Store ``values`` as fixed inputs of ``model`` (its metadata), checked against the inputs.

    `ModelError` for a name that is not a runtime input, a value that does not broadcast to the
    input's shape, or a non-integral value for an integer input.
    """
    if not values:
        return
    init = {i.name for i in model.graph.initializer}
    inputs = {vi.name: vi for vi in model.graph.input if vi.name not in init}
    stored = input_values(model)
    for name, v in values.items():
        vi = inputs.get(name)
        if vi is None:
            raise ModelError(f"--input names {name!r}, which is not an input of the model "
                             f"(inputs: {', '.join(inputs)})")
        info = static_info(vi)
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        stored[name] = fit_value(name, None if info is None else info.shape, dtype, v)
    _store(model, stored)


def fit_value(name: str, shape: Sequence[int] | None, dtype: np.dtype,
              value: object) -> np.ndarray:
    """``value`` as ``dtype``, checked to broadcast to ``shape`` (None: unknown) and, for an
    integer or bool input, to be whole; `ModelError` naming the input otherwise."""
    v = np.asarray(value)
    if shape is not None:
        try:
            np.broadcast_to(v, tuple(shape))
        except ValueError:
            raise ModelError(f"--input {name}: {v.size} value(s) do not fit its shape "
                             f"{'x'.join(map(str, shape)) or 'scalar'}") from None
    if dtype.kind in "iub" and not np.all(np.equal(np.mod(v, 1), 0)):
        raise ModelError(f"--input {name}: {dtype.name} input takes whole numbers, "
                         f"not {v.tolist()}")
    return v.astype(dtype)


def _store(model: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> None:
    keep = [p for p in model.metadata_props if p.key != INPUT_VALUES_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(keep)
    if values:
        p = model.metadata_props.add()
        p.key = INPUT_VALUES_KEY
        p.value = json.dumps({k: np.asarray(v).tolist() for k, v in values.items()})


def copy_input_values(src: onnx.ModelProto, dst: onnx.ModelProto,
                      inputs: Iterable[str]) -> None:
    """Give ``dst`` the fixed values ``src`` holds for ``inputs`` (a model cut from ``src``)."""
    have = input_values(src)
    if have:
        _store(dst, {k: have[k] for k in inputs if k in have})
