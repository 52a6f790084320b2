"""After the search of a measured campaign: refine the plan, then keep it only if never worse.

`post_search` refines the Dijkstra plan with measured local moves
(`collage_farm.postsearch.refine`), then times the Dijkstra plan, the refined plan and every
searched target's whole model in one interleaved run (`collage_farm.postsearch.never_worse`).
The mix is written only if it beats the best single toolchain beyond noise
(`collage_farm.postsearch.noise`), else that toolchain's whole model is (never worse). The
campaign passes what these steps need of its options as a `PostSearchOptions`; a campaign
whose estimator prices any plan without measuring (profile mode) passes `for_profile_mode`'s:
its never-worse run stops once the decision is clear and its refinement skips moves priced far
slower than the current plan. `PostSearch.phases_s` says where the seconds went.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from collage_farm.core.calibration_data import CalibrationData
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.phases import PhaseClock
from collage_farm.core.pins import PinSet
from collage_farm.core.search import SearchResult
from collage_farm.core.target import Target
from collage_farm.core.transition import TransitionModel
from collage_farm.execute import SIMULATED_TOOLCHAINS
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.execute.interleaved import plan_round_config
from collage_farm.postsearch import never_worse
from collage_farm.postsearch.moves import parts_of, plan_signature, to_search_result
from collage_farm.postsearch.never_worse import VerifyResult
from collage_farm.postsearch.refine import refine
from collage_farm.postsearch.vela_whole import ethos_u_board, exact_never_worse
from estimators.base import CostEstimator
from estimators.profiled import ProfiledEstimator
from runners.base import MeasureConfig

log = logging.getLogger(__name__)

__all__ = ["PROFILE_REFINE_SKIP_LOSS", "PROFILE_VERIFY_MIN_ROUNDS", "PostSearch",
           "PostSearchOptions", "for_profile_mode", "post_search"]

#: profile mode: the never-worse run may stop from this many rounds on (`for_profile_mode`)
PROFILE_VERIFY_MIN_ROUNDS = 4
#: profile mode: refinement does not run a move estimated this much slower than the current
#: plan: above the profile estimate's usual additive error on whole plans (2-11% in the bench
#: runs; the worst seen was +33%) plus the 3% noise floor, so a run would rarely keep it
PROFILE_REFINE_SKIP_LOSS = 0.15


@dataclass(frozen=True)
class PostSearchOptions:
    """What the steps after the search need of a campaign's options."""

    targets: tuple[Target, ...]  # the searched targets (their whole models are the singles)
    pins: PinSet | None  # the user's pins: every move and the fallback must honour them
    verify: bool  # never worse: the plan against each single toolchain, end to end
    refine_trials: int  # measured local moves; 0 disables
    refine_time_s: float  # no new refinement trial starts after this
    verify_rounds: int  # interleaved rounds of the never-worse run (at least 3)
    # a mix that looks faster (ratio < 1 - 3%) but not beyond noise gets this many more
    # interleaved rounds against the best single before the decision; 0 disables
    verify_extend_rounds: int
    report: bool  # time each partition of the written plan for the report
    # > 0: the never-worse run stops from this many rounds on once its decision is clear
    # (`never_worse.decision_is_clear`; ``verify_rounds`` is then the upper limit); 0: all
    verify_min_rounds: int = 0
    # > 0, with a `ProfiledEstimator` (estimates measure nothing): a refinement move whose
    # plan is estimated slower than the current plan by more than this share is not run
    refine_skip_loss: float = 0.0
    # the campaign's int8 samples (an Ethos-U board's Vela whole is compiled with their
    # ranges); None: seeded random
    calibration: CalibrationData | None = None


@dataclass(frozen=True)
class PostSearch:
    """What happened after the search: the plan to write and the figures to report."""

    result: SearchResult
    info: dict  # summary keys (plan_measured_s, best_single_target, ...)
    measured: dict  # for the report (`report.write_report`'s ``measured``)
    elapsed_s: float
    #: wall seconds of each step (refine, never_worse, drift, partition_timing); they add up
    #: to ``elapsed_s``
    phases_s: dict[str, float] = field(default_factory=dict)


def for_profile_mode(opts: PostSearchOptions) -> PostSearchOptions:
    """``opts`` for a campaign whose estimator prices any plan without measuring (profile
    mode): the never-worse run stops once its decision is clear, and refinement skips moves
    estimated far slower than the current plan. Exhaustive campaigns keep ``opts`` as is."""
    return dataclasses.replace(opts, verify_min_rounds=PROFILE_VERIFY_MIN_ROUNDS,
                               refine_skip_loss=PROFILE_REFINE_SKIP_LOSS)


class Kept(enum.Enum):
    """Which plan the never-worse check keeps."""

    PLAN = "plan"  # the mix (Dijkstra or refined)
    BEST_SINGLE = "best_single"  # the best single toolchain's whole model


def post_search(opts: PostSearchOptions, graph: DataflowGraph, result: SearchResult,
                est: CostEstimator, transition: TransitionModel,
                builder: PlanBuilder | None = None) -> PostSearch:
    """Refine the Dijkstra plan with measured moves, then keep it only if never worse.

    The Dijkstra plan, the refined plan (when a move was kept) and every searched target's
    whole model are numerically checked and timed interleaved in one run
    (`collage_farm.postsearch.never_worse.verify`). The mix (refined, unless the Dijkstra plan
    beat it beyond noise in this run) is kept only when it beats the best single toolchain
    beyond noise (`collage_farm.postsearch.noise`: 3% floor); otherwise the output plan is the
    best single toolchain's whole model, and the summary says so with both figures.

    On a simulated Ethos-U board (NPU + Cortex-M host targets only) nothing can be timed here:
    the plan is compared exactly with Vela's own partitioning of the model instead
    (`collage_farm.postsearch.vela_whole.exact_never_worse`).
    """
    clock = PhaseClock()
    board = ethos_u_board(opts.targets)
    if board is not None and opts.verify:  # simulated board: exact, against Vela whole
        out, info = exact_never_worse(graph, board, result, est, transition,
                                      opts.calibration)
        clock.lap("never_worse")
        return PostSearch(out, info, {}, clock.wall_s, dict(clock.phases))
    builder = builder or PlanBuilder(graph, threads=1)  # the campaign's: sessions reused
    start = parts_of(result)
    ref = refine(graph, start, opts.targets, trials=opts.refine_trials,
                 time_budget_s=opts.refine_time_s,
                 config=plan_round_config(5), pins=opts.pins,
                 builder=builder, extend_rounds=opts.verify_extend_rounds,
                 skip=_estimated_loser(graph, result, est, transition, opts.refine_skip_loss),
                 timed_later=_timed_anyway(graph, opts))
    refined_result = result
    if ref.changed:
        refined_result = to_search_result(graph, ref.parts, result, estimate=est.estimate,
                                          transition=transition)
    clock.lap("refine")
    info: dict = {"refine": ref.to_json()}
    skipped = _not_verified(opts, refined_result)
    if skipped:
        info.update(skipped)
        return PostSearch(refined_result, info, {}, clock.wall_s,
                          dict(clock.phases))

    plans = {"dijkstra": start}
    if ref.changed:
        plans["refined"] = list(ref.parts)
    rounds = max(3, opts.verify_rounds)
    v = never_worse.verify(graph, plans, opts.targets,
                           config=plan_round_config(rounds),
                           builder=builder, pins=opts.pins, min_rounds=opts.verify_min_rounds)
    med = v.median
    mix, mix_result = "dijkstra", result
    if "refined" in v.summaries and not ("dijkstra" in v.summaries
                                         and v.beats("dijkstra", "refined")):
        mix, mix_result = "refined", refined_result
    info.update({
        "singles_measured_s": {n: med(n) for n in v.singles if n in v.summaries},
        "dijkstra_measured_s": med("dijkstra"),
        "refined_measured_s": med("refined") if ref.changed else None,
        "refine_gain": (med("dijkstra") / med("refined") - 1.0
                        if ref.changed and med("refined") and med("dijkstra") else None),
        "verify_errors": dict(v.errors),
        "verify_rounds": v.rounds,  # fewer than asked when the decision was clear early
        "verify_rounds_limit": rounds,
        "singles_ineligible": dict(v.ineligible),
        # each plan's and whole model's round medians in this run, in round order: the
        # written plan is compared with each of them round by round (`noise.paired`)
        "verify_round_medians_s": {n: list(r) for n, r in v.round_medians.items()},
    })
    kept, note = _keep(opts, graph, v, mix, mix_result, plans[mix], builder, rounds, info)
    best = v.best_single
    out_result = mix_result
    if kept is Kept.BEST_SINGLE:
        assert best is not None
        target = next(t for t in opts.targets if t.id == best)
        out_result = to_search_result(graph, [Part(graph.all_mask, target)], result,
                                      estimate=est.estimate, transition=transition,
                                      rule="best-single")
    info.update(_plan_figures(v, result, out_result, mix, kept, note))
    clock.lap("never_worse")
    info.update(_drift_diagnostics(graph, result, v, opts.targets, est, transition))
    clock.lap("drift")
    measured = _for_report(info, builder, out_result, opts.report)
    clock.lap("partition_timing")
    return PostSearch(out_result, info, measured, clock.wall_s, dict(clock.phases))


def _timed_anyway(graph: DataflowGraph, opts: PostSearchOptions
                  ) -> Callable[[Sequence[Part]], str | None] | None:
    """`refine`'s ``timed_later`` for a move whose plan is one searched target's whole model: the
    never-worse run times every such whole model against the plan and writes the fastest
    single toolchain unless the plan beats it beyond noise, so a refinement trial of it (a
    1-partition plan's only moves are these switches) would decide nothing that run does not.
    None when there is no never-worse run (``opts.verify`` off)."""
    if not opts.verify:
        return None
    singles = {t.id for t in opts.targets if t.toolchain not in SIMULATED_TOOLCHAINS}

    def later(move: Sequence[Part]) -> str | None:
        if len(move) == 1 and move[0].mask == graph.all_mask and move[0].target.id in singles:
            return (f"{move[0].target.id}'s whole model is timed against the plan in the "
                    "never-worse run")
        return None
    return later


def _estimated_loser(graph: DataflowGraph, result: SearchResult, est: CostEstimator,
                     transition: TransitionModel, loss: float
                     ) -> Callable[[Sequence[Part], Sequence[Part]], str | None] | None:
    """`refine`'s ``skip``: a move estimated more than ``loss`` slower than the current plan,
    priced by a `ProfiledEstimator` (the shares it was searched with; a move touching a
    target without a profile is run, never priced: that would measure). None when ``loss``
    is 0 or the estimator is not one."""
    if loss <= 0 or not isinstance(est, ProfiledEstimator):
        return None
    known: dict[frozenset, float] = {}

    def plan_s(parts: Sequence[Part]) -> float:
        sig = plan_signature(parts)
        if sig not in known:
            known[sig] = to_search_result(graph, list(parts), result, estimate=est.estimate,
                                          transition=transition).total_s
        return known[sig]

    def skip(cur: Sequence[Part], move: Sequence[Part]) -> str | None:
        if any(p.target.id not in est.profiles for p in move):
            return None
        a, b = plan_s(cur), plan_s(move)
        if math.isfinite(a) and math.isfinite(b) and a > 0 and b > a * (1.0 + loss):
            return (f"profile estimate {b * 1e3:.4f} ms is {b / a - 1:+.0%} against the "
                    f"current plan's {a * 1e3:.4f} ms (more than {loss:.0%})")
        return None
    return skip


def _not_verified(opts: PostSearchOptions, plan: SearchResult) -> dict:
    """The summary keys that say why the plan is not checked end to end; empty when it is."""
    if not opts.verify:
        return {"verify": "skipped (--no-verify)"}
    simulated = sorted({p.candidate.target.id for p in plan.partitions
                        if p.candidate.target.toolchain in SIMULATED_TOOLCHAINS})
    if not simulated:
        return {}
    # part of the plan runs on a device this machine only simulates
    why = (f"skipped: partitions on {', '.join(simulated)} are simulated "
           "(Vela's estimate), so the plan cannot be timed end to end here; "
           "`collage-farm run` reports its measured and simulated parts")
    return {"verify": why, "never_worse": "not checked: " + why}


def _keep(opts: PostSearchOptions, graph: DataflowGraph, v: VerifyResult, mix: str,
                 mix_result: SearchResult, mix_parts: Sequence[Part], builder: PlanBuilder,
                 rounds: int, info: dict) -> tuple[Kept, str]:
    """Which plan to keep and the sentence that says why; the comparisons go into ``info``.

    Failures are data: a plan that did not run gives way to the best single toolchain, and
    with no single toolchain to compare against (none ran, or the pins allow none) the plan
    is kept and the sentence says it is unverified against one.
    """
    best = v.best_single
    if v.median(mix) is None and best is None:
        return Kept.PLAN, (f"UNVERIFIED: neither the plan nor any single toolchain ran here: "
                           f"{'; '.join(f'{k}: {e}' for k, e in v.errors.items())[:600]}")
    if v.median(mix) is None:
        assert best is not None
        return Kept.BEST_SINGLE, (f"the plan failed to run or to match the model "
                                  f"({v.errors.get(mix, '?')}); the output is the whole model "
                                  f"on {best}")
    if best is None:
        why = ("no single toolchain that the pins allow ran the whole model ("
               + "; ".join(v.ineligible.values()) + ")" if v.ineligible
               else "no single toolchain ran the whole model")
        return Kept.PLAN, f"{why}; the plan is kept unverified against one"
    single = (len(mix_result.partitions) == 1
              and mix_result.partitions[0].candidate.mask == graph.all_mask)
    whole = single and mix_result.partitions[0].candidate.target.id == best
    if single and not whole:  # another toolchain's whole model than the fastest median's
        return _whole_against_best(v, mix, mix_result.partitions[0].candidate.target.id, best,
                                   info)
    return _against_best(opts, graph, v, mix, mix_parts, best, whole, builder, rounds, info)


def _whole_against_best(v: VerifyResult, mix: str, target: str, best: str,
                        info: dict) -> tuple[Kept, str]:
    """A plan that is one toolchain's whole model against the single toolchain with the
    fastest median: it gives way only to one faster beyond noise. Swapping one whole model
    for another within noise of it trades the search's choice for one run's ordering: on
    resnet18-64 the never-worse run once put OpenVINO 1% ahead of the Dijkstra plan's LiteRT
    (paired, LiteRT 0.8% ahead), and the two ran 1.18x apart the other way minutes later."""
    cmp = v.compare(best, mix)  # best / plan
    info["noise_threshold"] = cmp.threshold
    info["mix_vs_best_single"] = v.compare(mix, best).to_json()
    mix_s, best_s = v.median(mix), v.median(best)
    assert mix_s is not None and best_s is not None
    if cmp.a_faster:
        return Kept.BEST_SINGLE, (
            f"the plan, {target}'s whole model ({mix_s * 1e3:.4f} ms measured), is slower "
            f"than {best}'s ({best_s * 1e3:.4f} ms) beyond noise (per-round ratio "
            f"{1 / cmp.ratio if cmp.ratio else math.inf:.3f}, noise {cmp.threshold:.1%}): the "
            f"output plan is {best}'s whole model")
    info["within_noise_of_best_single"] = True
    return Kept.PLAN, (
        f"the plan is {target}'s whole model ({mix_s * 1e3:.4f} ms measured), within noise of "
        f"the fastest single toolchain {best} ({best_s * 1e3:.4f} ms; per-round ratio "
        f"{1 / cmp.ratio if cmp.ratio else math.inf:.3f}, noise {cmp.threshold:.1%}): a whole "
        "model gives way only to one faster beyond noise")


def _against_best(opts: PostSearchOptions, graph: DataflowGraph, v: VerifyResult, mix: str,
                  mix_parts: Sequence[Part], best: str, whole: bool, builder: PlanBuilder,
                  rounds: int, info: dict) -> tuple[Kept, str]:
    """The mix against the best single toolchain: extended where undecided, and a win must
    hold in a second interleaved run."""
    cmp = v.compare(mix, best)
    second_rounds = rounds
    if never_worse.should_extend(cmp, whole, opts.verify_extend_rounds):
        # looks faster, not beyond this run's noise: measure more before deciding (the
        # threshold shrinks with sqrt(rounds); the mix must still win a second run)
        more = never_worse.extend(graph, mix_parts, opts.targets, best,
                                  opts.verify_extend_rounds, builder, v, mix)
        if more is not None:
            info["mix_vs_best_single_first"] = cmp.to_json()
            cmp = more
            second_rounds = rounds + opts.verify_extend_rounds
    thr = cmp.threshold
    info["noise_threshold"] = thr
    info["mix_vs_best_single"] = cmp.to_json()
    wins = not whole and cmp.a_faster
    if wins:  # one run's win can be this VM's drift: the mix must win a second run too
        again = never_worse.second_run(graph, mix_parts, opts.targets, best, second_rounds,
                                       builder)
        info["mix_vs_best_single_confirm"] = again.to_json() if again else None
        if again is None or not again.a_faster:
            wins = False
            cmp = again or cmp
    mix_s, best_s = v.median(mix), v.median(best)
    assert mix_s is not None and best_s is not None
    if whole:
        return Kept.PLAN, f"the plan is the best single toolchain's ({best}) whole model"
    if wins:
        return Kept.PLAN, (f"the {'Dijkstra' if mix == 'dijkstra' else mix} plan beats the "
                           f"best single toolchain {best} beyond noise in "
                           f"two interleaved runs ({mix_s * 1e3:.4f} ms vs "
                           f"{best_s * 1e3:.4f} ms; per-round ratio {cmp.ratio:.3f}, noise "
                           f"{thr:.1%})")
    return Kept.BEST_SINGLE, (
        f"the {'Dijkstra' if mix == 'dijkstra' else mix} plan ({mix_s * 1e3:.4f} ms measured) "
        f"is not faster than the best "
        f"single toolchain {best} ({best_s * 1e3:.4f} ms) beyond noise "
        f"(per-round ratio {cmp.ratio:.3f}, noise {cmp.threshold:.1%}"
        f"{'' if cmp.pairs else ', unpaired'}"
        f"{'' if 'mix_vs_best_single_confirm' not in info else ', second run'}): "
        f"the output plan is {best}'s whole model")


def _plan_figures(v: VerifyResult, dijkstra: SearchResult, out_result: SearchResult, mix: str,
                  kept: Kept, note: str) -> dict:
    """The summary's figures of the written plan against the search's estimate and the best
    single toolchain."""
    med = v.median
    best = v.best_single
    out_name = mix if kept is Kept.PLAN else best
    plan_s = med(out_name) if out_name is not None else None
    best_s = med(best) if best else None
    mix_s = med(mix)
    est_s = out_result.total_s
    add_err = ((plan_s - est_s) / plan_s
               if plan_s and est_s is not None and math.isfinite(est_s) else None)
    d_s, d_est = med("dijkstra"), dijkstra.total_s
    return {
        "plan_measured_s": plan_s,
        "plan_is": "best_single" if kept is Kept.BEST_SINGLE else mix,
        "best_single_target": best,
        "best_single_measured_s": best_s,
        "speedup_vs_best_single": best_s / plan_s if best_s and plan_s else None,
        "mix_measured_s": mix_s,
        "apparent_loss": mix_s / best_s - 1.0 if mix_s and best_s else None,
        "additive_error": add_err,
        "dijkstra_additive_error": (d_s - d_est) / d_s if d_s and math.isfinite(d_est) else None,
        "never_worse": note,
    }


def _for_report(info: dict, builder: PlanBuilder, out_result: SearchResult,
                per_partition: bool) -> dict:
    """The figures `collage_farm.report.write_report` draws (its ``measured``), with each
    partition of the written plan timed when ``per_partition``."""
    measured = {
        "plan_measured_s": info["plan_measured_s"], "additive_error": info["additive_error"],
        "apparent_loss": info["apparent_loss"], "singles_s": info["singles_measured_s"],
        "best_single": info["best_single_target"], "never_worse": info["never_worse"],
        "plan_is": info["plan_is"], "dijkstra_measured_s": info["dijkstra_measured_s"],
        "refined_measured_s": info["refined_measured_s"], "refine": info["refine"],
        "mix_measured_s": info["mix_measured_s"],
    }
    if per_partition and len(out_result.partitions) == 1:
        # one partition is the whole plan: its figure is the plan's, from the same run
        measured["partition_measured_s"] = {"p000": info["plan_measured_s"]}
    elif per_partition:
        try:
            ex = builder.executor(parts_of(out_result),
                                  [p.cost.seconds for p in out_result.partitions])
            per = ex.measure_partitions(MeasureConfig(rounds=3, min_round_s=0.01))
            measured["partition_measured_s"] = per
        except Exception as e:
            log.warning("per-partition timing failed: %s", e)
    return measured


def _drift_diagnostics(graph: DataflowGraph, dijkstra: SearchResult, v: VerifyResult,
                       targets: Sequence[Target], est: CostEstimator,
                       transition: TransitionModel) -> dict:
    """What the search believed against what ran, split into drift and additivity.

    * ``singles_estimated_s``: each target's whole model as the search's estimator prices it
      (cost table or farm, the same path as every candidate; a missing row is measured now).
    * ``estimated_gain_vs_best_single``: the best of those the pins allow over the Dijkstra
      estimate, i.e. how much faster than one toolchain the search *believed* its mix to be.
      A mix cannot be expected to win by more end to end.
    * ``calibration``: measured / estimated per target, from the whole models of the verify
      run. It is the drift between the campaign and the verify run plus any runner-vs-executor
      offset, both of which scale every partition on that target alike.
    * ``dijkstra_calibrated_additive_error``: the Dijkstra plan's measured latency against its
      estimate with each partition scaled by its target's calibration: what is left is the
      non-additivity of the plan (cuts, cache interplay), which is what the search's ranking
      depends on.
    """
    out: dict = {}
    est_s: dict[str, float] = {}
    for t in targets:
        if t.id not in v.singles:
            continue
        try:
            r = to_search_result(graph, [Part(graph.all_mask, t)], dijkstra,
                                 estimate=est.estimate, transition=transition, rule="single")
        except Exception as e:  # a diagnostic: never costs the plan
            log.warning("whole-model estimate on %s failed: %s", t.id, e)
            continue
        if math.isfinite(r.total_s) and r.total_s > 0:
            est_s[t.id] = r.total_s
    out["singles_estimated_s"] = est_s
    d_est = dijkstra.total_s
    ok = math.isfinite(d_est) and d_est > 0
    allowed = [e for tid, e in est_s.items() if tid not in v.ineligible]  # what pins allow
    out["estimated_gain_vs_best_single"] = (min(allowed) / d_est if allowed and ok else None)
    cal = {}
    for tid, e in est_s.items():
        m = v.median(tid)
        if m:
            cal[tid] = m / e
    out["calibration"] = cal
    d_s = v.median("dijkstra")
    parts = dijkstra.partitions
    if d_s and ok and parts and all(p.candidate.target.id in cal for p in parts):
        scaled = sum((p.cost.seconds + p.penalty_s) * cal[p.candidate.target.id] for p in parts)
        out["dijkstra_calibrated_additive_error"] = (d_s - scaled) / d_s
    else:
        out["dijkstra_calibrated_additive_error"] = None
    return out


