"""Price the best plans' partitions inside their running plan (``profile`` measure mode).

A profile cost is a candidate's share of its toolchain's whole-model run
(`estimators.profiled`). What no whole-model run shows is what a cut does to the partitions on
*both* sides of it: the toolchain that hands a tensor over must produce it in a plain layout
(OpenVINO's CPU plugin keeps blocked layouts inside a compiled model and reorders at its
outputs), a kernel fused across the cut runs unfused, and the next toolchain starts on what the
last one left in the caches. The cut-cost probe (`collage_farm.probes.cutcost`) charges the
entering side, per target, at the depths its chunks cut; the leaving side depends on the tensor
and the kernel before the cut and is not charged. On the two PaddleOCR models it was the
largest error left in profile mode: ppocr-det's Dijkstra plan (OpenVINO's first 324 nodes,
ONNX Runtime's last 6) ran its OpenVINO partition 2.6 ms (+23%) above its profile share, so
the plan ran 14-18% above its estimate and lost to OpenVINO's whole model, which the estimate
had put 3% behind it.

So when the search's plan is a mix, the campaign times it as a chain in its own process (the
executor the never-worse run uses; each partition timed *inside* the running chain,
`PlanExecutor.measure_in_chain`), interleaved in rotated rounds with the whole model of each
target the plan uses, and prices every partition of it that a profile share answers by that:

    price = median in chain x (the target's time base / its whole model now) - penalty

the time base being the whole-model time the target's profile shares add up to
(`TargetProfile.whole_s`: the cut-cost probe's, on the campaign's time base), ``penalty`` the
transition penalty the search charges the partition on that plan, so that the plan's estimate
becomes the sum of its partitions as they ran together. It searches again; a new plan that is a
mix with partitions not yet priced is timed next, up to ``rounds`` plans. A price once given is
kept (`ProfiledEstimator.price_in_chain`). Nothing is timed in isolation: these are a few
hundred runs of plans the search would choose, on the same time base as every profile share.

The loop stops when the plan is one partition (a whole model's profile shares add up to its
time base exactly), when the plan is a mix estimated less than the noise floor (3%) faster
than the fastest profiled target's whole model (``within_noise``, `near_best_single`: no
end-to-end run could tell the two apart; the campaign then goes on with that whole model,
`single_instead`; gpt2-2L's first plans were such mixes, a 1-3 node partition on another
toolchain in front of a whole model, and pricing and refining them took 18-20 s of a 65-89 s
campaign), when every priced partition of it was priced already (``priced``), after
``rounds`` timed plans (``rounds``), or when a plan cannot be built or run here (``error``;
the plan stays the search's). Targets this process times on another device than their runners
(`collage_farm.campaign.timing_host`) are never priced here: their shares are on the runner's
time base.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.pins import PinSet
from collage_farm.core.search import SearchResult
from collage_farm.core.target import Target
from collage_farm.core.transition import TransitionModel
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.execute.interleaved import PLAN_ROUND_S, runs_to_fill
from collage_farm.postsearch.moves import order_parts, to_search_result, why_invalid
from collage_farm.postsearch.noise import NOISE_FLOOR
from estimators.profiled import ProfiledEstimator

log = logging.getLogger(__name__)

__all__ = ["InChainPrice", "PlanTiming", "near_best_single", "price_best_plans",
           "single_instead", "time_plan_in_chain"]


def near_best_single(result: SearchResult, est: ProfiledEstimator,
                     floor: float = NOISE_FLOOR) -> str | None:
    """Why ``result``'s plan is not worth timing part by part, or None: it is a mix whose
    estimate is less than ``floor`` below the fastest profiled target's whole model (its
    profile time base, `TargetProfile.whole_s`: what the search estimates that whole model
    at, on the same time base as the mix). A one-partition plan, or an estimator with no
    profile, gives None."""
    fastest = _fastest_whole(est)
    if len(result.partitions) < 2 or fastest is None or not math.isfinite(result.total_s):
        return None
    best, whole_s = fastest
    gain = 1.0 - result.total_s / whole_s
    if gain >= floor:
        return None
    return (f"the mix is estimated {gain:.1%} faster than {best}'s whole model "
            f"({result.total_s * 1e3:.4g} vs {whole_s * 1e3:.4g} ms), under the "
            f"{floor:.0%} noise floor")


def _fastest_whole(est: ProfiledEstimator) -> tuple[str, float] | None:
    """The profiled target whose whole model is the fastest on its time base, and that time."""
    wholes = {t: p.whole_s for t, p in est.profiles.items() if p.whole_s > 0}
    if not wholes:
        return None
    best = min(wholes, key=lambda t: wholes[t])
    return best, wholes[best]



@dataclass(frozen=True)
class PlanTiming:
    """One plan timed in chain beside its targets' whole models, in interleaved rounds."""

    partition_s: tuple[float, ...]  # each partition's median inside the chain, plan order
    plan_s: float  # the chain's median end to end
    whole_s: dict[str, float]  # target id -> its whole model's median in the same rounds
    rounds: int
    wall_s: float


@dataclass(frozen=True)
class InChainPrice:
    """One candidate priced in chain (module docstring), with the figures it came from."""

    candidate: CandidatePartition
    seconds: float  # the price the estimator answers from now on
    in_chain_s: float  # the partition's median inside the running plan
    whole_now_s: float  # its target's whole model in the same rounds
    whole_base_s: float  # the time base its target's profile shares add up to
    penalty_s: float  # the transition penalty the search charged it on that plan
    profile_s: float  # what the estimator answered for it before (share, charges)

    def details(self) -> dict[str, float]:
        return {"in_chain_s": self.in_chain_s, "whole_now_s": self.whole_now_s,
                "whole_base_s": self.whole_base_s, "penalty_s": self.penalty_s,
                "profile_s": self.profile_s}


@dataclass
class _Log:
    plans: list[dict] = field(default_factory=list)
    prices: list[InChainPrice] = field(default_factory=list)


def time_plan_in_chain(builder: PlanBuilder, parts: Sequence[Part], targets: Sequence[Target],
                       *, rounds: int = 5, min_round_s: float = PLAN_ROUND_S) -> PlanTiming:
    """``parts`` (in executable order) run as one chain, each partition timed inside it, in
    ``rounds`` rotated rounds with each of ``targets``' whole models; every chain runs as many
    times per round as fill ``min_round_s``. Raises what building or running raises."""
    t0 = time.perf_counter()
    graph = builder.graph
    chains = {"plan": builder.executor(parts)}
    for t in dict.fromkeys(targets):
        chains[t.id] = builder.executor([Part(graph.all_mask, t)])
    runs: dict[str, int] = {}
    for label, ex in chains.items():
        first, _ = ex.measure_in_chain(1, warmup=1, feeds=builder.feeds(ex))
        if first[0] < min_round_s:  # it sizes the rounds: warm it more
            first, _ = ex.measure_in_chain(1)
        runs[label] = runs_to_fill(min_round_s, first[0])
    labels = list(chains)
    totals: dict[str, list[float]] = {k: [] for k in labels}
    per: dict[str, list[float]] = {}
    for r in range(max(1, rounds)):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            tot, inside = chains[label].measure_in_chain(runs[label])
            totals[label] += tot
            if label == "plan":
                for pid, xs in inside.items():
                    per.setdefault(pid, []).extend(xs)
    ids = [rt.id for rt in chains["plan"].partitions]
    return PlanTiming(tuple(statistics.median(per[i]) if per.get(i) else math.nan for i in ids),
                      statistics.median(totals["plan"]),
                      {k: statistics.median(v) for k, v in totals.items() if k != "plan"},
                      max(1, rounds), time.perf_counter() - t0)


def single_instead(graph: DataflowGraph, result: SearchResult, est: ProfiledEstimator,
                   transition: TransitionModel, targets: Sequence[Target],
                   pins: PinSet | None = None) -> tuple[SearchResult, dict | None]:
    """The plan a profile-mode campaign goes on with: ``result`` itself, or, when it is a mix
    `near_best_single` finds within the noise floor of the fastest profiled whole model, that
    target's whole model (priced as the search prices it), and what was set aside (the
    summary's ``mix_within_noise``: the mix, its estimate, the whole model's, why). The mix is
    then neither priced in chain, refined nor timed: no end-to-end run could tell it from the
    whole model, and an unpriced mix is optimistic (it misses what leaving a partition costs;
    gpt2-2L's, estimated 2.6% faster, ran 12% slower than that whole model). The never-worse
    run still times every target's whole model. Deterministic in the estimator's costs, so a
    re-run and an offline search set the same mix aside. ``result`` unchanged when the whole
    model breaks ``pins``."""
    why = near_best_single(result, est)
    fastest = _fastest_whole(est)
    if why is None or fastest is None:
        return result, None
    best = fastest[0]
    target = {t.id: t for t in targets}.get(best)
    if target is None:
        return result, None
    whole = [Part(graph.all_mask, target)]
    if why_invalid(graph, whole, pins) is not None:
        return result, None
    single = to_search_result(graph, whole, result, estimate=est.estimate,
                              transition=transition, rule="whole")
    return single, {"plan": [(p.candidate.target.id, len(p.candidate.node_names))
                             for p in result.partitions],
                    "estimated_s": result.total_s, "instead": f"{best} whole",
                    "instead_estimated_s": single.total_s, "why": why}


def price_best_plans(graph: DataflowGraph, est: ProfiledEstimator,
                     search_again: Callable[[], SearchResult], result: SearchResult,
                     builder: PlanBuilder, *, rounds: int = 4, timing_rounds: int = 5,
                     foreign: Collection[str] = ()
                     ) -> tuple[SearchResult, dict, list[InChainPrice]]:
    """The search result once the best plans' partitions are priced in chain (module
    docstring), what was done, and the new prices (for the cost table).

    ``search_again``: the campaign's search on ``est`` as it is now. ``foreign``: target ids
    whose shares are not on this process's time base. The summary dict: ``plans`` timed,
    ``priced`` (candidates priced now), ``stopped_by`` (``single`` | ``within_noise`` |
    ``priced`` | ``rounds`` | ``foreign`` | ``error``), ``why`` (``within_noise``'s figures),
    ``error``, ``log`` (per timed plan: its partitions, estimate,
    in-chain sum and end-to-end median), ``wall_s``."""
    t0 = time.perf_counter()
    done = _Log()
    stopped, error, why = "rounds", "", ""
    while True:  # until a stop below: at most ``rounds`` plans are timed
        parts = result.partitions
        if len(parts) < 2:
            stopped = "single"
            break
        near = near_best_single(result, est)
        if near:
            stopped, why = "within_noise", near
            break
        if any(p.candidate.target.id in foreign for p in parts):
            stopped = "foreign"
            break
        todo = [p for p in parts if est.priceable_in_chain(p.candidate)]
        if not todo:
            stopped = "priced"
            break
        if len(done.plans) >= max(0, rounds):
            break
        plan = [Part(p.candidate.mask, p.candidate.target) for p in parts]
        ordered = order_parts(graph, plan)
        if ordered is None:
            stopped, error = "error", "the plan's partitions depend on each other in a cycle"
            break
        try:
            timing = time_plan_in_chain(builder, ordered,
                                        [p.target for p in ordered], rounds=timing_rounds)
        except Exception as e:  # a partition that cannot be built or run alone here
            stopped, error = "error", f"{type(e).__name__}: {str(e)[:300]}"
            break
        by_mask = {(p.candidate.mask, p.candidate.target.id): p for p in parts}
        new: dict[tuple[str, int], float] = {}
        rows: list[dict] = []
        for part, s in zip(ordered, timing.partition_s):
            planned = by_mask[(part.mask, part.target.id)]
            c = planned.candidate
            row = {"target": c.target.id, "nodes": len(c.node_names),
                   "estimated_s": planned.cost.seconds, "penalty_s": planned.penalty_s,
                   "in_chain_s": s, "price_s": None}
            rows.append(row)
            if not est.priceable_in_chain(c) or not math.isfinite(s):
                continue
            base = est.profiles[c.target.id].whole_s
            now = timing.whole_s.get(c.target.id, 0.0)
            scale = base / now if now > 0 and base > 0 else 1.0
            price = InChainPrice(c, max(0.0, s * scale - planned.penalty_s), s, now, base,
                                 planned.penalty_s, planned.cost.seconds)
            done.prices.append(price)
            new[(c.target.id, c.mask)] = row["price_s"] = price.seconds
        done.plans.append({
            "partitions": rows, "estimated_s": result.total_s,
            "in_chain_sum_s": sum(timing.partition_s), "plan_s": timing.plan_s,
            "whole_s": timing.whole_s, "rounds": timing.rounds,
            "wall_s": round(timing.wall_s, 3)})
        est.price_in_chain(new)
        result = search_again()
    info = {"plans": len(done.plans), "priced": len(done.prices), "stopped_by": stopped,
            "error": error or None, "why": why or None, "exit_s": est.exit_charges,
            "log": done.plans, "wall_s": time.perf_counter() - t0}
    if error:
        log.warning("in-chain pricing stopped: %s", error)
    return result, info, done.prices
