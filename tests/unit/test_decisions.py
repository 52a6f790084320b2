"""Plan decisions as cost-table rows (`collage_farm.costtable.decisions`), without Ray: what a
measured campaign records is what an offline search finds, the newest decision answers, and an
unverified plan records nothing."""

from __future__ import annotations

import time
from pathlib import Path

from collage_farm import zoo
from collage_farm.core.graph import load_graph
from collage_farm.core.target import parse_targets
from collage_farm.costtable import CostTable, CostTableWriter
from collage_farm.costtable.decisions import decision_row, find_decision, plan_parts

TARGETS = parse_targets("ort-cpu,openvino-cpu")


def test_recorded_decision_is_found_for_its_search_plan_only(tmp_path: Path) -> None:
    g = load_graph(zoo.build("mnist"), name="mnist")
    ort, ov = TARGETS
    half = (1 << 5) - 1
    search = plan_parts(g, [(half, ort), (g.all_mask & ~half, ov)])
    final = plan_parts(g, [(g.all_mask, ort)])
    assert decision_row(g, TARGETS, search, final, "best_single", {"plan_measured_s": None},
                        campaign_id="c0") is None  # unverified: nothing to record
    with CostTableWriter(tmp_path / "t", background=False) as w:
        for cid, s in (("c1", 2e-4), ("c2", 1e-4)):
            w.append(decision_row(g, TARGETS, search, final, "best_single",
                                  {"plan_measured_s": s, "never_worse": "kept"},
                                  campaign_id=cid))
            time.sleep(0.002)  # distinct created_at: the newest must answer
    table = CostTable(tmp_path / "t")
    got = find_decision(table, g, TARGETS, search)
    assert got is not None and got.campaign_id == "c2" and got.plan_is == "best_single"
    assert got.final == final and got.figures["plan_measured_s"] == 1e-4
    rows = table.rows()
    assert {r.target for r in rows} == {"plan"} and all(r.median > 0 for r in rows)
    assert find_decision(table, g, TARGETS, final) is None  # another search plan
    assert find_decision(table, g, TARGETS[:1], search) is None  # other targets
