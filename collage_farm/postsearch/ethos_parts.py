"""Per-partition figures of a plan on a simulated Ethos-U board: cycles, options, what ran where.

What an embedded engineer asks of each partition of an Ethos-U plan: how many NPU cycles Vela
estimates for it and how many host cycles it costs, which Vela options it was compiled with, and
for every operator that runs on the Cortex-M host *why* it is not on the NPU. The figures are the
ones the campaign costed (the details of the cost-table rows of the plan's partitions, which
the campaign looks up for `with_ethos_figures`), so nothing is compiled again. Reasons come
from three places, each labelled in ``source``:

* ``vela``: Vela itself placed a TFLite operator of an NPU partition on the CPU; the reason is
  Vela's own warning (``Reason: ...`` and the constraint text) from that compile
  (`runners.vela_estimate.cpu_reasons`);
* ``vela`` / ``converter`` on a host partition: Vela whole's split (one Vela compile of the
  whole model, `collage_farm.postsearch.vela_split`) has the node on the CPU, by Vela's own
  reason from that compile, or because the int8 converter writes it in float32 only;
* ``capability``: the NPU target's capability check refused the node
  (`runners.ethosu.VelaCapabilities`: the converter cannot write it in int8, or a Vela
  constraint restated from Vela's published constraint text, each confirmed by compiling in the
  unit tests); the text is the check's;
* ``search``: the NPU takes the node, but the search found the plan cheaper with it on the host
  (an NPU invocation and its hand-overs cost more than the host's cycles for it).

Every figure is simulated (Vela) or analytic (the host's cycle model); ``figures`` says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from collage_farm.core.calibration_data import CalibrationData
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.plan import PartitionEntry, Plan
from collage_farm.core.target import Target
from collage_farm.postsearch.vela_split import vela_split
from collage_farm.postsearch.vela_whole import ethos_u_board
from runners.registry import capabilities_for_target
from runners.vela_placement import NodePlacement, PlacementSource

__all__ = ["FIGURES", "DetailsOf", "ethos_partitions", "host_partition", "host_reasons",
           "npu_partition", "with_ethos_figures"]

FIGURES = ("simulated: NPU cycles are Vela's estimate; host cycles the analytic Cortex-M cycle "
           "model (runners.host_model)")


#: the details of the ok cost row of (fingerprint, target), {} when there is none
DetailsOf = Callable[[str, Target], Mapping[str, Any]]


def npu_partition(entry: PartitionEntry, details: Mapping[str, Any]) -> dict[str, Any]:
    """An NPU partition's figures from its Vela row details (`runners.ethosu` measure)."""
    ops = details.get("ops") or []
    fallen = [{"nodes": list(o.get("nodes") or []), "op": o.get("op"),
               "reason": o.get("vela_reason") or "Vela placed it on the CPU (no reason logged)",
               "source": "vela", "host_cycles": o.get("host_cycles")}
              for o in ops if o.get("target") == "cpu"]
    clock = float(details.get("clock_hz") or 0.0)
    host_s = float(details.get("host_s") or 0.0)
    return {
        "half": "npu",
        "options": dict(entry.options),
        "vela_config": details.get("config"),
        "npu_cycles": details.get("total_cycles"),
        "npu_s": details.get("npu_s"),
        "clock_hz": clock or None,
        "host_cycles": sum(int(f["host_cycles"] or 0) for f in fallen),
        "host_s": host_s,
        "npu_ops": details.get("npu_ops"),
        "cpu_ops": details.get("cpu_ops"),
        "fallen_to_host": fallen,
    }


def host_reasons(graph: DataflowGraph, nodes: Sequence[str], npu: Target,
                 compiled: Mapping[str, NodePlacement] | None = None) -> list[dict[str, Any]]:
    """Why each of ``nodes`` (on the host) is not on ``npu`` (module docstring);
    ``compiled``: the host nodes of Vela whole's split read back from its compile."""
    caps = capabilities_for_target(npu)
    by_name = {n.name: n for n in graph.nodes}
    out = []
    for name in nodes:
        node = by_name[name]
        known = (compiled or {}).get(name)
        if known is not None and known.source in (PlacementSource.VELA,
                                                  PlacementSource.CONVERTER):
            out.append({"node": name, "op_type": node.op_type, "reason": known.reason,
                        "source": known.source.value})
            continue
        why = caps.why_not(node, graph)
        out.append({"node": name, "op_type": node.op_type,
                    "reason": why or f"{npu.id} takes it; the plan is cheaper with it on the "
                                     "host (an NPU invocation and hand-overs cost more)",
                    "source": "capability" if why else "search"})
    return out


def host_partition(entry: PartitionEntry, details: Mapping[str, Any], graph: DataflowGraph,
                   npu: Target, compiled: Mapping[str, NodePlacement] | None = None
                   ) -> dict[str, Any]:
    """A host partition's figures from its cycle-model row details (`runners.cortex_m`)."""
    return {
        "half": "host",
        "options": dict(entry.options),
        "host_cycles": details.get("cycles"),
        "host_s": details.get("seconds"),
        "mode": details.get("mode"),
        "npu_cycles": 0,
        "on_host": host_reasons(graph, entry.nodes, npu, compiled),
    }


def ethos_partitions(graph: DataflowGraph, partitions: Sequence[PartitionEntry],
                     targets: Sequence[Target], npu: Target, details_of: DetailsOf,
                     compiled: Mapping[str, NodePlacement] | None = None
                     ) -> dict[str, dict[str, Any]]:
    """Per partition id: its figures (`npu_partition` / `host_partition`); partitions on no
    Ethos-U board target are left out; ``compiled``: Vela whole's host nodes by name."""
    by_id = {t.id: t for t in targets}
    out: dict[str, dict[str, Any]] = {}
    for p in partitions:
        target = by_id.get(p.target)
        if target is None or target.toolchain not in ("vela", "cortex-m"):
            continue
        details = details_of(p.fingerprint, target)
        out[p.id] = (npu_partition(p, details) if target.toolchain == "vela"
                     else host_partition(p, details, graph, npu, compiled))
    return out


def with_ethos_figures(plan: Plan, graph: DataflowGraph, targets: Sequence[Target],
                       details_of: DetailsOf | None,
                       calibration: CalibrationData | None = None) -> Plan:
    """``plan`` with each partition's ``ethos`` figures when ``targets`` are an Ethos-U board
    and the campaign's cost rows are readable (``details_of``); otherwise ``plan`` unchanged.
    ``calibration``: the campaign's int8 samples (Vela whole's split, computed once)."""
    board = ethos_u_board(targets)
    if board is None or details_of is None:
        return plan
    try:
        compiled = {h.node: h for h in vela_split(graph, board, calibration).on_host}
    except ValueError:  # a node on neither half: the capability check's reasons only
        compiled = {}
    figures = ethos_partitions(graph, plan.partitions, targets, board.npu, details_of,
                               compiled)
    parts = tuple(dataclasses.replace(p, ethos=figures.get(p.id)) for p in plan.partitions)
    return dataclasses.replace(plan, partitions=parts)
