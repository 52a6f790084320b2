"""Where a campaign's costs come from: the rule trees per target, the estimator
(`CostSource` and `MeasureStrategy`), the transition model with measured rows and cut costs,
and, in profile mode, the `ProfiledEstimator` over each target's in-network profile and the
in-chain prices of the best plans' partitions."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from collage_farm.campaign.options import CostSource, TuneOptions, campaign_table
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.rules import PartitionSpec, RuleOptions, default_spec
from collage_farm.core.search import SearchResult
from collage_farm.core.target import CPU0, Target
from collage_farm.core.transition import (
    AnalyticTransitionModel,
    Requantise,
    TransitionModel,
    WithCutCosts,
    WithRequantise,
)
from collage_farm.costtable import CostTable, CostTableWriter, TableStore, check_writable
from collage_farm.costtable.inchain import in_chain_row, stored_in_chain_prices
from collage_farm.execute import SIMULATED_TOOLCHAINS
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.farm import Farm
from collage_farm.postsearch.inchain import price_best_plans
from collage_farm.postsearch.vela_whole import ethos_u_board
from collage_farm.probes.cutcost import build_probe_sessions, cached_cut_costs
from collage_farm.probes.profiles import (
    collect_profiles,
    prefix_profiled,
    profile_from_chain,
    table_has_profiles,
)
from collage_farm.probes.transitions import measured_transition_model
from estimators.base import CostEstimator
from estimators.int8_ranges import channel_means_provider, tensor_ranges_provider
from estimators.local import LocalService
from estimators.measured import FarmEstimator
from estimators.mock import MockEstimator
from estimators.profiled import (
    MeasureStrategy,
    ProfiledEstimator,
    ProfileRejected,
    TargetProfile,
    node_weights,
)
from estimators.sources import MeasurementService, RetryPolicy, Strictness
from estimators.table import TableEstimator
from runners.base import CANDIDATE_MODE, MeasureConfig
from runners.cortex_m import host_of
from runners.measure import time_callable
from runners.profile import OperatorProfile
from runners.registry import capabilities_for_target

log = logging.getLogger(__name__)


def build_specs(targets: Sequence[Target], options: RuleOptions) -> list[PartitionSpec]:
    """Phase 1: a rule tree per target from its toolchain's capabilities."""
    specs = []
    for t in targets:
        caps = capabilities_for_target(t)
        specs.append(default_spec(t, caps.supports, caps.style, options))
    return specs


def measure_strategy(opts: TuneOptions, graph: DataflowGraph) -> MeasureStrategy:
    """How this campaign's candidates get costs: ``opts.measure`` when given; else ``profile``
    for a farm campaign, for an offline one whose table holds this model's profile rows
    (so it prices as the campaign that wrote them did), and for any campaign on a simulated
    Ethos-U board that reads a cost table (profile builds of Vela's own split, estimates
    confirmed by exact builds: `estimators.board_profiled`; offline, the table's builds answer
    exactly, so it searches the costs the measuring campaign's last search did); else
    ``exhaustive`` (an offline table of isolated measurements; other simulated-only target
    sets; mock costs)."""
    if opts.measure:
        return MeasureStrategy.parse(opts.measure)
    if all(t.toolchain in SIMULATED_TOOLCHAINS for t in opts.targets):
        board = ethos_u_board(opts.targets) is not None and opts.estimator is not CostSource.MOCK
        return MeasureStrategy.PROFILE if board else MeasureStrategy.EXHAUSTIVE
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
            channel_means_for=channel_means_provider(graph, opts.targets, opts.calibration),
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
                      writer: CostTableWriter | None = None,
                      handoff_targets: Sequence[Target] | None = None) -> TransitionModel:
    """The search's transition model: measured rows from the cost table where they exist.

    ``opts.transition`` (configured, or analytic) is the fallback for what no row covers. A
    farm campaign that built its own estimator (``measure``) measures the missing transition
    rows on this machine first (`collage_farm.probes.transitions.measured_transition_model`)
    and appends them to ``writer``; an offline campaign reuses the table's rows; mock campaigns
    keep the given model. Rows are those of the mode the campaign's candidates are timed in
    (the estimator's `measure_mode`, else ``opts.measure_mode``, else `CANDIDATE_MODE`), so an
    offline search reads the transitions the measuring campaign used. ``handoff_targets``:
    the targets whose hand-offs are measured (None: all; profile mode measures them only for
    targets without a usable profile, the only ones charged hand-offs).
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
            campaign_id=opts.campaign_id, handoff_targets=handoff_targets)
    except Exception as e:  # a broken probe must not cost the campaign: say so, go on
        log.warning("measured transitions unavailable (%s: %s); using %s", type(e).__name__,
                    e, fallback.label)
        return fallback


def with_requantise(targets: Sequence[Target], transition: TransitionModel) -> TransitionModel:
    """``transition`` plus the host's int8 <-> int16 requantisation of every tensor crossing
    into or out of a 16x8 partition (`WithRequantise`, priced by the board host's cycle model,
    `runners.cortex_m.host_of`, `runners.host_model.HostModel.requantise_cycles`) when
    ``targets`` are an Ethos-U board with both 16x8 (``activations: int16``) and int8
    targets; else ``transition`` itself."""
    board = ethos_u_board(targets)
    wide = [t for t in targets if t.option("activations") == "int16"]
    if board is None or not wide or len(wide) == len(targets):  # one precision: no crossing
        return transition
    host = host_of(board.host)
    fixed = host.requantise_cycles(0)
    per_element = host.requantise_cycles(1) - fixed
    charge = Requantise(host.seconds(fixed), host.seconds(per_element))
    return WithRequantise(transition, {t.id: charge for t in wide})


#: targets whose probe sessions are built at once while Ray starts (two: a 2-core host's)
PROBE_BUILD_WORKERS = 2


def start_probe_builds(opts: TuneOptions, graph: DataflowGraph, builder: PlanBuilder,
                       pool: ThreadPoolExecutor) -> Future[dict[str, Any]] | None:
    """The cut-cost probe's sessions being built into ``builder`` on ``pool``
    (`collage_farm.probes.cutcost.build_probe_sessions`), for a farm campaign to start before
    Ray does: Ray's start-up times nothing, so building beside it biases no measurement, and
    the probe then finds its sessions built. The caller waits for the result before anything
    is timed. None when the campaign will not probe now: not a farm campaign, cut costs off,
    fewer than two live toolchains, or the table holds this model's probe already."""
    if not opts.cut_costs or opts.estimator is not CostSource.FARM:
        return None
    live = [t for t in opts.targets if t.toolchain not in SIMULATED_TOOLCHAINS]
    if len({t.toolchain for t in live}) < 2:
        return None
    wholes = measure_strategy(opts, graph) is MeasureStrategy.PROFILE
    table = campaign_table(opts)
    try:
        if table is not None and Path(table).is_dir() and cached_cut_costs(
                CostTable(table), graph, live, measure=False, wholes=wholes) is not None:
            return None
    except Exception:  # an unreadable table: the probe itself says so, later
        return None
    return pool.submit(build_probe_sessions, graph, live, builder, wholes=wholes,
                       workers=PROBE_BUILD_WORKERS)


def with_cut_costs(graph: DataflowGraph, targets: Sequence[Target],
                   transition: TransitionModel, table: Path | None = None,
                   campaign_id: str = "", measure: bool = True,
                   writer: CostTableWriter | None = None, wholes: bool = False,
                   builder: PlanBuilder | None = None) -> tuple[TransitionModel, dict | None]:
    """``transition`` plus this model's measured cut costs (`collage_farm.probes.cutcost`) when the
    campaign mixes two or more toolchains that run here; unchanged (and why) otherwise. With a
    cost ``table``, rows of an earlier probe on this host are reused; new ones are appended to
    ``writer``. ``wholes``: also each target's same-toolchain cut cost (profile mode).
    ``builder``: the probe's sessions come from (and stay in) it, for the campaign's later
    end-to-end runs of the same partitions and whole models."""
    live = [t for t in targets if t.toolchain not in SIMULATED_TOOLCHAINS]
    if len({t.toolchain for t in live}) < 2:
        return transition, None
    try:
        ct = CostTable(table) if table is not None and Path(table).is_dir() else None
        cc = cached_cut_costs(ct, graph, live, writer=writer, campaign_id=campaign_id,
                              measure=measure, wholes=wholes,
                              **({"builder": builder} if builder is not None else {}))
        if cc is None:  # offline, and no earlier probe of this model in the table
            return transition, None
    except Exception as e:  # a broken probe must not cost the campaign: say so, go on
        log.warning("cut costs unavailable (%s: %s)", type(e).__name__, e)
        return transition, {"error": f"{type(e).__name__}: {e}"}
    return WithCutCosts(transition, cc.cuts, cc.charges), cc.to_json()


def profiled_estimator(opts: TuneOptions, graph: DataflowGraph, est: CostEstimator,
                       cut_info: dict | None, builder: PlanBuilder | None = None,
                       foreign: Collection[str] = ()) -> tuple[ProfiledEstimator, dict]:
    """``est`` wrapped in a `ProfiledEstimator` over each target's profile of ``graph``
    (`collage_farm.probes.profiles`: the cost table's rows, else profiled on the farm of a
    measuring ``est``, with the whole model ``builder`` extracted when given), and what
    happened: per target, the profile runs sent, and one warning line per target whose
    costs fall back to ``est`` (no profile, or one rejected). Each target's shares are
    scaled to the cut-cost probe's whole-model time (``cut_info``'s ``wholes_s``) except for
    the ``foreign`` targets, which this process times on another device than their runners
    (`collage_farm.campaign.timing_host`): theirs keep the runner's own whole-model time.
    Every in-chain price of ``graph`` the table holds for this host and the other targets is
    loaded first (`collage_farm.costtable.inchain`; ``in_chain_stored`` counts them). A
    target whose toolchain has no per-operator timer (its request would time prefixes) takes
    its profile from the probe's one-toolchain chain instead, where the probe timed it here
    and the target is not ``foreign`` (`collage_farm.probes.profiles.profile_from_chain`): no
    request goes out for it. A CPU target this process times on its runner's device (its
    runner describes it, and it is not ``foreign``) is profiled in this process, its
    unprofiled whole model timed on the session ``builder`` holds (`_timers_here`)."""
    path = campaign_table(opts)
    table = CostTable(path) if path is not None else None
    farm_est = est if isinstance(est, FarmEstimator) else None  # the one that can profile
    chained, chain_note = _chain_profiles(opts, graph, cut_info, foreign)
    here = (_timers_here(graph, opts.targets, builder, farm_est.farm, foreign)
            if farm_est is not None and builder is not None else {})
    outcomes = collect_profiles(
        graph, opts.targets, table=table,
        farm=farm_est.farm if farm_est else None, store=farm_est.store if farm_est else None,
        strictness=Strictness.parse(opts.strictness),
        whole_model=(lambda: builder.model_bytes(graph.all_mask)) if builder else None,
        given=chained, here=here)
    same = (cut_info or {}).get("same_cuts_s") or {}
    wholes = (cut_info or {}).get("wholes_s") or {}  # every target's whole, one time base
    base = {k: v for k, v in wholes.items() if k not in foreign}  # this device's only
    weights = node_weights(graph)
    profiles: dict[str, TargetProfile] = {}
    warnings: list[str] = []
    for tid, o in outcomes.items():
        why = o.error
        if o.profile is not None:
            try:
                profiles[tid] = TargetProfile.of(o.profile, cut_s=float(same.get(tid, 0.0)),
                                                 tolerance=opts.profile_tolerance,
                                                 weights=weights, whole_s=base.get(tid))
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
            "warnings": warnings, "same_cuts_s": same, "wholes_s": wholes,
            "chain_profiles": chain_note}
    pe = ProfiledEstimator(profiles, est, graph)
    # the prices an earlier campaign on this table set (a re-run, an offline search): its
    # last search ran with all of them, so this one starts where that one ended
    stored = stored_in_chain_prices(table, graph,
                                    [t for t in opts.targets if t.id in profiles
                                     and t.id not in foreign])
    pe.price_in_chain(stored)
    info["in_chain_stored"] = len(stored)
    return pe, info


def _timers_here(graph: DataflowGraph, targets: Sequence[Target], builder: PlanBuilder,
                 farm: MeasurementService, foreign: Collection[str]
                 ) -> dict[str, Callable[[MeasureConfig], list[float]]]:
    """Per CPU target with its own per-operator profiler that this process times on its
    runner's device (a runner describes it; not ``foreign``): a `Toolchain.timer`-like
    function timing the whole model on ``builder``'s session of it (built by the cut-cost
    probe, or on first call), warm, as a worker's unprofiled rounds."""
    out: dict[str, Callable[[MeasureConfig], list[float]]] = {}
    for t in targets:
        if (t.id in foreign or t.device.kind != "cpu" or t.toolchain in SIMULATED_TOOLCHAINS
                or prefix_profiled(t) or farm.describe(t) is None):
            continue
        out[t.id] = _whole_timer(graph, builder, t)
    return out


def _whole_timer(graph: DataflowGraph, builder: PlanBuilder, target: Target
                 ) -> Callable[[MeasureConfig], list[float]]:
    """Warm rounds of ``target``'s whole model on ``builder``'s session, readied on the
    first call (so a target profiled from the table builds nothing)."""
    ready: list[Callable[[], None]] = []

    def timed(cfg: MeasureConfig) -> list[float]:
        if not ready:
            ex = builder.executor([Part(graph.all_mask, target)])
            ready.append(ex.timed_callable(builder.feeds(ex)))
        return time_callable(ready[0], dataclasses.replace(cfg, mode="warm"))[0]
    return timed


def _chain_profiles(opts: TuneOptions, graph: DataflowGraph, cut_info: dict | None,
                    foreign: Collection[str]) -> tuple[dict[str, OperatorProfile], dict[str, str]]:
    """The profiles the probe's one-toolchain chains give the targets with no per-operator
    timer that are not ``foreign`` (`profile_from_chain`), and per such target what its
    profile comes from: the chain, or a request and why (no chain, or one
    `OperatorProfile.problem` rejects under ``opts.profile_tolerance``)."""
    chained: dict[str, OperatorProfile] = {}
    note: dict[str, str] = {}
    for t in opts.targets:
        if t.id in foreign or t.toolchain in SIMULATED_TOOLCHAINS or not prefix_profiled(t):
            continue
        prof = profile_from_chain(graph, cut_info, t.id)
        why = ("the probe timed no chain of it" if prof is None
               else prof.problem(opts.profile_tolerance))
        if prof is not None and not why:
            chained[t.id] = prof
            note[t.id] = "the cut-cost probe's chain"
        else:
            note[t.id] = f"a profile request: {why}"
    return chained, note


def price_in_chain(graph: DataflowGraph, est: ProfiledEstimator, result: SearchResult,
                   builder: PlanBuilder, opts: TuneOptions, writer: CostTableWriter | None,
                   search_again: Callable[[], SearchResult], *, foreign: Collection[str] = ()
                   ) -> tuple[SearchResult, dict]:
    """The search result once the best plans' partitions are priced in chain
    (`collage_farm.postsearch.inchain`, up to ``opts.inchain_rounds`` plans), each new price
    appended to ``writer`` (the campaign's cost table) so that a re-run or an offline search
    on the table starts with it; and what was done (the summary's ``inchain``)."""
    result, info, prices = price_best_plans(graph, est, search_again, result, builder,
                                            rounds=opts.inchain_rounds, foreign=foreign)
    if writer is not None:
        for p in prices:
            writer.append(in_chain_row(graph, p.candidate.target, p.candidate.mask, p.seconds,
                                       p.details(), campaign_id=opts.campaign_id))
    return result, info
