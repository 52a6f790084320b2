"""Reading an ONNX model and binding its inputs to static shapes, as `load_graph` does.

Reading checks what a user's file can get wrong before anything else looks at it (missing,
unparsable, no graph, over protobuf's 2 GiB with its external data, unreadable external data).
Binding gives every runtime input a concrete shape: ``--shape NAME=DxDx...`` values
(`parse_shape`) replace dynamic dimensions, and an input left dynamic is a `ModelError` that
says which ``--shape`` to give.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
from onnx.external_data_helper import _get_all_tensors, uses_external_data

from collage_farm.core.tensors import MAX_MODEL_BYTES, ModelError, fixed_dim, itemsize, numel


def read_model(source: str | os.PathLike | bytes | onnx.ModelProto) -> onnx.ModelProto:
    """The model at a path, in serialised bytes, or ``source`` itself if already a proto.

    A file's external data is loaded from beside it once the whole model is known to fit the
    2 GiB protobuf limit. Raises `ModelError` naming the file (or ``<bytes>``) and the problem.
    """
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, bytes):
        return _read_bytes(source)
    return _read_file(Path(source))


def _read_bytes(data: bytes) -> onnx.ModelProto:
    where = "<bytes>"
    try:
        model = onnx.load_from_string(data)
    except Exception as e:
        raise ModelError(f"{where}: not a readable ONNX model ({type(e).__name__}: {e})") from None
    if not model.HasField("graph"):
        raise ModelError(f"{where}: parsed, but holds no ONNX graph")
    return model


def _read_file(path: Path) -> onnx.ModelProto:
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


def _model_bytes(model: onnx.ModelProto) -> int:
    """Serialised size of ``model`` once its external data is loaded (without loading it)."""
    total = model.ByteSize()
    for t in _get_all_tensors(model):
        if not uses_external_data(t):
            continue
        info = {e.key: e.value for e in t.external_data}
        try:
            total += int(info["length"])
        except (KeyError, ValueError):
            total += numel(t) * itemsize(t.data_type)
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


def bind_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> None:
    """Bind ``model``'s runtime inputs to ``shapes`` in place, with `load_graph`'s checks.

    For callers that need the original model, not the loaded graph, with static inputs: a
    plan's reference model run whole on each toolchain. Raises `ModelError` as loading does
    (unknown input, rank or fixed-size mismatch, a dynamic dimension left unbound).
    """
    clear_negative_dims(model)
    bind_inputs(model, shapes)


def clear_negative_dims(model: onnx.ModelProto) -> None:
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


def bind_inputs(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> None:
    """Give the runtime inputs named in ``shapes`` those shapes; check the others are static.

    Negative dimensions must have been cleared first (`clear_negative_dims`).
    """
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
            _bind_input(inp, list(shapes[inp.name]))
        else:
            _check_static_input(inp)


def _bind_input(inp: onnx.ValueInfoProto, want: list[int]) -> None:
    """Replace the input's shape by ``want`` where its rank and fixed sizes agree."""
    tt = inp.type.tensor_type
    if tt.HasField("shape") and len(tt.shape.dim) not in (0, len(want)):
        raise ModelError(
            f"--shape {inp.name}: rank {len(want)} given, model input has rank "
            f"{len(tt.shape.dim)}"
        )
    for d_i, (d, w) in enumerate(zip(tt.shape.dim, want)):
        if fixed_dim(d) and d.dim_value != w:
            raise ModelError(
                f"--shape {inp.name}: dim {d_i} is fixed to {d.dim_value} in the model, "
                f"{w} given"
            )
    tt.ClearField("shape")
    for w in want:
        tt.shape.dim.add().dim_value = int(w)


def _check_static_input(inp: onnx.ValueInfoProto) -> None:
    """Raise, with the ``--shape`` to give, unless every dimension of the input is fixed."""
    tt = inp.type.tensor_type
    if not tt.HasField("shape"):
        raise ModelError(
            f"input {inp.name!r} has no shape; bind it with --shape {inp.name}=DxDx..."
        )
    for d_i, d in enumerate(tt.shape.dim):
        if not fixed_dim(d):
            label = d.dim_param or (str(d.dim_value) if d.HasField("dim_value") else "?")
            what = (f"dimension {d_i} of size 0 (an empty tensor, or an unknown size "
                    f"written as 0)" if d.HasField("dim_value") and d.dim_value == 0
                    else f"dynamic dimension {d_i} ({label!r})")
            raise ModelError(
                f"input {inp.name!r} has {what}; bind it with "
                f"--shape {inp.name}=" + "x".join(
                    str(x.dim_value) if fixed_dim(x) else "N" for x in tt.shape.dim
                )
            )
