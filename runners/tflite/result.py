"""What the converter hands back: the TFLite bytes, the I/O contract and the errors."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

#: bumped when the TFLite written for the same sub-graph changes (new op mappings, the transpose
#: peephole, ...): part of the LiteRT toolchain version, so cost-table rows of older output are
#: not reused under the default (exact) strictness
CONVERTER_REVISION = 4


INT8_MIN, INT8_MAX = -128, 127
INT16_MAX = 32767
#: Vela keeps an int64 bias on the NPU only when it fits in 40 bits
INT40_MAX = 2**39 - 1


class ActivationBits(enum.Enum):
    """The integer type of an int8-mode model's activations.

    ``INT8``: TFLite's full-integer int8 (per-tensor asymmetric activations, int32 bias).
    ``INT16``: TFLite's "16x8" scheme: per-tensor *symmetric* int16 activations (zero point
    0), the same per-channel int8 weights, int64 bias; 256 times finer activation steps, for
    models whose channels differ too widely for one int8 scale per tensor.
    """

    INT8 = 8
    INT16 = 16

#: the non-float dtypes an fp32-mode model's inputs and outputs can have (ONNX layout kept)
_TYPED = ("int32", "int64", "bool")


MIN_RANGE = 1e-6  # a constant tensor still needs a positive scale


class ConversionError(ValueError):
    """The sub-model cannot be written as TFLite (base class)."""


class UnsupportedOp(ConversionError):
    """An ONNX node the converter does not map (or not with these attributes / shapes)."""

    def __init__(self, node_name: str, op_type: str, reason: str) -> None:
        super().__init__(f"{op_type} node {node_name!r}: {reason}")
        self.node_name = node_name
        self.op_type = op_type
        self.reason = reason

    def __reduce__(self) -> tuple:  # picklable across worker processes
        return (UnsupportedOp, (self.node_name, self.op_type, self.reason))


class MissingRangeError(ConversionError):
    """int8 mode needs a calibrated (min, max) for a tensor that has none."""


@dataclass(frozen=True)
class IOSpec:
    """A graph input or output of the TFLite model, and how to cross its boundary.

    ``onnx_shape`` is the ONNX (NCHW for rank 4) shape; ``tflite_shape`` the NHWC one for rank
    4, else equal. int8 tensors carry their ``scale`` / ``zero_point``.
    """

    name: str
    index: int  # tensor index in the TFLite subgraph
    onnx_shape: tuple[int, ...]
    tflite_shape: tuple[int, ...]
    dtype: str  # "int8" | "int16" (16x8) | "float32" | "int32" / "int64" / "bool" (fp32 mode)
    scale: float = 0.0
    zero_point: int = 0

    @property
    def nhwc(self) -> bool:
        return len(self.onnx_shape) == 4 and self.dtype in ("float32", "int8", "int16")

    def to_tflite(self, x: np.ndarray) -> np.ndarray:
        """ONNX-layout float data -> what the TFLite input takes (NHWC, quantised in int8 /
        int16)."""
        if self.dtype in _TYPED:  # integer ids, masks: ONNX layout, no transpose
            return np.ascontiguousarray(np.asarray(x).astype(self.dtype).reshape(self.onnx_shape))
        a = np.asarray(x, dtype=np.float32).reshape(self.onnx_shape)
        if self.nhwc:
            a = a.transpose(0, 2, 3, 1)
        if self.dtype == "int8":
            q = np.round(a / self.scale) + self.zero_point
            return np.ascontiguousarray(np.clip(q, INT8_MIN, INT8_MAX).astype(np.int8))
        if self.dtype == "int16":
            q = np.round(a / self.scale)
            return np.ascontiguousarray(np.clip(q, -INT16_MAX, INT16_MAX).astype(np.int16))
        return np.ascontiguousarray(a, dtype=np.float32)

    def from_tflite(self, y: np.ndarray) -> np.ndarray:
        """TFLite output -> float32 in the ONNX layout (dequantised in int8); integer and
        boolean outputs keep their type."""
        a = np.asarray(y)
        if self.dtype in _TYPED:
            return np.ascontiguousarray(a.astype(self.dtype).reshape(self.onnx_shape))
        if self.dtype in ("int8", "int16"):
            a = (a.astype(np.float32) - self.zero_point) * np.float32(self.scale)
        a = a.astype(np.float32).reshape(self.tflite_shape)
        if self.nhwc:
            a = a.transpose(0, 3, 1, 2)
        return np.ascontiguousarray(a)


@dataclass(frozen=True)
class OpInfo:
    """One TFLite operator: builtin name, the ONNX nodes it implements, and its work."""

    index: int
    op: str  # TFLite builtin name ("CONV_2D", ...)
    nodes: tuple[str, ...]  # ONNX node names; first: the node it was emitted for
    macs: int  # multiply-accumulates (conv / FC), 0 for the others
    bytes: int  # activation bytes read + written, plus constant bytes read
    out_bytes: int = 0  # activation bytes written (a GATHER reads as much as it writes)


@dataclass(frozen=True)
class ConvertedModel:
    """A TFLite flatbuffer and what a caller needs to feed it and read it back."""

    tflite: bytes
    mode: str  # "int8" (integer: int8 or 16x8 activations, the I/O specs' dtype) | "fp32"
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    ops: tuple[OpInfo, ...]

    @property
    def op_nodes(self) -> dict[int, tuple[str, ...]]:
        """TFLite operator index -> ONNX node names it implements."""
        return {o.index: o.nodes for o in self.ops}

    @property
    def op_to_node(self) -> dict[int, str]:
        """TFLite operator index -> the ONNX node it was emitted for."""
        return {o.index: o.nodes[0] for o in self.ops}

    def feeds(self, onnx_feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """ONNX-layout float feeds -> TFLite inputs by name (NHWC, quantised in int8)."""
        return {s.name: s.to_tflite(onnx_feeds[s.name]) for s in self.inputs}
