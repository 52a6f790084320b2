"""Time several callables in interleaved rounds: A B C, then B C A, ...

Why: the machines drift by ~10% between phases of one process, so two things timed one after
the other differ by the drift as much as by themselves. Rotating the order each round puts every
callable in every turn position, and round ``i`` of each ran within one turn of the rotation,
so the ratio of two callables' round-``i`` medians is free of the drift between turns.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from runners.base import MeasureConfig, Summary
from runners.measure import time_callable

__all__ = ["MAX_RUNS_PER_ROUND", "PLAN_ROUND_S", "Interleaved", "measure_interleaved",
           "measure_interleaved_rounds", "plan_round_config", "runs_to_fill"]

#: the round length plans are timed in (the never-worse run's ``min_round_s``): the cut-cost
#: probe's whole models and the in-chain pricing of plans fill rounds this long too, so a plan
#: is priced on the time base it is verified on
PLAN_ROUND_S = 0.05
#: the most runs of one chain in one round (a model of a few microseconds)
MAX_RUNS_PER_ROUND = 2000


def plan_round_config(rounds: int) -> MeasureConfig:
    """The `MeasureConfig` of an interleaved end-to-end run of plans (the never-worse run,
    refinement's trials): ``rounds`` rounds, each one `PLAN_ROUND_S` long with at least one
    run, the rounds the cut-cost probe and in-chain pricing time in (`runs_to_fill`), so a plan
    is verified on the time base it was priced on. A round of one 100 ms run is enough: the
    run averages itself, the rounds are what the paired comparison pairs, and a round off by
    more than ``outlier_ratio`` is run again (five runs a round made gpt2-2L's never-worse
    run 12 of its 92 s)."""
    return MeasureConfig(rounds=rounds, min_round_s=PLAN_ROUND_S, min_round_runs=1)


def runs_to_fill(round_s: float, run_s: float) -> int:
    """Runs of ``run_s`` seconds that fill ``round_s`` (at least 1, at most
    `MAX_RUNS_PER_ROUND`)."""
    if not run_s > 0:
        return MAX_RUNS_PER_ROUND
    return max(1, min(MAX_RUNS_PER_ROUND, math.ceil(round_s / run_s)))


@dataclass(frozen=True)
class Interleaved:
    """One interleaved run: each callable's summary and its round medians, in round order.

    Round ``i`` of every callable ran within one turn of the rotation (A B C, then B C A, ...),
    so the ratio of two callables' round-``i`` medians is free of the drift between turns:
    `collage_farm.postsearch.noise.paired` compares plans on those ratios.
    """

    summaries: dict[str, Summary]
    rounds: dict[str, tuple[float, ...]]


def measure_interleaved(fns: Mapping[str, Callable[[], None]], config: MeasureConfig
                        ) -> dict[str, Summary]:
    """Time several callables in interleaved rounds (A B C, B C A, ...), one round each turn.

    Each turn is one `time_callable` round (``rounds=1``); warm-up runs happen once per
    callable before the first round; rounds whose median is off by more than ``outlier_ratio``
    are re-run once at the end, interleaved too. `measure_interleaved_rounds` also returns the
    round medians.
    """
    return measure_interleaved_rounds(fns, config).summaries


def measure_interleaved_rounds(fns: Mapping[str, Callable[[], None]], config: MeasureConfig,
                               stop: Callable[[Mapping[str, Sequence[float]]], bool] | None
                               = None) -> Interleaved:
    """`measure_interleaved`, with each callable's round medians kept in round order.

    An outlier round re-run at the end replaces that round's median in place, so pairing by
    round index stays (that one pair is further apart in time, which only widens the spread).
    Nothing to time (no callables) gives an empty result. ``stop``, when given, is asked after
    each full round with every callable's round medians so far; True ends the run there
    (``config.rounds`` is then the upper limit; the result has as many rounds as were run).
    """
    names = list(fns)
    if not names:
        return Interleaved({}, {})
    one = dataclasses.replace(config, rounds=1, warmup_runs=0, outlier_ratio=0.0)
    for n in names:
        for _ in range(max(0, config.warmup_runs)):
            fns[n]()
    rounds = max(1, config.rounds)
    samples: dict[str, list[list[float]]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            s, _ = time_callable(fns[n], one)
            samples[n].append(s)
        if stop is not None and r + 1 < rounds and stop(
                {n: [statistics.median(x) for x in samples[n]] for n in names}):
            break
    if len(samples[names[0]]) >= 2 and config.outlier_ratio > 0:
        for n in names:
            meds = [statistics.median(s) for s in samples[n]]
            center = statistics.median(meds)
            for i, m in enumerate(meds):
                if center > 0 and abs(m - center) / center > config.outlier_ratio:
                    samples[n][i], _ = time_callable(fns[n], one)
    out, per_round = {}, {}
    for n in names:
        flat = [x for s in samples[n] for x in s]
        per_round[n] = tuple(statistics.median(s) for s in samples[n])
        out[n] = Summary.of(flat, per_round[n])
    return Interleaved(out, per_round)
