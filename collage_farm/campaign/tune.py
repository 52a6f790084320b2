"""A tuning campaign: phases 1-4 end to end, with whatever estimator the user chose.

This is the one place that wires the pieces together: load the model into a `DataflowGraph`,
build each target's partition rules from its toolchain's capabilities (phase 1), collect
candidates (phase 2), run the Dijkstra search against a cost estimator (phase 3), and write the
plan (phase 4). Estimators are picked by the caller:

* ``farm`` (default): measure on runners through Ray (embedded local cluster unless an address
  is given), answering from the cost table first and writing every result to it;
* ``local``: the same, with the toolchains' own isolated runners in this process's reach instead
  of Ray (`estimators.local.LocalService`: for simulated boards, whose figures need no timing
  slot);
* ``offline``: the cost table only (no Ray), optionally filling gaps analytically;
* ``mock``: deterministic fake costs, labelled as such everywhere they appear.

After the search, a measured campaign (farm costs) first re-measures the candidates on the
chosen path and searches again until the path is made of re-measured candidates
(`collage_farm.postsearch.confirm`: the cheapest of thousands of noisy costs is biased low). It
then does not trust the sum of isolated costs (`collage_farm.postsearch.decide.post_search`):
it refines the plan with measured local moves (`collage_farm.postsearch.refine`) and then times
the Dijkstra plan, the refined plan and every searched target's whole model in one interleaved
run (`collage_farm.postsearch.never_worse`); the mix is written only if it beats the best
single toolchain beyond noise, else that toolchain's whole model is (never worse). Mock and
offline campaigns skip this and say so; so does a re-run whose search plan an earlier campaign
on the table decided on end to end (its decision row): it writes that campaign's plan, as an
offline search does, unless ``reconfirm``. Every campaign writes ``report.html`` beside the plan
unless told not to.

How candidates get costs is ``TuneOptions.measure`` (`estimators.profiled.MeasureStrategy`):
``profile`` profiles each target's whole model once per operator, in network
(`collage_farm.probes.profiles`; prefix differences where the toolchain's profiler is not
trusted, said in one warning line), answers every candidate from those profiles
(`estimators.profiled.ProfiledEstimator`: node shares on the cut-cost probe's time base plus
measured cut costs; no launch or hand-off charge on those targets, `CallsIncluded`: the shares
and the cut costs already hold them), so neither the search nor the confirmation step measures
a candidate in isolation; when the search's plan is a mix, its partitions are timed inside the
running plan in this process and priced by that, and the search runs again, up to
``inchain_rounds`` plans (`collage_farm.postsearch.inchain`; not on a re-run whose search plan
a campaign already decided on); ``screen_rounds`` > 0 measures the uncertain candidates on the
best plans (`collage_farm.postsearch.screen`). A target without a usable profile falls back to
isolated measurement, with one warning line in the summary. On a simulated Ethos-U board
``profile`` builds Vela's own split once per target instead
(`collage_farm.probes.board_profiles`), prices candidates by their operators' cycles there
(`estimators.board_profiled`), and after the search builds the chosen path's candidates and
searches again until the path is made of exact builds
(`collage_farm.postsearch.exact_confirm`), so the plan's figures and the exact comparison with
Vela whole are never estimates. ``exhaustive`` measures every candidate the search asks for in
isolation (the behaviour before profiles). Profile mode applies to the estimator the campaign
builds; a caller's own estimator is used as is.

On an Ethos-U board the written plan is then checked as ``run`` checks it (int8 numerics
against the fp32 model) and, while it fails, the board is searched again with 16-bit
activations (the NPU's, then the host's too) into the same ``--out``
(`collage_farm.campaign.accuracy`; summary key ``accuracy``); a 16x8 partition's crossings to
int8 ones pay the host's requantisation (`collage_farm.campaign.costs.with_requantise`).

The summary returned (and printed with ``--json``) is a plain dict, so scripts can rely on its
keys: ``estimated_total_s``, ``partitions``, ``candidates``, ``distinct_fingerprints``,
``search_s`` and the campaign statistics; measured campaigns add ``plan_measured_s``,
``best_single_target``, ``best_single_measured_s``, ``speedup_vs_best_single``,
``additive_error`` and the other figures of `post_search`. ``measure_mode`` is the cache mode
candidates are timed in (``network``, ``warm``, ``flush``); ``measure`` is how costs were got
(``profile`` | ``exhaustive``), ``profiled`` the profile runs sent to the farm now (beside
``measured``, the candidates measured in isolation), ``profile`` per target what the profiles
were and ``warnings``, ``screen`` what the screening measured, ``inchain`` what the in-chain
pricing timed and priced. ``plan_timing_host`` (a
measuring campaign's): per measured target the device this process times plans on against
the device its runner measures on, the targets where they differ and a warning line
(`collage_farm.campaign.timing_host`). ``phases_s`` is the wall time
per phase (`collage_farm.core.phases.PhaseClock`: ``load``, ``candidates``, ``farm_start``,
``transitions``, ``cut_costs``, ``profiles``, ``search``, ``screen``, ``confirm``, ``refine``,
``never_worse``, ``drift``, ``partition_timing``, ``close``, ``plan``, ``report``...), adding
up to ``wall_s``. A profile-mode campaign's steps after the search stop early where the
estimator settles it (`collage_farm.postsearch.decide.for_profile_mode`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from collage_farm.campaign.accuracy import (
    AccuracyVerdict,
    check_plan,
    needs_check,
    wider_targets,
)
from collage_farm.campaign.costs import (
    build_specs,
    choose_transition,
    farm_slots,
    make_estimator,
    measure_strategy,
    price_in_chain,
    profiled_estimator,
    start_probe_builds,
    with_cut_costs,
    with_requantise,
)
from collage_farm.campaign.decisions import (
    already_decided,
    record_decision,
    reuse_decision,
)
from collage_farm.campaign.options import (
    TuneOptions,
    campaign_table,
    post_search_options,
)
from collage_farm.campaign.timing_host import plan_timing_host
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.estimator import EstimatorKind
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.phases import PhaseClock
from collage_farm.core.pins import filter_candidates
from collage_farm.core.plan import Plan, PlanError, make_plan, write_plan
from collage_farm.core.rules import all_candidates
from collage_farm.core.search import NoCoverError, SearchResult, search
from collage_farm.core.target import Target
from collage_farm.core.transition import CallsIncluded, rebased
from collage_farm.costtable import CostTable
from collage_farm.costtable.decisions import (
    PlanDecision,
)
from collage_farm.execute import CALIBRATION_KEY
from collage_farm.execute.builder import PlanBuilder
from collage_farm.postsearch.confirm import confirm
from collage_farm.postsearch.decide import PostSearch, for_profile_mode, post_search
from collage_farm.postsearch.ethos_parts import with_ethos_figures
from collage_farm.postsearch.exact_confirm import confirm_exact
from collage_farm.postsearch.inchain import single_instead
from collage_farm.postsearch.screen import screen
from collage_farm.postsearch.vela_whole import (
    baseline_candidates,
    ethos_u_board,
    profile_candidates,
)
from collage_farm.probes.board_profiles import board_profiled
from collage_farm.report import write_report
from collage_farm.report.summary import story_keys
from collage_farm.zoo.source import load_source
from estimators.base import CostEstimator
from estimators.board_profiled import BoardProfiledEstimator
from estimators.int8_ranges import calibrated_targets, int8_calibration
from estimators.measured import FarmEstimator
from estimators.profiled import (
    MeasureStrategy,
    ProfiledEstimator,
)

log = logging.getLogger(__name__)


def _with_reasons(e: NoCoverError, candidates: Sequence[CandidatePartition],
                  est: CostEstimator) -> NoCoverError:
    """``e`` with what the estimator knows of why the candidates at its node failed: the
    runner's own words (a crash, a type error, no runner for a target), one per target."""
    seen: dict[str, str] = {}
    for c in candidates:
        if e.node is None or e.node not in c.node_names or c.target.id in seen:
            continue
        why = est.why_invalid(c)
        if why:
            seen[c.target.id] = f"{c.target.id}: {' '.join(why.split())[:160]}"
    if not seen:
        return e
    return NoCoverError(f"{e}; e.g. {'; '.join(seen.values())}", e.node)


def _check_out(out: Path) -> None:
    """``--out`` must be a directory or creatable as one (found after a campaign, it cost the
    campaign; the measured rows were safe in the table, the user's time was not)."""
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                raise PlanError(f"--out {out}: {p} exists and is not a directory")
            if not os.access(p, os.W_OK | os.X_OK):
                raise PlanError(f"--out {out}: {p} is not writable")
            return


def run_tune(opts: TuneOptions, estimator: CostEstimator | None = None) -> dict:
    """Run phases 1-4; write the plan to ``opts.out``; where the plan can hold int8
    partitions, check it as ``run`` will and search again with 16-bit activations while it
    fails (`_accuracy_gate`); write the report; return the summary."""
    clock = PhaseClock()  # the summary's phases_s: wall seconds per phase, adding up to wall_s
    _check_out(Path(opts.out))  # before anything is measured: the plan must have a home
    graph = load_source(opts.model, opts.shapes, opts.layers, opts.inputs)
    calibration = int8_calibration(graph, opts.targets, opts.calibration)
    # an int8 row depends on its ranges: the calibration is part of the int8 targets' keys
    opts = dataclasses.replace(opts, calibration=calibration,
                               targets=calibrated_targets(opts.targets, calibration))
    clock.lap("load")
    summary, measured = _campaign(opts, estimator, graph, clock)
    if opts.accuracy_check and needs_check(opts.targets):
        summary, measured = _accuracy_gate(opts, estimator, graph, clock, summary, measured)
    if opts.report:
        try:
            summary["report"] = str(write_report(opts.out, summary, measured))
        except Exception as e:  # a drawing problem must not lose the plan
            log.warning("report not written: %s: %s", type(e).__name__, e)
            summary["report_error"] = f"{type(e).__name__}: {e}"
    clock.lap("report")
    summary["wall_s"] = clock.wall_s
    # wall seconds per phase (`PhaseClock`): they add up to wall_s, less this line's time
    summary["phases_s"] = {k: v for k, v in clock.phases.items() if v > 0.0005}
    return summary


def _accuracy_gate(opts: TuneOptions, estimator: CostEstimator | None, graph: DataflowGraph,
                   clock: PhaseClock, summary: dict, measured: Any) -> tuple[dict, Any]:
    """The written plan checked (`check_plan`); while it fails and the precision ladder has a
    step left (`wider_targets`), the board searched again on wider targets into the same
    ``--out`` and checked in turn. The summary returned is the written plan's, with
    ``accuracy``: its check, ``first`` (the campaign's own plan's check and estimate) and
    ``refused`` (every refused plan's) where the gate searched again."""
    targets = tuple(opts.targets)
    check = check_plan(opts.out, targets, opts.calibration)
    clock.lap("accuracy")
    failed: list[dict] = []  # the refused plans, in order
    while not check.ok and check.verdict is not AccuracyVerdict.ERROR:
        wide = wider_targets(targets)
        if wide is None:
            break
        log.warning("the plan fails the int8 check (%s); searching again with 16-bit "
                    "activations: %s", check.message, ", ".join(t.id for t in wide))
        failed.append({"check": check.to_json(),
                       "estimated_total_s": summary["estimated_total_s"],
                       "measured": summary["measured"], "partitions": summary["partitions"]})
        targets = wide
        again_id = f"{opts.campaign_id}-a16-{len(failed)}" if opts.campaign_id else ""
        summary, measured = _campaign(dataclasses.replace(opts, targets=wide,
                                                          campaign_id=again_id),
                                      estimator, graph, clock)
        check = check_plan(opts.out, wide, opts.calibration)
        clock.lap("accuracy")
    summary["accuracy"] = {**check.to_json(), "replanned": bool(failed)}
    if failed:  # ``first``: the campaign's own plan; ``refused``: every plan the gate refused
        summary["accuracy"].update(first=failed[0], refused=failed)
    return summary, measured


def _campaign(opts: TuneOptions, estimator: CostEstimator | None, graph: DataflowGraph,
              clock: PhaseClock) -> tuple[dict, Any]:
    """One search of ``graph`` on ``opts``' (calibrated) targets, the plan written to
    ``opts.out``; the summary and the post-search step's measurements (the report's)."""
    campaign_id = opts.campaign_id or uuid.uuid4().hex[:12]
    opts = TuneOptions(**{**opts.__dict__, "campaign_id": campaign_id})
    calibration = opts.calibration

    specs = build_specs(opts.targets, opts.rule_options)
    candidates = all_candidates(graph, specs)
    # on an Ethos-U board, Vela's own partitioning is a plan the search can always fall back to
    have = set(candidates)
    candidates += [c for c in baseline_candidates(graph, opts.targets, opts.calibration)
                   if c not in have]
    if opts.pins is not None:
        candidates = filter_candidates(candidates, opts.pins)
    fingerprints = {c.fingerprint for c in candidates}
    clock.lap("candidates")

    own = estimator is None
    table = campaign_table(opts)
    # one session cache for the cut-cost probe and the end-to-end runs after the search: the
    # never-worse run's whole models are the probe's, built once
    builder = PlanBuilder(graph, threads=1)
    # the probe's sessions are built while Ray starts (nothing is timed until both are done)
    pool = ThreadPoolExecutor(1, thread_name_prefix="probe-builds") if own else None
    early = start_probe_builds(opts, graph, builder, pool) if pool is not None else None
    try:
        # a farm campaign's one writer on its cost table: candidates, transitions, cut costs
        est, writer = make_estimator(opts, graph) if estimator is None else (estimator, None)
    finally:
        early_builds = early.result() if early is not None else None
        if pool is not None:
            pool.shutdown()
    post: PostSearch | None = None
    farm_est = est  # the measuring estimator, before profile mode wraps it
    # the device this process times plans on, against the runners' (a cluster's head is not)
    timing_host = (plan_timing_host(opts.targets, est.farm)
                   if own and isinstance(est, FarmEstimator) else None)
    clock.lap("farm_start")  # the estimator: Ray up (farm campaigns), the table opened
    try:
        # profile mode wraps the estimator the campaign built; a caller's own is used as is
        profile_mode = (own and est.kind.reads_table
                        and measure_strategy(opts, graph) is MeasureStrategy.PROFILE)
        # profile shares hold their calls and hand-offs (`CallsIncluded`): profile mode on
        # CPUs and GPUs measures hand-offs after the profiles, for targets without one only
        late_handoffs = profile_mode and ethos_u_board(opts.targets) is None
        transition = choose_transition(opts, est, measure=own, writer=writer,
                                       handoff_targets=() if late_handoffs else None)
        transition = with_requantise(opts.targets, transition)  # 16x8 among int8 partitions
        clock.lap("transitions")
        cut_info: dict | None = None
        if opts.cut_costs and est.kind.reads_table:
            # farm campaigns probe (or reuse) this model's cut costs; offline ones reuse only
            transition, cut_info = with_cut_costs(graph, opts.targets, transition,
                                                  table, campaign_id,
                                                  measure=est.kind.measures, writer=writer,
                                                  wholes=profile_mode, builder=builder)
            if cut_info is not None and early_builds is not None:
                cut_info["built_while_ray_started"] = early_builds
        clock.lap("cut_costs")
        profile_info: dict | None = None
        if profile_mode and ethos_u_board(opts.targets) is not None:  # simulated board
            profiles = profile_candidates(graph, opts.targets, opts.calibration)
            est, profile_info = board_profiled(graph, profiles, est, table)
        elif profile_mode:
            est, profile_info = profiled_estimator(
                opts, graph, est, cut_info, builder,
                foreign=timing_host.different if timing_host is not None else ())
        if isinstance(est, ProfiledEstimator):  # profile shares already hold calls, hand-offs
            transition = CallsIncluded(transition, frozenset(est.profiles))
            unprofiled = [t for t in opts.targets if t.id not in est.profiles]
            if late_handoffs and unprofiled:  # isolated costs pay their hand-offs
                transition = rebased(transition, choose_transition(
                    opts, est, measure=own, writer=writer, handoff_targets=unprofiled))
        clock.lap("profiles")
        lazy = bool(opts.prune and est.has_lower_bound)
        try:
            result: SearchResult = search(graph, candidates, est, transition, lazy=lazy)
        except NoCoverError as e:
            raise _with_reasons(e, candidates, est) from None
        clock.lap("search")
        inchain_info: dict | None = None
        # a re-run whose search plan an earlier campaign decided on times nothing
        if (isinstance(est, ProfiledEstimator) and est.kind.measures
                and opts.inchain_rounds > 0
                and already_decided(graph, opts, table, result) is None):
            result, inchain_info = price_in_chain(
                graph, est, result, builder, opts, writer,
                lambda: search(graph, candidates, est, transition, lazy=lazy),
                foreign=timing_host.different if timing_host is not None else ())
        mix_info: dict | None = None
        if isinstance(est, ProfiledEstimator):  # a mix within noise of a whole model: that
            result, mix_info = single_instead(graph, result, est, transition, opts.targets,
                                              opts.pins)
        clock.lap("inchain")
        screen_info: dict | None = None
        if isinstance(est, ProfiledEstimator):
            result, screen_info = screen(graph, candidates, est, transition, result,
                                         rounds=opts.screen_rounds, lazy=lazy)
        clock.lap("screen")
        first_estimate_s, first_search_s = result.total_s, result.search_s
        measured = est.kind.measures  # costs measured on runners, not mock/table/analytic
        confirm_info: dict | None = None
        if isinstance(est, BoardProfiledEstimator):  # the path's figures: exact builds only
            result, confirm_info = confirm_exact(graph, candidates, est, transition, result,
                                                 lazy=lazy)
        elif measured and opts.confirm_rounds > 0:
            confirm_info = already_decided(graph, opts, table, result)
            if confirm_info is None:
                result, confirm_info = confirm(graph, candidates, est, transition, result,
                                               opts.targets, rounds=opts.confirm_rounds,
                                               lazy=lazy)
        clock.lap("confirm")
        # a re-run that reaches a search plan an earlier campaign decided on end to end
        # writes that campaign's plan and times nothing (unless --reconfirm): two toolchains
        # within noise of each other would otherwise swap places from run to run
        decided_before = bool(measured and (opts.verify or opts.refine_trials > 0)
                              and already_decided(graph, opts, table, result) is not None)
        if measured and (opts.verify or opts.refine_trials > 0) and not decided_before:
            pso = post_search_options(opts)
            if isinstance(est, ProfiledEstimator):  # prices any plan without measuring
                pso = for_profile_mode(pso)
            post = post_search(pso, graph, result, est, transition, builder)
            clock.lap("post_search")
            clock.add(post.phases_s, into="post_search")  # refine, never_worse, ...
            if writer is not None:  # offline reuse of this table writes the same plan
                record_decision(writer, graph, opts, result, post)
        decision: PlanDecision | None = None
        searched = result  # the Dijkstra plan, before a recorded decision replaces it
        if est.kind is EstimatorKind.TABLE or decided_before:
            result, decision = reuse_decision(graph, opts, table, est, transition, result)
        clock.lap("decision")
    finally:
        stats = est.stats()
        slots = farm_slots(farm_est)  # profile mode's estimator wraps the farm's
        if own:
            est.close()  # closes the writer it opened
        clock.lap("close")  # the table written out, Ray shut down
    dijkstra = searched
    if post is not None:
        result = post.result
    plan = make_plan(graph, result, opts.targets, estimator=est.label,
                     transition=transition.label)
    plan.extra.update({"campaign_id": campaign_id, "source": opts.model})
    if opts.shapes or opts.model.startswith("pkg:"):  # `run` rebinds a dynamic source
        plan.extra["shapes"] = {n: list(graph.tensors[n].shape) for n in graph.graph_inputs}
    if opts.layers is not None:
        plan.extra["layers"] = opts.layers
    if calibration is not None:  # `run` builds the int8 partitions with these samples' ranges
        plan.extra[CALIBRATION_KEY] = calibration.to_json()
    plan.extra["runner_ups"] = {
        e.id: [{**dataclasses.asdict(a), "cost_s": a.cost_s if math.isfinite(a.cost_s) else None}
               for a in alts]
        for e, alts in zip(plan.partitions, result.alternatives) if alts}
    if post is not None:
        plan.extra["never_worse"] = post.info
    if decision is not None:
        plan.extra["decision"] = decision.to_json()
    plan = with_ethos_figures(plan, graph, opts.targets,  # Ethos-U boards
                              _row_details(table, plan, opts.targets), opts.calibration)
    write_plan(plan, graph, result, opts.out, models=builder.model_bytes)  # its extractions
    clock.lap("plan")

    per_target: dict[str, int] = {}
    for p in plan.partitions:
        per_target[p.target] = per_target.get(p.target, 0) + 1
    summary = {
        "model": graph.name,
        "campaign_id": campaign_id,
        "estimator": est.label,
        "measure_mode": est.measure_mode or opts.measure_mode or "any",
        "targets": [t.id for t in opts.targets],
        "nodes": len(graph.nodes),
        "candidates": len(candidates),
        "distinct_fingerprints": len(fingerprints),
        "partitions": len(plan.partitions),
        "partitions_per_target": per_target,
        "estimated_total_s": result.total_s,
        "estimated_compute_s": sum(p.cost.seconds for p in result.partitions),
        "estimated_transition_s": sum(p.penalty_s for p in result.partitions),
        "cut_costs": cut_info,
        "states_expanded": result.states_expanded,
        "costs_requested": stats.requested or result.candidates_estimated,
        "cache_hits": stats.cache_hits,
        "measured": stats.measured,
        "pruned": max(0, len(fingerprints) - result.distinct_estimated),
        "analytic": stats.analytic,
        "failed": stats.failed,
        "failed_by_status": dict(getattr(stats, "failed_by_status", {}) or {}),
        "load_s": clock.phases["load"],
        "phase2_s": clock.phases["candidates"],
        "search_s": first_search_s + (confirm_info or {}).get("search_s", 0.0),
        "wall_s": clock.wall_s,
        "plan": str(Path(opts.out) / "plan.json"),
        "cost_table": str(table) if table is not None else None,  # the report's heat map
    }
    if any(p.ethos for p in plan.partitions):
        summary["ethos_partitions"] = {p.id: {"target": p.target, **p.ethos}
                                       for p in plan.partitions if p.ethos}
    summary["confirm"] = confirm_info
    summary[CALIBRATION_KEY] = plan.extra.get(CALIBRATION_KEY)
    summary["slots"] = slots
    summary["plan_timing_host"] = timing_host.to_json() if timing_host is not None else None
    # `measure_mode` above is the cache mode candidates are timed in (warm | flush | network);
    # `measure` is how costs were obtained (profile | exhaustive), `profiled` the profile runs
    summary["measure"] = (MeasureStrategy.PROFILE.value if profile_info is not None
                          else MeasureStrategy.EXHAUSTIVE.value)
    summary["profiled"] = (profile_info or {}).get("runs", 0)
    summary["profile"] = profile_info
    summary["screen"] = screen_info
    summary["inchain"] = inchain_info
    summary["mix_within_noise"] = mix_info
    summary["first_search_estimated_s"] = first_estimate_s
    summary["dijkstra_estimated_s"] = dijkstra.total_s
    summary["dijkstra_partitions"] = len(dijkstra.partitions)
    if post is not None:
        summary.update(post.info)
        summary["post_search_s"] = post.elapsed_s
    elif decision is not None:
        summary["decision"] = decision.to_json()
        summary["plan_is"] = decision.plan_is
        summary["verify"] = (
            f"not measured now: the plan is the one campaign {decision.campaign_id} wrote for "
            f"this search plan after measuring it end to end ({decision.plan_is}; "
            f"{decision.figures.get('never_worse')})")
    else:
        summary["verify"] = (
            f"skipped: costs from {est.label} are not measurements on this machine; run "
            f"`collage-farm run {opts.out}` to measure the plan" if not est.kind.measures
            else "skipped (--no-verify, --refine-trials 0)")
    # one story, every figure named by its plan (collage_farm.report.summary)
    summary.update(story_keys(summary, result, dijkstra, len(graph.nodes)))
    return summary, (post.measured if post else None)


def _row_details(table: Path | None, plan: Plan, targets: Sequence[Target]
                 ) -> Callable[[str, Target], dict] | None:
    """Details of the ok row of each of ``plan``'s partitions in the campaign's cost table,
    looked up in one pass, answered by (fingerprint, target)."""
    if table is None or not table.exists():
        return None
    by_id = {t.id: t for t in targets}
    keys = [(p.fingerprint, by_id[p.target].measure_key) for p in plan.partitions
            if p.target in by_id]
    found = CostTable(table).lookup(keys)

    def details_of(fp: str, target: Target) -> dict:
        row = found.get((fp, target.measure_key))
        return row.details_dict() if row is not None and row.ok else {}
    return details_of
