"""An Ethos-U board's profile builds: built once, read back from the cost table as profiles.

A campaign on a simulated Ethos-U board in ``profile`` mode builds a few ordinary candidates
first (`collage_farm.postsearch.vela_whole.profile_candidates`: Vela's own split of the model,
its NPU partitions on each NPU target and every partition on each host target) through the
campaign's estimator, so they land in the cost table like any candidate and a re-run or an
offline campaign reads them instead of building them again. Their rows' per-operator cycles
(``details["ops"]``) become one `estimators.board_profiled.BoardProfile` per target, and the
campaign's estimator is wrapped in a `estimators.board_profiled.BoardProfiledEstimator`.

The cost table's (fingerprint, measure key) pairs already present are read first: those
candidates answer their exact figure from the start (an offline campaign over the table of a
finished campaign then searches exactly the costs that campaign's last search did).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.costtable import CostTable
from estimators.base import CostEstimator
from estimators.board_profiled import BoardProfile, BoardProfiledEstimator, ProfileBuild
from estimators.measured import FarmEstimator
from runners.cortex_m import host_of, price
from runners.deterministic import ConversionFailed, convert_for_build
from runners.host_model import HostModel

log = logging.getLogger(__name__)

__all__ = ["FIGURES", "board_profiled"]

FIGURES = ("simulated: Vela's cycle estimate for the NPU and the analytic cycle model of the "
           "Cortex-M host; the plan's figures are exact builds, profile estimates only "
           "steered the search")


def _table_keys(table: Path | None) -> set[tuple[str, str]]:
    """The (fingerprint, measure key) pairs ``table`` holds rows for (any status)."""
    if table is None or not Path(table).is_dir():
        return set()
    t = CostTable(table).read(columns=["fingerprint", "target_key"])
    return set(zip(t.column("fingerprint").to_pylist(), t.column("target_key").to_pylist()))


def _renamed(details: dict, row_nodes: Sequence[str], nodes: Sequence[str]) -> dict:
    """``details`` of a row recorded for another candidate of the same structure (a repeated
    layer shares its fingerprint with the first one built) with its operators' node names
    mapped onto ``nodes`` by position (both in the sub-graph's node order)."""
    if tuple(row_nodes) == tuple(nodes) or len(row_nodes) != len(nodes):
        return details
    to = dict(zip(row_nodes, nodes))
    ops = [{**op, "nodes": [to.get(n, n) for n in op.get("nodes") or ()]}
           for op in details.get("ops") or ()]
    return {**details, "ops": ops}


def _profile_rows(table: Path | None, parts: Sequence[CandidatePartition]
                  ) -> list[dict | None]:
    """The details of each profile build's ok row (None where it has none), its operators
    named by the build's own nodes."""
    if table is None or not Path(table).is_dir():
        return [None] * len(parts)
    found = CostTable(table).lookup([(c.fingerprint, c.target.measure_key) for c in parts])
    out: list[dict | None] = []
    for c in parts:
        row = found.get((c.fingerprint, c.target.measure_key))
        out.append(_renamed(row.details_dict(), row.nodes, c.node_names)
                   if row is not None and row.ok else None)
    return out


def _fp32_priced(c: CandidatePartition, host: HostModel) -> ProfileBuild | None:
    """An int8 host profile build priced again in float32 here (the host's cycle model is a
    formula over the converter's float32 operators, which need no calibration ranges), so a
    candidate the host converts in float32 (it also holds a node that maps in float32 only) is
    accounted too; None when the float32 conversion fails (its candidates are then built)."""
    try:
        graph = load_graph(c.sub_graph.extract(f"profile_{c.fingerprint[:12]}")
                           .SerializeToString())
        conv, _ = convert_for_build(graph, "fp32", (), write=False)
    except (ConversionFailed, ValueError) as e:
        log.info("no float32 host profile of %s: %s", c.label(), e)
        return None
    return ProfileBuild(tuple(c.node_names), price(conv, host))


def board_profiled(graph: DataflowGraph, parts: Sequence[CandidatePartition],
                   est: CostEstimator, table: Path | None
                   ) -> tuple[BoardProfiledEstimator, dict]:
    """``est`` wrapped in a `BoardProfiledEstimator` over the profiles of ``parts`` (the
    profile builds, built through ``est`` when the table has no row of them; offline, only
    those the table holds), and what
    happened: per target its builds, groups and unaccounted nodes, ``runs`` (profile builds
    made now) and one warning line per target left without a profile."""
    known = _table_keys(table)
    if not est.kind.measures:  # offline: the profile builds the table holds, nothing else
        parts = [c for c in parts if (c.fingerprint, c.target.measure_key) in known]
    before = est.stats().measured
    costs = est.estimate(parts)
    runs = max(0, est.stats().measured - before)
    if isinstance(est, FarmEstimator):
        est.flush()  # the rows the profile reads
    rows = _profile_rows(table, parts)
    by_target: dict[str, list[ProfileBuild]] = {}
    by_part: dict[str, list[CandidatePartition]] = {}
    targets = {}
    for c, cost, d in zip(parts, costs, rows):
        targets[c.target.id] = c.target
        if d is not None and cost.is_known:
            by_target.setdefault(c.target.id, []).append(ProfileBuild(tuple(c.node_names), d))
            by_part.setdefault(c.target.id, []).append(c)
    profiles: dict[str, BoardProfile] = {}
    warnings: list[str] = []
    info_targets: dict[str, dict] = {}
    for tid, t in targets.items():
        builds = by_target.get(tid, [])
        n_parts = sum(1 for c in parts if c.target.id == tid)
        if builds:
            host = host_of(t) if t.toolchain == "cortex-m" else None
            if host is not None:  # every int8 build priced in float32 too
                builds += [f for b, c in zip(builds, by_part[tid]) if b.details.get("mode")
                           == "int8" and (f := _fp32_priced(c, host)) is not None]
            profiles[tid] = p = BoardProfile.of(tid, builds, host, graph)
        if not builds or len(builds) < n_parts:
            warnings.append(f"warning: {tid}: {n_parts - len(builds)} of {n_parts} profile "
                            "builds failed; candidates holding their nodes are built")
        info_targets[tid] = {
            "builds": n_parts, "ok": len(builds),
            "groups": len(p.group_size) if builds else 0,
            "accounted_nodes": len({n for n, _ in p.group_of}) if builds else 0,
            "unaccounted": dict(sorted(p.dropped.items())[:20]) if builds else {}}
    keys = known | {(c.fingerprint, c.target.measure_key) for c in parts}
    info = {"board": True, "figures": FIGURES, "targets": info_targets,
            "profiled_targets": sorted(profiles), "runs": runs, "warnings": warnings}
    log.info("board profiles of %s: %d profile builds (%d now)", graph.name, len(parts), runs)
    return BoardProfiledEstimator(profiles, est, known=keys, profile_builds=runs), info
