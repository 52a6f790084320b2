"""Whole-model int8 ranges for a campaign's candidates, and the samples they come from.

A campaign with an int8 target (an Ethos-U NPU, a Cortex-M host: `runners.calibration.
INT8_TOOLCHAINS`) calibrates its model once (`runners.calibration.calibrate`) on the samples
`int8_calibration` settles (the user's ``--calibration-data``, checked against the model before
anything is measured, else seeded random), and every candidate's build request carries its
tensors' ranges (`tensor_ranges_provider`). plan.json records those samples, so ``run`` builds
the plan's int8 partitions with the same ranges. A 16x8 target (``activations: int16``)
also gets the same calibration's per-channel means (`channel_means_provider`). An int8 row's
cost depends on those ranges, so `calibrated_targets` puts the samples' identity into the int8
targets' keys: rows built on one calibration never serve a campaign on another (the
default's keys are unchanged).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from collage_farm.core.calibration_data import CalibrationData
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import DataflowGraph, ModelError
from collage_farm.core.target import Target
from runners.calibration import INT8_TOOLCHAINS, calibrate, channel_means
from runners.deterministic import activation_bits
from runners.tflite import ActivationBits

__all__ = ["calibrated_targets", "channel_means_provider", "int8_calibration",
           "tensor_ranges_provider", "wide_target"]

ChannelMeans = tuple[tuple[str, tuple[float, ...]], ...]


def int8_calibration(graph: DataflowGraph, targets: Sequence[Target],
                     calibration: CalibrationData | None = None) -> CalibrationData | None:
    """The samples a campaign over ``targets`` calibrates its int8 builds on, checked against
    ``graph`` (`ModelError`, one line): ``calibration``, else seeded random; None when no
    target builds int8 (`ModelError` when ``calibration`` was given: it would not be used)."""
    if not any(t.toolchain in INT8_TOOLCHAINS for t in targets):
        if calibration is not None:
            raise ModelError(f"calibration data {calibration.path}: no target of this "
                             "campaign builds int8 (an Ethos-U NPU or a Cortex-M host); it "
                             "would not be used")
        return None
    return (calibration or CalibrationData.random()).validated(graph)


def tensor_ranges_provider(graph: DataflowGraph, targets: Sequence[Target],
                           calibration: CalibrationData | None = None
                           ) -> Callable[[CandidatePartition], tuple] | None:
    """Calibrated ranges (whole fp32 model, once, on ``calibration``'s samples: seeded random
    by default) for targets that quantise; None when no target does."""
    if not any(t.toolchain in INT8_TOOLCHAINS for t in targets):
        return None
    ranges = calibrate(graph, data=calibration)

    def for_candidate(c: CandidatePartition) -> tuple:
        names: set[str] = set(c.sub_graph.input_tensors)
        for n in c.sub_graph.nodes:
            names.update(o for o in n.outputs if o)
        return tuple((k, float(ranges[k][0]), float(ranges[k][1]))
                     for k in sorted(names) if k in ranges)

    return for_candidate


def wide_target(target: Target) -> bool:
    """True for a target whose builds are 16x8 (``activations: int16``), corrected with the
    calibration's channel means."""
    return target.toolchain in INT8_TOOLCHAINS and \
        activation_bits(target.option("activations")) is ActivationBits.INT16


def channel_means_provider(graph: DataflowGraph, targets: Sequence[Target],
                           calibration: CalibrationData | None = None
                           ) -> Callable[[CandidatePartition], ChannelMeans] | None:
    """Per-channel means (`runners.calibration.channel_means`, the calibration the ranges come
    from) of a candidate's tensors, for the candidates of 16x8 targets (`wide_target`; empty
    for the others); None when no target is 16x8."""
    if not any(wide_target(t) for t in targets):
        return None
    means = channel_means(graph, data=calibration)

    def for_candidate(c: CandidatePartition) -> ChannelMeans:
        if not wide_target(c.target):
            return ()
        names: set[str] = set(c.sub_graph.input_tensors)
        for n in c.sub_graph.nodes:
            names.update(o for o in n.outputs if o)
        return tuple((k, tuple(float(x) for x in means[k])) for k in sorted(names) if k in means)

    return for_candidate


def calibrated_targets(targets: Sequence[Target], calibration: CalibrationData | None
                       ) -> tuple[Target, ...]:
    """``targets`` with ``Target.calibration`` set to ``calibration``'s `row_key` on those
    that build int8 (empty for the default calibration: the targets come back equal), so
    their candidates' fingerprints and cost-row keys name the calibration."""
    key = calibration.row_key if calibration is not None else ""
    return tuple(dataclasses.replace(t, calibration=key)
                 if t.toolchain in INT8_TOOLCHAINS else t for t in targets)
