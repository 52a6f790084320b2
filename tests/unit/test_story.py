"""One story per campaign: every figure `tune` prints, its JSON and report.html name their plan.

A whole campaign (`run_tune`) runs on mnist with the farm estimator over a scripted measurement
service (ort-cpu candidates cost less than openvino-cpu ones, so the search writes ort-cpu
whole) and scripted end-to-end timings in place of the interleaved runs (the one function
`collage_farm.execute.measure_interleaved_rounds`): ort-cpu whole 45.1 ms, openvino-cpu whole
41.0 ms, and a refinement move to openvino-cpu measured slower in its own run (42.5 -> 47.9 ms),
the resnet18 case that printed the Dijkstra plan's estimate beside the fallback's measurement.
The plans are built and checked for real (ORT and OpenVINO sessions); only the clock is
scripted. The never-worse fallback must win, and no line may print an estimate of a plan other
than the one it names.
"""

from __future__ import annotations

import html
import io
import math
import re
from collections.abc import Callable, Mapping
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from collage_farm import execute
from collage_farm.campaign import TuneOptions, run_tune
from collage_farm.cli.tune import print_summary
from collage_farm.core.target import parse_targets
from collage_farm.costtable import TableStore
from collage_farm.execute import Interleaved
from collage_farm.postsearch.noise import Paired, paired
from collage_farm.report.summary import compare_words, move_verdict, ms, plan_label
from estimators.measured import FarmEstimator
from runners.base import MeasureConfig, Summary
from tests.helpers import ScriptedService

pytest.importorskip("openvino")

#: scripted end-to-end latency per name of an interleaved run (seconds)
LATENCY = {"ort-cpu": 45.1e-3, "openvino-cpu": 41.0e-3, "dijkstra": 45.1e-3,
           "current": 42.5e-3, "candidate": 47.9e-3}
JITTER = (1.00, 1.02, 0.99, 1.03, 0.98, 1.01, 0.97, 1.02, 1.00, 0.99)


def _scripted_rounds(fns: Mapping[str, Callable[[], None]], config: MeasureConfig
                     ) -> Interleaved:
    """What `measure_interleaved_rounds` returns, from `LATENCY`, with per-name jitter."""
    summaries, rounds = {}, {}
    for k, name in enumerate(fns):
        base = LATENCY[name]
        r = tuple(base * JITTER[(i + 3 * k) % len(JITTER)] for i in range(config.rounds))
        rounds[name] = r
        summaries[name] = Summary.of(list(r), list(r))
    return Interleaved(summaries, rounds)


@pytest.fixture(scope="module")
def fallback(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """A campaign whose Dijkstra plan (ort-cpu whole) loses to openvino-cpu whole."""
    mp = pytest.MonkeyPatch()
    mp.setattr(execute, "measure_interleaved_rounds", _scripted_rounds)
    tmp = tmp_path_factory.mktemp("story")
    service = ScriptedService(per_target={"ort-cpu": 1e-3, "openvino-cpu": 2e-3})
    est = FarmEstimator(service, TableStore(tmp / "costs"), model="mnist", close_farm=False)
    try:
        s = run_tune(TuneOptions(model="zoo:mnist", targets=tuple(parse_targets(
            "ort-cpu,openvino-cpu")), out=tmp / "out", cut_costs=False, confirm_rounds=1,
            refine_trials=2, verify_rounds=7, verify_extend_rounds=0), estimator=est)
    finally:
        est.close()
        mp.undo()
    return s, tmp / "out"


def _printed(s: dict) -> list[str]:
    buf = io.StringIO()
    with redirect_stdout(buf):
        print_summary(s)
    return buf.getvalue().splitlines()


def test_the_fallback_is_written_and_said_so(fallback: tuple[dict, Path]) -> None:
    s, _ = fallback
    assert s["plan_is"] == "best_single" and s["best_single_target"] == "openvino-cpu"
    assert s["written_plan"] == "openvino-cpu whole"
    assert s["dijkstra_plan"] == "ort-cpu whole"
    assert s["written_plan_estimated_s"] == s["estimated_total_s"]
    assert s["plan_measured_s"] == pytest.approx(41.0e-3, rel=0.03)
    # the written plan against the Dijkstra plan, round by round, with its interval
    vs = s["written_plan_vs"]["ort-cpu"]
    assert vs["ratio"] == pytest.approx(41.0 / 45.1, rel=0.03)
    assert vs["low"] < vs["ratio"] < vs["high"] < 1
    sections = [d["section"] for d in s["story"]]
    assert sections[:4] == ["plan", "singles", "decision", "estimate"]
    assert set(sections[4:]) == {"history"}
    decision = s["story"][2]["text"]
    assert re.search(r"openvino-cpu whole is \d+(\.\d)?% faster than the Dijkstra plan "
                     r"\(ort-cpu whole\), 95% interval [\d.]+%-[\d.]+% faster", decision), decision


def test_no_printed_estimate_belongs_to_another_plan(fallback: tuple[dict, Path]) -> None:
    s, out = fallback
    written_est = ms(s["estimated_total_s"])
    dijkstra_est = ms(s["dijkstra_estimated_s"])
    assert written_est != dijkstra_est  # else the check below could not tell them apart
    page = html.unescape(re.sub(r"<[^>]+>", "\n", (out / "report.html").read_text()))
    for where, lines in (("tune", _printed(s)), ("report", page.splitlines())):
        text = "\n".join(lines)
        assert written_est in text and dijkstra_est in text, where
        assert " 1 partitions" not in text, where
        assert "believed its mix" not in text, where  # the search's plan was no mix
        assert "not beyond noise" not in text, where  # the move was 1.13x slower
        for line in lines:
            if written_est in line:
                assert "written plan (openvino-cpu whole)" in line, (where, line)
            if dijkstra_est in line:
                assert "Dijkstra plan" in line and "ort-cpu whole" in line, (where, line)
            if "estimat" in line and re.search(r"\d ms", line):
                assert "Dijkstra plan" in line or "written plan" in line, (where, line)
    # refinement's only move (ort-cpu whole -> openvino-cpu whole) is left to the never-worse
    # run, which timed both whole models: said once, with no verdict of its own
    printed = "\n".join(_printed(s))
    assert ("1 move to a toolchain's whole model left to the never-worse run" in printed
            and "rejected" not in printed), printed


def test_report_partition_figure_is_the_plan_figure(fallback: tuple[dict, Path]) -> None:
    s, out = fallback
    page = (out / "report.html").read_text()
    row = re.search(r"<tr><td>p000</td>.*?</tr>", page)
    assert row is not None
    assert f"{s['plan_measured_s'] * 1e3:.4f}" in row.group(0)


def test_words_and_labels() -> None:
    assert plan_label([("ort-cpu", 11)], 11) == "ort-cpu whole"
    assert plan_label([("ort-cpu", 5), ("openvino-cpu", 6)], 11) == (
        "a mix of 2 partitions (ort-cpu 1, openvino-cpu 1)")
    assert plan_label([("ort-cpu", 5)], 11) == "a mix of 1 partition (ort-cpu 1)"
    p = Paired(1 / 1.096, 0.03, 7, 1 / 1.15, 1 / 1.04)
    assert compare_words("a", "b", p) == (
        "a is 9.6% faster than b, 95% interval 4.0%-15% faster (7 paired rounds)")
    assert "slower" in compare_words("a", "b", Paired(1.5, 0.03, 7, 1.4, 1.6))
    assert "from 2.0% faster to 3.0% slower" in compare_words(
        "a", "b", Paired(1.0, 0.03, 7, 1 / 1.02, 1.03))
    assert move_verdict({"status": "rejected", "ratio": 1.5, "threshold": 0.05}) == (
        "rejected: 1.50x slower")
    assert "within noise" in move_verdict({"status": "rejected", "ratio": 1.01,
                                           "threshold": 0.05})


def test_interval_covers_the_ratio_and_shrinks_with_rounds() -> None:
    a = [1.0 * j for j in JITTER]
    b = [1.1 * j for j in reversed(JITTER)]
    s = Summary.of(a, a)
    few, many = paired(s, s, a[:5], b[:5], 5), paired(s, s, a * 3, b * 3, 30)
    for p in (few, many):
        assert p.low < p.ratio < p.high
        assert math.isfinite(p.low) and p.to_json()["low"] == p.low
    assert many.high - many.low < few.high - few.low
