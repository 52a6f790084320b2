"""`tune` on the Ray farm: never worse than the best single toolchain, measured end to end.

The losing mix is built honestly, the way it happens to users: a **stale cost table**. A first
campaign measures mnist for real; then rows are appended, newer, that price every candidate of
two or more nodes 100x higher (a table written while the machine was loaded, say). Trusting
that table (no confirmation round), the search must cut mnist into eleven one-node partitions
with ten cuts; measured end to end with the whole model on each toolchain (one interleaved
run), that plan does not beat the best single toolchain beyond noise, and the written plan
must be that toolchain's whole model. Costs are real farm measurements (ORT CPU and OpenVINO
runners). (Pins cannot build this case: the never-worse fallback honours them, so a plan
pinned into a mix has no single toolchain to fall back to.)
"""

from __future__ import annotations

import io
import json
import math
from contextlib import redirect_stdout
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from collage_farm.campaign import TuneOptions, load_source, run_tune
from collage_farm.cli import main
from collage_farm.core.target import parse_targets
from collage_farm.costtable import CostTable, CostTableWriter, TableStore
from collage_farm.execute import PlanExecutor

pytest.importorskip("openvino")

TARGETS = "ort-cpu,openvino-cpu"
SUMMARY_KEYS = ("estimated_total_s", "partitions", "candidates", "distinct_fingerprints",
                "search_s", "cache_hits", "measured", "pruned", "failed", "failed_by_status",
                "wall_s")
NEVER_WORSE_KEYS = ("plan_measured_s", "best_single_target", "best_single_measured_s",
                    "speedup_vs_best_single", "additive_error")


def _make_stale(costs: Path, factor: float = 100.0) -> int:
    """Append newer copies of every ok row of 2+ nodes with the cost scaled by ``factor``."""
    t = CostTable(costs).read()
    t = t.filter(pc.and_(pc.equal(t["status"], "ok"),
                         pc.greater_equal(pc.list_value_length(t["nodes"]), 2)))
    later = pc.add(t["created_at"], pa.scalar(timedelta(seconds=1),
                                              pa.duration("us")))
    t = t.set_column(t.schema.get_field_index("created_at"), "created_at",
                     later.cast(t.schema.field("created_at").type))
    for col in ("median", "mean", "p10", "p90", "min"):
        t = t.set_column(t.schema.get_field_index(col), col, pc.multiply(t[col], factor))
    with CostTableWriter(costs, background=False) as w:
        w.extend(t.to_pylist())
    return t.num_rows


def test_alternating_mix_is_replaced_by_the_best_single(make_farm: Any, tmp_path: Path) -> None:
    from estimators.measured import FarmEstimator

    graph = load_source("zoo:mnist")
    targets = parse_targets(TARGETS)
    names = [t.id for t in targets]
    farm = make_farm(toolchains=["ort-cpu", "openvino"])
    out, costs = tmp_path / "out", tmp_path / "costs"
    est = FarmEstimator(farm, TableStore(costs), model="mnist", close_farm=False)
    try:
        run_tune(TuneOptions(model="zoo:mnist", targets=tuple(targets), out=tmp_path / "first",
                             refine_trials=0, verify=False, confirm_rounds=0, report=False,
                             prune=False),  # every candidate has a row
                 estimator=est)
    finally:
        est.close()
    assert _make_stale(costs) > 0
    est = FarmEstimator(farm, TableStore(costs), model="mnist", close_farm=False)
    try:
        s = run_tune(TuneOptions(model="zoo:mnist", targets=tuple(targets), out=out,
                                 refine_trials=0, verify_rounds=5, confirm_rounds=0),
                     estimator=est)
    finally:
        est.close()
    assert s["measured"] == 0  # the stale table answered everything
    for k in SUMMARY_KEYS + NEVER_WORSE_KEYS:
        assert k in s, k
    assert s["dijkstra_partitions"] == len(graph.nodes)  # the stale table cut everywhere
    assert s["plan_is"] == "best_single", s["never_worse"]
    assert s["best_single_target"] in names and not s["singles_ineligible"]
    # the search believed in its mix: the stale whole models are priced 100x, but the mix
    # also pays ten cuts at the cut costs this run's probe measured (live, so the gain was
    # 9.8x in one run on the 2-core VM, where 10 was asserted before)
    assert s["estimated_gain_vs_best_single"] > 3
    assert s["partitions"] == 1
    assert s["plan_measured_s"] == s["best_single_measured_s"]
    assert s["speedup_vs_best_single"] == pytest.approx(1.0)
    assert s["mix_measured_s"] == s["dijkstra_measured_s"] > 0
    # decided round by round; what the search believed, split into drift and additivity
    assert s["mix_vs_best_single"]["pairs"] == 5
    assert s["mix_vs_best_single"]["ratio"] >= 1 - s["noise_threshold"]
    assert set(s["singles_estimated_s"]) == set(names)
    assert all(v > 0 for v in s["singles_estimated_s"].values())
    assert s["estimated_gain_vs_best_single"] == pytest.approx(
        min(s["singles_estimated_s"].values()) / s["dijkstra_estimated_s"])
    for t, k in s["calibration"].items():
        assert k == pytest.approx(s["singles_measured_s"][t] / s["singles_estimated_s"][t])
    assert math.isfinite(s["dijkstra_calibrated_additive_error"])
    # both figures in the summary's sentence
    assert f"{s['mix_measured_s'] * 1e3:.4f} ms" in s["never_worse"]
    assert f"{s['best_single_measured_s'] * 1e3:.4f} ms" in s["never_worse"]
    plan = json.loads((out / "plan.json").read_text())
    assert [p["target"] for p in plan["partitions"]] == [s["best_single_target"]]
    assert len(plan["partitions"][0]["nodes"]) == len(graph.nodes)
    assert plan["never_worse"]["plan_is"] == "best_single"
    PlanExecutor(out).check()  # the written plan runs and matches the model
    assert (out / "report.html").exists() and (out / "report_e2e.png").exists()
    assert "Never worse" in (out / "report.html").read_text()


def test_tune_cli_json_refines_and_compare_spreads(ray_cluster: Any, tmp_path: Path) -> None:
    out, costs = tmp_path / "out", tmp_path / "costs"
    buf = io.StringIO()
    with redirect_stdout(buf):  # no pruning: every candidate gets a row (see the re-run below)
        rc = main(["tune", "zoo:mnist", "--targets", TARGETS, "--out", str(out),
                   "--cost-table", str(costs), "--refine-trials", "2", "--no-prune",
                   "--measure", "exhaustive", "--json"])
    assert rc == 0
    s = json.loads(buf.getvalue())
    for k in SUMMARY_KEYS + NEVER_WORSE_KEYS:
        assert k in s, k
    assert s["measured"] > 0
    # the chosen path and the whole models were re-measured (the winner's curse)
    assert s["confirm"]["remeasured"] >= 2 and s["confirm"]["stopped_by"] in ("stable", "rounds")
    assert len(s["refine"]["log"]) <= 2
    assert s["plan_is"] in ("dijkstra", "refined", "best_single")
    assert set(s["singles_measured_s"]) == set(TARGETS.split(","))
    best = min(s["singles_measured_s"].values())
    assert s["best_single_measured_s"] == best
    if s["plan_is"] != "best_single" and s["partitions"] > 1:  # kept only beyond noise,
        for k in ("mix_vs_best_single", "mix_vs_best_single_confirm"):  # in two runs
            assert s[k]["ratio"] < 1 - s[k]["threshold"]
    assert (out / "report.html").exists()

    # --no-verify: no end-to-end claim, said so; every cost is a cache hit now
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["tune", "zoo:mnist", "--targets", TARGETS, "--out", str(tmp_path / "nv"),
                   "--cost-table", str(costs), "--no-verify", "--refine-trials", "0",
                   "--measure", "exhaustive", "--no-report", "--json"])
    assert rc == 0
    s2 = json.loads(buf.getvalue())
    assert "plan_measured_s" not in s2 and "skipped" in s2["verify"]
    # the table's rows say which costs were re-measurements: the re-run measures nothing but
    # what the first run left unconfirmed (its confirmation ran out of rounds, or a
    # re-measurement was too noisy to count as one). With pruning in the first run, a candidate
    # it pruned could be needed now that confirmation moved the costs (a flake, 1 run in ~8)
    assert s2["measured"] == s2["confirm"]["remeasured"], s2["confirm"]
    # every partition of the path is backed by a re-measurement: one the first run marked
    # steady in the table, or one made now (a first-run re-measurement with cv > 0.10 on this
    # noisy VM is not marked, so how many are "already" confirmed is the machine's choice)
    conf = s2["confirm"]
    if conf["stopped_by"] == "stable":  # else the last round's new path is not re-measured
        assert conf["already_confirmed"] + conf["remeasured"] >= s2["partitions"], conf
    assert not (tmp_path / "nv" / "report.html").exists()

    # the same sub-graph across targets from the table just measured, largest spread first
    buf = io.StringIO()
    png = tmp_path / "spread.png"
    with redirect_stdout(buf):
        rc = main(["compare", "zoo:mnist", "--targets", TARGETS, "--cost-table", str(costs),
                   "--no-whole", "--plan", str(out), "--plot", str(png), "--json"])
    assert rc == 0
    sp = json.loads(buf.getvalue())["subgraphs"]
    assert sp and all(len(r["costs_s"]) == 2 for r in sp)
    spreads = [r["spread"] for r in sp]
    assert spreads == sorted(spreads, reverse=True) and spreads[-1] >= 1.0
    for r in sp:
        assert r["spread"] == pytest.approx(max(r["costs_s"].values())
                                            / min(r["costs_s"].values()))
    assert png.stat().st_size > 1000
