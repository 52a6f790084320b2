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
offline campaigns skip this and say so. Every campaign writes ``report.html`` beside the plan
unless told not to.

How candidates get costs is ``TuneOptions.measure`` (`estimators.profiled.MeasureStrategy`):
``profile`` profiles each target's whole model once per operator, in network
(`collage_farm.probes.profiles`; prefix differences where the toolchain's profiler is not
trusted, said in one warning line), answers every candidate from those profiles
(`estimators.profiled.ProfiledEstimator`: node shares on the cut-cost probe's time base plus
measured cut costs), so neither the search nor the confirmation step measures a candidate in
isolation; ``screen_rounds`` > 0 measures the uncertain candidates on the best plans
(`collage_farm.postsearch.screen`). A target without a usable profile falls back to isolated
measurement, with one warning line in the summary. ``exhaustive`` (the default) measures every
candidate the search asks for in isolation (the behaviour before profiles). Profile mode
applies to the estimator the campaign builds; a caller's own estimator is used as is.

The summary returned (and printed with ``--json``) is a plain dict, so scripts can rely on its
keys: ``estimated_total_s``, ``partitions``, ``candidates``, ``distinct_fingerprints``,
``search_s`` and the campaign statistics; measured campaigns add ``plan_measured_s``,
``best_single_target``, ``best_single_measured_s``, ``speedup_vs_best_single``,
``additive_error`` and the other figures of `post_search`. ``measure_mode`` is the cache mode
candidates are timed in (``network``, ``warm``, ``flush``); ``measure`` is how costs were got
(``profile`` | ``exhaustive``), ``profiled`` the profile runs sent to the farm now (beside
``measured``, the candidates measured in isolation), ``profile`` per target what the profiles
were and ``warnings``, ``screen`` what the screening measured.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import math
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collage_farm.core.calibration_data import CalibrationData
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.estimator import EstimatorKind
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.pins import PinSet, filter_candidates
from collage_farm.core.plan import PlanError, make_plan, write_plan
from collage_farm.core.rules import PartitionSpec, RuleOptions, all_candidates, default_spec
from collage_farm.core.search import NoCoverError, SearchResult, search
from collage_farm.core.target import CPU0, Target
from collage_farm.core.transition import AnalyticTransitionModel, TransitionModel, WithCutCosts
from collage_farm.costtable import CostTable, CostTableWriter, TableStore, check_writable
from collage_farm.costtable.decisions import (
    PlanDecision,
    decision_row,
    find_decision,
    plan_parts,
)
from collage_farm.execute import CALIBRATION_KEY, SIMULATED_TOOLCHAINS
from collage_farm.farm import Farm
from collage_farm.postsearch.confirm import confirm
from collage_farm.postsearch.decide import PostSearch, PostSearchOptions, post_search
from collage_farm.postsearch.ethos_parts import with_ethos_figures
from collage_farm.postsearch.moves import parts_from_names, to_search_result
from collage_farm.postsearch.screen import screen
from collage_farm.postsearch.vela_whole import baseline_candidates
from collage_farm.probes.cutcost import cached_cut_costs
from collage_farm.probes.profiles import collect_profiles, table_has_profiles
from collage_farm.probes.transitions import measured_transition_model
from collage_farm.report import write_report
from collage_farm.report.summary import story_keys
from collage_farm.zoo.source import load_source
from estimators.base import CostEstimator
from estimators.int8_ranges import int8_calibration, tensor_ranges_provider
from estimators.local import LocalService
from estimators.measured import FarmEstimator
from estimators.mock import MockEstimator
from estimators.profiled import (
    DEFAULT_TOLERANCE,
    MeasureStrategy,
    ProfiledEstimator,
    ProfileRejected,
    TargetProfile,
    node_weights,
)
from estimators.sources import RetryPolicy, Strictness
from estimators.table import TableEstimator
from runners.base import CANDIDATE_MODE, MeasureConfig
from runners.registry import capabilities_for_target

log = logging.getLogger(__name__)

DEFAULT_REFINE_TRIALS = 6


class CostSource(str, enum.Enum):
    """Where a campaign's candidate costs come from (`TuneOptions.estimator`).

    ``FARM``: measured on the Ray farm (`collage_farm.farm.Farm`), recorded in the cost table.
    ``LOCAL``: measured by the toolchains' own isolated runners in this process, no Ray (the
    simulated Ethos-U boards, whose costs are deterministic), recorded in the cost table.
    ``OFFLINE``: read from an existing cost table only; nothing is measured.
    ``MOCK``: a deterministic analytic stand-in (`estimators.mock.MockEstimator`); no table.
    """

    FARM = "farm"
    LOCAL = "local"
    OFFLINE = "offline"
    MOCK = "mock"

    @property
    def measures(self) -> bool:
        """Whether candidates are measured (and recorded) now."""
        return self in (CostSource.FARM, CostSource.LOCAL)


@dataclass(frozen=True)
class TuneOptions:
    model: str  # a path, zoo:NAME or pkg:NAME
    targets: tuple[Target, ...]
    out: Path
    shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    layers: int | None = None  # zoo models only
    estimator: CostSource = CostSource.FARM  # a `CostSource` or its value ("mock", ...)
    cost_table: Path | None = None
    address: str | None = None
    allow_analytic: bool = False
    prune: bool = True
    retry_failed: bool = False  # failed rows never answer: measure them all again
    reconfirm: bool = False  # the table's confirmations do not count: re-measure the path
    rule_options: RuleOptions = RuleOptions()
    transition: TransitionModel | None = None
    pins: object = None  # collage_farm.core.pins.PinSet, when given
    campaign_id: str = ""
    strictness: str = "exact"
    num_cpus: int | None = None
    slots: int | None = None  # CPU runners per host, forced (default: one per LLC domain)
    # after the search (measured campaigns only; see `post_search`)
    verify: bool = True  # never worse: plan vs each single toolchain, measured end to end
    refine_trials: int = DEFAULT_REFINE_TRIALS  # measured local moves; 0 disables
    refine_time_s: float = 120.0
    verify_rounds: int = 7
    # a mix that looks faster (ratio < 1 - 3%) but not beyond noise gets this many more
    # interleaved rounds against the best single before the decision; 0 disables
    verify_extend_rounds: int = 14
    measure_mode: str = ""  # candidates' MeasureConfig.mode; "" = runners.base.CANDIDATE_MODE
    cut_costs: bool = True  # measure this model's cut cost per target (collage_farm.probes.cutcost)
    confirm_rounds: int = 3  # re-measure the chosen path, re-search (`confirm`); 0 disables
    report: bool = True  # report.html + PNGs beside the plan
    # how candidates get costs (`MeasureStrategy`): "profile" (in-network operator profiles,
    # `estimators.profiled`), "exhaustive" (every candidate measured in isolation) or ""
    # (the cost source's default, `measure_strategy`)
    measure: str = ""
    profile_tolerance: float = DEFAULT_TOLERANCE  # profile sum vs whole model: else fall back
    # plans whose uncertain candidates are measured in isolation (`screen`); 0: none, as an
    # isolated cost mixed into profile shares misprices mixed plans (estimators.profiled)
    screen_rounds: int = 0
    inputs: Mapping[str, object] = field(default_factory=dict)  # fixed input values (--input)
    # samples int8 builds are calibrated on (--calibration-data); None: seeded random
    calibration: CalibrationData | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "estimator", CostSource(self.estimator))
        except ValueError:
            raise ValueError(f"unknown estimator {self.estimator!r} "
                             f"({', '.join(m.value for m in CostSource)})") from None


def campaign_table(opts: TuneOptions) -> Path | None:
    """The cost-table directory a campaign reads and writes: ``--cost-table``, else
    ``OUT/costs`` (where a farm campaign with this ``--out`` left it); mock campaigns have
    none."""
    if opts.cost_table is not None:
        return Path(opts.cost_table)
    return opts.out / "costs" if opts.estimator is not CostSource.MOCK else None


def build_specs(targets: Sequence[Target], options: RuleOptions) -> list[PartitionSpec]:
    """Phase 1: a rule tree per target from its toolchain's capabilities."""
    specs = []
    for t in targets:
        caps = capabilities_for_target(t)
        specs.append(default_spec(t, caps.supports, caps.style, options))
    return specs


def measure_strategy(opts: TuneOptions, graph: DataflowGraph) -> MeasureStrategy:
    """How this campaign's candidates get costs: ``opts.measure`` when given; else ``profile``
    for a farm campaign, and for an offline one whose table holds this model's profile rows
    (so it prices as the campaign that wrote them did); else ``exhaustive`` (an offline table
    of isolated measurements; simulated boards, which have no profiler; mock costs)."""
    if opts.measure:
        return MeasureStrategy.parse(opts.measure)
    if opts.estimator is CostSource.FARM:
        return MeasureStrategy.PROFILE
    table = campaign_table(opts)
    if (opts.estimator is CostSource.OFFLINE and table is not None
            and table_has_profiles(CostTable(table), graph)):
        return MeasureStrategy.PROFILE
    return MeasureStrategy.EXHAUSTIVE


def make_estimator(opts: TuneOptions, graph: DataflowGraph
                   ) -> tuple[CostEstimator, CostTableWriter | None]:
    """The campaign's estimator, and for a farm campaign the campaign's one writer on its cost
    table (its store's, closed with the estimator; the campaign appends its transition and
    cut-cost rows to it too). The writer is opened only once Ray is up, so a campaign refused
    before measuring leaves no table directory behind."""
    if opts.estimator is CostSource.MOCK:
        return MockEstimator(), None
    if opts.estimator is CostSource.OFFLINE:
        table = campaign_table(opts)
        assert table is not None
        return TableEstimator(TableStore.existing(table),
                              allow_analytic=opts.allow_analytic,
                              strictness=Strictness.parse(opts.strictness),
                              mode=opts.measure_mode or None), None
    if opts.estimator.measures:
        table = campaign_table(opts)
        assert table is not None
        check_writable(table)  # before Ray starts: an unwritable table costs no measurements
        toolchains = sorted({t.toolchain for t in opts.targets})
        # local: the toolchains' own isolated runners, no Ray (deterministic simulated boards)
        service = (LocalService(toolchains) if opts.estimator is CostSource.LOCAL else
                   Farm.start(opts.address, toolchains=toolchains, num_cpus=opts.num_cpus,
                              slots=opts.slots))
        store = TableStore(table, campaign_id=opts.campaign_id)
        est = FarmEstimator(
            service,
            store,
            model=graph.name,
            measure_config=MeasureConfig(mode=opts.measure_mode or CANDIDATE_MODE),
            tensor_ranges_for=tensor_ranges_provider(graph, opts.targets, opts.calibration),
            prune=opts.prune,
            strictness=Strictness.parse(opts.strictness),
            retry=RetryPolicy.ALL if opts.retry_failed else RetryPolicy.TRANSIENT,
            reconfirm=opts.reconfirm,
        )
        return est, store.writer
    raise AssertionError(f"unhandled cost source {opts.estimator!r}")


def farm_slots(est: CostEstimator) -> dict | None:
    """The summary's ``slots``: the CPU runners the campaign's farm measured with and why
    (`collage_farm.farm.Farm.slots`); None when no farm measured."""
    if isinstance(est, FarmEstimator) and isinstance(est.farm, Farm):
        return est.farm.slots()
    return None


def choose_transition(opts: TuneOptions, est: CostEstimator, *, measure: bool,
                      writer: CostTableWriter | None = None) -> TransitionModel:
    """The search's transition model: measured rows from the cost table where they exist.

    ``opts.transition`` (configured, or analytic) is the fallback for what no row covers. A
    farm campaign that built its own estimator (``measure``) measures the missing transition
    rows on this machine first (`collage_farm.probes.transitions.measured_transition_model`)
    and appends them to ``writer``; an offline campaign reuses the table's rows; mock campaigns
    keep the given model. Rows are those of the mode the campaign's candidates are timed in
    (the estimator's `measure_mode`, else ``opts.measure_mode``, else `CANDIDATE_MODE`), so an
    offline search reads the transitions the measuring campaign used.
    """
    fallback = opts.transition or AnalyticTransitionModel()
    table = campaign_table(opts)
    if opts.estimator is CostSource.MOCK or table is None:
        return fallback
    if not measure and not Path(table).is_dir():
        return fallback
    # the rows of the mode this campaign's candidates are (or, offline, were) measured in: an
    # offline search over a farm campaign's table then uses the transitions that campaign used
    config = MeasureConfig(mode=est.measure_mode or opts.measure_mode or CANDIDATE_MODE)
    try:
        return measured_transition_model(
            CostTable(table), opts.targets, writer=writer,
            measure=measure and opts.estimator is CostSource.FARM,
            config=config, fallback=fallback, host=getattr(fallback, "host", None) or CPU0,
            campaign_id=opts.campaign_id)
    except Exception as e:  # a broken probe must not cost the campaign: say so, go on
        log.warning("measured transitions unavailable (%s: %s); using %s", type(e).__name__,
                    e, fallback.label)
        return fallback


def with_cut_costs(graph: DataflowGraph, targets: Sequence[Target],
                   transition: TransitionModel, table: Path | None = None,
                   campaign_id: str = "", measure: bool = True,
                   writer: CostTableWriter | None = None, wholes: bool = False
                   ) -> tuple[TransitionModel, dict | None]:
    """``transition`` plus this model's measured cut costs (`collage_farm.probes.cutcost`) when the
    campaign mixes two or more toolchains that run here; unchanged (and why) otherwise. With a
    cost ``table``, rows of an earlier probe on this host are reused; new ones are appended to
    ``writer``. ``wholes``: also each target's same-toolchain cut cost (profile mode)."""
    live = [t for t in targets if t.toolchain not in SIMULATED_TOOLCHAINS]
    if len({t.toolchain for t in live}) < 2:
        return transition, None
    try:
        ct = CostTable(table) if table is not None and Path(table).is_dir() else None
        cc = cached_cut_costs(ct, graph, live, writer=writer, campaign_id=campaign_id,
                              measure=measure, wholes=wholes)
        if cc is None:  # offline, and no earlier probe of this model in the table
            return transition, None
    except Exception as e:  # a broken probe must not cost the campaign: say so, go on
        log.warning("cut costs unavailable (%s: %s)", type(e).__name__, e)
        return transition, {"error": f"{type(e).__name__}: {e}"}
    return WithCutCosts(transition, cc.cuts), cc.to_json()


def profiled_estimator(opts: TuneOptions, graph: DataflowGraph, est: CostEstimator,
                       cut_info: dict | None) -> tuple[ProfiledEstimator, dict]:
    """``est`` wrapped in a `ProfiledEstimator` over each target's profile of ``graph``
    (`collage_farm.probes.profiles`: the cost table's rows, else profiled on the farm of a
    measuring ``est``), and what happened: per target, the profile runs sent, and one warning
    line per target whose costs fall back to ``est`` (no profile, or one rejected)."""
    table = campaign_table(opts)
    farm_est = est if isinstance(est, FarmEstimator) else None  # the one that can profile
    outcomes = collect_profiles(
        graph, opts.targets, table=CostTable(table) if table is not None else None,
        farm=farm_est.farm if farm_est else None, store=farm_est.store if farm_est else None,
        strictness=Strictness.parse(opts.strictness))
    same = (cut_info or {}).get("same_cuts_s") or {}
    wholes = (cut_info or {}).get("wholes_s") or {}  # every target's whole, one time base
    weights = node_weights(graph)
    profiles: dict[str, TargetProfile] = {}
    warnings: list[str] = []
    for tid, o in outcomes.items():
        why = o.error
        if o.profile is not None:
            try:
                profiles[tid] = TargetProfile.of(o.profile, cut_s=float(same.get(tid, 0.0)),
                                                 tolerance=opts.profile_tolerance,
                                                 weights=weights, whole_s=wholes.get(tid))
            except ProfileRejected as e:
                why = str(e)
        if tid not in profiles:
            warnings.append(f"warning: {tid}: no usable profile ({why}); its candidates are "
                            "measured in isolation")
        elif profiles[tid].rejected:
            warnings.append(f"warning: {tid}: its profiler's profile was not used "
                            f"({profiles[tid].rejected}); its costs come from prefix "
                            "differences at thin cuts instead")
    info = {"targets": {k: o.to_json() for k, o in outcomes.items()},
            "profiled_targets": sorted(profiles), "runs": sum(o.ran for o in outcomes.values()),
            "warnings": warnings, "same_cuts_s": same, "wholes_s": wholes}
    return ProfiledEstimator(profiles, est), info


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
    """Run phases 1-4; write the plan to ``opts.out``; return the summary."""
    t_start = time.perf_counter()
    campaign_id = opts.campaign_id or uuid.uuid4().hex[:12]
    opts = TuneOptions(**{**opts.__dict__, "campaign_id": campaign_id})
    _check_out(Path(opts.out))  # before anything is measured: the plan must have a home
    graph = load_source(opts.model, opts.shapes, opts.layers, opts.inputs)
    calibration = int8_calibration(graph, opts.targets, opts.calibration)
    opts = dataclasses.replace(opts, calibration=calibration)
    t_loaded = time.perf_counter()

    specs = build_specs(opts.targets, opts.rule_options)
    candidates = all_candidates(graph, specs)
    # on an Ethos-U board, Vela's own partitioning is a plan the search can always fall back to
    have = set(candidates)
    candidates += [c for c in baseline_candidates(graph, opts.targets) if c not in have]
    if opts.pins is not None:
        candidates = filter_candidates(candidates, opts.pins)
    t_cands = time.perf_counter()
    fingerprints = {c.fingerprint for c in candidates}

    own = estimator is None
    table = campaign_table(opts)
    # a farm campaign's one writer on its cost table: candidates, transitions and cut costs
    est, writer = make_estimator(opts, graph) if estimator is None else (estimator, None)
    post: PostSearch | None = None
    try:
        transition = choose_transition(opts, est, measure=own, writer=writer)
        cut_info: dict | None = None
        # profile mode wraps the estimator the campaign built; a caller's own is used as is
        profile_mode = (own and est.kind.reads_table
                        and measure_strategy(opts, graph) is MeasureStrategy.PROFILE)
        if opts.cut_costs and est.kind.reads_table:
            # farm campaigns probe (or reuse) this model's cut costs; offline ones reuse only
            transition, cut_info = with_cut_costs(graph, opts.targets, transition,
                                                  table, campaign_id,
                                                  measure=est.kind.measures, writer=writer,
                                                  wholes=profile_mode)
        profile_info: dict | None = None
        if profile_mode:
            est, profile_info = profiled_estimator(opts, graph, est, cut_info)
        lazy = bool(opts.prune and est.has_lower_bound)
        try:
            result: SearchResult = search(graph, candidates, est, transition, lazy=lazy)
        except NoCoverError as e:
            raise _with_reasons(e, candidates, est) from None
        screen_info: dict | None = None
        if isinstance(est, ProfiledEstimator):
            result, screen_info = screen(graph, candidates, est, transition, result,
                                         rounds=opts.screen_rounds, lazy=lazy)
        first_estimate_s, first_search_s = result.total_s, result.search_s
        measured = est.kind.measures  # costs measured on runners, not mock/table/analytic
        confirm_info: dict | None = None
        if measured and opts.confirm_rounds > 0:
            confirm_info = _already_decided(graph, opts, table, result)
            if confirm_info is None:
                result, confirm_info = confirm(graph, candidates, est, transition, result,
                                               opts.targets, rounds=opts.confirm_rounds,
                                               lazy=lazy)
        if measured and (opts.verify or opts.refine_trials > 0):
            post = post_search(post_search_options(opts), graph, result, est, transition)
            if writer is not None:  # offline reuse of this table writes the same plan
                _record_decision(writer, graph, opts, result, post)
        decision: PlanDecision | None = None
        searched = result  # the Dijkstra plan, before a recorded decision replaces it
        if est.kind is EstimatorKind.TABLE:
            result, decision = _reuse_decision(graph, opts, table, est, transition, result)
    finally:
        stats = est.stats()
        slots = farm_slots(est)
        if own:
            est.close()  # closes the writer it opened
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
    plan = with_ethos_figures(plan, graph, opts.targets, _row_details(table))  # Ethos-U boards
    write_plan(plan, graph, result, opts.out)
    t_end = time.perf_counter()

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
        "load_s": t_loaded - t_start,
        "phase2_s": t_cands - t_loaded,
        "search_s": first_search_s + (confirm_info or {}).get("search_s", 0.0),
        "wall_s": t_end - t_start,
        "plan": str(Path(opts.out) / "plan.json"),
        "cost_table": str(table) if table is not None else None,  # the report's heat map
    }
    if any(p.ethos for p in plan.partitions):
        summary["ethos_partitions"] = {p.id: {"target": p.target, **p.ethos}
                                       for p in plan.partitions if p.ethos}
    summary["confirm"] = confirm_info
    summary[CALIBRATION_KEY] = plan.extra.get(CALIBRATION_KEY)
    summary["slots"] = slots
    # `measure_mode` above is the cache mode candidates are timed in (warm | flush | network);
    # `measure` is how costs were obtained (profile | exhaustive), `profiled` the profile runs
    summary["measure"] = (MeasureStrategy.PROFILE.value if profile_info is not None
                          else MeasureStrategy.EXHAUSTIVE.value)
    summary["profiled"] = (profile_info or {}).get("runs", 0)
    summary["profile"] = profile_info
    summary["screen"] = screen_info
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
    if opts.report:
        try:
            summary["report"] = str(write_report(opts.out, summary,
                                                 post.measured if post else None))
        except Exception as e:  # a drawing problem must not lose the plan
            log.warning("report not written: %s: %s", type(e).__name__, e)
            summary["report_error"] = f"{type(e).__name__}: {e}"
    summary["wall_s"] = time.perf_counter() - t_start
    return summary


def _row_details(table: Path | None) -> Callable[[str, Target], dict] | None:
    """Details of the ok row of (fingerprint, target) in the campaign's cost table."""
    if table is None or not table.exists():
        return None
    rows = CostTable(table)

    def details_of(fp: str, target: Target) -> dict:
        row = rows.lookup([(fp, target.measure_key)]).get((fp, target.measure_key))
        return row.details_dict() if row is not None and row.ok else {}
    return details_of


def _search_parts(graph: DataflowGraph, result: SearchResult) -> tuple:
    return plan_parts(graph, [(p.candidate.mask, p.candidate.target) for p in result.partitions])


def _record_decision(writer: CostTableWriter, graph: DataflowGraph, opts: TuneOptions,
                     searched: SearchResult, post: PostSearch) -> None:
    """Append the campaign's verified outcome for its search plan to its cost table
    (`collage_farm.costtable.decisions`); an unverified plan records nothing."""
    row = decision_row(graph, opts.targets, _search_parts(graph, searched),
                       _search_parts(graph, post.result), str(post.info.get("plan_is", "")),
                       post.info, campaign_id=opts.campaign_id)
    if row is not None:
        writer.append(row)


def _find_decision(graph: DataflowGraph, opts: TuneOptions, table: Path | None,
                   result: SearchResult) -> PlanDecision | None:
    """The newest decision an earlier campaign recorded for this search plan, or None (no
    table, none recorded, or rows that cannot be read: said, and the search goes on)."""
    if table is None or not Path(table).is_dir():
        return None
    try:
        return find_decision(CostTable(table), graph, opts.targets,
                             _search_parts(graph, result))
    except Exception as e:  # an unreadable row must not cost the search's own plan
        log.warning("recorded plan decisions unreadable (%s: %s)", type(e).__name__, e)
        return None


def _already_decided(graph: DataflowGraph, opts: TuneOptions, table: Path | None,
                     result: SearchResult) -> dict | None:
    """The confirmation step's summary when an earlier campaign already confirmed this search
    plan and decided on it end to end (its decision row is in the table): a re-run of a
    finished campaign measures nothing, even where that campaign's confirmation ran out of
    rounds before every candidate on the path was re-measured. None: confirm as usual
    (no such decision, or ``--reconfirm``)."""
    decision = None if opts.reconfirm else _find_decision(graph, opts, table, result)
    if decision is None:
        return None
    return {"remeasured": 0, "already_confirmed": len(result.partitions),
            "stopped_by": "decided", "decided_by": decision.campaign_id,
            "path_changed": False, "median_after_over_before": None, "wall_s": 0.0,
            "search_s": 0.0, "log": []}


def _reuse_decision(graph: DataflowGraph, opts: TuneOptions, table: Path | None,
                    est: CostEstimator, transition: TransitionModel, result: SearchResult
                    ) -> tuple[SearchResult, PlanDecision | None]:
    """Offline: the plan a measured campaign wrote for the search plan found now, if one is
    recorded in ``table``; else ``result`` unchanged."""
    decision = _find_decision(graph, opts, table, result)
    if decision is None:
        return result, None
    parts = parts_from_names(graph, decision.final, opts.targets)
    if parts is None:
        log.warning("the decision of campaign %s names nodes or targets this campaign has "
                    "not; the search's plan is written", decision.campaign_id)
        return result, None
    return to_search_result(graph, parts, result, estimate=est.estimate,
                            transition=transition, rule=decision.plan_is), decision


def post_search_options(opts: TuneOptions) -> PostSearchOptions:
    """What `collage_farm.postsearch.decide.post_search` needs of the campaign's options."""
    pins = PinSet.of(opts.pins) if opts.pins is not None else None  # type: ignore[arg-type]
    return PostSearchOptions(
        targets=tuple(opts.targets), pins=pins,
        verify=opts.verify, refine_trials=opts.refine_trials, refine_time_s=opts.refine_time_s,
        verify_rounds=opts.verify_rounds, verify_extend_rounds=opts.verify_extend_rounds,
        report=opts.report)
