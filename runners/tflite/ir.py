"""The converter's own IR: TFLite tensors and ops, built by the emitters, quantised last."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from runners.tflite.attrs import DTYPES
from runners.tflite.layout import _nhwc
from runners.tflite.result import ActivationBits

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node


@dataclass
class _T:
    """A TFLite tensor: an activation (``act``), or constant data of one quantisation kind."""

    name: str
    shape: tuple[int, ...]
    kind: str  # "act" | "weight" | "bias" | "const" | "like" | "int32" | "int64"
    data: np.ndarray | None = None
    axis: int = 0  # per-channel axis of a weight
    range: tuple[float, float] | None = None  # calibrated (act)
    pin: tuple[float, int] | None = None  # fixed qparams (act)
    refs: tuple[int, ...] = ()  # bias: (input, weight); like: (act,)
    dtype: str = "float32"  # act: "int32" / "int64" / "bool" for such tensors (fp32 mode)


@dataclass
class _Op:
    """A TFLite operator: builtin code, tensor indices, options, the ONNX nodes it implements."""

    code: str
    inputs: list[int]
    outputs: list[int]
    options: tuple[str, tuple[tuple[str, Any], ...]] | None
    nodes: tuple[str, ...]
    macs: int = 0


#: TFLite builtin -> its BuiltinOptions table (ops not listed take no options)
_OPTIONS_FOR = {
    "CONV_2D": "Conv2DOptions",
    "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
    "FULLY_CONNECTED": "FullyConnectedOptions",
    "MAX_POOL_2D": "Pool2DOptions",
    "AVERAGE_POOL_2D": "Pool2DOptions",
    "ADD": "AddOptions",
    "SUB": "SubOptions",
    "MUL": "MulOptions",
    "RESHAPE": "ReshapeOptions",
    "CONCATENATION": "ConcatenationOptions",
    "SOFTMAX": "SoftmaxOptions",
    "MEAN": "ReducerOptions",
    "REDUCE_MAX": "ReducerOptions",
    "PAD": "PadOptions",
    "PADV2": "PadV2Options",
    "TRANSPOSE": "TransposeOptions",
    "MAXIMUM": "MaximumMinimumOptions",
    "MINIMUM": "MaximumMinimumOptions",
    "LEAKY_RELU": "LeakyReluOptions",
    "HARD_SWISH": "HardSwishOptions",
    "QUANTIZE": "QuantizeOptions",
    "DIV": "DivOptions",
    "SUM": "ReducerOptions",
    "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions",
    "RESIZE_BILINEAR": "ResizeBilinearOptions",
    "TRANSPOSE_CONV": "TransposeConvOptions",
    "STRIDED_SLICE": "StridedSliceOptions",
    "SPLIT_V": "SplitVOptions",
    "BATCH_MATMUL": "BatchMatMulOptions",
    "GATHER": "GatherOptions",
    "GELU": "GeluOptions",
}


def _act_enum(name: str) -> int:
    """TFLite's ActivationFunctionType value of a fused activation name."""
    return {"NONE": 0, "RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3, "TANH": 4}[name]


class _Builder:
    """The TFLite tensors and ops emitted so far for one graph, and the helpers emitters share.

    ``tensors`` and ``ops`` are in emission order (a tensor's index is its TFLite index);
    ``by_name`` finds the tensor of an ONNX tensor name; ``ties`` lists activation pairs that
    must share int8 parameters (with the op allowed to requantise between them, for Concat).
    """

    def __init__(self, graph: DataflowGraph, mode: str,
                 ranges: Mapping[str, tuple[float, float]] | None) -> None:
        if mode not in ("int8", "fp32"):
            raise ValueError(f"mode must be 'int8' or 'fp32', not {mode!r}")
        self.g = graph
        self.mode = mode
        self.ranges = dict(ranges or {})
        self.tensors: list[_T] = []
        self.by_name: dict[str, int] = {}
        self.ops: list[_Op] = []
        self.ties: list[tuple[int, int, int | None]] = []  # (a, b, op index allowed to requant)
        #: int8 mode: the activations' integer type, and the per-channel means of tensors that
        #: weights read (bias correction; `runners.tflite.quant`)
        self.activations = ActivationBits.INT8
        self.channel_means: dict[str, np.ndarray] = {}

    def _add(self, t: _T) -> int:
        self.tensors.append(t)
        return len(self.tensors) - 1

    def act(self, name: str) -> int:
        return self.by_name[name]

    def new_act(self, name: str, onnx_shape: Sequence[int] | None = None,
                tfl_shape: Sequence[int] | None = None, *, calibrated: bool = True,
                pin: tuple[float, int] | None = None, dtype: str | None = None) -> int:
        """A new activation; ``dtype`` defaults to the ONNX tensor's (float32 for the
        converter's own intermediates)."""
        shape = tuple(tfl_shape) if tfl_shape is not None else _nhwc(onnx_shape or ())
        if dtype is None:
            info = self.g.tensors.get(name) if calibrated else None
            dtype = DTYPES.get(info.elem_type, "float32") if info is not None else "float32"
        rng = self.ranges.get(name) if calibrated else None
        tid = self._add(_T(name, shape, "act", range=rng, pin=pin, dtype=dtype))
        if calibrated:
            self.by_name[name] = tid
        return tid

    def const(self, name: str, data: np.ndarray, kind: str, *, axis: int = 0,
              refs: tuple[int, ...] = ()) -> int:
        arr = np.asarray(data)  # not copied when it has the type already (never written to)
        arr = arr.astype({"int32": np.int32, "int64": np.int64}.get(kind, np.float32),
                         copy=False)
        return self._add(_T(name, tuple(arr.shape), kind, data=arr, axis=axis, refs=refs))

    def tie(self, a: int, b: int, requant_op: int | None = None) -> None:
        self.ties.append((a, b, requant_op))

    def op(self, code: str, inputs: Sequence[int], outputs: Sequence[int], nodes: Sequence[str],
           options: Mapping[str, Any] | None = None, macs: int = 0) -> int:
        opts = None
        if code in _OPTIONS_FOR:
            opts = (_OPTIONS_FOR[code], tuple((options or {}).items()))
        self.ops.append(_Op(code, list(inputs), list(outputs), opts, tuple(nodes), macs))
        return len(self.ops) - 1

    def _tmp(self, n: Node, tag: str, tfl_shape: Sequence[int]) -> int:
        return self.new_act(f"{n.name}/{tag}", tfl_shape=tfl_shape, calibrated=False)

    def _scalar(self, n: Node, tag: str, value: float, rank: int) -> int:
        return self.const(f"{n.name}/{tag}", np.full((1,) * rank, value, np.float32), "const")

    def _to_nchw(self, x: int, n: Node, tag: str) -> int:
        """TRANSPOSE an NHWC-held rank-4 tensor to the ONNX (NCHW) layout."""
        s = self.tensors[x].shape
        perm = self.const(f"{n.name}/{tag}_to_nchw_perm", np.array([0, 3, 1, 2]), "int32")
        t = self._tmp(n, f"{tag}_nchw", (s[0], s[3], s[1], s[2]))
        self.tie(x, t)
        self.op("TRANSPOSE", [x, perm], [t], (n.name,))
        return t

    def _from_nchw(self, x: int, out: str, nodes: tuple[str, ...]) -> int:
        """TRANSPOSE an NCHW rank-4 result into the NHWC-held tensor ``out``."""
        perm = self.const(f"{out}/to_nhwc_perm", np.array([0, 2, 3, 1]), "int32")
        y = self.new_act(out, self.g.tensors[out].shape)
        self.tie(x, y)
        self.op("TRANSPOSE", [x, perm], [y], nodes)
        return y
