"""Refine a Dijkstra plan with measured end-to-end latency: first-improvement hill climbing.

Why: the search adds isolated candidate costs plus a transition model, and on CPUs that sum is
off by more than the mixing gain (mixing ORT and OpenVINO, estimates promised up to 9% while
no mix beat the best single toolchain end to end, 0.87-1.00x; each cut costs OpenVINO
130-650 us on CNNs). The Collage paper's answer is a graph-level step that optimises the real
objective; this module takes it with the heterogeneous executor (`collage_farm.execute`).

`refine` tries the local moves of the plan (`collage_farm.postsearch.moves.propose_moves`) in
order. Each move is checked for validity first (`moves.why_invalid`), then run (numerics
against the whole model in ONNX Runtime CPU) and timed interleaved with the current plan in
one run. It is kept only when faster **beyond noise** (`collage_farm.postsearch.noise`),
twice: in that run and in a second interleaved run (on a shared VM one run's win can be drift:
mnist accepted a move at 0.038 -> 0.036 ms that ran 0.055 ms in the final never-worse run).
The budget is a trial count and a wall-clock limit. Simulated partitions (Ethos-U) are left as
they are: they have no measured latency to improve. A caller with a cheap estimate of a whole
plan (profile mode's estimator, which measures nothing) can pass ``skip``: a move it names a
reason for is not run (``skipped_by_estimate`` counts them, and the reasons are logged), e.g.
one estimated far slower than the current plan, a gain no noise could turn into a win. A
caller that times some plans anyway after refinement (the never-worse run times every
target's whole model against the plan) passes ``timed_later``: a move whose plan it names a
reason for is not run either (``skipped_timed_later`` counts them).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# the module, not its function: measure_interleaved_rounds is looked up at call time, so tests
# can script the timings
from collage_farm import execute
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.pins import PinSet
from collage_farm.core.target import Target
from collage_farm.execute import Interleaved
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.execute.interleaved import plan_round_config
from collage_farm.postsearch.moves import (
    default_supports,
    order_parts,
    plan_signature,
    propose_moves,
    why_invalid,
)
from collage_farm.postsearch.noise import NOISE_FLOOR, Paired, paired
from runners.base import MeasureConfig, Summary

log = logging.getLogger(__name__)

__all__ = ["RefineResult", "Trial", "refine"]


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
    skipped_by_estimate: int = 0  # moves not run: ``skip`` gave a reason
    skipped_timed_later: int = 0  # moves not run: ``timed_later`` gave a reason

    @property
    def changed(self) -> bool:
        return plan_signature(self.start) != plan_signature(self.parts)

    @property
    def accepted(self) -> int:
        return sum(t.status == "accepted" for t in self.trials)

    def to_json(self) -> dict:
        return {"trials": len(self.trials), "accepted": self.accepted,
                "invalid_skipped": self.invalid_skipped, "elapsed_s": self.elapsed_s,
                "skipped_by_estimate": self.skipped_by_estimate,
                "skipped_timed_later": self.skipped_timed_later,
                "stopped_by": self.stopped_by, "changed": self.changed,
                "partitions_before": len(self.start), "partitions_after": len(self.parts),
                "log": [t.to_json() for t in self.trials]}


def refine(graph: DataflowGraph, start: Sequence[Part], targets: Sequence[Target], *,
           trials: int = 6, time_budget_s: float = 120.0, config: MeasureConfig | None = None,
           threads: int = 1, pins: PinSet | None = None, builder: PlanBuilder | None = None,
           supports: Callable[[Target, int], bool] | None = None,
           extend_rounds: int = 0,
           skip: Callable[[Sequence[Part], Sequence[Part]], str | None] | None = None,
           timed_later: Callable[[Sequence[Part]], str | None] | None = None
           ) -> RefineResult:
    """Hill-climb from ``start`` with measured end-to-end latency (see module doc).

    At most ``trials`` moves are run and timed (invalid moves are skipped without running and
    do not count), and no new trial starts after ``time_budget_s``. Never raises for a move
    that fails to build or run: it becomes a ``failed`` trial. A move that looks faster than
    the 3% floor but not beyond noise gets ``extend_rounds`` more rounds, pooled with the
    first run's pairs, before it is decided (its second run is then as long). ``skip``
    (current parts, move's parts) -> a reason not to run the move, or None; a skipped move
    does not count as a trial. ``timed_later`` (move's parts) -> a reason the caller times
    that plan anyway after refinement, or None; such a move is not run nor counted either.
    """
    t0 = time.perf_counter()
    start = tuple(start)
    if trials <= 0:
        return RefineResult(start, start, (), 0, 0.0, "disabled")
    config = config or plan_round_config(5)
    builder = builder or PlanBuilder(graph, threads=threads)
    sup = supports or default_supports(graph)
    # the start plan is built and checked when the first move is timed against it: a plan
    # whose every move is skipped or left to a later run builds nothing here
    cur_fn: Callable[[], None] | None = None
    cur = start
    log_: list[Trial] = []
    invalid = 0
    skipped = later = 0
    tried: set[frozenset] = {plan_signature(cur)}
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
            sig = plan_signature(mv.parts)
            if sig in tried:
                continue
            tried.add(sig)
            if why_invalid(graph, mv.parts, pins, sup) is not None:
                invalid += 1
                continue
            why_later = timed_later(mv.parts) if timed_later is not None else None
            if why_later:
                later += 1
                log.info("refine: %s not run: %s", mv.description, why_later)
                continue
            why_not = skip(cur, mv.parts) if skip is not None else None
            if why_not:
                skipped += 1
                log.info("refine: %s not run: %s", mv.description, why_not)
                continue
            ordered = order_parts(graph, mv.parts)
            assert ordered is not None
            if cur_fn is None:
                try:
                    cur_fn = _timed(builder, start)
                except Exception as e:
                    return RefineResult(start, start, (), invalid, time.perf_counter() - t0,
                                        f"start failed: {type(e).__name__}: {str(e)[:200]}",
                                        skipped, later)
            try:
                fn = _timed(builder, ordered)
                res = execute.measure_interleaved_rounds({"current": cur_fn, "candidate": fn},
                                                         config)
            except Exception as e:
                log_.append(Trial(mv.kind, mv.description, "failed",
                                  error=f"{type(e).__name__}: {str(e)[:300]}"))
                continue
            a, b, cmp, ok = _decide(res, cur_fn, fn, config, extend_rounds)
            log_.append(Trial(mv.kind, mv.description, "accepted" if ok else "rejected",
                              a.median, b.median, cmp.threshold, ratio=cmp.ratio,
                              pairs=cmp.pairs))
            log.info("refine: %s: %.4f -> %.4f ms, per-round ratio %.3f (%s)", mv.description,
                     a.median * 1e3, b.median * 1e3, cmp.ratio,
                     "kept" if ok else "rejected: slower" if cmp.ratio > 1 + cmp.threshold
                     else "rejected: not faster beyond noise")
            if ok:
                cur, cur_fn = tuple(ordered), fn
                improved = True
                break
        else:
            continue
        if stopped in ("trials", "time"):
            break
    return RefineResult(start, tuple(cur), tuple(log_), invalid, time.perf_counter() - t0,
                        stopped, skipped, later)


def _timed(builder: PlanBuilder, parts: Sequence[Part]) -> Callable[[], None]:
    """``parts`` built, checked against the whole model, and bound to the builder's feeds."""
    ex = builder.executor(parts)
    builder.check(ex)
    return ex.timed_callable(builder.feeds(ex))


def _decide(res: Interleaved, cur_fn: Callable[[], None], fn: Callable[[], None],
            config: MeasureConfig, extend_rounds: int
            ) -> tuple[Summary, Summary, Paired, bool]:
    """Current, candidate, the deciding comparison, and whether the candidate is kept.

    ``res`` is the first interleaved run. A candidate that looks faster than the floor but not
    beyond noise gets ``extend_rounds`` more rounds, pooled with the first run's. A candidate
    faster beyond noise must be faster in a second interleaved run as long as the evidence so
    far; when it is not, that run's figures are the ones returned (they decided).
    """
    fns = {"current": cur_fn, "candidate": fn}
    a, b, cmp = _pair(res, config.rounds)
    second_config = config
    if (extend_rounds > 0 and not cmp.a_faster and cmp.pairs
            and cmp.ratio < 1.0 - NOISE_FLOOR):
        try:  # looks faster, inside this run's noise: more rounds before deciding
            more = execute.measure_interleaved_rounds(
                fns, dataclasses.replace(config, rounds=extend_rounds))
        except Exception:  # ran once, fails now: decided on the first run
            more = None
        if more is not None:
            res = _pooled(res, more)
            a, b, cmp = _pair(res, config.rounds + extend_rounds)
            second_config = dataclasses.replace(config, rounds=config.rounds + extend_rounds)
    if not cmp.a_faster:
        return a, b, cmp, False
    try:  # a second interleaved run: one run's win can be this VM's drift
        again = execute.measure_interleaved_rounds(fns, second_config)
    except Exception:  # ran once, fails now: not a move to keep
        return a, b, cmp, False
    a2, b2, cmp2 = _pair(again, second_config.rounds)
    if not cmp2.a_faster:  # the log shows the run that decided
        return a2, b2, cmp2, False
    return a, b, cmp, True


def _pooled(first: Interleaved, more: Interleaved) -> Interleaved:
    """Two interleaved runs as one: round medians concatenated (each pair stays within one
    turn of one rotation), summaries from the longer evidence's second run."""
    rounds = {k: (*first.rounds.get(k, ()), *more.rounds.get(k, ()))
              for k in set(first.rounds) | set(more.rounds)}
    return Interleaved(more.summaries, rounds)


def _pair(res: Interleaved, rounds: int) -> tuple[Summary, Summary, Paired]:
    """current, candidate, and the candidate against the current (`paired`)."""
    a, b = res.summaries["current"], res.summaries["candidate"]
    return a, b, paired(b, a, res.rounds.get("candidate", ()), res.rounds.get("current", ()),
                        rounds)
