"""End to end on the Ray farm: a tuning campaign for zoo:mnist on an Ethos-U55-128 target.

Why: the unit tests check the Vela toolchain alone; this checks that the pieces around it carry
an Ethos-U campaign through: the farm places a runner on a node that advertises the
``ethosu_sim`` resource, the campaign passes whole-model calibrated ranges with every candidate,
the runner's simulated rows land in the cost table labelled ``simulated``, and the search turns
them into a plan. The session cluster has no ``ethosu_sim`` slot, so the test adds a node with
one (as an Ethos-U simulation node of cluster.yaml would) and removes it afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ethosu.regor")

import ray

from collage_farm.core.target import BUILTIN_TARGETS


def test_mnist_campaign_on_ethos_u55_gives_a_simulated_plan(ray_cluster: Any, make_farm: Any,
                                                            tmp_path: Path) -> None:
    from collage_farm.campaign import TuneOptions, load_source, run_tune, tensor_ranges_provider
    from collage_farm.costtable import CostTable, TableStore
    from estimators.measured import FarmEstimator

    node = ray_cluster.add_node(num_cpus=1, resources={"ethosu_sim": 1.0})
    try:
        ray_cluster.wait_for_nodes()
        farm = make_farm(toolchains=["vela"])
        assert [r.kind for r in farm.runners] == ["ethos-u"]
        target = BUILTIN_TARGETS["ethos-u55-128"]
        out = tmp_path / "out"
        table = tmp_path / "costs"
        graph = load_source("zoo:mnist")
        est = FarmEstimator(farm, TableStore(table, campaign_id="ethosu"),
                            model="mnist", close_farm=False,
                            tensor_ranges_for=tensor_ranges_provider(graph, [target]))
        opts = TuneOptions(model="zoo:mnist", targets=(target,), out=out, cost_table=table,
                           verify=True, refine_trials=0, report=False)
        try:
            summary = run_tune(opts, estimator=est)
        finally:
            est.close()  # flushes the cost table (the farm is make_farm's)
            farm.close()
    finally:
        ray_cluster.remove_node(node)

    assert summary["failed"] == 0 and summary["measured"] > 0, summary
    # an all-NPU plan cannot be timed end to end here: no made-up measured figures
    assert "simulated" in summary["verify"] and summary.get("plan_measured_s") is None
    assert summary["partitions_per_target"] == {"ethos-u55-128": summary["partitions"]}
    assert 0 < summary["estimated_total_s"] < 1e-2
    plan = json.loads((out / "plan.json").read_text())
    covered = [n for p in plan["partitions"] for n in p["nodes"]]
    assert sorted(covered) == sorted(n.name for n in graph.nodes)
    assert {p["toolchain"] for p in plan["partitions"]} == {"vela"}
    rows = CostTable(table).rows()
    assert len(rows) == summary["measured"]
    for row in rows:
        assert row.kind == "simulated" and row.status == "ok" and row.n == 1
        assert row.toolchain == "vela" and row.device.startswith("ethos-u | ethos-u55-128")
        assert "Ethos_U55_High_End_Embedded" in row.device
        d = row.details_dict()
        assert d["ranges"] == "whole model"  # the campaign's calibrated ranges arrived
        assert sum(op["cycles"] for op in d["ops"]) == d["total_cycles"]
        assert row.median == pytest.approx(d["total_cycles"] / d["clock_hz"] + d["host_s"])
    # every partition's estimate is a row of the table
    by_fp = {r.fingerprint: r for r in rows}
    for p in plan["partitions"]:
        assert by_fp[p["fingerprint"]].median == pytest.approx(p["estimated_s"])
    assert ray.is_initialized()
