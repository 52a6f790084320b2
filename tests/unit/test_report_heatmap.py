"""The report's compact graph, per-node heat map, headline and labels, without a browser.

The flow (`collage_farm.report.flow`) must fold a 12-layer encoder into one block of count 12
and leave a model without repeats alone; the heat map (`collage_farm.report.nodecosts`,
`collage_farm.report.heatmap`) must take, per node and target, a one-node row before a profile
before a share of a larger candidate, say why a cell is empty, and star each row's cheapest
target. The cost rows are written to a real Parquet table by the real writer.
"""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from collage_farm import zoo
from collage_farm.core.graph import load_graph
from collage_farm.core.plan import load_plan
from collage_farm.costtable import CostTableWriter
from collage_farm.execute.builder import Part
from collage_farm.report import write_report
from collage_farm.report.flow import FlowNode, Repeat, collapse, plan_flow
from collage_farm.report.headline import headline_html, speedup_words
from collage_farm.report.heatmap import MAX_ROWS, heat_rows, heatmap_html
from collage_farm.report.nodecosts import Source, node_costs
from runners.profile import PROFILE_DETAIL, PROFILE_PREFIX, OperatorProfile, ProfileMethod
from tests.unit.test_executor import ORT, OV, write_parts

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _flow(ops: str, target: str = "t") -> list[FlowNode]:
    """A chain of single-input nodes named n0, n1, ... in one partition."""
    return [FlowNode(f"n{i}", op, "p0", target, (1,) if i else (-1,), i == 0)
            for i, op in enumerate(ops.split())]


def test_collapse_folds_repeated_blocks_and_runs() -> None:
    items = collapse(_flow("Conv Relu MatMul Add MatMul Add MatMul Add Relu Relu Relu Tanh"))
    kinds = [(type(x).__name__, getattr(x, "count", 1)) for x in items]
    assert kinds == [("FlowNode", 1), ("FlowNode", 1), ("Repeat", 3), ("Repeat", 3),
                     ("FlowNode", 1)]
    block = items[2]
    assert isinstance(block, Repeat) and block.size == 2
    assert block.members == (("n2", "n3"), ("n4", "n5"), ("n6", "n7"))
    # a different target breaks the repeat
    mixed = [*_flow("Tanh Relu Relu"), FlowNode("x", "Relu", "p1", "u", (1,), True)]
    assert [type(x).__name__ for x in collapse(mixed)] == ["FlowNode", "Repeat", "FlowNode"]


def test_bert_layers_collapse_to_one_block_of_12(tmp_path: Path) -> None:
    g = load_graph(zoo.build("bert", layers=12, width=32, heads=2, vocab=100, seq_len=8),
                   name="bert12")
    n = len(g.nodes)
    d = write_parts(g, [Part((1 << n) - 1, ORT)], tmp_path / "plan")
    flow = plan_flow(*load_plan(d))
    assert len(flow) == n
    items = collapse(flow)
    reps = [x for x in items if isinstance(x, Repeat)]
    assert max(r.count for r in reps) == 12 and len(items) < 20
    rows = heat_rows(items, {f.name: f.op for f in flow})
    assert len(rows) < 60 and any(r.count == 12 for r in rows)


def test_heat_rows_merge_above_the_limit() -> None:
    ops = " ".join(f"Op{i}" for i in range(3 * MAX_ROWS))  # no two alike
    flow = _flow(ops)
    rows = heat_rows(collapse(flow), {f.name: f.op for f in flow})
    assert len(rows) <= MAX_ROWS
    assert sum(len(r.members[0]) for r in rows) == len(flow)


def _row(fp: str, target: str, nodes: list[str], median: float | None, at: int,
         status: str = "ok", kind: str = "measured", details: dict | None = None) -> dict:
    return {"fingerprint": fp, "target": target, "target_key": target, "status": status,
            "kind": kind, "median": median, "samples": [median] if median else [],
            "model": "m", "nodes": nodes, "op_types": ["X"] * len(nodes),
            "created_at": T0 + timedelta(seconds=at), "details": details or {},
            "error": "" if status == "ok" else "no"}


def test_node_costs_take_the_best_source(tmp_path: Path) -> None:
    prof = OperatorProfile(ProfileMethod.ORT_TRACE, ((("a",), 2e-3), (("b", "c"), 4e-3)),
                           runs=3, whole_s=6e-3)
    rows = [
        _row("s-old", "ort", ["a"], 9e-3, 0), _row("s-new", "ort", ["a"], 1e-3, 5),
        _row(PROFILE_PREFIX + "x", "ort", ["a", "b", "c"], 6e-3, 1, kind="profiled",
             details={PROFILE_DETAIL: prof.to_json()}),
        _row("pair", "ov", ["a", "b"], 8e-3, 2), _row("triple", "ov", ["a", "b", "c"], 9e-3, 2),
        _row("fail", "ov", ["d"], None, 3, status="unsupported"),
        # a node measured only inside a 10-node candidate: no even share of a whole block
        _row("big", "ort", ["e"] + [f"x{i}" for i in range(9)], 1e-2, 2),
        # a profile whose per-operator sum is twice the whole model: the estimator rejects it
        _row(PROFILE_PREFIX + "y", "ov2", ["a", "b", "c"], 3e-3, 1, kind="profiled",
             details={PROFILE_DETAIL: dataclasses.replace(prof, whole_s=3e-3).to_json()}),
    ]
    with CostTableWriter(tmp_path / "costs", background=False) as w:
        w.extend(rows)
    c = node_costs(tmp_path / "costs", "m", ["a", "b", "c", "d", "e"])
    assert c[("a", "ort")].seconds == 1e-3 and c[("a", "ort")].source is Source.SINGLE
    assert c[("b", "ort")].source is Source.PROFILE and c[("b", "ort")].seconds == 2e-3
    assert c[("a", "ov")].source is Source.SHARE and c[("a", "ov")].of_nodes == 2
    assert c[("a", "ov")].seconds == 4e-3
    assert c[("c", "ov")].source is Source.SHARE and c[("c", "ov")].of_nodes == 3
    assert c[("d", "ov")].source is Source.FAILED and c[("d", "ov")].status == "unsupported"
    assert ("d", "ort") not in c and not [k for k in c if k[1] == "ov2"]
    assert c[("e", "ort")].source is Source.COARSE and c[("e", "ort")].seconds is None
    flow = [FlowNode(n, f"X{n}", "p0", "ort", (1,), n == "a") for n in "abcde"]
    page = heatmap_html(heat_rows(collapse(flow), {f.name: f.op for f in flow}), ["ort", "ov"],
                        c, {n: "ort" for n in "abcde"})
    cells = [x for x in re.findall(r"<td class='(?:num|nodata)[^']*'[^>]*>([^<]*)</td>", page)
             if x]  # the count column is empty for single nodes
    # a: the one-node row on ort beats a's share of the pair on ov (8 ms / 2)
    assert cells[:2] == ["1 ★", "≈4"]
    assert cells[2] == "◆2 ★" and cells[3] == "≈4"  # b: profiled on ort, share on ov
    assert cells[6:8] == ["no data", "unsupported"]  # d: nothing on ort, failed on ov
    assert cells[8] == "in a 10-node block"
    assert "class='num chosen'" in page


def test_headline_of_a_mix_has_its_own_bar_and_each_speedup() -> None:
    s = {"plan_measured_s": 1e-3, "singles_measured_s": {"ort-cpu": 2e-3, "openvino-cpu": 3e-3},
         "written_plan_vs": {"ort-cpu": {"ratio": 0.5, "low": 0.45, "high": 0.55, "pairs": 7},
                             "openvino-cpu": {"ratio": 1 / 3, "low": None, "high": None}}}
    page = "".join(headline_html("a mix of 2 partitions", s, None, 9e-4))
    names = re.findall(r"<tr><td>([^<]*)</td>", page)
    assert names == ["a mix of 2 partitions", "ort-cpu whole", "openvino-cpu whole"]
    assert "class='bar mine'" in page and "2.00× faster (95% interval 1.82–2.22×" in page
    assert "3.00× faster (one run, no interval)" in page
    assert "0.9 ms" not in page  # measured: the estimate is not the headline figure


def test_speedup_words() -> None:
    assert speedup_words(0.5, 0.4, 0.625, 7) == ("2.00× faster (95% interval 1.60–2.50×, "
                                                  "7 paired rounds)")
    assert speedup_words(1.25) == "1.25× slower (one run, no interval)"
    # an interval holding 1 is not a speed-up: said first, the median after
    assert speedup_words(1 / 1.3, 0.39, 1.52, 7) == (
        "not beyond noise: 1.30× faster in the median (95% interval 0.66–2.56×, "
        "7 paired rounds)")


def test_report_has_labels_not_keys(tmp_path: Path) -> None:
    g = load_graph(zoo.build("mnist"), name="mnist")
    d = write_parts(g, [Part(g.all_mask, ORT)], tmp_path / "plan")
    summary = {"nodes": 11, "cache_hits": 3, "failed_by_status": {"build_failed": 2},
               "cost_table": str(tmp_path / "none")}
    text = write_report(d, summary).read_text()
    body = re.sub(r"<[^>]+>", " ", text.split("<body>", 1)[1])
    assert "cache_hits" not in body and "build_failed" not in body
    assert "costs answered by the cost table" in body and "build failed: 2" in body
    assert "1 partition over 1 target" in body
    assert json.dumps(OV.id)  # both targets exist in the plan's target list


@pytest.mark.parametrize("n", [1, 2])
def test_plural_partitions_in_legend(tmp_path: Path, n: int) -> None:
    g = load_graph(zoo.build("mnist"), name="mnist")
    half = sum(1 << i for i in range(len(g.nodes) // 2))
    parts = ([Part(g.all_mask, ORT)] if n == 1
             else [Part(half, ORT), Part(g.all_mask & ~half, ORT)])
    text = write_report(write_parts(g, parts, tmp_path / "plan"), {}).read_text()
    assert f"ort-cpu: {n} partition{'s' if n > 1 else ''}<" in text
