"""The measurement options ``run`` and ``compare`` share, and how both print a latency."""

from __future__ import annotations

import argparse

from runners.base import MeasureConfig

__all__ = ["add_measure_args", "fmt_ms", "measure_config"]


def add_measure_args(p: argparse.ArgumentParser) -> None:
    """``--rounds``, ``--min-round-s``, ``--threads`` and ``--json`` on ``p``."""
    p.add_argument("--rounds", type=int, default=5, help="measurement rounds (default 5)")
    p.add_argument("--min-round-s", type=float, default=0.05,
                   help="minimum timed seconds per round (default 0.05)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON")


def measure_config(args: argparse.Namespace) -> MeasureConfig:
    """The `MeasureConfig` of the options `add_measure_args` added (at least one round)."""
    return MeasureConfig(rounds=max(1, args.rounds), min_round_s=args.min_round_s,
                         threads=args.threads)


def fmt_ms(x: float | None) -> str:
    """Seconds as ``"1.2345 ms"``; ``"-"`` for no value."""
    return "-" if x is None else f"{x * 1e3:.4f} ms"
