"""``tune --measure profile`` (the default) on mnist against ``--measure exhaustive``, on the
shared Ray cluster: profile mode profiles each target's whole model once, measures in isolation
only what can change the decision, and writes a plan checked end to end like exhaustive mode's.
A re-run on the same table profiles and measures nothing."""

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

FAST = ("--targets", "ort-cpu,openvino-cpu", "--refine-trials", "1", "--refine-time", "20",
        "--verify-extend-rounds", "0", "--no-report", "--json")


def _tune(*argv: str) -> dict:
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["tune", "zoo:mnist", *FAST, *argv]) == 0
    return json.loads(buf.getvalue())


def test_profile_mode_measures_far_fewer_candidates(ray_cluster: Any, tmp_path: Path) -> None:
    ex = _tune("--measure", "exhaustive", "--out", str(tmp_path / "ex"),
               "--cost-table", str(tmp_path / "ex_costs"))
    pr = _tune("--out", str(tmp_path / "pr"), "--cost-table", str(tmp_path / "pr_costs"))
    assert ex["measure"] == "exhaustive" and ex["profiled"] == 0 and ex["profile"] is None
    assert pr["measure"] == "profile" and pr["profiled"] == 2  # one profile run per target
    assert pr["measure_mode"] == ex["measure_mode"] == "network"  # the cache mode, as before
    usable = pr["profile"]["profiled_targets"]
    assert len(pr["profile"]["warnings"]) == 2 - len(usable)
    assert usable, pr["profile"]  # at least one target's profile is within 20%
    assert pr["measured"] < ex["measured"], (pr["measured"], ex["measured"])
    if len(usable) == 2:  # no fallback: only the screen and the confirmation measure
        assert pr["measured"] <= pr["screen"]["measured"] + pr["confirm"]["remeasured"]
        assert 3 * pr["measured"] <= ex["measured"]
    for s in (pr, ex):
        assert s["plan_measured_s"] > 0 and s["plan_is"]
    rows = CostTable(tmp_path / "pr_costs").rows({"kind": "profiled"})
    assert len(rows) == 2 and all(r.schema_version == 2 for r in rows)
    assert all(r.fingerprint.startswith("profile:") for r in rows)

    again = _tune("--out", str(tmp_path / "pr2"), "--cost-table", str(tmp_path / "pr_costs"))
    assert again["profiled"] == 0 and again["measured"] == 0, again["confirm"]
    assert again["dijkstra_estimated_s"] == pytest.approx(pr["dijkstra_estimated_s"],
                                                          rel=1e-12)
