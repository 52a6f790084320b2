"""``--input NAME=VALUE``: fixed values for model inputs, shared by ``tune``, ``run``, ``compare``.

Generated feeds suit most inputs (floats drawn, indices drawn inside the axis they index); an
input that must hold one value (a sample rate, a number of detections) is given here. The value
is a number or comma-separated numbers, broadcast to the input's shape
(`collage_farm.core.feeds`); a malformed one, or one that does not fit, is a one-line error.
"""

from __future__ import annotations

import argparse

import numpy as np

from collage_farm.core.feeds import parse_input_value

__all__ = ["add_input_arg", "input_values"]


def add_input_arg(p: argparse.ArgumentParser) -> None:
    """Register the repeatable ``--input NAME=VALUE`` option on ``p``."""
    p.add_argument("--input", action="append", default=[], metavar="NAME=VALUE",
                   help="fix an input's value in every check and timing (a number or "
                   "comma-separated numbers, broadcast to its shape), e.g. --input "
                   "sample_rate=16000")


def input_values(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """``--input`` options as name -> value; `ModelError` for a malformed one."""
    return dict(parse_input_value(text) for text in args.input)
