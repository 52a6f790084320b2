"""``--input NAME=VALUE``: fixed values for model inputs, shared by ``tune``, ``run``, ``compare``.

Generated feeds suit most inputs (floats drawn, indices drawn inside the axis they index); an
input that must hold one value (a sample rate, a number of detections) is given here. The value
is a number or comma-separated numbers, broadcast to the input's shape
(`collage_farm.core.feeds`); a malformed one, or one that does not fit, is a one-line error.

``--calibration-data FILE.npz|DIR``: the samples int8 builds (Ethos-U NPU and Cortex-M host
partitions) are calibrated on, instead of seeded random feeds (`collage_farm.core.
calibration_data`: an .npz keyed by input name, or a directory of <input name>.npy files; one
sample in the input's shape or N stacked on a leading axis).
"""

from __future__ import annotations

import argparse

import numpy as np

from collage_farm.core.calibration_data import CalibrationData
from collage_farm.core.feeds import parse_input_value

__all__ = ["add_calibration_arg", "add_input_arg", "calibration_data", "input_values"]


def add_input_arg(p: argparse.ArgumentParser) -> None:
    """Register the repeatable ``--input NAME=VALUE`` option on ``p``."""
    p.add_argument("--input", action="append", default=[], metavar="NAME=VALUE",
                   help="fix an input's value in every check and timing (a number or "
                   "comma-separated numbers, broadcast to its shape), e.g. --input "
                   "sample_rate=16000")


def input_values(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """``--input`` options as name -> value; `ModelError` for a malformed one."""
    return dict(parse_input_value(text) for text in args.input)


def add_calibration_arg(p: argparse.ArgumentParser, default: str) -> None:
    """Register ``--calibration-data FILE.npz|DIR`` on ``p``; ``default`` says what is used
    without it."""
    p.add_argument("--calibration-data", metavar="FILE.npz|DIR",
                   help="real inputs to calibrate int8 builds on (Ethos-U NPU, Cortex-M host): "
                   "an .npz keyed by input name, or a directory of <input name>.npy files; "
                   "each array one sample in the input's shape or N samples stacked on a "
                   f"leading axis (default: {default})")


def calibration_data(args: argparse.Namespace) -> CalibrationData | None:
    """``--calibration-data`` read (not yet checked against a model), or None when not given;
    `ModelError` (one line) for a file that cannot be read."""
    path = getattr(args, "calibration_data", None)
    return CalibrationData.load(path) if path else None
