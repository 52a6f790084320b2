"""Exact confirmation of a board search on profile estimates: build the plan, search again.

In ``profile`` mode on a simulated Ethos-U board (`estimators.board_profiled`) most candidates
answer a profile estimate: the sum of their operators' cycles in Vela's own split of the model,
not the figure of their own compile. `confirm_exact` builds the chosen path's candidates that
still answer an estimate (isolated Vela compiles, host conversions: their exact figures), then
searches again with those figures, until the path is made of built candidates only. Every
round builds at least one candidate never built before, and a built candidate never answers an
estimate again, so the loop ends; the path it ends on is the cheapest under the final costs
(exact where built, estimates elsewhere), and its figures, which the plan and the exact
comparison with Vela's own split report, are exact builds.

This differs from the measured campaigns' confirmation (`collage_farm.postsearch.confirm`),
which re-measures noisy timings a bounded number of rounds: here nothing is noisy, an estimate
is replaced by the exact figure once, and the loop runs until no estimate is left on the path.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.search import SearchResult, search
from collage_farm.core.transition import TransitionModel
from estimators.board_profiled import BoardProfiledEstimator

__all__ = ["confirm_exact"]


def confirm_exact(graph: DataflowGraph, candidates: Sequence[CandidatePartition],
                  est: BoardProfiledEstimator, transition: TransitionModel,
                  result: SearchResult, *, lazy: bool = True) -> tuple[SearchResult, dict]:
    """The search's path rebuilt until exact (module docstring), and the summary's figures:
    ``built`` candidates built to confirm, ``rounds`` searches, each built candidate's profile
    estimate beside its exact figure (``log``), whether the path changed, ``estimated``
    candidates priced by a profile estimate only (never built), and the wall time."""
    t0 = time.perf_counter()
    first_path = [p.candidate.fingerprint for p in result.partitions]
    first_s = result.total_s
    entries: list[dict] = []
    rounds = 0
    search_s = 0.0
    while True:
        todo = list({p.candidate.fingerprint: p.candidate for p in result.partitions
                     if est.provisional(p.candidate)}.values())
        if not todo:
            break
        before = est.estimate(todo)
        after = est.build(todo)
        for c, b, a in zip(todo, before, after):
            entries.append({"candidate": c.label(), "estimate_s": b.seconds,
                            "exact_s": a.seconds if a.is_known else None,
                            "invalid": not a.is_known})
        result = search(graph, candidates, est, transition, lazy=lazy)
        search_s += result.search_s
        rounds += 1
    errors = [e["exact_s"] / e["estimate_s"] - 1.0 for e in entries
              if e["exact_s"] and e["estimate_s"]]
    return result, {
        "exact": True,
        "built": len(entries),
        "rounds": rounds,
        "stopped_by": "exact",
        "first_estimated_s": first_s,
        "path_changed": [p.candidate.fingerprint for p in result.partitions] != first_path,
        "max_abs_estimate_error": max((abs(x) for x in errors), default=None),
        "remeasured": 0,
        "already_confirmed": sum(1 for p in result.partitions if est.is_confirmed(p.candidate)),
        "estimated": est.estimated(),  # candidates the search priced by estimate only
        "wall_s": time.perf_counter() - t0,
        "search_s": search_s,
        "log": entries,
    }
