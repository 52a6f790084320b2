"""Measure in isolation only what can change the decision (``profile`` measure mode).

With profile costs (`estimators.profiled.ProfiledEstimator`) most candidates cost a share of
one in-network whole-model run, and no candidate is timed alone. What can still change the
decision is a candidate whose profile estimate is *uncertain* (it splits a group the toolchain
fused, or holds a node the profile does not account for) and that lies on a plan the search
would choose. `screen` finds those: it takes the best plan by estimate, measures its uncertain
candidates in isolation (the cost table first), searches again on the new costs, and repeats
with the next best plan until the chosen plan has no unmeasured uncertain candidate, or for
``rounds`` plans. The campaign's confirmation, refinement and never-worse steps follow
unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.search import SearchResult, search
from collage_farm.core.transition import TransitionModel
from estimators.profiled import ProfiledEstimator

__all__ = ["screen"]


def screen(graph: DataflowGraph, candidates: Sequence[CandidatePartition],
           est: ProfiledEstimator, transition: TransitionModel, result: SearchResult, *,
           rounds: int = 4, lazy: bool = True) -> tuple[SearchResult, dict]:
    """The search result once the uncertain candidates on the best plans are measured (module
    docstring), and what was done: ``plans`` looked at, ``measured`` (candidates measured in
    isolation, table hits included), ``uncertain_left`` (uncertain candidates on the final
    plan still answered by their estimate: 0 unless ``rounds`` ran out), ``stopped_by``
    (``certain`` | ``rounds``), ``search_s``."""
    t0 = time.perf_counter()
    measured: list[str] = []
    plans = 0
    search_s = 0.0
    for _ in range(max(0, rounds)):
        todo = _uncertain(est, result)
        if not todo:
            break
        plans += 1
        est.measure_isolated(todo)
        measured += [c.label() for c in todo]
        result = search(graph, candidates, est, transition, lazy=lazy)
        search_s += result.search_s
    left = len(_uncertain(est, result))
    return result, {"plans": plans + 1, "measured": len(measured), "candidates": measured[:50],
                    "uncertain_left": left, "stopped_by": "rounds" if left else "certain",
                    "search_s": search_s,
                    "wall_s": time.perf_counter() - t0}


def _uncertain(est: ProfiledEstimator, result: SearchResult) -> list[CandidatePartition]:
    """The uncertain candidates on ``result``'s plan, once each."""
    return list({c.fingerprint: c for c in (p.candidate for p in result.partitions)
                 if est.uncertain(c)}.values())
