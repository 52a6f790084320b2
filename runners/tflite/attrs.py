"""Reading ONNX nodes without importing onnx: attributes and the element types converted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collage_farm.core.graph import Node

FLOAT = 1  # onnx.TensorProto.FLOAT
_INT_TYPES = {6: "int32", 7: "int64"}  # onnx.TensorProto.INT32 / INT64
#: ONNX element type -> the dtype name the converter writes (TensorType FLOAT32 / INT32 /
#: INT64 / BOOL); any other element type is not converted
DTYPES = {FLOAT: "float32", **_INT_TYPES, 9: "bool"}


def _ints(v: object, default: Sequence[int] = ()) -> tuple[int, ...]:
    if v is None:
        return tuple(default)
    if isinstance(v, (list, tuple)):
        return tuple(int(x) for x in v)
    return (int(v),)  # type: ignore[call-overload]


def _attr(node: Node, name: str, default: object = None) -> object:
    v = node.attrs.get(name, default)
    if isinstance(v, bytes):
        return v.decode()
    return v
