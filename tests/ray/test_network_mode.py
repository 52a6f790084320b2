"""Network-mode campaigns on the shared local Ray cluster: rows carry each candidate's network.

Kept apart from test_farm.py's fault tests: its ONNX Runtime runners are heavier than the
``null`` runners those tests time their faults against.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from collage_farm.core.target import BUILTIN_TARGETS
from tests.ray.test_farm import FAST, candidates, table_rows


def test_network_mode_rows_carry_each_candidates_network(make_farm: Any,
                                                          tmp_path: Path) -> None:
    """A network-mode campaign sends every candidate the bytes the rest of *its* model touches,
    the rows say so, and a warm campaign on the same table does not reuse those timings."""
    import dataclasses

    from collage_farm.costtable import TableStore
    from estimators.measured import FarmEstimator

    farm = make_farm(toolchains=["ort-cpu"])
    cands = candidates("mnist", target=BUILTIN_TARGETS["ort-cpu"])
    first = {c.fingerprint: c for c in cands}
    table = tmp_path / "costs"
    net = dataclasses.replace(FAST, mode="network")
    est = FarmEstimator(farm, TableStore(table, campaign_id="net"), model="mnist", close_farm=False,
                        measure_config=net)
    assert all(c.is_known for c in est.estimate(cands))
    est.close()
    rows = table_rows(table)
    assert {r.fingerprint for r in rows} == set(first)
    for r in rows:
        cfg = r.config
        assert cfg.measure_mode == "network" and r.ok
        assert cfg.network_bytes == max(1, first[r.fingerprint].sub_graph.rest_of_network_bytes())
    # warm timings are another measurement: measured again, not reused
    warm = FarmEstimator(farm, TableStore(table, campaign_id="warm"),
                         model="mnist", close_farm=False,
                         measure_config=FAST)
    warm.estimate(cands)
    warm.close()
    assert warm.stats().cache_hits == 0 and warm.stats().measured == len(first)
    # the same mode again: every cost from the table
    again = FarmEstimator(farm, TableStore(table, campaign_id="net2"),
                          model="mnist", close_farm=False,
                          measure_config=net)
    again.estimate(cands)
    again.close()
    assert again.stats().cache_hits == len(first) and again.stats().measured == 0
