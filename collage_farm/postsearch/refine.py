"""Refine a Dijkstra plan with measured end-to-end latency, and keep it never worse.

Why: the search adds isolated candidate costs plus a transition model, and on CPUs that sum is
off by more than the mixing gain (field notes, "Mixing ORT and OpenVINO": estimates promised up
to 9% while no mix beat the best single toolchain end to end, 0.87-1.00x; each cut costs
OpenVINO 130-650 us on CNNs). The Collage paper's answer is a graph-level step that optimises the
real objective. This module does that with the heterogeneous executor (`collage_farm.execute`):

* **Refinement** (`refine`): first-improvement hill climbing over local moves of the plan:
  merge two neighbouring partitions onto one target (either side's), switch a partition's
  target, move a boundary node into its neighbour's partition. Each move is checked for
  validity first (every node in exactly one partition, convex partitions, an acyclic partition
  order, every node supported by its target's toolchain, pins respected: `why_invalid`), then
  run (numerics against the whole model in ONNX Runtime CPU) and timed interleaved with the
  current plan in one run. It is kept only when faster **beyond noise**, twice: in that run and
  in a second interleaved run (on a shared VM one run's win can be drift: mnist accepted a move
  at 0.038 -> 0.036 ms that ran 0.055 ms in the final verify); the budget is a trial
  count and a wall-clock limit. Simulated partitions (Ethos-U) are left as they are: they have
  no measured latency to improve.
* **Never worse** (`verify`): the final candidates (Dijkstra plan, refined plan) and every
  searched target's whole model are checked and timed interleaved in one run; the caller keeps
  the mix only when it beats the best single toolchain beyond noise.

Noise: two plans timed interleaved in one run are compared **round by round** (`paired`):
round ``i`` of each ran within one turn of the rotation, so the ratio of their round-``i``
medians is free of the drift between turns, which on a shared VM is the larger noise (a whole
model moved 30% between back-to-back runs; the unpaired spread of round medians made the
never-worse threshold 3-20%). ``a`` beats ``b`` when the median of the per-round ratios
``a_i / b_i`` is below ``1 - threshold``, ``threshold = max(NOISE_FLOOR, NOISE_SIGMAS * 1.25 *
sd(log ratios) / sqrt(rounds))``: ~2.5 standard errors of that median. The floor (3%) is the
field notes' process-to-process spread and the issue's goal tolerance, so a plan is never
swapped for a gain a second run would not reproduce. Without round data (one round, or a
caller's summaries only) the unpaired rule stands: ``max(NOISE_FLOOR, NOISE_SIGMAS *
sqrt(cv_a^2 + cv_b^2) / sqrt(rounds))`` on the medians, the cv's being those of each side's
round medians (`Summary.cv`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.search import PlannedPartition, SearchResult, static_penalty_s
from collage_farm.core.subgraph import SubGraph, iter_bits
from collage_farm.core.target import Target
from collage_farm.core.transition import AnalyticTransitionModel, TransitionModel
from collage_farm.execute import SIMULATED_TOOLCHAINS
from collage_farm.execute.builder import Part, PlanBuilder
from runners.base import MeasureConfig, Summary

log = logging.getLogger(__name__)

__all__ = [
    "NOISE_FLOOR",
    "Move",
    "Paired",
    "Part",
    "PlanBuilder",
    "RefineResult",
    "Trial",
    "VerifyResult",
    "beyond_noise",
    "noise_threshold",
    "order_parts",
    "paired",
    "parts_of",
    "propose_moves",
    "refine",
    "to_search_result",
    "verify",
    "why_invalid",
]

NOISE_FLOOR = 0.03
NOISE_SIGMAS = 2.5
SIMULATED = SIMULATED_TOOLCHAINS  # toolchains whose latency is an estimate, never timed here


def noise_threshold(a: Summary, b: Summary, rounds: int) -> float:
    """Relative difference below which two interleaved medians are the same (see module doc)."""
    ca = a.cv if math.isfinite(a.cv) else 0.0
    cb = b.cv if math.isfinite(b.cv) else 0.0
    return max(NOISE_FLOOR, NOISE_SIGMAS * math.hypot(ca, cb) / math.sqrt(max(1, rounds)))


def beyond_noise(faster: Summary, slower: Summary, rounds: int) -> bool:
    """Whether ``faster`` beats ``slower`` by more than `noise_threshold` (unpaired)."""
    return faster.median < slower.median * (1.0 - noise_threshold(faster, slower, rounds))


MEDIAN_SE = 1.2533  # standard error of a median / standard error of a mean (normal samples)


@dataclass(frozen=True)
class Paired:
    """``a`` against ``b`` from one interleaved run (see module doc)."""

    ratio: float  # a / b: the median of the per-round ratios (paired), else of the medians
    threshold: float  # relative difference below which a and b are the same
    pairs: int  # rounds compared pairwise; 0 = the unpaired rule decided

    @property
    def a_faster(self) -> bool:
        """``a`` beats ``b`` beyond noise. A ratio on the boundary to within rounding is not a
        win: a per-round drift that scales both sides must not flip the decision (hypothesis
        found 0.97 and 0.96999999999999990 for one set of rounds with and without drift)."""
        return self.ratio < (1.0 - self.threshold) * (1.0 - 1e-12)

    def to_json(self) -> dict:
        return {"ratio": self.ratio, "threshold": self.threshold, "pairs": self.pairs}


def paired(a: Summary, b: Summary, a_rounds: Sequence[float] = (),
           b_rounds: Sequence[float] = (), rounds: int = 1) -> Paired:
    """Compare ``a`` with ``b`` round by round when both have >= 3 positive round medians,
    else on their medians with the unpaired `noise_threshold` (see module doc)."""
    pairs = [(x, y) for x, y in zip(a_rounds, b_rounds) if x > 0 and y > 0]
    if len(pairs) >= 3:
        logs = [math.log(x / y) for x, y in pairs]
        sd = float(np.std(logs, ddof=1))
        thr = max(NOISE_FLOOR, NOISE_SIGMAS * MEDIAN_SE * sd / math.sqrt(len(pairs)))
        return Paired(float(math.exp(float(np.median(logs)))), thr, len(pairs))
    ratio = a.median / b.median if b.median > 0 else math.inf
    return Paired(ratio, noise_threshold(a, b, rounds), 0)


# ----------------------------------------------------------------------------------------
# plans as (node set, target) parts


def parts_of(result: SearchResult) -> list[Part]:
    return [Part(p.candidate.mask, p.candidate.target) for p in result.partitions]


def order_parts(graph: DataflowGraph, parts: Sequence[Part]) -> list[Part] | None:
    """Parts in an executable order (producers first), or None if they depend in a cycle."""
    owner: dict[int, int] = {}
    for k, p in enumerate(parts):
        for i in iter_bits(p.mask):
            owner[i] = k
    deps: list[set[int]] = [set() for _ in parts]
    for k, p in enumerate(parts):
        for i in iter_bits(p.mask):
            for q in graph.nodes[i].preds:
                o = owner.get(q, k)
                if o != k:
                    deps[k].add(o)
    out: list[Part] = []
    done: set[int] = set()
    pending = list(range(len(parts)))
    while pending:  # stable: keeps the given order where it is already executable
        k = next((k for k in pending if deps[k] <= done), None)
        if k is None:
            return None
        pending.remove(k)
        done.add(k)
        out.append(parts[k])
    return out


def why_invalid(graph: DataflowGraph, parts: Sequence[Part], pins: Any = None,
                supports: Callable[[Target, int], bool] | None = None) -> str | None:
    """None when ``parts`` is a valid plan, else why not.

    Valid: every node in exactly one part, every part convex, an acyclic partition order, every
    node supported by its part's toolchain (``supports(target, node_index)``, default: the
    toolchain's capabilities) and allowed by ``pins`` (a `collage_farm.core.pins.PinSet`).
    """
    seen = 0
    for p in parts:
        if p.mask & seen:
            return "a node is in two partitions"
        seen |= p.mask
    if seen != graph.all_mask:
        return "a node is in no partition"
    for p in parts:
        if not SubGraph(graph, p.mask).is_convex:
            return f"partition on {p.target.id} is not convex"
    if order_parts(graph, parts) is None:
        return "partitions depend on each other in a cycle"
    sup = supports or default_supports(graph)
    for p in parts:
        for i in iter_bits(p.mask):
            if not sup(p.target, i):
                return f"{p.target.id} does not support {graph.nodes[i].name}"
            if pins and not pins.allowed(graph.nodes[i], p.target):
                return f"pins keep {graph.nodes[i].name} off {p.target.id}"
    return None


def default_supports(graph: DataflowGraph) -> Callable[[Target, int], bool]:
    from runners.registry import capabilities_for

    cache: dict[tuple[str, int], bool] = {}

    def sup(t: Target, i: int) -> bool:
        k = (t.toolchain, i)
        if k not in cache:
            cache[k] = capabilities_for(t.toolchain).supports(graph.nodes[i], graph)
        return cache[k]

    return sup


def _signature(parts: Sequence[Part]) -> frozenset[tuple[int, str]]:
    return frozenset((p.mask, p.target.id) for p in parts)


# ----------------------------------------------------------------------------------------
# local moves


@dataclass(frozen=True)
class Move:
    """A proposed plan: ``kind`` (merge | switch | move-node), what it does, the new parts."""

    kind: str
    description: str
    parts: tuple[Part, ...]


def _neighbour_pairs(graph: DataflowGraph, parts: Sequence[Part]) -> list[tuple[int, int]]:
    owner = {i: k for k, p in enumerate(parts) for i in iter_bits(p.mask)}
    pairs: set[tuple[int, int]] = set()
    for k, p in enumerate(parts):
        for i in iter_bits(p.mask):
            for s in graph.nodes[i].succs:
                o = owner[s]
                if o != k:
                    pairs.add((k, o))
    return sorted(pairs)


def propose_moves(graph: DataflowGraph, parts: Sequence[Part], targets: Sequence[Target]
                  ) -> Iterator[Move]:
    """Local moves in the order they are tried (validity is checked by the caller).

    Order: merges of neighbours on different targets (each cut removed is a cut's cost saved;
    smaller partitions first, the likeliest losers), whole-partition target switches (smaller
    first), boundary-node moves, then merges of same-target neighbours (a launch saved).
    Simulated partitions are never touched.
    """
    measured = [t for t in targets if t.toolchain not in SIMULATED]
    fixed = {k for k, p in enumerate(parts) if p.target.toolchain in SIMULATED}
    pairs = [(a, b) for a, b in _neighbour_pairs(graph, parts) if a not in fixed
             and b not in fixed]

    def label(k: int) -> str:
        return f"p{k:03d}[{parts[k].target.id}, {parts[k].size()} nodes]"

    def without(*ks: int) -> list[Part]:
        return [p for j, p in enumerate(parts) if j not in ks]

    moves: list[tuple[tuple, Move]] = []
    for a, b in pairs:
        union = parts[a].mask | parts[b].mask
        same = parts[a].target == parts[b].target
        for t in dict.fromkeys((parts[a].target, parts[b].target)):
            rank = 3 if same else 0
            moves.append(((rank, min(parts[a].size(), parts[b].size()), a, b, t.id), Move(
                "merge", f"merge {label(a)} and {label(b)} on {t.id}",
                tuple([*without(a, b), Part(union, t)]))))
    for k, p in enumerate(parts):
        if k in fixed:
            continue
        for t in measured:
            if t != p.target:
                new = list(parts)
                new[k] = Part(p.mask, t)
                moves.append(((1, p.size(), k, 0, t.id), Move(
                    "switch", f"switch {label(k)} to {t.id}", tuple(new))))
    owner = {i: k for k, p in enumerate(parts) for i in iter_bits(p.mask)}
    for a, b in pairs:
        if parts[a].target == parts[b].target:
            continue
        # nodes of a that feed b, and nodes of b fed by a: move one across
        for src, dst, nodes in (
            (a, b, [i for i in iter_bits(parts[a].mask)
                    if any(owner[s] == b for s in graph.nodes[i].succs)]),
            (b, a, [i for i in iter_bits(parts[b].mask)
                    if any(owner[q] == a for q in graph.nodes[i].preds)]),
        ):
            for i in nodes:
                rest = parts[src].mask & ~(1 << i)
                new = [p for j, p in enumerate(parts) if j not in (src, dst)]
                if rest:
                    new.append(Part(rest, parts[src].target))
                new.append(Part(parts[dst].mask | 1 << i, parts[dst].target))
                moves.append(((2, parts[src].size(), src, i, parts[dst].target.id), Move(
                    "move-node", f"move {graph.nodes[i].name} from {label(src)} to {label(dst)}",
                    tuple(new))))
    moves.sort(key=lambda m: m[0])
    seen: set[frozenset] = {_signature(parts)}
    for _, m in moves:
        sig = _signature(m.parts)
        if sig not in seen:
            seen.add(sig)
            yield m


# ----------------------------------------------------------------------------------------
# refinement


@dataclass(frozen=True)
class Trial:
    """One move tried: ``status`` accepted | rejected (not faster beyond noise) | failed."""

    kind: str
    description: str
    status: str
    current_s: float | None = None
    candidate_s: float | None = None
    threshold: float | None = None
    error: str = ""
    ratio: float | None = None  # candidate / current, paired per round (`paired`)
    pairs: int = 0  # rounds the deciding comparison paired (more when it was extended)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class RefineResult:
    start: tuple[Part, ...]
    parts: tuple[Part, ...]
    trials: tuple[Trial, ...]
    invalid_skipped: int
    elapsed_s: float
    stopped_by: str  # "trials" | "time" | "exhausted" | "disabled" | "start failed: ..."

    @property
    def changed(self) -> bool:
        return _signature(self.start) != _signature(self.parts)

    @property
    def accepted(self) -> int:
        return sum(t.status == "accepted" for t in self.trials)

    def to_json(self) -> dict:
        return {"trials": len(self.trials), "accepted": self.accepted,
                "invalid_skipped": self.invalid_skipped, "elapsed_s": self.elapsed_s,
                "stopped_by": self.stopped_by, "changed": self.changed,
                "partitions_before": len(self.start), "partitions_after": len(self.parts),
                "log": [t.to_json() for t in self.trials]}


def refine(graph: DataflowGraph, start: Sequence[Part], targets: Sequence[Target], *,
           trials: int = 6, time_budget_s: float = 120.0, config: MeasureConfig | None = None,
           threads: int = 1, pins: Any = None, builder: PlanBuilder | None = None,
           supports: Callable[[Target, int], bool] | None = None,
           extend_rounds: int = 0) -> RefineResult:
    """Hill-climb from ``start`` with measured end-to-end latency (see module doc).

    At most ``trials`` moves are run and timed (invalid moves are skipped without running and
    do not count), and no new trial starts after ``time_budget_s``. Never raises for a move
    that fails to build or run: it becomes a ``failed`` trial. A move that looks faster than
    the 3% floor but not beyond noise gets ``extend_rounds`` more rounds, pooled with the
    first run's pairs, before it is decided (its confirmation run is then as long).
    """
    t0 = time.perf_counter()
    start = tuple(start)
    if trials <= 0:
        return RefineResult(start, start, (), 0, 0.0, "disabled")
    config = config or MeasureConfig(rounds=5, min_round_s=0.02)
    builder = builder or PlanBuilder(graph, threads=threads)
    sup = supports or default_supports(graph)
    from collage_farm.execute import measure_interleaved_rounds

    try:
        cur_ex = builder.executor(start)
        builder.check(cur_ex)
        cur_fn = cur_ex.timed_callable(builder.feeds(cur_ex))
    except Exception as e:
        return RefineResult(start, start, (), 0, time.perf_counter() - t0,
                            f"start failed: {type(e).__name__}: {str(e)[:200]}")
    cur = start
    log_: list[Trial] = []
    invalid = 0
    tried: set[frozenset] = {_signature(cur)}
    stopped = "exhausted"
    improved = True
    while improved:
        improved = False
        for mv in propose_moves(graph, cur, targets):
            if len(log_) >= trials:
                stopped = "trials"
                break
            if time.perf_counter() - t0 > time_budget_s:
                stopped = "time"
                break
            sig = _signature(mv.parts)
            if sig in tried:
                continue
            tried.add(sig)
            why = why_invalid(graph, mv.parts, pins, sup)
            if why is not None:
                invalid += 1
                continue
            ordered = order_parts(graph, mv.parts)
            assert ordered is not None
            try:
                ex = builder.executor(ordered)
                builder.check(ex)
                fn = ex.timed_callable(builder.feeds(ex))
                res = measure_interleaved_rounds({"current": cur_fn, "candidate": fn}, config)
            except Exception as e:
                log_.append(Trial(mv.kind, mv.description, "failed",
                                  error=f"{type(e).__name__}: {str(e)[:300]}"))
                continue
            a, b, cmp = _pair(res, config.rounds)
            confirm_config = config
            if (extend_rounds > 0 and not cmp.a_faster and cmp.pairs
                    and cmp.ratio < 1.0 - NOISE_FLOOR):
                try:  # looks faster, inside this run's noise: more rounds before deciding
                    more = measure_interleaved_rounds(
                        {"current": cur_fn, "candidate": fn},
                        dataclasses.replace(config, rounds=extend_rounds))
                except Exception:  # ran once, fails now: decided on the first run
                    more = None
                if more is not None:
                    res = _pooled(res, more)
                    a, b, cmp = _pair(res, config.rounds + extend_rounds)
                    confirm_config = dataclasses.replace(
                        config, rounds=config.rounds + extend_rounds)
            ok = cmp.a_faster
            if ok:  # confirm in a second interleaved run: one run's win can be this VM's drift
                try:
                    again = measure_interleaved_rounds({"current": cur_fn, "candidate": fn},
                                                       confirm_config)
                except Exception:  # ran once, fails now: not a move to keep
                    ok = False
                else:
                    a2, b2, cmp2 = _pair(again, confirm_config.rounds)
                    ok = cmp2.a_faster
                    if not ok:  # the log shows the run that decided
                        a, b, cmp = a2, b2, cmp2
            thr = cmp.threshold
            log_.append(Trial(mv.kind, mv.description, "accepted" if ok else "rejected",
                              a.median, b.median, thr, ratio=cmp.ratio, pairs=cmp.pairs))
            log.info("refine: %s: %.4f -> %.4f ms (%s)", mv.description, a.median * 1e3,
                     b.median * 1e3, "kept" if ok else "not beyond noise")
            if ok:
                cur, cur_fn = tuple(ordered), fn
                improved = True
                break
        else:
            continue
        if stopped in ("trials", "time"):
            break
    return RefineResult(start, tuple(cur), tuple(log_), invalid, time.perf_counter() - t0,
                        stopped)


def _pooled(first: Any, more: Any) -> Any:
    """Two interleaved runs as one: round medians concatenated (each pair stays within one
    turn of one rotation), summaries from the longer evidence's second run."""
    from collage_farm.execute import Interleaved

    rounds = {k: (*first.rounds.get(k, ()), *more.rounds.get(k, ()))
              for k in set(first.rounds) | set(more.rounds)}
    return Interleaved(more.summaries, rounds)


def _pair(res: Any, rounds: int) -> tuple[Summary, Summary, Paired]:
    """current, candidate, and the candidate against the current (`paired`)."""
    a, b = res.summaries["current"], res.summaries["candidate"]
    return a, b, paired(b, a, res.rounds.get("candidate", ()), res.rounds.get("current", ()),
                        rounds)


# ----------------------------------------------------------------------------------------
# never worse


@dataclass(frozen=True)
class VerifyResult:
    """Plans and single-toolchain whole models, checked and timed in one interleaved run."""

    summaries: dict[str, Summary]  # name -> summary (plans by name, singles by target id)
    errors: dict[str, str]  # name -> why it could not be checked or run
    singles: tuple[str, ...]  # the names that are single-target whole models
    rounds: int
    check_errors: dict[str, dict[str, float]] = field(default_factory=dict)
    round_medians: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # single -> why it may not be the output plan (pins keep a node off its target); such a
    # whole model is still timed, for information, but never chosen as the fallback
    ineligible: dict[str, str] = field(default_factory=dict)

    def median(self, name: str) -> float | None:
        s = self.summaries.get(name)
        return s.median if s is not None else None

    @property
    def best_single(self) -> str | None:
        """The fastest single-target whole model that ran and that the pins allow."""
        ok = [n for n in self.singles if n in self.summaries and n not in self.ineligible]
        return min(ok, key=lambda n: self.summaries[n].median) if ok else None

    def compare(self, a: str, b: str) -> Paired:
        """``a`` against ``b``, round by round (`paired`)."""
        return paired(self.summaries[a], self.summaries[b], self.round_medians.get(a, ()),
                      self.round_medians.get(b, ()), self.rounds)

    def beats(self, name: str, other: str) -> bool:
        """``name`` faster than ``other`` beyond noise."""
        return self.compare(name, other).a_faster

    def threshold(self, a: str, b: str) -> float:
        return self.compare(a, b).threshold


def verify(graph: DataflowGraph, plans: Mapping[str, Sequence[Part]],
           targets: Sequence[Target], *, config: MeasureConfig | None = None,
           threads: int = 1, builder: PlanBuilder | None = None,
           pins: Any = None) -> VerifyResult:
    """Check every plan and every target's whole model, then time them all interleaved.

    Plans identical to another entry are timed once (aliases share the summary). A plan or
    whole model that fails to build, run or match the reference is left out with its error.
    A whole model that ``pins`` (a `collage_farm.core.pins.PinSet`) forbid is timed but marked
    `VerifyResult.ineligible`, so it is never `best_single`: the never-worse fallback must
    still honour the user's pins.
    """
    config = config or MeasureConfig(rounds=7, min_round_s=0.05)
    builder = builder or PlanBuilder(graph, threads=threads)
    entries: dict[str, tuple[Part, ...]] = {k: tuple(v) for k, v in plans.items()}
    singles = []
    ineligible: dict[str, str] = {}
    for t in targets:
        if t.toolchain in SIMULATED:
            continue
        entries[t.id] = (Part(graph.all_mask, t),)
        singles.append(t.id)
        if pins:
            banned = next((n.name for n in graph.nodes if not pins.allowed(n, t)), None)
            if banned is not None:
                ineligible[t.id] = f"pins keep {banned} off {t.id}"
    from collage_farm.execute import measure_interleaved_rounds

    fns: dict[str, Callable[[], None]] = {}
    errors: dict[str, str] = {}
    checks: dict[str, dict[str, float]] = {}
    alias: dict[str, str] = {}
    by_sig: dict[frozenset, str] = {}
    for name, parts in entries.items():
        sig = _signature(parts)
        if sig in by_sig:
            alias[name] = by_sig[sig]
            continue
        by_sig[sig] = name
        try:
            ordered = order_parts(graph, parts)
            if ordered is None:
                raise ValueError("partitions depend on each other in a cycle")
            ex = builder.executor(ordered)
            checks[name] = builder.check(ex)
            fns[name] = ex.timed_callable(builder.feeds(ex))
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {str(e)[:300]}"
    run = measure_interleaved_rounds(fns, config) if fns else None
    summaries = dict(run.summaries) if run else {}
    per_round = dict(run.rounds) if run else {}
    for name, src in alias.items():
        if src in summaries:
            summaries[name] = summaries[src]
            per_round[name] = per_round.get(src, ())
            checks[name] = checks.get(src, {})
        elif src in errors:
            errors[name] = errors[src]
    return VerifyResult(summaries, errors, tuple(singles), max(1, config.rounds), checks,
                        per_round, ineligible)


# ----------------------------------------------------------------------------------------
# back to search results (so make_plan / write_plan write any of these plans)


def to_search_result(graph: DataflowGraph, parts: Sequence[Part], base: SearchResult, *,
                     estimate: Callable[[list[CandidatePartition]], list[Cost]] | None = None,
                     transition: TransitionModel | None = None, rule: str = "refine"
                     ) -> SearchResult:
    """``parts`` as a `SearchResult`: partitions the search chose keep their cost, penalty and
    alternatives; new ones are costed by ``estimate`` (the campaign's estimator; unknown when
    absent) and charged the search's penalty. Statistics are the base search's."""
    transition = transition or AnalyticTransitionModel()
    ordered = order_parts(graph, parts)
    if ordered is None:
        raise ValueError("partitions depend on each other in a cycle")
    known = {(p.candidate.mask, p.candidate.target.id): (p, base.alternatives[k]
             if k < len(base.alternatives) else ())
             for k, p in enumerate(base.partitions)}
    new: list[CandidatePartition] = []
    for p in ordered:
        if (p.mask, p.target.id) not in known:
            new.append(CandidatePartition(SubGraph(graph, p.mask), p.target, rule=rule))
    costs: dict[int, Cost] = {}
    if new:
        got: list[Cost] = []
        if estimate is not None:
            try:
                got = list(estimate(new))
            except Exception as e:  # a missing cost must not lose the measured plan
                log.warning("refine: could not estimate %d new partitions: %s", len(new), e)
        for c, cost in zip(new, got or [Cost.unknown()] * len(new)):
            costs[id(c)] = cost
    planned: list[PlannedPartition] = []
    alts = []
    it = iter(new)
    for p in ordered:
        hit = known.get((p.mask, p.target.id))
        if hit is not None:
            planned.append(hit[0])
            alts.append(hit[1])
            continue
        c = next(it)
        planned.append(PlannedPartition(c, costs[id(c)], static_penalty_s(graph, c, transition)))
        alts.append(())
    total = sum(pp.cost.seconds + pp.penalty_s for pp in planned)
    return dataclasses.replace(base, partitions=tuple(planned), total_s=total,
                               alternatives=tuple(alts))
