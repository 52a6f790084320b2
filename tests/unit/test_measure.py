"""The shared measurement loop: exact statistics on a fake clock, outlier re-runs, cache flush."""

from __future__ import annotations

import os
import statistics

import pytest

import runners.measure as measure
from runners.base import MeasureConfig
from runners.measure import CacheFlusher, llc_bytes, pin_to_cores, summarize, time_callable


class FakeClock:
    """perf_counter_ns stand-in: only the timed callable (and flush) advance it."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += ns


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    c = FakeClock()
    monkeypatch.setattr(measure.time, "perf_counter_ns", c)
    return c


def test_known_durations_give_exact_stats(clock: FakeClock) -> None:
    durations = iter([5_000] * 3 + [1_000, 2_000, 3_000, 4_000] * 100)
    calls = []

    def fn() -> None:
        d = next(durations)
        calls.append(d)
        clock.advance(d)

    cfg = MeasureConfig(warmup_runs=3, rounds=2, min_round_runs=4, min_round_s=0.0)
    samples, medians = time_callable(fn, cfg)
    assert len(calls) == 3 + 8  # warm-up discarded, then 2 rounds x 4 runs
    assert samples == pytest.approx([1e-6, 2e-6, 3e-6, 4e-6] * 2)
    assert medians == pytest.approx([2.5e-6, 2.5e-6])
    s = summarize(samples, medians)
    assert s.n == 8
    assert s.median == pytest.approx(2.5e-6)
    assert s.mean == pytest.approx(2.5e-6)
    assert s.min == pytest.approx(1e-6)
    assert s.cv == pytest.approx(0.0)
    assert s.p10 < s.median < s.p90


def test_round_runs_until_min_time_and_cap(clock: FakeClock) -> None:
    def fn() -> None:
        clock.advance(1_000_000)  # 1 ms

    cfg = MeasureConfig(warmup_runs=0, rounds=3, min_round_runs=2, min_round_s=0.010)
    samples, _medians = time_callable(fn, cfg)
    assert len(samples) == 3 * 10  # each round needs 10 ms of timed runs
    capped = MeasureConfig(warmup_runs=0, rounds=3, min_round_runs=2, min_round_s=1.0,
                           max_samples=12)
    samples, _ = time_callable(fn, capped)
    assert len(samples) == 12  # max_samples overall, split over rounds


def test_outlier_round_is_rerun_once(clock: FakeClock) -> None:
    # round 2 (runs 10..14) is 3x slower; its re-run (after round 5) is normal again
    state = {"i": 0}

    def fn() -> None:
        i = state["i"]
        state["i"] += 1
        clock.advance(30_000 if 10 <= i < 15 else 10_000)

    cfg = MeasureConfig(warmup_runs=0, rounds=5, min_round_runs=5, min_round_s=0.0,
                        outlier_ratio=0.25)
    samples, medians = time_callable(fn, cfg)
    assert state["i"] == 30  # 5 rounds + one re-run
    assert len(samples) == 25
    assert medians == pytest.approx([1e-5] * 5)
    assert max(samples) == pytest.approx(1e-5)


def test_persistent_outlier_is_kept_after_one_rerun(clock: FakeClock) -> None:
    state = {"i": 0, "slow": False}

    def fn() -> None:
        state["i"] += 1
        clock.advance(50_000 if state["slow"] else 10_000)

    def flush() -> None:  # slow for round 3 (runs 6..8) and for its re-run (runs 15..17)
        n = state["i"]
        state["slow"] = 6 <= n < 9 or n >= 15

    cfg = MeasureConfig(warmup_runs=0, rounds=5, min_round_runs=3, min_round_s=0.0)
    _samples, medians = time_callable(fn, cfg, flush=flush)
    assert state["i"] == 18
    assert sorted(medians)[-1] == pytest.approx(5e-5)  # re-run was slow too: kept, once


def test_cache_flush_runs_before_every_timed_run_and_is_not_timed(clock: FakeClock) -> None:
    flushes = []

    def fn() -> None:
        clock.advance(2_000)

    def flush() -> None:
        flushes.append(clock.now)
        clock.advance(10_000_000)  # 10 ms flush must not show up in samples

    cfg = MeasureConfig(warmup_runs=2, rounds=3, min_round_runs=4, min_round_s=0.0,
                        mode="cache_flush")
    samples, _ = time_callable(fn, cfg, flush=flush)
    assert len(flushes) == 2 + 12
    assert samples == pytest.approx([2e-6] * 12)


def test_sync_is_inside_the_timed_region(clock: FakeClock) -> None:
    def fn() -> None:
        clock.advance(1_000)

    def sync() -> None:
        clock.advance(4_000)

    samples, _ = time_callable(fn, MeasureConfig(warmup_runs=0, rounds=1, min_round_runs=3,
                                                 min_round_s=0.0), sync=sync)
    assert samples == pytest.approx([5e-6] * 3)


def test_isolated_mode_ignores_default_flush_and_rejects_unknown_mode() -> None:
    cfg = MeasureConfig(warmup_runs=0, rounds=1, min_round_runs=1, min_round_s=0.0,
                        mode="bogus")
    with pytest.raises(ValueError, match="bogus"):
        time_callable(lambda: None, cfg)


def test_real_cache_flush_mode_and_default_flusher() -> None:
    assert llc_bytes() > 0
    f = CacheFlusher(1 << 20)
    f()
    assert f.size_bytes == 1 << 20
    cfg = MeasureConfig(warmup_runs=1, rounds=2, min_round_runs=2, min_round_s=0.0,
                        mode="cache_flush")
    data = list(range(1000))
    samples, _medians = time_callable(lambda: sum(data), cfg)
    assert len(samples) == 4 and all(s > 0 for s in samples)
    default = measure._default_flusher()
    assert default.size_bytes >= 2 * llc_bytes(0) or default.size_bytes == (64 << 20)


def test_real_callable_statistics_are_sane() -> None:
    data = list(range(2000))
    cfg = MeasureConfig(warmup_runs=2, rounds=3, min_round_runs=5, min_round_s=0.002)
    samples, medians = time_callable(lambda: sorted(data), cfg)
    s = summarize(samples, medians)
    assert s.n == len(samples) >= 15
    assert s.min <= s.p10 <= s.median <= s.p90
    assert s.median == pytest.approx(statistics.median(samples))
    assert 0 <= s.cv < 1


def test_pin_to_cores_round_trip() -> None:
    before = os.sched_getaffinity(0)
    core = min(before)
    try:
        prev = pin_to_cores([core])
        assert prev == before
        assert os.sched_getaffinity(0) == {core}
        assert pin_to_cores(None) == {core}
        with pytest.raises(ValueError):
            pin_to_cores([10_000])
    finally:
        os.sched_setaffinity(0, before)
