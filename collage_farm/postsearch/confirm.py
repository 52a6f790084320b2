"""Confirm the search's chosen path: re-measure its candidates and search again.

"Confirm" here means one thing: the re-measurement of the candidates on the path the search
chose, and the re-search on the fresh costs (`confirm`). The never-worse check's own second
interleaved run is a different step (`collage_farm.postsearch.never_worse.second_run`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.search import SearchResult, search
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import Target
from collage_farm.core.transition import TransitionModel
from collage_farm.execute import SIMULATED_TOOLCHAINS
from estimators.base import CostEstimator

__all__ = ["confirm"]


def confirm(graph: DataflowGraph, candidates: Sequence[CandidatePartition],
            est: CostEstimator, transition: TransitionModel, result: SearchResult,
            targets: Sequence[Target], *, rounds: int = 3, lazy: bool = True
            ) -> tuple[SearchResult, dict]:
    """Re-measure the chosen path's candidates and re-search, until the path is confirmed.

    Why: Dijkstra picks the cheapest path among thousands of candidate costs, each measured
    once on a noisy machine, so the costs on the path it picks are biased low (the winner's
    curse): on this VM the search promised mixes 4-28% faster than they ran. A fresh
    measurement of just those candidates is independent of the choice, hence unbiased; with it
    the search may prefer another path, whose new candidates are re-measured in turn. Each
    round re-measures, in one farm batch, the path's candidates not yet re-measured and each
    target's whole model (so the path and the single toolchains are priced at the same time,
    on the same drift). A cost that already is a re-measurement (`is_confirmed`: here, or in
    an earlier campaign's table row) is not measured again, so a re-run measures only what
    an earlier run left unconfirmed (out of rounds, or a re-measurement too noisy to count).
    Stops when a path is made only of re-measured candidates ("stable"), or after ``rounds``.
    Simulated candidates (Vela's estimate) are deterministic: left alone. The info dict logs
    every re-measured candidate (before / after).
    """
    t0 = time.perf_counter()
    wholes = [CandidatePartition(SubGraph(graph, graph.all_mask), t, rule="whole")
              for t in targets if t.toolchain not in SIMULATED_TOOLCHAINS]
    done: set[str] = set()
    reused = 0  # confirmed by an earlier campaign (its table row is a re-measurement)
    entries: list[dict] = []
    stopped = "rounds"
    first_path = [p.candidate.fingerprint for p in result.partitions]
    search_s = 0.0  # the re-searches
    for _ in range(rounds):
        todo: dict[str, CandidatePartition] = {}
        for c in [p.candidate for p in result.partitions] + wholes:
            if c.target.toolchain in SIMULATED_TOOLCHAINS or c.fingerprint in done:
                continue
            todo.setdefault(c.fingerprint, c)
        if not todo:
            stopped = "stable"
            break
        batch = list(todo.values())
        before = est.estimate(batch)  # memo hits (wholes are measured here if never were)
        done.update(todo)
        reused += sum(1 for c in batch if est.is_confirmed(c))
        live = [(c, b) for c, b in zip(batch, before) if b.is_known and not est.is_confirmed(c)]
        if not live:
            continue
        after = est.remeasure([c for c, _ in live])
        if after is None:
            return result, {"skipped": f"the {est.label} estimator cannot re-measure"}
        for (c, b), a in zip(live, after):
            entries.append({"candidate": c.label(), "before_s": b.seconds,
                            "after_s": a.seconds if a.is_known else None})
        result = search(graph, candidates, est, transition, lazy=lazy)
        search_s += result.search_s
    else:
        if all(p.candidate.fingerprint in done
               or p.candidate.target.toolchain in SIMULATED_TOOLCHAINS
               for p in result.partitions):
            stopped = "stable"
    ratios = [e["after_s"] / e["before_s"] for e in entries
              if e["after_s"] and e["before_s"] and e["before_s"] > 0]
    return result, {
        "remeasured": len(entries),
        "already_confirmed": reused,
        "stopped_by": stopped,
        "path_changed": [p.candidate.fingerprint for p in result.partitions] != first_path,
        "median_after_over_before": float(np.median(ratios)) if ratios else None,
        "wall_s": time.perf_counter() - t0,
        "search_s": search_s,
        "log": entries,
    }
