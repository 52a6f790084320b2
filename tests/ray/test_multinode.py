"""A real multi-node farm on loopback: head + worker node with different resources.

The session cluster (conftest) is a `ray.cluster_utils.Cluster`; this test adds a worker node
with its own resources (one ``cpu_slot_0``, one CPU, a marker resource), checks that a default
farm scales out with one CPU runner per last-level-cache domain per node (the head's two cores
share one; the worker declares none, so it is one domain) and that a campaign spreads over both
nodes, then removes the worker node mid-campaign: its runner is retired (no
strike against the candidate it was running), its work goes to the head's runners, and the
campaign completes with every fingerprint in the cost table exactly once.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import ray

from tests.ray.test_farm import FAST, candidates, null_target, table_rows

WORKER_RESOURCES = {"cpu_slot_0": 1.0, "farm_test_worker": 1.0}


def test_campaign_spreads_over_two_nodes_and_survives_losing_one(
        ray_cluster: Any, make_farm: Any, tmp_path: Path) -> None:
    from collage_farm.costtable import TableStore
    from estimators.measured import FarmEstimator

    worker = ray_cluster.add_node(num_cpus=1, resources=dict(WORKER_RESOURCES))
    removed = False
    try:
        ray_cluster.wait_for_nodes()
        alive = [n for n in ray.nodes() if n["Alive"]]
        assert len(alive) == 2
        worker_id = next(n["NodeID"] for n in alive if "farm_test_worker" in n["Resources"])

        farm = make_farm(toolchains=["null"])
        runners = farm.runners
        assert len(runners) == 2
        assert Counter(r.node_id == worker_id for r in runners) == {False: 1, True: 1}
        assert farm.slots()["used"] == 2 and farm.slots()["why"] == "llc-domains"

        cands = candidates("random_dag", depth=3, target=null_target(sleep_s=0.06))
        distinct = {c.fingerprint for c in cands}
        seen_worker = threading.Event()
        progress = farm.progress
        start_done = progress.done

        def remove_when_busy() -> None:
            nonlocal removed
            # let the worker's runner (and so the campaign) finish a few candidates first
            deadline = time.monotonic() + 60
            while (farm.results_by_node().get(worker_id, 0) < 2
                   or progress.done - start_done < 9) and time.monotonic() < deadline:
                time.sleep(0.02)
            seen_worker.set()
            ray_cluster.remove_node(worker)
            removed = True

        remover = threading.Thread(target=remove_when_busy, daemon=True)
        table = tmp_path / "costs"
        est = FarmEstimator(farm, TableStore(table, campaign_id="multinode"), model="random_dag",
                            close_farm=False, measure_config=FAST)
        remover.start()
        costs = est.estimate(cands)
        est.close()
        remover.join(60)
        assert removed and seen_worker.is_set()

        assert all(c.is_known for c in costs)
        rows = table_rows(table)
        counts = Counter(r.fingerprint for r in rows)
        assert set(counts) == distinct and max(counts.values()) == 1  # no row lost or doubled
        assert all(r.status == "ok" for r in rows)
        nodes = Counter(r.details_dict().get("node") for r in rows)
        assert worker_id[:12] in nodes and len(nodes) == 2  # both nodes measured
        assert nodes[worker_id[:12]] < len(distinct)  # the head finished the campaign
        st = farm.stats()
        assert st.runner_failures >= 1 and st.crashed == 0
        assert farm.alive_runners() == 1  # the worker's runner is retired
    finally:
        if not removed:
            ray_cluster.remove_node(worker)
