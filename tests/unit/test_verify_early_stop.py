"""Never worse stops its interleaved run early once the decision is clear, never before.

Synthetic round medians (no Ray, no model): a mix clearly slower than the best single, a mix
clearly faster, and an undecided one; singles told apart or the same within the noise floor.
The interleaved runner honours the rule: it asks after each full round and stops there.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from collage_farm.execute.interleaved import (
    PLAN_ROUND_S,
    measure_interleaved_rounds,
    plan_round_config,
    runs_to_fill,
)
from collage_farm.postsearch.never_worse import decision_is_clear
from runners.base import MeasureConfig


def _around(ms: float, sd: float, n: int, seed: int) -> list[float]:
    """``n`` round medians around ``ms`` with log spread ``sd`` (seeded)."""
    rng = np.random.default_rng(seed)
    return [ms * 1e-3 * math.exp(sd * z) for z in rng.normal(0.0, 1.0, n)]


def _scaled(base: list[float], ratio: float, sd: float, seed: int) -> list[float]:
    """``base`` times per-round ratios whose logs have median ``log(ratio)`` and exactly the
    spread ``sd``."""
    z = np.random.default_rng(seed).normal(0.0, 1.0, len(base))
    logs = sd * (z - z.mean()) / z.std(ddof=1)
    logs += math.log(ratio) - float(np.median(logs))
    return [b * math.exp(x) for b, x in zip(base, logs)]


def test_a_clearly_slower_mix_is_decided_after_min_rounds() -> None:
    best = _around(10.0, 0.1, 4, seed=1)  # drift between rounds is shared: pairs cancel it
    meds = {"a": best, "b": _scaled(best, 1.30, 0.01, 2), "dijkstra": _scaled(best, 1.15, 0.01, 3)}
    assert decision_is_clear(meds, ["dijkstra"], ["a", "b"], min_rounds=4)
    short = {k: v[:3] for k, v in meds.items()}
    assert not decision_is_clear(short, ["dijkstra"], ["a", "b"], min_rounds=4)  # too few


def test_a_clearly_faster_mix_is_decided() -> None:
    best = _around(10.0, 0.1, 5, seed=4)
    meds = {"a": best, "dijkstra": _scaled(best, 0.80, 0.01, 5)}
    assert decision_is_clear(meds, ["dijkstra"], ["a"], min_rounds=4)


def test_an_undecided_mix_or_singles_keep_the_run_going() -> None:
    best = _around(10.0, 0.1, 6, seed=6)
    near = {"a": best, "dijkstra": _scaled(best, 0.96, 0.06, 7)}  # could be a win: measure on
    assert not decision_is_clear(near, ["dijkstra"], ["a"], min_rounds=4)
    # the mix is out of the race, but which single is the fallback is not settled yet
    close = {"a": best, "b": _scaled(best, 1.02, 0.06, 8), "dijkstra": _scaled(best, 1.5, 0.01, 9)}
    assert not decision_is_clear(close, ["dijkstra"], ["a", "b"], min_rounds=4)
    # singles the same within the floor: either is a fallback within noise
    same = {"a": best, "b": _scaled(best, 1.0, 0.002, 10), "dijkstra": _scaled(best, 1.5, 0.01, 9)}
    assert decision_is_clear(same, ["dijkstra"], ["a", "b"], min_rounds=4)
    assert not decision_is_clear({"dijkstra": best}, ["dijkstra"], [], min_rounds=4)


def test_a_plan_that_is_the_best_single_decides_on_the_singles_alone() -> None:
    best = _around(10.0, 0.1, 4, seed=11)
    meds = {"a": best, "b": _scaled(best, 1.4, 0.01, 12), "dijkstra": list(best)}  # ratio 1
    assert decision_is_clear(meds, ["dijkstra"], ["a", "b"], min_rounds=4)


def test_the_interleaved_run_stops_where_the_rule_says() -> None:
    asked: list[int] = []

    def stop(meds) -> bool:
        assert set(meds) == {"x", "y"} and len(meds["x"]) == len(meds["y"])
        asked.append(len(meds["x"]))
        return len(meds["x"]) >= 3

    cfg = MeasureConfig(rounds=7, warmup_runs=0, min_round_runs=1, min_round_s=0.0)
    run = measure_interleaved_rounds({"x": lambda: None, "y": lambda: None}, cfg, stop)
    assert asked == [1, 2, 3]
    assert len(run.rounds["x"]) == 3 and run.summaries["y"].n >= 3
    full = measure_interleaved_rounds({"x": lambda: None}, cfg, lambda meds: False)
    assert len(full.rounds["x"]) == 7  # the upper limit


def test_plan_rounds_fill_the_probe_round_with_at_least_one_run() -> None:
    """An end-to-end run of plans times each in rounds of `PLAN_ROUND_S` with at least one
    run: a plan longer than the round runs once a round (as the probe and in-chain pricing
    time it), a short one as many times as fill the round."""
    cfg = plan_round_config(3)
    assert cfg.rounds == 3 and cfg.min_round_s == PLAN_ROUND_S and cfg.min_round_runs == 1
    calls = {"long": 0, "short": 0}
    spin = {"long": PLAN_ROUND_S * 1.2, "short": PLAN_ROUND_S / 4.5}

    def busy(name: str) -> Callable[[], None]:
        def run() -> None:
            calls[name] += 1
            end = time.perf_counter() + spin[name]
            while time.perf_counter() < end:
                pass
        return run

    got = measure_interleaved_rounds({k: busy(k) for k in calls},
                                     dataclasses.replace(cfg, warmup_runs=0, outlier_ratio=0))
    assert calls["long"] == 3 and got.summaries["long"].n == 3
    assert calls["short"] == 3 * runs_to_fill(PLAN_ROUND_S, spin["short"]) == 15
