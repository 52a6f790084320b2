"""``tune --measure profile`` on mnist on the shared Ray cluster: each target's whole model is
profiled once (in the campaign's process, which times on the runners' device) and recorded
as a ``profiled`` row, except LiteRT's (no per-operator timer: its
profile is the cut-cost probe's one-toolchain chain, whose sessions were built while Ray
started); the search measures no candidate in isolation
when every profile is usable (a profile the worker cannot trust is replaced there by prefix
differences, said in one warning line); the plan is checked end to end like exhaustive mode's.
A re-run on the same table profiles and measures nothing and reproduces the estimate and the
plan; ``--offline --measure profile`` on that table writes the same plan at the same estimate.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from collage_farm.cli import main
from collage_farm.core.target import parse_targets
from collage_farm.costtable import CostTable
from runners.transitions import parse_fingerprint

pytest.importorskip("openvino")

FAST = ("--targets", "ort-cpu,openvino-cpu,litert-cpu", "--refine-trials", "1",
        "--refine-time", "20", "--verify-extend-rounds", "0", "--no-report", "--json",
        "--measure", "profile")


def _tune(*argv: str) -> dict:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["tune", "zoo:mnist", *FAST, *argv]) == 0
    return json.loads(buf.getvalue())


def _plan(out: Path) -> list[tuple[str, tuple[str, ...]]]:
    plan = json.loads((out / "plan.json").read_text())
    return sorted((p["target"], tuple(p["nodes"])) for p in plan["partitions"])


def test_profile_mode_reruns_and_offline_reproduce_the_plan(ray_cluster: Any,
                                                             tmp_path: Path) -> None:
    table = tmp_path / "costs"
    pr = _tune("--out", str(tmp_path / "pr"), "--cost-table", str(table))
    # one profile run per target with a profiler; LiteRT's profile is the probe's chain
    # unless that chain's chunks cannot be told from their cuts (mnist runs ~50 us: a
    # loaded host can push it past the tolerance), and then a request, said in the summary
    lite = pr["profile"]["targets"]["litert-cpu"]
    note = pr["profile"]["chain_profiles"]["litert-cpu"]
    via_chain = lite["method"] == "probe-chain"
    assert pr["measure"] == "profile" and pr["profiled"] == (2 if via_chain else 3)
    assert (note == "the cut-cost probe's chain") if via_chain else \
        note.startswith("a profile request: "), note
    assert lite["groups"] >= 2, lite
    # this process times on the runners' device: ORT and OpenVINO are profiled here, on the
    # probe's sessions, not sent to a runner
    for tid in ("ort-cpu", "openvino-cpu"):
        assert pr["profile"]["targets"][tid]["where"] == "campaign process", tid
    assert pr["cut_costs"]["built_while_ray_started"]["built"] == 6  # 3 targets' chunks, wholes
    assert pr["measure_mode"] == "network"  # the cache mode candidates would be timed in
    usable = pr["profile"]["profiled_targets"]
    fallbacks = [w for w in pr["profile"]["warnings"] if "measured in isolation" in w]
    assert len(fallbacks) == 3 - len(usable)  # each target without a profile is said
    if len(usable) == 3:  # no fallback: the search and the confirmation measure nothing
        assert pr["measured"] == 0 and pr["confirm"]["remeasured"] == 0
    assert pr["plan_measured_s"] > 0 and pr["plan_is"]
    # the runners of an embedded Ray measure on this host's CPU, where the plans are timed
    assert pr["slots"]["used"] >= 1  # the farm's slots, though profile mode wraps its estimator
    timing = pr["plan_timing_host"]
    assert timing["different"] == [] and timing["warning"] is None
    assert {t: v["match"] for t, v in timing["targets"].items()} == {
        "ort-cpu": "same", "openvino-cpu": "same", "litert-cpu": "same"}
    # where the wall time went: every phase of a profile campaign, adding up to wall_s
    ph = pr["phases_s"]
    assert {"load", "farm_start", "transitions", "cut_costs", "profiles", "search", "refine",
            "never_worse", "close", "plan"} <= set(ph)
    assert sum(ph.values()) == pytest.approx(pr["wall_s"], rel=0.02, abs=0.05)
    assert pr["verify_rounds"] <= pr["verify_rounds_limit"]  # may stop once it is clear
    rows = CostTable(table).rows({"kind": "profiled"})
    assert len(rows) == pr["profiled"] and all(r.schema_version == 2 for r in rows)
    # a profiled target is charged no launch or hand-off (its shares hold them), so none is
    # measured for it: hand-off rows only for the toolchains of targets without a profile
    handoffs = {info["toolchain"] for r in CostTable(table).rows()
                if (info := parse_fingerprint(r.fingerprint)) and info["kind"] != "copy"}
    lacking = {t.toolchain for t in parse_targets(FAST[1]) if t.id not in usable}
    assert handoffs == lacking, (handoffs, usable)
    if pr["partitions"] == 1 and not lacking:  # a whole model: its share, nothing on top
        assert pr["estimated_transition_s"] == 0.0
    assert all(r.fingerprint.startswith("profile:") for r in rows)

    # a mixed plan is priced in chain (timed in this process), a single one needs nothing
    chain = pr["inchain"]
    assert chain["stopped_by"] in ("single", "within_noise", "priced", "rounds")
    assert chain["plans"] <= 4 and chain["priced"] >= chain["plans"]
    assert pr["profile"]["in_chain_stored"] == 0  # a fresh table

    again = _tune("--out", str(tmp_path / "pr2"), "--cost-table", str(table))
    assert again["profiled"] == 0 and again["measured"] == 0  # all rows of the table now
    # the same LiteRT profile: the probe's rows give the same chain, or its profile row
    assert again["profile"]["targets"]["litert-cpu"]["method"] == lite["method"]
    assert "built_while_ray_started" not in again["cut_costs"]  # the probe's rows answer
    # the prices the first campaign set are read back, and nothing is timed again for them
    assert again["profile"]["in_chain_stored"] == chain["priced"]
    assert not (again["inchain"] or {}).get("plans")
    assert again["dijkstra_estimated_s"] == pytest.approx(pr["dijkstra_estimated_s"],
                                                          rel=1e-12)
    assert _plan(tmp_path / "pr2") == _plan(tmp_path / "pr")
    # the decision the first campaign recorded is written again, nothing is timed end to end
    assert again["verify"].startswith("not measured now") and "never_worse" not in again["phases_s"]
    assert again["plan_is"] == pr["plan_is"] and "plan_measured_s" not in again

    off = _tune("--offline", "--out", str(tmp_path / "off"), "--cost-table", str(table))
    assert off["estimator"] == "table" and off["measured"] == 0 and off["profiled"] == 0
    assert off["plan_timing_host"] is None  # no runner to compare with, nothing timed
    assert off["inchain"] is None  # nothing timed offline; the stored prices answer
    assert off["profile"]["in_chain_stored"] == chain["priced"]
    assert off["profile"]["profiled_targets"] == again["profile"]["profiled_targets"]
    assert off["dijkstra_estimated_s"] == pytest.approx(again["dijkstra_estimated_s"],
                                                        rel=1e-12)
    assert _plan(tmp_path / "off") == _plan(tmp_path / "pr2")
    assert off["plan_is"] == again["plan_is"]
