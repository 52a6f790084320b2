"""Plan decisions as cost-table rows: what a measured campaign wrote, so that offline reuse
reproduces it exactly.

A measured campaign does more than add candidate costs: after the search it refines the plan
with measured moves and keeps the mix only when it beats the best single toolchain end to end
(never worse). Those steps are measurements of whole plans, and an offline search over the
same table cannot redo them. So the campaign records its outcome as one row: the plan the
search chose (after confirmation), the plan it wrote, which of them it kept and the measured
figures that decided it. An offline search that arrives at the same search plan from the same
costs finds the row and writes the same final plan.

The row (`decision_row`) uses the ordinary schema:

* ``fingerprint`` ``decision:<model>:<targets>:<plan>``: the whole model's structural hash
  (`collage_farm.core.subgraph.SubGraph.structural_hash`: op types, attributes, shapes,
  topology), a hash of the campaign's target ids and measure keys, and a hash of the search
  plan's partitions (node names and target ids);
* ``target`` ``plan``, ``target_key`` ``plan:<targets>``, ``toolchain`` ``collage``: the row
  belongs to no toolchain (a query grouping by target shows it apart);
* ``kind`` ``measured`` and ``median``: the written plan's end-to-end latency measured in the
  campaign's interleaved never-worse run;
* ``details``: JSON with ``search`` and ``final`` (lists of ``[node names, target id]``),
  ``plan_is`` and the deciding figures.

Only verified decisions are recorded (a plan that was never timed end to end has nothing to
reproduce beyond its search). Several campaigns may record one search plan; the newest row
answers (`find_decision`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from collage_farm.core.graph import DataflowGraph
from collage_farm.core.subgraph import SubGraph, iter_bits
from collage_farm.core.target import Target
from collage_farm.costtable.reader import CostTable
from collage_farm.costtable.rows import CostRow, normalize_row, to_json, utcnow
from runners.base import DeviceDescription, Kind, MeasureConfig, Status

__all__ = ["DECISION_PREFIX", "PlanDecision", "decision_fingerprint", "decision_row",
           "find_decision", "plan_parts"]

DECISION_PREFIX = "decision:"

#: one partition as stored: (node names in graph order, target id)
StoredPart = tuple[tuple[str, ...], str]

#: the figures of the never-worse step a decision row keeps (summary keys)
FIGURES = ("plan_measured_s", "best_single_target", "best_single_measured_s",
           "speedup_vs_best_single", "mix_measured_s", "never_worse")


@dataclass(frozen=True)
class PlanDecision:
    """A measured campaign's outcome for one search plan, read back from the table."""

    search: tuple[StoredPart, ...]  # the plan the search chose (after confirmation)
    final: tuple[StoredPart, ...]  # the plan the campaign wrote
    plan_is: str  # "dijkstra" | "refined" | "best_single"
    figures: Mapping[str, Any]  # the deciding measured figures (`FIGURES`)
    campaign_id: str
    created_at: str  # ISO 8601, UTC
    device: str  # the host that measured them

    def to_json(self) -> dict[str, Any]:
        return {"campaign_id": self.campaign_id, "created_at": self.created_at,
                "device": self.device, "plan_is": self.plan_is, **dict(self.figures)}


def plan_parts(graph: DataflowGraph, parts: Sequence[tuple[int, Target]]
               ) -> tuple[StoredPart, ...]:
    """``(node mask, target)`` partitions as stored parts, in a canonical order."""
    out = [(tuple(graph.nodes[i].name for i in iter_bits(mask)), t.id) for mask, t in parts]
    return tuple(sorted(out))


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def _targets_key(targets: Sequence[Target]) -> str:
    return _digest(json.dumps(sorted([t.id, t.measure_key] for t in targets)), 12)


def decision_fingerprint(graph: DataflowGraph, targets: Sequence[Target],
                         search: Sequence[StoredPart]) -> str:
    """The fingerprint of the decision row for this model, targets and search plan."""
    whole = SubGraph(graph, graph.all_mask).structural_hash[:24]
    plan = _digest(json.dumps([list(p) for p in sorted(search)]), 16)
    return f"{DECISION_PREFIX}{whole}:{_targets_key(targets)}:{plan}"


def _finite(v: Any) -> Any:
    return v if not isinstance(v, float) or math.isfinite(v) else None


def decision_row(graph: DataflowGraph, targets: Sequence[Target],
                 search: Sequence[StoredPart], final: Sequence[StoredPart], plan_is: str,
                 figures: Mapping[str, Any], *, campaign_id: str,
                 config: MeasureConfig | None = None) -> dict[str, Any] | None:
    """The row recording one verified decision; None when the written plan has no measured
    latency (an unverified plan: nothing to record)."""
    plan_s = figures.get("plan_measured_s")
    if not isinstance(plan_s, (int, float)) or not math.isfinite(plan_s) or plan_s <= 0:
        return None
    key = _targets_key(targets)
    details = {"search": [list(p) for p in sorted(search)],
               "final": [list(p) for p in sorted(final)], "plan_is": plan_is,
               **{k: _finite(figures.get(k)) for k in FIGURES}}
    s = float(plan_s)
    return normalize_row({
        "fingerprint": decision_fingerprint(graph, targets, search),
        "target": "plan", "target_key": f"plan:{key}", "toolchain": "collage",
        "device": DeviceDescription.host_cpu().describe(), "device_kind": "cpu",
        "measure_config": (config or MeasureConfig()).to_json(),
        "status": Status.OK.value, "kind": Kind.MEASURED.value,
        "samples": [s], "median": s, "mean": s, "std": 0.0, "p10": s, "p90": s, "min": s,
        "n": 1, "campaign_id": campaign_id, "model": graph.name, "nodes": [],
        "op_types": ["decision"], "created_at": utcnow(), "details": to_json(details),
    }, campaign_id=campaign_id)


def _parse(row: CostRow) -> PlanDecision | None:
    try:
        d = json.loads(row.details)
        search = tuple((tuple(str(n) for n in nodes), str(t)) for nodes, t in d["search"])
        final = tuple((tuple(str(n) for n in nodes), str(t)) for nodes, t in d["final"])
        plan_is = str(d["plan_is"])
    except (ValueError, KeyError, TypeError):  # not written by `decision_row`: ignored
        return None
    figures = {k: d.get(k) for k in FIGURES}
    return PlanDecision(search, final, plan_is, figures, row.campaign_id,
                        row.created_at.isoformat() if row.created_at else "", row.device)


def find_decision(table: CostTable, graph: DataflowGraph, targets: Sequence[Target],
                  search: Sequence[StoredPart]) -> PlanDecision | None:
    """The newest recorded decision for this model, targets and search plan, or None."""
    fp = decision_fingerprint(graph, targets, search)
    rows = [r for r in table.rows(pc.field("fingerprint") == fp) if r.ok]
    for row in sorted(rows, key=lambda r: r.created_at, reverse=True):
        got = _parse(row)
        if got is not None and sorted(got.search) == sorted(search):
            return got
    return None
