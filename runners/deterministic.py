"""What the toolchains whose cost is a deterministic figure share: Vela (`runners.ethosu`) and
the Cortex-M host's cycle model (`runners.cortex_m`).

Both turn a candidate into TFLite with the converter (`convert_for_build`: int8 with the whole
model's ranges, any tensor without one calibrated on the sub-model, or float32) and report one
figure as their one sample (`one_sample`: n=1 whatever `MeasureConfig` asks, since the same
artifact gives the same figure every time).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from runners.base import BuildResult, MeasureConfig, MeasureInput, MeasureResult, Status, Toolchain
from runners.calibration import ranges_for
from runners.measure import summarize
from runners.tflite import ActivationBits, ConversionError, ConvertedModel, UnsupportedOp, convert

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node

__all__ = ["A16_SOFTMAX_MAX_ROW", "ConversionFailed", "activation_bits", "convert_for_build",
           "one_sample", "row_fields", "wide_softmax_why"]


def activation_bits(option: object) -> ActivationBits:
    """The activation precision a target's ``activations`` option asks for (``int8``, the
    default, also for None; ``int16``: TFLite's 16x8)."""
    return ActivationBits.INT16 if option == "int16" else ActivationBits.INT8


#: longest Softmax row a 16x8 target (``activations: int16``) takes. TFLite's int16 SOFTMAX
#: reads exp from a table over [-10, 0], so every entry further below its row's maximum counts
#: e^-10 of the maximum's weight instead of ~0: a row of N entries inflates its sum by up to
#: N e^-10, and 86 entries keep a probability near 1 within one int8 step (1/256). Measured
#: in LiteRT's reference kernels on PP-OCRv4 rec's CTC head (rows of 6,625 classes): a top
#: probability of 0.881 came out 0.653, 60 int8 steps of the output's range
A16_SOFTMAX_MAX_ROW = 86


def wide_softmax_why(node: Node, graph: DataflowGraph) -> str | None:
    """Why a 16x8 target leaves this Softmax to the host (rows longer than
    `A16_SOFTMAX_MAX_ROW`), or None."""
    shape = graph.tensors[node.inputs[0]].shape if node.inputs[0] in graph.tensors else ()
    axis = int(node.attrs.get("axis", -1))  # type: ignore[arg-type]
    row = shape[axis] if shape and -len(shape) <= axis < len(shape) else 0
    if row > A16_SOFTMAX_MAX_ROW:
        return (f"16x8 softmax over rows of {row} entries: the int16 kernel counts every entry "
                f"at least e^-10 of the row maximum (rows of at most {A16_SOFTMAX_MAX_ROW})")
    return None


class ConversionFailed(Exception):
    """The candidate cannot be written as TFLite: the build's status and error text."""

    def __init__(self, status: Status, error: str) -> None:
        super().__init__(error)
        self.status = status
        self.error = error


def convert_for_build(graph: DataflowGraph, mode: str,
                      tensor_ranges: tuple[tuple[str, float, float], ...], *,
                      write: bool = True, activations: ActivationBits = ActivationBits.INT8,
                      channel_means: tuple[tuple[str, tuple[float, ...]], ...] = ()
                      ) -> tuple[ConvertedModel, str]:
    """``graph`` as TFLite in ``mode`` and a note on the ranges used (int8 only);
    ``write=False``: without the flatbuffer bytes; ``activations`` and ``channel_means``
    (int8 mode): the activation precision and the means its biases are corrected with
    (`runners.tflite.convert`).

    Raises `ConversionFailed` (unsupported or build failed, with the converter's words)."""
    filled = 0
    ranges: Mapping[str, tuple[float, float]] = {}
    try:
        if mode == "int8":
            given = {k: (float(lo), float(hi)) for k, lo, hi in tensor_ranges}
            ranges, filled = ranges_for(graph, given)
        conv = convert(graph, mode, ranges, write=write, activations=activations,
                       channel_means=dict(channel_means))
    except UnsupportedOp as e:
        raise ConversionFailed(Status.UNSUPPORTED, str(e)) from None
    except ConversionError as e:
        raise ConversionFailed(Status.BUILD_FAILED, f"{mode} TFLite conversion: {e}") from None
    except Exception as e:
        raise ConversionFailed(Status.BUILD_FAILED, f"{mode} TFLite conversion: "
                                                    f"{type(e).__name__}: {e}") from None
    note = ("none (float32)" if mode != "int8" else "whole model" if not filled
            else f"whole model; {filled} tensor(s) calibrated on the sub-model")
    if mode == "int8" and activations is ActivationBits.INT16:
        note += f"; 16x8, {len(channel_means)} channel mean(s)"
    return conv, note


def one_sample(build: BuildResult, config: MeasureConfig, seconds: float, what: str,
               details: Mapping[str, Any], t0: float, common: Mapping[str, Any]
               ) -> MeasureResult:
    """``seconds`` as the one sample of a result (``what`` names the figure in the error when
    it is not a positive time)."""
    if not (math.isfinite(seconds) and seconds > 0):
        return MeasureResult.failed(build, Status.RUNTIME_ERROR,
                                    f"{what} is not a positive time ({seconds})", config,
                                    measure_s=time.perf_counter() - t0, **common)
    return MeasureResult(
        fingerprint=build.fingerprint, target=build.target, status=Status.OK, config=config,
        samples=(seconds,), summary=summarize((seconds,)), measure_s=time.perf_counter() - t0,
        details=tuple(sorted(details.items())), **common)


def row_fields(tc: Toolchain, inp: MeasureInput) -> tuple[dict[str, Any], MeasureResult | None]:
    """What every result of ``tc`` for ``inp`` carries (kind, device, version, build time), and
    the failed result when the build failed (else None)."""
    build = inp.build
    common: dict[str, Any] = dict(kind=tc.kind, device=tc.device_description(build.target),
                                  toolchain_version=tc.version(), build_s=build.build_s)
    if build.ok:
        return common, None
    return common, MeasureResult.failed(build, build.status, build.error or "build failed",
                                        inp.config, **common)
