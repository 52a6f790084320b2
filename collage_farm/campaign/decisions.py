"""A campaign's verified decision as a cost-table row: recorded after the end-to-end check,
found again by a re-run or an offline search that reaches the same search plan, so both
write the plan the measuring campaign wrote (`collage_farm.costtable.decisions`)."""

from __future__ import annotations

import logging
from pathlib import Path

from collage_farm.campaign.options import TuneOptions
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.search import SearchResult
from collage_farm.core.transition import TransitionModel
from collage_farm.costtable import CostTable, CostTableWriter
from collage_farm.costtable.decisions import (
    PlanDecision,
    decision_row,
    find_decision,
    plan_parts,
)
from collage_farm.postsearch.decide import PostSearch
from collage_farm.postsearch.moves import parts_from_names, to_search_result
from estimators.base import CostEstimator

log = logging.getLogger(__name__)


def search_parts(graph: DataflowGraph, result: SearchResult) -> tuple:
    return plan_parts(graph, [(p.candidate.mask, p.candidate.target) for p in result.partitions])


def record_decision(writer: CostTableWriter, graph: DataflowGraph, opts: TuneOptions,
                     searched: SearchResult, post: PostSearch) -> None:
    """Append the campaign's verified outcome for its search plan to its cost table
    (`collage_farm.costtable.decisions`); an unverified plan records nothing."""
    row = decision_row(graph, opts.targets, search_parts(graph, searched),
                       search_parts(graph, post.result), str(post.info.get("plan_is", "")),
                       post.info, campaign_id=opts.campaign_id)
    if row is not None:
        writer.append(row)


def recorded_decision(graph: DataflowGraph, opts: TuneOptions, table: Path | None,
                   result: SearchResult) -> PlanDecision | None:
    """The newest decision an earlier campaign recorded for this search plan, or None (no
    table, none recorded, or rows that cannot be read: said, and the search goes on)."""
    if table is None or not Path(table).is_dir():
        return None
    try:
        return find_decision(CostTable(table), graph, opts.targets,
                             search_parts(graph, result))
    except Exception as e:  # an unreadable row must not cost the search's own plan
        log.warning("recorded plan decisions unreadable (%s: %s)", type(e).__name__, e)
        return None


def already_decided(graph: DataflowGraph, opts: TuneOptions, table: Path | None,
                     result: SearchResult) -> dict | None:
    """The confirmation step's summary when an earlier campaign already confirmed this search
    plan and decided on it end to end (its decision row is in the table): a re-run of a
    finished campaign measures nothing, even where that campaign's confirmation ran out of
    rounds before every candidate on the path was re-measured. None: confirm as usual
    (no such decision, or ``--reconfirm``)."""
    decision = None if opts.reconfirm else recorded_decision(graph, opts, table, result)
    if decision is None:
        return None
    return {"remeasured": 0, "already_confirmed": len(result.partitions),
            "stopped_by": "decided", "decided_by": decision.campaign_id,
            "path_changed": False, "median_after_over_before": None, "wall_s": 0.0,
            "search_s": 0.0, "log": []}


def reuse_decision(graph: DataflowGraph, opts: TuneOptions, table: Path | None,
                    est: CostEstimator, transition: TransitionModel, result: SearchResult
                    ) -> tuple[SearchResult, PlanDecision | None]:
    """The plan a measured campaign wrote for the search plan found now, if one is recorded in
    ``table`` (an offline search, or a re-run that times nothing again); else ``result``
    unchanged."""
    decision = recorded_decision(graph, opts, table, result)
    if decision is None:
        return result, None
    parts = parts_from_names(graph, decision.final, opts.targets)
    if parts is None:
        log.warning("the decision of campaign %s names nodes or targets this campaign has "
                    "not; the search's plan is written", decision.campaign_id)
        return result, None
    return to_search_result(graph, parts, result, estimate=est.estimate,
                            transition=transition, rule=decision.plan_is), decision
