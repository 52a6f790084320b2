"""In-chain prices as cost-table rows: a profile-mode campaign's prices of the partitions of
the plans it timed in chain (`collage_farm.postsearch.inchain`), kept so that a re-run on the
table times nothing and an offline search prices the same candidates the same.

A campaign's last search ran with every price it set, so a later search that starts with all
of them (`stored_in_chain_prices`) reaches the plan that campaign reached.

The row (`in_chain_row`) uses the ordinary schema:

* ``fingerprint`` ``inchain:<model>:<partition>``: the whole model's structural hash
  (`collage_farm.core.subgraph.SubGraph.structural_hash`) and a hash of the candidate's target
  measure key and node names (a structural fingerprint would give two identical layers one
  price, though they sit at different cuts);
* ``target`` / ``target_key`` / ``toolchain``: the candidate's target; ``nodes``: its nodes;
* ``kind`` ``measured``, ``median``: the price (seconds on the campaign's time base, less the
  transition penalty the search charged the partition), ``device``: the host that timed it;
* ``details``: the figures it came from (``in_chain_s``, ``whole_now_s``, ``whole_base_s``,
  ``penalty_s``, ``profile_s``).

Prices are read back on the host that timed them only, like the cut-cost probe's rows whose
whole-model times they are scaled to.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence

import pyarrow.compute as pc

from collage_farm.core.graph import DataflowGraph
from collage_farm.core.subgraph import SubGraph, iter_bits
from collage_farm.core.target import Target
from collage_farm.costtable.reader import CostTable
from collage_farm.costtable.rows import normalize_row, to_json, utcnow
from runners.base import DeviceDescription, Kind, MeasureConfig, Status

__all__ = ["INCHAIN_PREFIX", "in_chain_fingerprint", "in_chain_row", "stored_in_chain_prices"]

INCHAIN_PREFIX = "inchain:"


def _model_key(graph: DataflowGraph) -> str:
    return f"{INCHAIN_PREFIX}{SubGraph(graph, graph.all_mask).structural_hash[:24]}:"


def in_chain_fingerprint(graph: DataflowGraph, target: Target, mask: int) -> str:
    """The fingerprint of the price of the partition ``mask`` on ``target`` (module
    docstring)."""
    names = [graph.nodes[i].name for i in iter_bits(mask)]
    digest = hashlib.sha256(json.dumps([target.measure_key, names]).encode()).hexdigest()[:20]
    return _model_key(graph) + digest


def in_chain_row(graph: DataflowGraph, target: Target, mask: int, seconds: float,
                 details: Mapping[str, float], *, campaign_id: str, toolchain_version: str = ""
                 ) -> dict:
    """The row of one in-chain price (module docstring)."""
    s = max(0.0, float(seconds))
    nodes = [graph.nodes[i] for i in iter_bits(mask)]
    return normalize_row({
        "fingerprint": in_chain_fingerprint(graph, target, mask),
        "target": target.id, "target_key": target.measure_key, "toolchain": target.toolchain,
        "toolchain_version": toolchain_version,
        "device": DeviceDescription.host_cpu().describe(), "device_kind": "cpu",
        "measure_config": MeasureConfig(mode="warm").to_json(),
        "status": Status.OK.value, "kind": Kind.MEASURED.value,
        "samples": [s], "median": s, "mean": s, "std": 0.0, "p10": s, "p90": s, "min": s,
        "n": 1, "campaign_id": campaign_id, "model": graph.name,
        "nodes": [n.name for n in nodes], "op_types": [n.op_type for n in nodes],
        "created_at": utcnow(), "details": to_json(dict(details)),
    }, campaign_id=campaign_id)


def stored_in_chain_prices(table: CostTable | None, graph: DataflowGraph,
                           targets: Sequence[Target]) -> dict[tuple[str, int], float]:
    """Every price of ``graph``'s partitions on ``targets`` in ``table`` that this host timed,
    by (target id, node mask); the newest row of a partition answers. Rows naming a node
    ``graph`` has not, or a target that is not among ``targets`` (by id and measure key), are
    passed over. Empty without a table."""
    if table is None or not table.path.is_dir():
        return {}
    host = DeviceDescription.host_cpu().describe()
    rows = table.rows(pc.starts_with(pc.field("fingerprint"), _model_key(graph))
                      & (pc.field("device") == host))
    by_id = {t.id: t for t in targets}
    index = {n.name: n.index for n in graph.nodes}
    newest: dict[str, tuple[float, str, int, float]] = {}
    for r in rows:
        t = by_id.get(r.target)
        if not r.ok or t is None or t.measure_key != r.target_key or r.median is None:
            continue
        if any(n not in index for n in r.nodes) or not r.nodes:
            continue
        mask = sum(1 << index[n] for n in r.nodes)
        if r.fingerprint != in_chain_fingerprint(graph, t, mask):
            continue
        ts = r.created_at.timestamp() if r.created_at is not None else 0.0
        if r.fingerprint not in newest or ts > newest[r.fingerprint][0]:
            newest[r.fingerprint] = (ts, t.id, mask, float(r.median))
    return {(tid, mask): s for _, tid, mask, s in newest.values()}
