"""A tuning campaign: phases 1-4 end to end, with whatever estimator the user chose.

This is the one place that wires the pieces together: load the model into a `DataflowGraph`,
build each target's partition rules from its toolchain's capabilities (phase 1), collect
candidates (phase 2), run the Dijkstra search against a cost estimator (phase 3), and write the
plan (phase 4). Estimators are picked by the caller:

* ``farm`` (default): measure on runners through Ray (embedded local cluster unless an address
  is given), answering from the cost table first and writing every result to it;
* ``offline``: the cost table only (no Ray), optionally filling gaps analytically;
* ``mock``: deterministic fake costs, labelled as such everywhere they appear.

The summary returned (and printed with ``--json``) is a plain dict, so scripts can rely on its
keys: ``estimated_total_s``, ``partitions``, ``candidates``, ``distinct_fingerprints``,
``search_s`` and the campaign statistics.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from collage_farm.candidate import CandidatePartition
from collage_farm.graph import DataflowGraph, ModelError, load_graph
from collage_farm.plan import make_plan, write_plan
from collage_farm.rules import PartitionSpec, RuleOptions, all_candidates, default_spec
from collage_farm.search import SearchResult, search
from collage_farm.target import Target
from collage_farm.transition import AnalyticTransitionModel, TransitionModel
from estimators.base import CostEstimator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TuneOptions:
    model: str  # a path, or zoo:NAME
    targets: tuple[Target, ...]
    out: Path
    shapes: Mapping[str, Sequence[int]] = field(default_factory=dict)
    layers: int | None = None  # zoo models only
    estimator: str = "farm"  # farm | offline | mock
    cost_table: Path | None = None
    address: str | None = None
    allow_analytic: bool = False
    prune: bool = True
    rule_options: RuleOptions = RuleOptions()
    transition: TransitionModel | None = None
    pins: object = None  # collage_farm.pins.PinSet, when given
    campaign_id: str = ""
    strictness: str = "exact"
    num_cpus: int | None = None


def load_source(spec: str, shapes: Mapping[str, Sequence[int]] | None = None,
                layers: int | None = None) -> DataflowGraph:
    """A model path or ``zoo:NAME``, loaded into a graph."""
    if spec.startswith("zoo:"):
        from collage_farm import zoo

        name = spec[4:]
        kw = {} if layers is None else {"layers": layers}
        try:
            model = zoo.build(name, **kw)
        except KeyError as e:
            raise ModelError(str(e.args[0]) if e.args else f"unknown zoo model {name!r}") from None
        return load_graph(model, shapes, name=name)
    if layers is not None:
        raise ModelError("--layers applies to zoo models only")
    return load_graph(spec, shapes)


def build_specs(targets: Sequence[Target], options: RuleOptions) -> list[PartitionSpec]:
    """Phase 1: a rule tree per target from its toolchain's capabilities."""
    from runners.registry import capabilities_for

    specs = []
    for t in targets:
        caps = capabilities_for(t.toolchain)
        specs.append(default_spec(t, caps.supports, caps.style, options))
    return specs


def tensor_ranges_provider(graph: DataflowGraph, targets: Sequence[Target]
                           ) -> Callable[[CandidatePartition], tuple] | None:
    """Calibrated ranges (whole fp32 model, once) for targets that quantise."""
    if not any(t.toolchain == "vela" for t in targets):
        return None
    from runners.calibration import calibrate

    ranges = calibrate(graph)

    def for_candidate(c: CandidatePartition) -> tuple:
        names: set[str] = set(c.sub_graph.input_tensors)
        for n in c.sub_graph.nodes:
            names.update(o for o in n.outputs if o)
        return tuple((k, float(ranges[k][0]), float(ranges[k][1]))
                     for k in sorted(names) if k in ranges)

    return for_candidate


def make_estimator(opts: TuneOptions, graph: DataflowGraph) -> CostEstimator:
    if opts.estimator == "mock":
        from estimators.mock import MockEstimator

        return MockEstimator()
    if opts.estimator == "offline":
        from estimators.table import TableEstimator

        if opts.cost_table is None:
            raise ValueError("--offline needs --cost-table DIR")
        return TableEstimator(opts.cost_table, allow_analytic=opts.allow_analytic,
                              strictness=opts.strictness)
    if opts.estimator == "farm":
        from collage_farm.farm import Farm
        from estimators.measured import FarmEstimator

        table = opts.cost_table or (opts.out / "costs")
        farm = Farm.start(opts.address, toolchains=sorted({t.toolchain for t in opts.targets}),
                          num_cpus=opts.num_cpus)
        return FarmEstimator(
            farm,
            table,
            campaign_id=opts.campaign_id,
            model=graph.name,
            tensor_ranges_for=tensor_ranges_provider(graph, opts.targets),
            prune=opts.prune,
            strictness=opts.strictness,
        )
    raise ValueError(f"unknown estimator {opts.estimator!r} (farm, offline, mock)")


def run_tune(opts: TuneOptions, estimator: CostEstimator | None = None) -> dict:
    """Run phases 1-4; write the plan to ``opts.out``; return the summary."""
    t_start = time.perf_counter()
    campaign_id = opts.campaign_id or uuid.uuid4().hex[:12]
    opts = TuneOptions(**{**opts.__dict__, "campaign_id": campaign_id})
    graph = load_source(opts.model, opts.shapes, opts.layers)
    t_loaded = time.perf_counter()

    specs = build_specs(opts.targets, opts.rule_options)
    candidates = all_candidates(graph, specs)
    if opts.pins is not None:
        from collage_farm.pins import filter_candidates

        candidates = filter_candidates(candidates, opts.pins)
    t_cands = time.perf_counter()
    fingerprints = {c.fingerprint for c in candidates}

    own = estimator is None
    est = estimator or make_estimator(opts, graph)
    transition = opts.transition or AnalyticTransitionModel()
    try:
        result: SearchResult = search(graph, candidates, est, transition,
                                      lazy=bool(opts.prune and est.has_lower_bound))
    finally:
        stats = est.stats()
        if own:
            est.close()
    plan = make_plan(graph, result, opts.targets, estimator=est.label,
                     transition=transition.label)
    plan.extra.update({"campaign_id": campaign_id, "source": opts.model})
    write_plan(plan, graph, result, opts.out)
    t_end = time.perf_counter()

    per_target: dict[str, int] = {}
    for p in plan.partitions:
        per_target[p.target] = per_target.get(p.target, 0) + 1
    return {
        "model": graph.name,
        "campaign_id": campaign_id,
        "estimator": est.label,
        "targets": [t.id for t in opts.targets],
        "nodes": len(graph.nodes),
        "candidates": len(candidates),
        "distinct_fingerprints": len(fingerprints),
        "partitions": len(plan.partitions),
        "partitions_per_target": per_target,
        "estimated_total_s": result.total_s,
        "estimated_compute_s": sum(p.cost.seconds for p in result.partitions),
        "estimated_transition_s": sum(p.penalty_s for p in result.partitions),
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
        "search_s": result.search_s,
        "wall_s": t_end - t_start,
        "plan": str(Path(opts.out) / "plan.json"),
    }
