"""The entry point: `convert` runs check and lowering, the peephole, quantisation, writing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from collage_farm.core.graph import DataflowGraph, load_graph
from runners.tflite.flatbuffer import _serialise
from runners.tflite.lower import _Lowering
from runners.tflite.peephole import _TransposeOptimiser
from runners.tflite.quant import resolve_qparams
from runners.tflite.result import ActivationBits, ConvertedModel

if TYPE_CHECKING:
    import onnx


def lowered(graph: DataflowGraph, mode: str, ranges: Mapping[str, tuple[float, float]],
            activations: ActivationBits = ActivationBits.INT8,
            channel_means: Mapping[str, Sequence[float] | np.ndarray] | None = None
            ) -> _Lowering:
    """``graph`` lowered into the converter's IR: every node's ops, then (fp32) the layout
    peephole; not yet quantised or written (``activations``, ``channel_means``: `convert`)."""
    lowering = _Lowering(graph, mode, ranges)
    lowering.activations = activations
    lowering.channel_means = {k: np.asarray(v, np.float64).reshape(-1)
                              for k, v in (channel_means or {}).items()}
    lowering.run()
    if mode == "fp32":
        _TransposeOptimiser(lowering).run()
    return lowering


def convert(
    model: bytes | onnx.ModelProto | DataflowGraph,
    mode: str = "int8",
    tensor_ranges: Mapping[str, tuple[float, float]] | Sequence[tuple[str, float, float]]
    | None = None,
    *,
    write: bool = True,
    activations: ActivationBits = ActivationBits.INT8,
    channel_means: Mapping[str, Sequence[float] | np.ndarray] | None = None,
) -> ConvertedModel:
    """Convert a standalone ONNX (sub-)model to TFLite.

    ``mode``: ``"int8"`` (full-integer; needs ``tensor_ranges`` for every graph input and every
    node output that survives fusion) or ``"fp32"``. ``tensor_ranges`` maps ONNX tensor names to
    calibrated (min, max), as a mapping or as ``BuildInput.tensor_ranges`` triples.
    ``write=False`` returns everything but the flatbuffer (``tflite`` empty): the operators,
    their figures and the I/O contract, for callers that only price the model.
    ``activations`` (int8 mode): int8, or int16 with int8 weights (TFLite's 16x8; the I/O
    specs say ``int16``). ``channel_means``: per-channel means of ONNX tensors (channel axis 1
    of a rank-4 tensor, else the last) on the calibration samples; the weights reading them
    get their bias corrected for the mean shift their rounding causes (`runners.tflite.quant`).

    Raises `UnsupportedOp` for a node `convertible` refuses, `MissingRangeError` when a range
    is missing, `ConversionError` for anything else the writer cannot express.
    """
    graph = model if isinstance(model, DataflowGraph) else load_graph(model)
    ranges: dict[str, tuple[float, float]]
    if tensor_ranges is None:
        ranges = {}
    elif isinstance(tensor_ranges, Mapping):
        ranges = {k: (float(v[0]), float(v[1])) for k, v in tensor_ranges.items()}
    else:
        ranges = {k: (float(lo), float(hi)) for k, lo, hi in tensor_ranges}
    lowering = lowered(graph, mode, ranges, activations, channel_means)
    q = resolve_qparams(lowering) if mode == "int8" else {}
    return _serialise(lowering, q, write)
