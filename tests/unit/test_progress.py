"""Campaign progress: the ETA is the slowest device kind's, and ``done`` never passes ``total``.

Why: one runner per GPU works through the CUDA candidates while a runner per core works
through the CPU ones; on an H100 host the aggregate rate promised "5 s left" while the CUDA
queue needed over a minute.
"""

from __future__ import annotations

import io
import math

import pytest

import collage_farm.farm.progress as progress_mod
from collage_farm.core.target import CPU0, CUDA0, Target
from collage_farm.farm import Progress
from runners.base import BuildResult, MeasureConfig, MeasureResult, Status


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _result(kind: str, ok: bool = True) -> MeasureResult:
    dev = CUDA0 if kind == "cuda" else CPU0
    t = Target.make(f"t-{kind}", "ort-cuda" if kind == "cuda" else "ort-cpu", dev)
    if ok:
        return MeasureResult("fp", t, Status.OK, MeasureConfig(), samples=(1e-3,))
    return MeasureResult.failed(BuildResult("fp", t, Status.OK), Status.RUNTIME_ERROR, "boom",
                                MeasureConfig())


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(progress_mod.time, "monotonic", c)
    return c


def test_eta_is_the_slowest_kinds(clock: Clock) -> None:
    p = Progress(enabled=False, stream=io.StringIO())
    p.add(total=120, hits=10, kinds={"cpu": 90, "cuda": 20})
    clock.now += 10
    for _ in range(60):
        p.result(_result("cpu"))
    for _ in range(2):
        p.result(_result("cuda"))
    # aggregate: 48 left at 6.2/s = 7.7 s; CUDA alone: 18 left at 0.2/s = 90 s
    assert p.eta_s() == pytest.approx(90.0)
    for _ in range(30):
        p.result(_result("cpu"))
    assert p.eta_s() == pytest.approx(18 * 10 / 2)


def test_a_kind_with_work_and_no_result_yet_has_no_eta(clock: Clock) -> None:
    p = Progress(enabled=False, stream=io.StringIO())
    p.add(total=10, kinds={"cpu": 5, "ethos-u": 5})
    clock.now += 1
    p.result(_result("cpu"))
    assert math.isnan(p.eta_s())  # the NPU's rate is unknown


def test_unannounced_results_grow_the_total(clock: Clock) -> None:
    p = Progress(enabled=False, stream=io.StringIO())
    p.add(total=2, hits=1, kinds={"cpu": 1})
    clock.now += 1
    for _ in range(3):  # a confirmation re-measures two candidates nobody announced
        p.result(_result("cpu", ok=False))
    assert p.done == 3 and p.total == 4 and p.failed == 3
    assert "done=3 total=4" in p.line()
    assert p.eta_s() == 0.0


def test_without_kinds_the_overall_rate_still_counts(clock: Clock) -> None:
    p = Progress(enabled=False, stream=io.StringIO())
    p.add(total=100)
    clock.now += 10
    for _ in range(10):
        p.result(_result("cpu"))
    assert p.eta_s() == pytest.approx(90.0)  # was 0.0: every kind looked finished


def test_a_kind_that_starts_late_is_timed_from_its_own_start(clock: Clock) -> None:
    p = Progress(enabled=False, stream=io.StringIO())
    p.add(total=50, kinds={"cpu": 50})
    clock.now += 600
    for _ in range(50):
        p.result(_result("cpu"))
    p.add(total=20, kinds={"cuda": 20})
    clock.now += 2
    p.result(_result("cuda"))
    assert p.eta_s() == pytest.approx(19 * 2.0)  # not 19 x 602


def test_settle_forgets_requests_that_never_came_back(clock: Clock) -> None:
    p = Progress(enabled=False, stream=io.StringIO())
    p.add(total=10, kinds={"cpu": 10})
    clock.now += 5
    for _ in range(8):  # two candidates could not be extracted
        p.result(_result("cpu"))
    assert p.eta_s() > 0
    p.settle()
    assert p.total == 8 and p.eta_s() == 0.0
    p.add(total=4, kinds={"cpu": 4})  # the next campaign's batch is timed afresh
    clock.now += 1
    p.result(_result("cpu"))
    assert p.eta_s() == pytest.approx(3.0)
