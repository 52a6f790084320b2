"""The ``collage-farm`` command line.

Subcommands: ``tune`` (a campaign: phases 1-4), ``zoo`` (built-in models), ``costs`` (cost
tables), ``targets`` (target configurations), ``cluster`` (cluster.yaml checks), ``run`` and
``compare`` where available. Every user error (bad model, unknown target, missing cost, bad
config) prints one clear line on stderr and exits with status 2; nothing is half-written.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_USAGE = 2


def _add_tune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tune", help="find the fastest mix of toolchains for a model")
    p.add_argument("model", help="an ONNX file, zoo:NAME or pkg:NAME (see `collage-farm zoo "
                   "list`)")
    p.add_argument("--targets", default="ort-cpu,openvino-cpu",
                   help="comma-separated target names (default: ort-cpu,openvino-cpu)")
    p.add_argument("--out", default="out", help="plan directory (default: ./out)")
    p.add_argument("--shape", action="append", default=[], metavar="INPUT=DxDx...",
                   help="bind a dynamic input shape, e.g. --shape input=1x3x224x224")
    p.add_argument("--layers", type=int, help="layers for zoo transformer models")
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
    p.add_argument("--max-depth", type=int, default=4, help="candidate depth limit (default 4)")
    p.add_argument("--strictness", default="exact", choices=["exact", "device", "any"],
                   help="cost-table matching (see README)")
    p.add_argument("--num-cpus", type=int, help="CPUs for the embedded Ray")
    p.add_argument("--measure-mode", choices=["warm", "flush", "network"], default=None,
                   help="cache state candidates are timed in (default network: what the rest "
                   "of the model touches is evicted before each run; with --offline: use "
                   "only rows taken in this mode)")
    p.add_argument("--no-cut-costs", action="store_true",
                   help="do not measure this model's cut cost per target (each chunk inside "
                   "chains of other toolchains vs its own) for the search's transitions")
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
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    try:
        from collage_farm.cli.targets import add_config_args

        add_config_args(p)
    except ImportError:  # pragma: no cover - config module not installed
        pass


def _run_tune(args: argparse.Namespace) -> int:
    import os

    from collage_farm.campaign import DEFAULT_REFINE_TRIALS, TuneOptions, run_tune
    from collage_farm.core.graph import parse_shape
    from collage_farm.core.rules import RuleOptions

    shapes = dict(parse_shape(s) for s in args.shape)
    _check_tune_args(args)
    targets, transition, pins, rule_options = _targets_from_args(args)
    estimator = "mock" if args.mock else "offline" if args.offline else "farm"
    address = args.address or os.environ.get("RAY_ADDRESS") or None
    opts = TuneOptions(
        model=args.model,
        targets=tuple(targets),
        out=Path(args.out),
        shapes=shapes,
        layers=args.layers,
        estimator=estimator,
        cost_table=Path(args.cost_table) if args.cost_table else None,
        address=address,
        allow_analytic=args.allow_analytic,
        prune=not args.no_prune,
        retry_failed=args.retry_failed,
        rule_options=rule_options or RuleOptions(max_depth=args.max_depth),
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
        confirm_rounds=max(0, args.confirm_rounds),
        verify_extend_rounds=max(0, args.verify_extend_rounds),
    )
    summary = run_tune(opts)
    if args.json:
        print(json.dumps(summary, indent=2, default=str))
    else:
        _print_summary(summary)
    return 0


def _check_tune_args(args: argparse.Namespace) -> None:
    """Option combinations and values argparse cannot check, as one-line user errors."""
    if args.mock and args.offline:
        raise _UserError("--mock and --offline exclude each other")
    if args.offline and not args.cost_table:
        raise _UserError("--offline needs --cost-table DIR (a cost table measured earlier)")
    if args.allow_analytic and not args.offline:
        raise _UserError("--allow-analytic applies to --offline only")
    for flag, value in (("--max-depth", args.max_depth), ("--num-cpus", args.num_cpus),
                        ("--layers", args.layers)):
        if value is not None and value < 1:
            raise _UserError(f"{flag} must be at least 1, not {value}")


def _targets_from_args(args: argparse.Namespace):
    """Targets, transition model, pins and rule options from --targets and config files."""
    from collage_farm.core.rules import RuleOptions
    from collage_farm.core.target import parse_targets

    try:
        from collage_farm.cli.targets import config_from_args
    except ImportError:  # pragma: no cover
        config_from_args = None
    cfg = config_from_args(args) if config_from_args else None
    if cfg is None:
        return parse_targets(args.targets), None, None, None
    targets = cfg.resolve_targets(args.targets)
    limits = getattr(cfg, "subgraph_limits", None)
    opts = None
    if limits is not None:
        opts = RuleOptions(
            max_depth=getattr(limits, "max_depth", None) or args.max_depth,
            max_exits=getattr(limits, "max_exits", 2),
            allow_taps=getattr(limits, "allow_taps", False),
        )
    pins = getattr(cfg, "pin_set", None) or (getattr(cfg, "pins", None) or None)
    return targets, cfg.transition, pins, opts


def _print_summary(s: dict) -> None:
    est = s["estimator"]
    warn = "  (MOCK COSTS: not measurements)" if est == "mock" else ""
    print(f"model {s['model']}: {s['nodes']} nodes, {s['candidates']} candidates, "
          f"{s['distinct_fingerprints']} distinct fingerprints")
    by = s.get("failed_by_status") or {}
    print(f"costs from {est}{warn}: {s['measured']} measured, {s['cache_hits']} cache hits, "
          f"{s['pruned']} pruned, {s['failed']} failed"
          + (f" ({', '.join(f'{k}: {v}' for k, v in sorted(by.items()))})" if by else ""))
    if by.get("no_runner"):
        print(f"warning: {by['no_runner']} candidates had no runner on this cluster (a target "
              "whose device or toolchain no node offers: `collage-farm targets list --check`); "
              "the plan leaves those targets out")
    per = ", ".join(f"{k}: {v}" for k, v in s["partitions_per_target"].items())
    print(f"plan: {s['partitions']} partitions ({per}); estimated "
          f"{s['estimated_total_s'] * 1e3:.3f} ms{warn}")
    if s.get("plan_measured_s") is not None:
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
    elif s.get("never_worse"):
        print(f"never worse: {s['never_worse']}")
    elif isinstance(s.get("verify"), str):
        print(f"end-to-end check {s['verify']}")
    if s.get("report"):
        print(f"report: {s['report']}")
    print(f"search {s['search_s']:.2f} s, wall {s['wall_s']:.2f} s; plan in {s['plan']}")


def _add_zoo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("zoo", help="built-in models (built in code, seeded weights)")
    zs = p.add_subparsers(dest="zoo_cmd", required=True)
    zs.add_parser("list", help="list the models")
    e = zs.add_parser("export", help="write a model to an ONNX file")
    e.add_argument("name")
    e.add_argument("-o", "--output", required=True)
    e.add_argument("--layers", type=int)
    e.add_argument("--seed", type=int, default=0)


def _run_zoo(args: argparse.Namespace) -> int:
    from collage_farm import zoo

    if args.zoo_cmd == "list":
        for name in zoo.names():
            print(f"{name:14s} {zoo.describe(name)}")
        _list_packaged()
        return 0
    kw = {"seed": args.seed}
    if args.layers is not None:
        kw["layers"] = args.layers
    try:
        zoo.export(args.name, args.output, **kw)
    except KeyError as e:
        raise _UserError(str(e.args[0]) if e.args else str(e)) from None
    print(f"wrote {args.output}")
    return 0


def _list_packaged() -> None:
    """Real exported models from pip wheels (``pkg:NAME``), and whether each is here."""
    from collage_farm.zoo import packaged

    print("\nreal exported models from pip packages (use as pkg:NAME; default shapes apply "
          "to inputs without --shape):")
    for name in packaged.names():
        e = packaged.get(name)
        state = ("installed" if packaged.installed(name)
                 else f"not installed: {e.install_command}")
        shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in e.shapes.items())
        print(f"pkg:{name:12s} {e.requirement} [{state}] {shapes}. {e.description}")


class _UserError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="collage-farm",
        description="Collage partition search over ONNX models with a Ray measurement farm.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="cmd", required=True)
    _add_tune(sub)
    _add_zoo(sub)
    for mod, adder in (("collage_farm.cli.costs", "add_costs_parser"),
                       ("collage_farm.cli.targets", "add_targets_parser"),
                       ("collage_farm.cli.cluster", "add_cluster_parser"),
                       ("collage_farm.cli.run", "add_run_parser")):
        try:
            module = __import__(mod, fromlist=[adder])
        except ImportError:
            continue
        getattr(module, adder)(sub)
    return parser


_RUNNERS = {
    "costs": ("collage_farm.cli.costs", "run_costs"),
    "targets": ("collage_farm.cli.targets", "run_targets"),
    "cluster": ("collage_farm.cli.cluster", "run_cluster"),
    "run": ("collage_farm.cli.run", "run_run"),
    "compare": ("collage_farm.cli.run", "run_compare"),
}


def _user_errors() -> tuple[type[BaseException], ...]:
    from collage_farm.core.graph import ModelError
    from collage_farm.core.plan import PlanError
    from collage_farm.core.search import NoCoverError
    from collage_farm.core.target import UnknownTargetError

    # path problems are the user's to fix, and their message names the path
    errs: list[type[BaseException]] = [ModelError, PlanError, NoCoverError, UnknownTargetError,
                                       _UserError, FileNotFoundError, NotADirectoryError,
                                       IsADirectoryError, FileExistsError, PermissionError]
    for mod, name in (("collage_farm.config", "ConfigError"),
                      ("collage_farm.costtable", "CostTableError"),
                      ("collage_farm.farm", "FarmError"),
                      ("estimators.table", "MissingCostsError")):
        with contextlib.suppress(ImportError, AttributeError):
            errs.append(getattr(__import__(mod, fromlist=[name]), name))
    return tuple(errs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    errors = _user_errors()
    try:
        if args.cmd == "tune":
            return _run_tune(args)
        if args.cmd == "zoo":
            return _run_zoo(args)
        mod, fn = _RUNNERS[args.cmd]
        return int(getattr(__import__(mod, fromlist=[fn]), fn)(args))
    except errors as e:
        print(f"collage-farm {args.cmd}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print(f"collage-farm {args.cmd}: interrupted; measured rows are in the cost table",
              file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head` closed stdout: the reader's choice, not an error
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a killed pipeline member


if __name__ == "__main__":
    sys.exit(main())
