"""``collage-farm run`` and ``collage-farm compare``: execute plans, compare toolchains.

Why these commands: a plan's estimated total is a sum of isolated costs, and the field notes
show mixes that were promised 9% faster losing to the best single toolchain once run end to end.
``run`` checks a plan's numerics against the whole model (exit 1 on mismatch: a wrong plan must
never look like a fast one), then times it interleaved with every single toolchain it uses and
prints the additive error and the apparent loss. ``compare`` puts whole-model latencies per
toolchain side by side from one interleaved run (plus ORT's own multi-EP assignment where it
applies, and optionally a plan), as a table, JSON and a PNG bar chart.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from runners.base import MeasureConfig

EXIT_MISMATCH = 1


def _measure_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rounds", type=int, default=5, help="measurement rounds (default 5)")
    p.add_argument("--min-round-s", type=float, default=0.05,
                   help="minimum timed seconds per round (default 0.05)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    p.add_argument("--json", action="store_true", help="print JSON")


def add_run_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a plan end to end: check numerics, measure latency")
    p.add_argument("plan_dir", help="plan directory (with plan.json)")
    p.add_argument("--model", help="the original model (default: plan.json's source)")
    p.add_argument("--shape", action="append", default=[], metavar="INPUT=DxDx...",
                   help="input shape for the feeds, e.g. --shape input=1x3x224x224")
    p.add_argument("--no-singles", action="store_true",
                   help="do not measure the whole model on each single toolchain")
    p.add_argument("--report", action="store_true", help="write report.html into the plan dir")
    _measure_args(p)

    c = sub.add_parser("compare", help="whole-model latency per target, interleaved")
    c.add_argument("model", help="an ONNX file, zoo:NAME or pkg:NAME")
    c.add_argument("--targets", default="ort-cpu,openvino-cpu", help="comma-separated targets")
    c.add_argument("--plan", help="also run this plan directory in the same interleaved run")
    c.add_argument("--plot", help="write a PNG bar chart here")
    c.add_argument("--shape", action="append", default=[], metavar="INPUT=DxDx...")
    c.add_argument("--cost-table", metavar="DIR",
                   help="also compare sub-graphs from this cost table: the same sub-graph on "
                   "each target, sorted by largest spread (where the toolchain matters most)")
    c.add_argument("--top", type=int, default=20, help="sub-graphs shown with --cost-table")
    c.add_argument("--no-whole", action="store_true",
                   help="with --cost-table: only the per-sub-graph comparison (no timing run)")
    c.add_argument("--layers", type=int, help="layers for zoo transformer models")
    _measure_args(c)


def _config(args: argparse.Namespace) -> MeasureConfig:
    return MeasureConfig(rounds=max(1, args.rounds), min_round_s=args.min_round_s,
                         threads=args.threads)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.4f} ms"


def run_run(args: argparse.Namespace) -> int:
    from collage_farm.core.graph import ModelError, parse_shape
    from collage_farm.core.plan import PlanError
    from collage_farm.execute import (
        ExecutionMismatch,
        PlanExecutor,
        Single,
        compare_interleaved,
        tolerance_label,
    )

    shapes = dict(parse_shape(s) for s in args.shape)
    ex = PlanExecutor(args.plan_dir, threads=args.threads, model=args.model, shapes=shapes)
    unknown = sorted(set(shapes) - set(ex.plan.graph_inputs))
    if unknown and ex.plan.graph_inputs:  # as tune: a typo must not pass silently
        raise PlanError(f"--shape names {', '.join(map(repr, unknown))}, which is not an input "
                        f"of the plan (inputs: {', '.join(ex.plan.graph_inputs)})")
    feeds = ex.random_feeds()
    try:
        errors = ex.check(feeds)
    except ExecutionMismatch as e:
        print(f"collage-farm run: NUMERICS MISMATCH: {e}", file=sys.stderr)
        return EXIT_MISMATCH
    except (PlanError, ModelError):
        raise
    except Exception as e:  # the plan's files do not fit the model they claim to come from
        why = " ".join(str(e).split())
        raise PlanError(f"plan {args.plan_dir} does not run against its original model "
                        f"({type(e).__name__}: {why[:300]}); a partition file swapped or "
                        "edited, or --model/--shape of another model?") from None
    # each target the plan uses, whole, with that target's options (as `tune` verifies)
    singles = [] if args.no_singles else [
        Single(t, tc, tuple(sorted(ex.target_options(t).items())))
        for t, tc in sorted({(rt.target, rt.toolchain) for rt in ex.partitions})]
    cmp = compare_interleaved(None if args.no_singles else ex.reference(), singles,
                              _config(args), plan=ex, threads=args.threads, multi_ep=False)
    assert cmp.plan is not None
    out: dict[str, Any] = {
        "plan": str(Path(args.plan_dir)),
        "model": ex.plan.model,
        "estimator": ex.plan.estimator,
        "check": {"ok": True, "max_abs_error": errors,
                  "tolerance": tolerance_label(ex.precision)},
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
             "estimated_s": rt.estimated_s, "kind": rt.kind, "numerics": rt.numerics}
            for rt in ex.partitions
        ],
        "cv": cmp.plan.summary.cv,
    }
    if args.report:
        from collage_farm.report import write_report

        out["partition_measured_s"] = ex.measure_partitions(_config(args))
        out["report"] = str(write_report(args.plan_dir, dict(ex.plan.extra), out))
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(f"plan {out['plan']} ({out['model']}): {len(ex.partitions)} partitions; numerics OK "
          f"({out['check']['tolerance']})")
    for p in out["partitions"]:
        print(f"  {p['id']}  {p['target']:16s} est {_ms(p['estimated_s']):>14s}  {p['kind']}")
    print(f"measured end to end {_ms(out['plan_measured_s'])} (measured part "
          f"{_ms(out['measured_part_s'])}, simulated part {_ms(out['simulated_part_s'])}); "
          f"estimated {_ms(out['estimated_total_s'])} [{ex.plan.estimator}]")
    if out["additive_error"] is not None:
        print(f"additive error {out['additive_error']:+.1%}")
    for k, v in cmp.singles.items():
        print(f"  whole model on {k:10s} {_ms(v)}")
    if cmp.apparent_loss is not None:
        print(f"apparent loss vs best single ({out['best_single']}): {cmp.apparent_loss:+.1%}")
    if "report" in out:
        print(f"report: {out['report']}")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    from collage_farm.campaign import load_source
    from collage_farm.core.graph import parse_shape
    from collage_farm.core.target import parse_targets
    from collage_farm.execute import PlanExecutor, Single, compare_interleaved

    shapes = dict(parse_shape(s) for s in args.shape)
    graph = load_source(args.model, shapes, args.layers)
    targets = parse_targets(args.targets)
    toolchains = [t.toolchain for t in targets]
    singles = [Single.of(t) for t in targets]  # labelled by target, built with its options
    spread: list[dict] | None = None
    if args.cost_table:
        plan_parts = None
        if args.plan:
            from collage_farm.core.plan import load_plan

            plan_parts = {(tuple(p.nodes), p.target) for p in load_plan(args.plan)[0].partitions}
        spread = subgraph_spread(graph, targets, Path(args.cost_table), plan_parts)
    if spread is not None and args.no_whole:
        return _print_spread(graph.name, spread, args)
    plan = PlanExecutor(args.plan, threads=args.threads, model=graph.model) if args.plan else None
    cmp = compare_interleaved(graph.model, singles, _config(args), plan=plan,
                              threads=args.threads)
    out = {"model": graph.name, "toolchains": toolchains, "targets": [t.id for t in targets],
           **cmp.to_json()}
    if spread is not None:
        out["subgraphs"] = spread
        if args.plot and spread:
            out["subgraph_plot"] = str(plot_spread(
                spread[:args.top], _spread_png(Path(args.plot)), graph.name))
    rows = [(k, v) for k, v in cmp.singles.items()]
    if "measured_s" in cmp.ort_multi_ep:
        rows.append(("ort-multi-ep", cmp.ort_multi_ep["measured_s"]))
    if cmp.plan is not None:
        rows.append(("plan", cmp.plan.total_s))
    if args.plot:
        out["plot"] = str(plot_bars(rows, Path(args.plot), f"{graph.name}: whole-model latency"))
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    best = min((v for _, v in rows), default=None)
    print(f"{graph.name}: one interleaved run, {args.rounds} rounds, {args.threads} thread(s)")
    for k, v in rows:
        rel = f"{v / best:6.2f}x" if best else ""
        print(f"  {k:14s} {_ms(v):>14s}  {rel}")
    for k, e in cmp.single_errors.items():
        print(f"  {k:14s} failed: {e}")
    print(f"  ORT multi-EP: {cmp.ort_multi_ep.get('note', '')}")
    if cmp.additive_error is not None:
        print(f"plan additive error {cmp.additive_error:+.1%}, apparent loss "
              f"{cmp.apparent_loss:+.1%}")
    if args.plot:
        print(f"plot: {out['plot']}")
    if spread is not None:
        _spread_table(spread, args.top)
        if "subgraph_plot" in out:
            print(f"sub-graph plot: {out['subgraph_plot']}")
    return 0


def _spread_png(plot: Path) -> Path:
    return plot.with_name(plot.stem + "_subgraphs" + (plot.suffix or ".png"))


def _print_spread(model: str, spread: list[dict], args: argparse.Namespace) -> int:
    out: dict[str, Any] = {"model": model, "subgraphs": spread}
    if args.plot and spread:  # no empty chart: the table line below says why
        out["subgraph_plot"] = str(plot_spread(spread[:args.top], Path(args.plot), model))
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    _spread_table(spread, args.top)
    if "subgraph_plot" in out:
        print(f"sub-graph plot: {out['subgraph_plot']}")
    return 0


def _spread_table(spread: list[dict], top: int) -> None:
    targets = sorted({t for r in spread for t in r["costs_s"]})
    if not spread:
        print("sub-graphs measured on 2+ targets: 0: no sub-graph of this model has a cost on "
              "two or more of the targets in this table (a table of another model, or of one "
              "target?); no sub-graph plot")
        return
    print(f"sub-graphs measured on 2+ targets: {len(spread)}; largest spread first "
          f"(max/min of median cost; 'x N' = repeated N times in the model)")
    print("  " + f"{'spread':>7s}  {'nodes':40s} " + " ".join(f"{t:>14s}" for t in targets))
    for r in spread[:top]:
        label = r["label"] + (f" x {r['occurrences']}" if r["occurrences"] > 1 else "")
        cells = []
        for t in targets:
            v = r["costs_s"].get(t)
            mark = "*" if t in r.get("in_plan", ()) else " "
            cells.append(f"{_ms(v):>13s}{mark}" if v is not None else f"{'-':>14s}")
        print(f"  {r['spread']:6.2f}x  {label[:40]:40s} " + " ".join(cells))
    if any(r.get("in_plan") for r in spread):
        print("  * = chosen by the plan")


def subgraph_spread(graph: Any, targets: Any, table_dir: Path,
                    plan_parts: set[tuple[tuple[str, ...], str]] | None = None) -> list[dict]:
    """The same sub-graph's measured cost on each target, largest spread (max/min) first.

    Sub-graphs are the model's candidates (phase 1 + 2 for ``targets``); a candidate's cost on
    a target is the newest ok row of the table with its fingerprint (the fingerprint already
    includes the target, so every cost compared belongs to exactly this sub-graph structure).
    Repeated structures (the layers of a transformer) appear once, with their count.
    """
    from collage_farm.campaign import build_specs
    from collage_farm.core.rules import RuleOptions, all_candidates
    from collage_farm.costtable import CostTable

    if not table_dir.is_dir():
        raise FileNotFoundError(f"{table_dir}: no cost table directory")
    tbl = CostTable(table_dir).read(columns=["fingerprint", "status", "median", "created_at"])
    newest: dict[str, tuple[Any, float]] = {}
    for fp, st, med, ts in zip(*(tbl.column(c).to_pylist() for c in
                                 ("fingerprint", "status", "median", "created_at"))):
        if st == "ok" and med is not None and (fp not in newest or ts > newest[fp][0]):
            newest[fp] = (ts, float(med))
    cands = all_candidates(graph, build_specs(targets, RuleOptions()))
    by_mask: dict[int, dict[str, Any]] = {}
    for c in cands:
        hit = newest.get(c.fingerprint)
        if hit is None:
            continue
        d = by_mask.setdefault(c.mask, {"cand": c, "costs": {}})
        d["costs"][c.target.id] = hit[1]
    groups: dict[str, dict] = {}
    for d in by_mask.values():
        if len(d["costs"]) < 2:
            continue
        c = d["cand"]
        key = c.sub_graph.structural_hash + "|" + ",".join(sorted(d["costs"]))
        nodes = tuple(c.node_names)
        in_plan = sorted(t for t in d["costs"] if plan_parts and (nodes, t) in plan_parts)
        g = groups.get(key)
        if g is not None:
            g["occurrences"] += 1
            g["in_plan"] = sorted(set(g["in_plan"]) | set(in_plan))
            continue
        lo, hi = min(d["costs"].values()), max(d["costs"].values())
        ops = list(dict.fromkeys(c.op_types))
        groups[key] = {
            "label": (nodes[0] if len(nodes) == 1 else f"{nodes[0]}..{nodes[-1]}")
            + f" ({len(nodes)}: {'/'.join(ops)[:40]})",
            "nodes": list(nodes),
            "structural_hash": c.sub_graph.structural_hash,
            "costs_s": dict(sorted(d["costs"].items())),
            "fastest": min(d["costs"], key=d["costs"].get),
            "spread": hi / lo if lo > 0 else float("inf"),
            "occurrences": 1,
            "in_plan": in_plan,
        }
    return sorted(groups.values(), key=lambda r: (-r["spread"], r["label"]))


def plot_spread(rows: list[dict], path: Path, model: str) -> Path:
    """Grouped horizontal bars: each sub-graph's cost per target (ms, log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = sorted({t for r in rows for t in r["costs_s"]})
    fig, ax = plt.subplots(figsize=(8, 0.45 * max(2, len(rows)) * max(1, len(targets)) / 1.5
                                    + 1.2))
    h = 0.8 / max(1, len(targets))
    for k, t in enumerate(targets):
        ys = [i + k * h for i in range(len(rows))]
        ax.barh(ys, [r["costs_s"].get(t, 0.0) * 1e3 for r in rows], h, label=t)
    ax.set_yticks([i + 0.4 - h / 2 for i in range(len(rows))],
                  [f"{r['label'][:38]} ({r['spread']:.2f}x)" for r in rows], fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("median cost (ms, log scale)")
    ax.set_title(f"{model}: sub-graphs by spread across toolchains", fontsize=9)
    ax.invert_yaxis()
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_bars(rows: list[tuple[str, float]], path: Path, title: str) -> Path:
    """A horizontal bar chart of latencies (ms), Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 0.5 * max(2, len(rows)) + 1))
    names = [r[0] for r in rows]
    vals = [r[1] * 1e3 for r in rows]
    colors = ["#d62728" if n == "plan" else "#1f77b4" for n in names]
    ax.barh(names, vals, color=colors)
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.3f}", va="center", fontsize=8)
    ax.set_xlabel("median latency (ms)")
    ax.set_title(title)
    ax.invert_yaxis()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
