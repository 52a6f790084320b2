"""``collage-farm run``: execute a plan, check its numerics, measure its latency.

Why: a plan's estimated total is a sum of isolated costs, and mixes promised 9% faster have lost
to the best single toolchain once run end to end. ``run`` checks a plan's numerics against the
whole model (exit 1 on mismatch: a wrong plan must never look like a fast one), then times it
interleaved with every single toolchain it uses and prints the additive error and the apparent
loss.

A plan with int8 partitions (an Ethos-U NPU, its Cortex-M host) is checked with those
partitions built as the campaign costed them: quantised with the source model's ranges,
calibrated whole on the samples plan.json's ``int8_calibration`` names (``--calibration-data``
overrides it), and held to a tolerance in int8 steps of each output's calibrated range, or of
the fixed int8 scale of a Sigmoid / Softmax / Tanh output where that is coarser
(`collage_farm.execute.numerics`). With the user's calibration data the check runs on its first
sample, else on seeded random feeds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from collage_farm.cli.inputs import (
    add_calibration_arg,
    add_input_arg,
    calibration_data,
    input_values,
)
from collage_farm.cli.measure import add_measure_args, fmt_ms, measure_config
from collage_farm.core.graph import ModelError, parse_shape
from collage_farm.core.plan import PlanError
from collage_farm.execute import (
    CALIBRATION_KEY,
    CompareResult,
    ExecutionMismatch,
    PlanExecutor,
    Single,
    compare_interleaved,
)
from collage_farm.report import write_report

__all__ = ["EXIT_MISMATCH", "add_run_parser", "run_run"]

EXIT_MISMATCH = 1


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``run`` on the main parser's subcommands."""
    p = sub.add_parser("run", help="run a plan end to end: check numerics, measure latency")
    p.add_argument("plan_dir", help="plan directory (with plan.json)")
    p.add_argument("--model", help="the original model (default: plan.json's source)")
    p.add_argument("--shape", action="append", default=[], metavar="INPUT=DxDx...",
                   help="input shape for the feeds, e.g. --shape input=1x3x224x224")
    add_input_arg(p)
    add_calibration_arg(p, "what plan.json's int8_calibration records")
    p.add_argument("--no-singles", action="store_true",
                   help="do not measure the whole model on each single toolchain")
    p.add_argument("--report", action="store_true", help="write report.html into the plan dir")
    add_measure_args(p)


def _executor(args: argparse.Namespace) -> PlanExecutor:
    shapes = dict(parse_shape(s) for s in args.shape)
    inputs = input_values(args)
    ex = PlanExecutor(args.plan_dir, threads=args.threads, model=args.model, shapes=shapes,
                      inputs=inputs, calibration=calibration_data(args))
    for flag, names in (("--shape", shapes), ("--input", inputs)):
        unknown = sorted(set(names) - set(ex.plan.graph_inputs))
        if unknown and ex.plan.graph_inputs:  # as tune: a typo must not pass silently
            raise PlanError(f"{flag} names {', '.join(map(repr, unknown))}, which is not an "
                            f"input of the plan (inputs: {', '.join(ex.plan.graph_inputs)})")
    return ex


def _check(ex: PlanExecutor, plan_dir: str) -> dict[str, float]:
    """The plan's largest error per output against the whole model on the executor's check
    feeds (`PlanExecutor.check_feeds`).

    Raises `ExecutionMismatch` beyond tolerance, and `PlanError` when the plan's files do not
    run against the model at all.
    """
    try:
        return ex.check(ex.check_feeds())
    except (ExecutionMismatch, PlanError, ModelError):
        raise
    except Exception as e:  # the plan's files do not fit the model they claim to come from
        why = " ".join(str(e).split())
        raise PlanError(f"plan {plan_dir} does not run against its original model "
                        f"({type(e).__name__}: {why[:300]}); a partition file swapped or "
                        "edited, or --model/--shape of another model?") from None


def _result(args: argparse.Namespace, ex: PlanExecutor, errors: dict[str, float],
            cmp: CompareResult) -> dict[str, Any]:
    """``run --json``'s dict (also what `write_report` takes as ``measured``)."""
    assert cmp.plan is not None
    return {
        "plan": str(Path(args.plan_dir)),
        "model": ex.plan.model,
        "estimator": ex.plan.estimator,
        "check": {"ok": True, "max_abs_error": errors, "tolerance": ex.tolerance},
        CALIBRATION_KEY: ex.calibration.to_json() if ex.calibration else None,
        "plan_measured_s": cmp.plan.total_s,
        "measured_part_s": cmp.plan.summary.median,
        "simulated_part_s": cmp.plan.simulated_s,
        "measured_partitions": list(cmp.plan.measured_partitions),
        "simulated_partitions": list(cmp.plan.simulated_partitions),
        "estimated_total_s": ex.plan.estimated_total_s,
        "additive_error": cmp.additive_error,
        "singles_s": cmp.singles,
        "single_errors": cmp.single_errors,
        "best_single": cmp.best_single[0] if cmp.best_single else None,
        "apparent_loss": cmp.apparent_loss,
        "partitions": [
            {"id": rt.id, "target": rt.target, "toolchain": rt.toolchain,
             "estimated_s": rt.estimated_s, "kind": rt.kind.value, "numerics": rt.numerics}
            for rt in ex.partitions
        ],
        "cv": cmp.plan.summary.cv,
    }


def run_run(args: argparse.Namespace) -> int:
    """``collage-farm run``: 0 when the plan's numerics hold, `EXIT_MISMATCH` when not."""
    ex = _executor(args)
    try:
        errors = _check(ex, args.plan_dir)
    except ExecutionMismatch as e:
        print(f"collage-farm run: NUMERICS MISMATCH: {e}", file=sys.stderr)
        return EXIT_MISMATCH
    # each target the plan uses, whole, with that target's options (as `tune` verifies)
    singles = [] if args.no_singles else [
        Single(t, tc, tuple(sorted(ex.target_options(t).items())))
        for t, tc in sorted({(rt.target, rt.toolchain) for rt in ex.partitions})]
    cmp = compare_interleaved(None if args.no_singles else ex.reference(), singles,
                              measure_config(args), plan=ex, threads=args.threads,
                              multi_ep=False)
    out = _result(args, ex, errors, cmp)
    if args.report:
        out["partition_measured_s"] = ex.measure_partitions(measure_config(args))
        out["report"] = str(write_report(args.plan_dir, dict(ex.plan.extra), out))
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        _print_run(out, ex, cmp)
    return 0


def _print_run(out: dict[str, Any], ex: PlanExecutor, cmp: CompareResult) -> None:
    print(f"plan {out['plan']} ({out['model']}): {len(ex.partitions)} partitions; numerics OK "
          f"({out['check']['tolerance']})")
    if ex.calibration is not None:
        print(f"int8 partitions calibrated on the whole model, {ex.calibration.describe()}")
    for p in out["partitions"]:
        print(f"  {p['id']}  {p['target']:16s} est {fmt_ms(p['estimated_s']):>14s}  {p['kind']}")
    how = "measured" if out["measured_partitions"] else "simulated"  # a board: all simulated
    print(f"{how} end to end {fmt_ms(out['plan_measured_s'])} (measured part "
          f"{fmt_ms(out['measured_part_s'])}, simulated part {fmt_ms(out['simulated_part_s'])}); "
          f"estimated {fmt_ms(out['estimated_total_s'])} [{ex.plan.estimator}]")
    if out["additive_error"] is not None:
        print(f"additive error {out['additive_error']:+.1%}")
    for k, v in cmp.singles.items():
        print(f"  whole model on {k:10s} {fmt_ms(v)}")
    if cmp.apparent_loss is not None:
        print(f"apparent loss vs best single ({out['best_single']}): {cmp.apparent_loss:+.1%}")
    if "report" in out:
        print(f"report: {out['report']}")
