"""Re-runs and offline reuse are exact: what a measured campaign left in its cost table gives
the same plan again, with nothing measured.

Two measured mnist campaigns share one table (the second a plain re-run), then ``tune
--offline`` runs twice on that table. The re-run measures no candidate (every cost, every
confirmation, every transition and cut-cost row is in the table) and times nothing end to end:
it reaches the first campaign's search plan and writes the plan that campaign decided on (its
decision row). Each offline run uses the measured transitions the campaigns used (not the
analytic fallback), finds every cost it asks for, and writes the same plan: the same
partitions on the same targets, priced at the same estimate, because it arrives at the same
search plan from the same costs and finds that decision (`collage_farm.costtable.decisions`).
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from collage_farm.cli import main
from collage_farm.costtable import CostTable

pytest.importorskip("openvino")

TARGETS = "ort-cpu,openvino-cpu"
# exhaustive mode (every candidate measured in isolation): what this file checks is that its
# measurements and confirmations are reused; profile mode's own run: test_profile_mode.py
FAST = ("--measure", "exhaustive", "--refine-trials", "1", "--refine-time", "20",
        "--verify-extend-rounds", "0", "--no-report", "--json")


def _tune(*argv: str) -> dict:
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["tune", "zoo:mnist", "--targets", TARGETS, *argv])
    assert rc == 0
    return json.loads(buf.getvalue())


def _plan(out: Path) -> tuple[list[tuple[str, tuple[str, ...]]], str]:
    plan = json.loads((out / "plan.json").read_text())
    parts = sorted((p["target"], tuple(p["nodes"])) for p in plan["partitions"])
    return parts, plan["transition"]


def test_rerun_measures_nothing_and_offline_writes_the_campaigns_plan(
        ray_cluster: Any, tmp_path: Path) -> None:
    table = tmp_path / "costs"
    first = _tune("--cost-table", str(table), "--out", str(tmp_path / "a"), *FAST)
    assert first["measured"] > 0 and first["confirm"]["remeasured"] > 0
    # one CPU runner per LLC domain by default; --slots forces more and the summary says so
    assert (first["slots"]["used"], first["slots"]["why"]) == (1, "llc-domains")

    again = _tune("--cost-table", str(table), "--out", str(tmp_path / "b"), "--slots", "2",
                  *FAST)
    assert (again["slots"]["used"], again["slots"]["why"]) == (2, "forced")
    assert again["measured"] == 0, again["confirm"]  # candidates, confirmations: all stored
    assert again["confirm"]["remeasured"] == 0
    assert again["dijkstra_estimated_s"] == pytest.approx(first["dijkstra_estimated_s"],
                                                          rel=1e-12)
    b_parts, b_transition = _plan(tmp_path / "b")
    assert b_transition.startswith("measured")  # the table's measured transitions
    assert (b_parts, b_transition) == _plan(tmp_path / "a")  # the first campaign's plan
    assert again["decision"]["campaign_id"] == first["campaign_id"]
    assert again["verify"].startswith("not measured now") and again["plan_is"] == first["plan_is"]

    decisions = CostTable(table).rows({"target": "plan"})  # the re-run decided nothing new
    assert [d.campaign_id for d in decisions] == [first["campaign_id"]]

    for k in range(2):
        out = tmp_path / f"offline{k}"
        off = _tune("--offline", "--cost-table", str(table), "--out", str(out), "--json")
        assert off["estimator"] == "table" and off["measured"] == 0 and off["slots"] is None
        parts, transition = _plan(out)
        assert transition == b_transition  # not the analytic fallback
        assert parts == b_parts  # the plan the newest campaign wrote
        assert off["decision"]["campaign_id"] == first["campaign_id"]
        assert off["plan_is"] == again["plan_is"]
        assert off["dijkstra_estimated_s"] == pytest.approx(again["dijkstra_estimated_s"],
                                                            rel=1e-12)
        assert off["estimated_total_s"] == pytest.approx(again["estimated_total_s"],
                                                         rel=1e-12)
