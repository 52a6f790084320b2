"""``collage-farm tune``: options -> `TuneOptions` -> `run_tune` (the campaign) -> its summary.

The summary is printed as text or, with ``--json``, as the campaign's summary dict unchanged.
Option combinations argparse cannot check raise `UserError` before anything is measured.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from collage_farm.campaign import DEFAULT_REFINE_TRIALS, TuneOptions
from collage_farm.campaign import run_tune as run_campaign
from collage_farm.cli.errors import UserError
from collage_farm.cli.targets import add_config_args, config_from_args
from collage_farm.core.graph import parse_shape
from collage_farm.core.pins import PinSet
from collage_farm.core.rules import RuleOptions
from collage_farm.core.target import Target, parse_targets
from collage_farm.core.transition import TransitionModel
from estimators.profiled import MeasureStrategy

__all__ = ["add_tune_parser", "print_summary", "run_tune"]


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="an ONNX file, zoo:NAME or pkg:NAME (see `collage-farm zoo "
                   "list`)")
    p.add_argument("--targets", default="ort-cpu,openvino-cpu",
                   help="comma-separated target names (default: ort-cpu,openvino-cpu)")
    p.add_argument("--out", default="out", help="plan directory (default: ./out)")
    p.add_argument("--shape", action="append", default=[], metavar="INPUT=DxDx...",
                   help="bind a dynamic input shape, e.g. --shape input=1x3x224x224")
    p.add_argument("--layers", type=int, help="layers for zoo transformer models")


def _add_cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cost-table", help="Parquet cost table directory (default: OUT/costs)")
    p.add_argument("--address", help="join a Ray cluster: auto | ray://HOST:PORT "
                   "(default: RAY_ADDRESS, else an embedded local Ray)")
    p.add_argument("--offline", action="store_true",
                   help="use the cost table only: no Ray, no runners")
    p.add_argument("--allow-analytic", action="store_true",
                   help="with --offline: answer missing costs with the analytic estimator")
    p.add_argument("--mock", action="store_true",
                   help="deterministic fake costs (for trying the search; labelled 'mock')")
    p.add_argument("--no-prune", action="store_true",
                   help="measure every candidate (no lower-bound pruning)")
    p.add_argument("--retry-failed", action="store_true",
                   help="measure again every candidate the cost table records as failed "
                   "(e.g. after fixing a toolchain); without it, only a timeout or crash "
                   "seen once is retried")
    p.add_argument("--reconfirm", action="store_true",
                   help="re-measure the chosen path even where the cost table holds a "
                   "confirmation (without it, a candidate confirmed once stays confirmed, so a "
                   "re-run of a finished campaign measures nothing)")
    p.add_argument("--max-depth", type=int, default=4, help="candidate depth limit (default 4)")
    p.add_argument("--strictness", default="exact", choices=["exact", "device", "any"],
                   help="cost-table matching (see README)")
    p.add_argument("--num-cpus", type=int, help="CPUs for the embedded Ray")
    p.add_argument("--measure-mode", choices=["warm", "flush", "network"], default=None,
                   help="cache state candidates are timed in (default network: what the rest "
                   "of the model touches is evicted before each run; with --offline: use "
                   "only rows taken in this mode)")
    p.add_argument("--measure", choices=[m.value for m in MeasureStrategy],
                   default=MeasureStrategy.PROFILE.value,
                   help="how candidates get costs: profile (default: each target's whole "
                   "model profiled per operator in network; only the uncertain candidates on "
                   "the best plans, and the confirmation step, are measured in isolation) or "
                   "exhaustive (every candidate the search asks for measured in isolation)")
    p.add_argument("--no-cut-costs", action="store_true",
                   help="do not measure this model's cut cost per target (each chunk inside "
                   "chains of other toolchains vs its own) for the search's transitions")


def _add_post_search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--confirm-rounds", type=int, default=3, metavar="N",
                   help="after the search, re-measure the chosen path's candidates and each "
                   "target's whole model, then search again, up to N times until the path "
                   "is made of re-measured candidates (default 3; 0 disables; measured "
                   "campaigns only)")
    p.add_argument("--verify-extend-rounds", type=int, default=14, metavar="N",
                   help="when the mix looks faster than the best single toolchain (by > 3%%) "
                   "but not beyond the verify run's noise, time N more interleaved rounds of "
                   "the two and decide on all rounds (default 14; 0 disables)")
    p.add_argument("--no-verify", action="store_true",
                   help="do not measure the plan end to end against each single toolchain "
                   "(never-worse check); by default a plan not faster than the best single "
                   "toolchain beyond noise is replaced by that toolchain's whole model")
    p.add_argument("--refine-trials", type=int, default=None, metavar="N",
                   help="measured local moves tried on the Dijkstra plan (default 6; 0 "
                   "disables refinement)")
    p.add_argument("--refine-time", type=float, default=120.0, metavar="S",
                   help="wall-clock budget for refinement, seconds (default 120)")
    p.add_argument("--no-report", action="store_true",
                   help="do not write report.html and its PNGs beside the plan")


def add_tune_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``tune`` (with the config-file options) on the main parser's subcommands."""
    p = sub.add_parser("tune", help="find the fastest mix of toolchains for a model")
    _add_model_args(p)
    _add_cost_args(p)
    _add_post_search_args(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_config_args(p)


def _check_tune_args(args: argparse.Namespace) -> None:
    """Option combinations and values argparse cannot check, as one-line user errors."""
    if args.mock and args.offline:
        raise UserError("--mock and --offline exclude each other")
    if args.allow_analytic and not args.offline:
        raise UserError("--allow-analytic applies to --offline only")
    for flag, value in (("--max-depth", args.max_depth), ("--num-cpus", args.num_cpus),
                        ("--layers", args.layers)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be at least 1, not {value}")


def _targets_from_args(args: argparse.Namespace
                       ) -> tuple[list[Target], TransitionModel | None, PinSet | None,
                                  RuleOptions]:
    """Targets, transition model, pins and rule options from --targets and config files.

    Without a config file: the built-in targets named, no transition model and no pins (the
    campaign's defaults), and ``--max-depth``. With one, its ``subgraph`` limits decide (their
    ``max_depth`` unset: ``--max-depth``).
    """
    cfg = config_from_args(args)
    if cfg is None:
        return parse_targets(args.targets), None, None, RuleOptions(max_depth=args.max_depth)
    return (cfg.resolve_targets(args.targets), cfg.transition, cfg.pin_set or None,
            cfg.rule_options(args.max_depth))


def _tune_options(args: argparse.Namespace) -> TuneOptions:
    shapes = dict(parse_shape(s) for s in args.shape)
    _check_tune_args(args)
    targets, transition, pins, rule_options = _targets_from_args(args)
    return TuneOptions(
        model=args.model,
        targets=tuple(targets),
        out=Path(args.out),
        shapes=shapes,
        layers=args.layers,
        estimator="mock" if args.mock else "offline" if args.offline else "farm",
        cost_table=Path(args.cost_table) if args.cost_table else None,
        address=args.address or os.environ.get("RAY_ADDRESS") or None,
        allow_analytic=args.allow_analytic,
        prune=not args.no_prune,
        retry_failed=args.retry_failed,
        reconfirm=args.reconfirm,
        rule_options=rule_options,
        transition=transition,
        pins=pins,
        strictness=args.strictness,
        num_cpus=args.num_cpus,
        verify=not args.no_verify,
        refine_trials=(DEFAULT_REFINE_TRIALS if args.refine_trials is None
                       else max(0, args.refine_trials)),
        refine_time_s=args.refine_time,
        report=not args.no_report,
        measure_mode=args.measure_mode or "",
        cut_costs=not args.no_cut_costs,
        measure=args.measure,
        confirm_rounds=max(0, args.confirm_rounds),
        verify_extend_rounds=max(0, args.verify_extend_rounds),
    )


def run_tune(args: argparse.Namespace) -> int:
    """``collage-farm tune``: run the campaign and print its summary; 0 once a plan is written."""
    summary = run_campaign(_tune_options(args))
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print_summary(summary)
    return 0


def print_summary(s: dict[str, Any]) -> None:
    """The campaign summary (`run_tune`'s dict) as the text ``tune`` prints."""
    est = s["estimator"]
    warn = "  (MOCK COSTS: not measurements)" if est == "mock" else ""
    print(f"model {s['model']}: {s['nodes']} nodes, {s['candidates']} candidates, "
          f"{s['distinct_fingerprints']} distinct fingerprints")
    by = s.get("failed_by_status") or {}
    if s.get("measure") == "profile":
        scr = s.get("screen") or {}
        print(f"costs from in-network profiles: {s.get('profiled', 0)} profile runs, "
              f"{scr.get('measured', 0)} uncertain candidates on {scr.get('plans', 0)} best "
              "plans measured in isolation")
    print(f"costs from {est}{warn}: {s['measured']} measured, {s['cache_hits']} cache hits, "
          f"{s['pruned']} pruned, {s['failed']} failed"
          + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(by.items()))})" if by else ""))
    for line in (s.get("profile") or {}).get("warnings", ()):
        print(line)
    if by.get("no_runner"):
        print(f"warning: {by['no_runner']} candidates had no runner on this cluster (a target "
              "whose device or toolchain no node offers: `collage-farm targets list --check`); "
              "the plan leaves those targets out")
    per = ", ".join(f"{k}: {v}" for k, v in s["partitions_per_target"].items())
    print(f"plan: {s['partitions']} partitions ({per}); estimated "
          f"{s['estimated_total_s'] * 1e3:.3f} ms{warn}")
    if s.get("plan_measured_s") is not None:
        _print_post_search(s)
    elif s.get("never_worse"):
        print(f"never worse: {s['never_worse']}")
    elif isinstance(s.get("verify"), str):
        print(f"end-to-end check {s['verify']}")
    if s.get("report"):
        print(f"report: {s['report']}")
    print(f"search {s['search_s']:.2f} s, wall {s['wall_s']:.2f} s; plan in {s['plan']}")


def _print_post_search(s: dict[str, Any]) -> None:
    """Confirmation, refinement and the measured end-to-end figures of a measured campaign."""
    conf = s.get("confirm") or {}
    if conf.get("remeasured"):
        print(f"confirmation: {conf['remeasured']} candidates re-measured "
              f"({conf['stopped_by']}; path {'changed' if conf['path_changed'] else 'kept'};"
              f" median fresh/first {conf['median_after_over_before'] or float('nan'):.3f}"
              f"); estimate {s['first_search_estimated_s'] * 1e3:.3f} -> "
              f"{s['dijkstra_estimated_s'] * 1e3:.3f} ms")
    ref = s.get("refine") or {}
    print(f"refinement: {ref.get('trials', 0)} measured trials, {ref.get('accepted', 0)} "
          f"kept ({ref.get('stopped_by', '')})" + (
              f"; refined {s['refined_measured_s'] * 1e3:.4f} ms vs Dijkstra "
              f"{s['dijkstra_measured_s'] * 1e3:.4f} ms" if s.get("refined_measured_s")
              else ""))
    best = s.get("best_single_target")
    best_s = s.get("best_single_measured_s")
    line = f"measured end to end: plan {s['plan_measured_s'] * 1e3:.4f} ms"
    if best and best_s:
        line += (f", best single {best} {best_s * 1e3:.4f} ms "
                 f"(speedup {s['speedup_vs_best_single']:.3f}x)")
    if s.get("additive_error") is not None:
        line += f"; additive error {s['additive_error']:+.1%}"
    print(line)
    gain, cae = s.get("estimated_gain_vs_best_single"), s.get(
        "dijkstra_calibrated_additive_error")
    if gain is not None:
        print(f"the search believed its mix {gain:.3f}x the best single toolchain"
              + (f"; Dijkstra plan's additive error after per-target calibration "
                 f"{cae:+.1%}" if cae is not None else ""))
    for t, why in (s.get("singles_ineligible") or {}).items():
        print(f"not a fallback: {t}'s whole model ({why})")
    print(f"never worse: {s.get('never_worse', '')}")
