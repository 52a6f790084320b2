"""Tensor types of an ONNX model: `TensorInfo`, element-type names, static value-info reading.

The vocabulary every loading step shares, kept below `collage_farm.core.graph` so the steps
(reading, binding, folding, shape inference) can use it without importing the graph: the
`ModelError` they raise, the version and size limits, and what counts as a known dimension.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

# ONNX Runtime 1.31 reads IR <= 13 while onnx 1.23 writes 14; 10 works in ORT and OpenVINO.
MAX_IR_VERSION = 10
#: protobuf refuses to serialise a message of 2 GiB or more
MAX_MODEL_BYTES = 2**31 - 1


class ModelError(ValueError):
    """The model cannot be used: malformed, cyclic, unbound dynamic dimension, ..."""


_DTYPE_NAMES = {
    v: np.dtype(helper.tensor_dtype_to_np_dtype(v)).name
    for v in onnx.TensorProto.DataType.values()
    if v not in (0, onnx.TensorProto.STRING)
    and v < 16  # the classic numeric types; exotic float8/int4 stay by number
}


def dtype_name(elem_type: int) -> str:
    """The numpy name of an ONNX element type (``float32``), or ``onnx<N>`` for exotic ones."""
    return _DTYPE_NAMES.get(elem_type, f"onnx{elem_type}")


def itemsize(elem_type: int) -> int:
    """Bytes per element of an ONNX element type; 4 where numpy has no equivalent."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 4


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
        return self.size * itemsize(self.elem_type)


def numel(t: onnx.TensorProto) -> int:
    """Number of elements of a tensor proto, from its dims (data not read)."""
    n = 1
    for d in t.dims:
        n *= d
    return n


def fixed_dim(d: onnx.TensorShapeProto.Dimension) -> bool:
    """Whether a dimension has a concrete size.

    Only a positive ``dim_value`` is one: exporters write unknown sizes as ``dim_param``, as
    nothing, as 0, or (PaddlePaddle's paddle2onnx) as -1, and all of those mean dynamic.
    """
    return d.HasField("dim_value") and d.dim_value > 0


def static_info(vi: onnx.ValueInfoProto) -> TensorInfo | None:
    """The value info's type if it is a tensor with a known element type and all sizes known."""
    if not vi.type.HasField("tensor_type"):
        return None
    tt = vi.type.tensor_type
    if tt.elem_type == 0 or not tt.HasField("shape"):
        return None
    dims = []
    for d in tt.shape.dim:
        # 0 may be a real empty tensor or an unknown size (see fixed_dim): either way the
        # probe run settles it, so only positive sizes count as known here
        if not fixed_dim(d):
            return None
        dims.append(d.dim_value)
    return TensorInfo(vi.name, tuple(dims), tt.elem_type)
