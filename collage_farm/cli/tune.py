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

from collage_farm.campaign import DEFAULT_REFINE_TRIALS, CostSource, TuneOptions
from collage_farm.campaign import run_tune as run_campaign
from collage_farm.cli.errors import UserError
from collage_farm.cli.inputs import (
    add_calibration_arg,
    add_input_arg,
    calibration_data,
    input_values,
)
from collage_farm.cli.targets import add_config_args, config_from_args, toolchain_unavailable
from collage_farm.config import builtin_system_for
from collage_farm.core.graph import parse_shape
from collage_farm.core.phases import top_phases
from collage_farm.core.pins import PinSet
from collage_farm.core.rules import RuleOptions
from collage_farm.core.target import (
    EMBEDDED_TOOLCHAINS,
    Target,
    board_conflict,
    parse_targets,
)
from collage_farm.core.transition import TransitionModel
from collage_farm.report.summary import plural, story_text
from estimators.profiled import MeasureStrategy
from runners.profile import ProfileMethod

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
    add_input_arg(p)
    add_calibration_arg(p, "8 seeded random samples; plan.json records which was used")


def _add_cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cost-table", help="Parquet cost table directory (default: OUT/costs)")
    p.add_argument("--address", metavar="ADDR",
                   help="join a Ray cluster: HOST:PORT (its head's GCS port, 6379 by "
                   "default), ray://HOST:PORT (Ray Client, 10001) or auto (the cluster "
                   "`ray start` last started on this machine); default: RAY_ADDRESS, else "
                   "an embedded local Ray")
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
    p.add_argument("--slots", type=int, metavar="N",
                   help="force N CPU measurement slots (runners timing at once) per host; "
                   "default: one per last-level-cache domain, more only where `bench/farm.py "
                   "--record-bias` measured the concurrency bias there at <= 2%%")
    p.add_argument("--measure-mode", choices=["warm", "flush", "network"], default=None,
                   help="cache state candidates are timed in (default network: what the rest "
                   "of the model touches is evicted before each run; with --offline: use "
                   "only rows taken in this mode)")
    p.add_argument("--measure", choices=[m.value for m in MeasureStrategy], default="",
                   help="how candidates get costs (default: profile for a campaign that "
                   "measures and on a simulated Ethos-U board, --offline too; with --offline "
                   "elsewhere, profile where the table holds this model's profile rows, else "
                   "exhaustive; on a board, profile builds Vela's own split once per target, "
                   "prices candidates by its per-operator cycles and builds the chosen path "
                   "exactly): exhaustive (every candidate the "
                   "search asks for measured in isolation) or profile (each "
                   "target's whole model profiled per operator in network, or by prefix "
                   "differences where its profiler is not trusted; candidates cost their "
                   "nodes' shares plus measured cut costs, and none is measured in isolation "
                   "unless a target has no usable profile)")
    p.add_argument("--no-cut-costs", action="store_true",
                   help="do not measure this model's cut cost per target (each chunk inside "
                   "chains of other toolchains vs its own) for the search's transitions")


def _add_post_search_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--confirm-rounds", type=int, default=3, metavar="N",
                   help="after the search, re-measure the chosen path's candidates and each "
                   "target's whole model, then search again, up to N times until the path "
                   "is made of re-measured candidates (default 3; 0 disables; measured "
                   "campaigns only)")
    p.add_argument("--inchain-rounds", type=int, default=4, metavar="N",
                   help="profile mode: when the search's plan is a mix, time it in this "
                   "process with each partition timed inside the running plan, price its "
                   "partitions by that and search again, up to N plans (default 4; 0 "
                   "disables; measured campaigns only)")
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
    p.add_argument("--no-accuracy-check", action="store_true",
                   help="on an Ethos-U board, do not check the written plan's int8 numerics "
                   "as `run` does (by default a plan that fails is searched once more with "
                   "16-bit activations, the NPU's first, then the host's)")


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
                        ("--layers", args.layers), ("--slots", args.slots)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be at least 1, not {value}")
    if args.slots is not None and (args.mock or args.offline):
        raise UserError("--slots applies to campaigns that measure (not --offline or --mock)")


def _targets_from_args(args: argparse.Namespace
                       ) -> tuple[list[Target], TransitionModel | None, PinSet | None,
                                  RuleOptions]:
    """Targets, transition model, pins and rule options from --targets and config files.

    Without a config file: the built-in targets named (refused when they are on no one board,
    `_board`), no pins and ``--max-depth``. With one, its ``subgraph`` limits decide (their
    ``max_depth`` unset: ``--max-depth``). An Ethos-U NPU comes with its board's host.
    """
    cfg = config_from_args(args)
    if cfg is None:
        targets, transition = _board(parse_targets(args.targets))
        return targets, transition, None, RuleOptions(max_depth=args.max_depth)
    return (cfg.with_board_host(cfg.resolve_targets(args.targets)), cfg.transition,
            cfg.pin_set or None, cfg.rule_options(args.max_depth))


def _board(targets: list[Target]) -> tuple[list[Target], TransitionModel | None]:
    """Built-in targets named without a system file, on their board: the built-in Ethos-U board
    that holds them gives its transition model (NPU invocation, hand-over) and its host (when
    only the NPU is named); other targets keep the campaign's default (None). `UserError` when
    no one board holds them all (an x86 toolchain next to a simulated NPU): such a plan would
    be for a board that does not exist."""
    why = board_conflict(targets)
    if why is not None:
        raise UserError(why)
    if not all(t.toolchain in EMBEDDED_TOOLCHAINS for t in targets):
        return targets, None
    board = builtin_system_for(targets)
    if board is None:
        return targets, None
    return board.with_board_host(targets), board.transition


def _tune_options(args: argparse.Namespace) -> TuneOptions:
    shapes = dict(parse_shape(s) for s in args.shape)
    _check_tune_args(args)
    targets, transition, pins, rule_options = _targets_from_args(args)
    return TuneOptions(
        model=args.model,
        targets=tuple(targets),
        out=Path(args.out),
        shapes=shapes,
        inputs=input_values(args),
        calibration=calibration_data(args),
        layers=args.layers,
        estimator=(CostSource.MOCK if args.mock else CostSource.OFFLINE if args.offline
                   else CostSource.FARM),
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
        slots=args.slots,
        verify=not args.no_verify,
        refine_trials=(DEFAULT_REFINE_TRIALS if args.refine_trials is None
                       else max(0, args.refine_trials)),
        refine_time_s=args.refine_time,
        report=not args.no_report,
        accuracy_check=not args.no_accuracy_check,
        measure_mode=args.measure_mode or "",
        cut_costs=not args.no_cut_costs,
        measure=args.measure,
        confirm_rounds=max(0, args.confirm_rounds),
        verify_extend_rounds=max(0, args.verify_extend_rounds),
        inchain_rounds=max(0, args.inchain_rounds),
    )


def _check_runnable_here(opts: TuneOptions) -> None:
    """An embedded farm measures every target on this machine: a target whose toolchain
    cannot run here is refused before Ray starts, with the reason ``targets list --check``
    gives (a cluster joined with ``--address`` may have what this machine lacks)."""
    if opts.estimator is not CostSource.FARM or opts.address:
        return
    for tc in dict.fromkeys(t.toolchain for t in opts.targets):
        why = toolchain_unavailable(tc)
        if why:
            names = ", ".join(t.id for t in opts.targets if t.toolchain == tc)
            raise UserError(f"{names} cannot run on this machine ({tc}: {why}); "
                            "`collage-farm targets list --check` says which targets can, "
                            "--address joins a cluster with nodes that run it")


def run_tune(args: argparse.Namespace) -> int:
    """``collage-farm tune``: run the campaign and print its summary; 0 once a plan is written."""
    opts = _tune_options(args)
    _check_runnable_here(opts)
    summary = run_campaign(opts)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print_summary(summary)
    return 0


def print_summary(s: dict[str, Any]) -> None:
    """The campaign summary (`run_tune`'s dict) as the text ``tune`` prints: the model, the
    story of the plan (`collage_farm.report.summary`: the written plan measured, each single
    toolchain, the decision, the estimate of the written plan, the history), then where the
    costs came from."""
    est = s["estimator"]
    warn = "  (MOCK COSTS: not measurements)" if est == "mock" else ""
    print(f"model {s['model']}: {s['nodes']} nodes, {s['candidates']} candidates, "
          f"{s['distinct_fingerprints']} distinct fingerprints")
    for line in story_text(s):
        print(line)
    by = s.get("failed_by_status") or {}
    if s.get("measure") == "profile" and (s.get("profile") or {}).get("board"):
        conf = s.get("confirm") or {}
        print(f"costs from profile builds: {plural(int(s.get('profiled', 0)), 'build')} of "
              f"Vela's own split now, {plural(int(conf.get('estimated', 0)), 'candidate')} "
              "priced by per-operator estimate only; the plan's figures are exact builds "
              f"({plural(int(conf.get('built', 0)), 'candidate')} built to confirm it), "
              "simulated (Vela cycles, Cortex-M cycle model), not measured")
    elif s.get("measure") == "profile":
        scr = s.get("screen") or {}
        screened = (f"{plural(int(scr.get('measured', 0)), 'uncertain candidate')} on "
                    f"{plural(int(scr.get('plans', 0)), 'best plan')} measured in isolation"
                    if scr.get("measured") else "no candidate measured in isolation")
        chained = sorted(t for t, o in ((s.get("profile") or {}).get("targets") or {}).items()
                         if (o or {}).get("method") == ProfileMethod.CHAIN.value)
        ran = [o for o in ((s.get("profile") or {}).get("targets") or {}).values()
               if (o or {}).get("where")]
        local = sum(o["where"] == "campaign process" for o in ran)
        where = (f", {local} in this process on the runners' device and {len(ran) - local} "
                 "on the farm" if local else " on the farm")
        print(f"costs from in-network profiles: {plural(int(s.get('profiled', 0)), 'profile run')}"
              f" now{where if ran else ''} (per-operator shares of each target's whole model"
              + (f"; {', '.join(chained)}: the cut-cost probe's chunks, timed in chain"
                 if chained else "") + f"); {screened}")
        chain = s.get("inchain") or {}
        stored = int((s.get("profile") or {}).get("in_chain_stored") or 0)
        if chain.get("plans") or stored:
            print(f"in-chain prices: {plural(int(chain.get('priced', 0)), 'partition')} of "
                  f"{plural(int(chain.get('plans', 0)), 'mixed plan')} timed in this process "
                  f"now (measured, scaled to the profiles' time base), {stored} from the cost "
                  f"table; stopped by {chain.get('stopped_by', 'none')}"
                  + (f" ({chain['error']})" if chain.get("error") else ""))
    # an Ethos-U board's candidates are built and simulated (Vela, the host model), not timed
    done = "built (simulated)" if s.get("baseline") == "vela_whole" else "measured"
    print(f"costs from {est}{warn}: {s['measured']} {done}, {s['cache_hits']} cache hits, "
          f"{s['pruned']} pruned, {s['failed']} failed"
          + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(by.items()))})" if by else ""))
    for line in (s.get("profile") or {}).get("warnings", ()):
        print(line)
    if (s.get("plan_timing_host") or {}).get("warning"):
        print(s["plan_timing_host"]["warning"])
    if by.get("no_runner"):
        print(f"warning: {by['no_runner']} candidates had no runner on this cluster (a target "
              "whose device or toolchain no node offers: `collage-farm targets list --check`); "
              "the plan leaves those targets out")
    if s.get("accuracy"):
        print(accuracy_line(s["accuracy"], s.get("estimated_total_s")))
    if s.get("slots"):
        print(_slots_line(s["slots"]))
    if s.get("report"):
        print(f"report: {s['report']}")
    print(f"search {s['search_s']:.2f} s, wall {s['wall_s']:.2f} s; plan in {s['plan']}")
    if s.get("phases_s"):
        print(f"wall by phase (largest): {top_phases(s['phases_s'])}")


def accuracy_line(acc: dict[str, Any], estimated_s: float | None) -> str:
    """The accuracy gate's outcome (the summary's ``accuracy``) in one line: the written
    plan's check and, where the campaign searched again, why and what it cost."""
    def check(c: dict[str, Any]) -> str:
        steps = c.get("worst_steps")
        worst = (f"{c['worst_output']} {steps:.1f} int8 steps" if steps is not None
                 else c.get("worst_output") or "")
        return f"{c['verdict']}" + (f" ({worst})" if worst else "")
    line = f"accuracy (`run`'s int8 check of the written plan): {check(acc)}"
    refused = acc.get("refused") or ([acc["first"]] if acc.get("first") else [])
    for r in refused:
        line += (f"; refused: the plan on {', '.join(r['check']['targets'])} (simulated "
                 f"{r['estimated_total_s'] * 1e3:.3f} ms) {check(r['check'])}")
    if refused:
        line += f"; so the board was searched with 16-bit activations ({', '.join(acc['targets'])})"
        if estimated_s is not None:
            line += f": simulated {estimated_s * 1e3:.3f} ms"
    if acc.get("verdict") != "passed":
        line += f". WARNING: {acc.get('message', '')[:300]}"
    return line


def _slots_line(slots: dict[str, Any]) -> str:
    """How many CPU runners measured at once, and why (the summary's ``slots``)."""
    line = f"measured with {slots['used']} CPU slot(s) ({slots['why']}"
    if slots.get("forced"):
        line += f": --slots {slots['forced']} per host"
    biases = [f"{h['host']} {h['bias']:+.1%} at {h['bias_slots']} per domain"
              for h in slots.get("per_host", []) if h.get("bias") is not None]
    return line + (f"; measured concurrency bias {', '.join(biases)}" if biases else "") + ")"
