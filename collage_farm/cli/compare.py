"""``collage-farm compare``: whole-model latency per toolchain, side by side.

One interleaved run times the model whole on each target (plus ORT's own multi-EP assignment
where it applies, and optionally a plan), printed as a table, JSON and a PNG bar chart. With
``--cost-table`` it also compares sub-graphs: the same sub-graph's measured cost on each target,
largest spread first (where the choice of toolchain matters most).

On a simulated Ethos-U board (``--targets`` an NPU and its Cortex-M host) nothing can be timed
here: the table gives simulated figures instead (`collage_farm.cli.compare_board.
simulated_board`): each target's whole model (where it takes every node), **Vela whole** (Vela's
own NPU / host split, `collage_farm.postsearch.vela_whole`) and, with ``--plan``, the plan's
estimate. Ethos-U parts listed beside timed targets get their simulated whole-model figure
(`simulated_wholes`: an NPU's is Vela whole on its board), printed after the timings and marked
"(simulated)" in the chart. Every target that failed is printed with why, and listed under the
chart.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from collage_farm.campaign import build_specs
from collage_farm.cli.compare_board import simulated_board, simulated_wholes, vela_whole_sources
from collage_farm.cli.inputs import (
    add_calibration_arg,
    add_input_arg,
    calibration_data,
    input_values,
)
from collage_farm.cli.measure import add_measure_args, fmt_ms, measure_config
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import DataflowGraph, parse_shape
from collage_farm.core.plan import load_plan
from collage_farm.core.rules import RuleOptions, all_candidates
from collage_farm.core.target import EMBEDDED_TOOLCHAINS, Target, parse_targets
from collage_farm.costtable import CostTable
from collage_farm.execute import CompareResult, PlanExecutor, Single, compare_interleaved
from collage_farm.postsearch.vela_whole import FIGURES, ethos_u_board
from collage_farm.report import plot_bars, plot_spread
from collage_farm.zoo.source import load_source
from estimators.int8_ranges import calibrated_targets, int8_calibration

__all__ = ["add_compare_parser", "run_compare", "simulated_board", "subgraph_spread"]


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``compare`` on the main parser's subcommands."""
    c = sub.add_parser("compare", help="whole-model latency per target, interleaved")
    c.add_argument("model", help="an ONNX file, zoo:NAME or pkg:NAME")
    c.add_argument("--targets", default="ort-cpu,openvino-cpu",
                   help="comma-separated target names (default: ort-cpu,openvino-cpu)")
    c.add_argument("--plan", help="also run this plan directory in the same interleaved run")
    c.add_argument("--plot", help="write a PNG bar chart here")
    c.add_argument("--shape", action="append", default=[], metavar="INPUT=DxDx...",
                   help="bind a dynamic input shape, e.g. --shape input=1x3x224x224")
    c.add_argument("--cost-table", metavar="DIR",
                   help="also compare sub-graphs from this cost table: the same sub-graph on "
                   "each target, sorted by largest spread (where the toolchain matters most)")
    c.add_argument("--top", type=int, default=20, help="sub-graphs shown with --cost-table")
    c.add_argument("--no-whole", action="store_true",
                   help="with --cost-table: only the per-sub-graph comparison (no timing run)")
    c.add_argument("--layers", type=int, help="layers for zoo transformer models")
    add_input_arg(c)
    add_calibration_arg(c, "8 seeded random samples")
    add_measure_args(c)


def run_compare(args: argparse.Namespace) -> int:
    """``collage-farm compare``: always 0 once the model loads (failed targets are listed)."""
    shapes = dict(parse_shape(s) for s in args.shape)
    graph = load_source(args.model, shapes, args.layers, input_values(args))
    targets = parse_targets(args.targets)
    board = ethos_u_board(targets)
    calibration = calibration_data(args)
    if calibration is not None:  # checked against the model; refused where nothing is int8
        calibration = int8_calibration(graph, targets, calibration)
    if board is not None:
        return _print_board(graph.name, simulated_board(graph, targets, board, args.plan,
                                                        calibration), args)
    # Ethos-U parts beside timed targets: simulated figures, printed apart (compare_board)
    sim_s, sim_errors = simulated_wholes(graph, targets, calibration)
    singles = [Single.of(t) for t in targets  # labelled by target, built with its options
               if t.toolchain not in EMBEDDED_TOOLCHAINS]
    spread: list[dict] | None = None
    if args.cost_table:
        plan_parts = None
        if args.plan:
            plan_parts = {(tuple(p.nodes), p.target) for p in load_plan(args.plan)[0].partitions}
        # int8 rows are keyed by their calibration (`calibrated_targets`), as the campaign's
        spread = subgraph_spread(graph, calibrated_targets(targets, calibration),
                                 Path(args.cost_table), plan_parts)
    if spread is not None and args.no_whole:
        return _print_spread(graph.name, spread, args)
    plan = PlanExecutor(args.plan, threads=args.threads, model=graph.model,
                        inputs=input_values(args), calibration=calibration) if args.plan else None
    cmp = compare_interleaved(graph.model, singles, measure_config(args), plan=plan,
                              threads=args.threads)
    out = {"model": graph.name, "toolchains": [t.toolchain for t in targets],
           "targets": [t.id for t in targets], **cmp.to_json()}
    out["single_errors"] = {**out["single_errors"], **sim_errors}
    if sim_s or sim_errors:
        out["simulated_s"] = sim_s
        out["simulated_figures"] = FIGURES
        sources = vela_whole_sources(graph, targets, calibration)
        if sources:  # per NPU target: where its Vela whole's split came from
            out["vela_whole_source"] = sources
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
    sim_rows = [(_sim_label(k, targets), v) for k, v in sim_s.items()]
    if args.plot:
        notes = [f"{k}: failed: {' '.join(str(e).split())}" for k, e in
                 out["single_errors"].items()]
        out["plot"] = str(plot_bars(rows + sim_rows, Path(args.plot),
                                    f"{graph.name}: whole-model latency (measured here"
                                    + ("; simulated figures marked" if sim_rows else "") + ")",
                                    notes=notes))
    if args.json:
        print(json.dumps(out, indent=2, default=str))
    else:
        _print_compare(graph.name, rows, cmp, out, spread, args)
        for k, v in sim_rows:
            print(f"  {k:14s} {fmt_ms(v):>14s}  ({FIGURES})")
        for k, line in (out.get("vela_whole_source") or {}).items():
            print(f"  {k} vela-whole split: {line}")
    return 0


def _sim_label(target_id: str, targets: Sequence[Target]) -> str:
    """How a simulated figure is named: an NPU's is its Vela-whole plan."""
    tc = next((t.toolchain for t in targets if t.id == target_id), "")
    return f"{target_id} {'Vela whole' if tc == 'vela' else 'whole'} (simulated)"


def _print_compare(model: str, rows: list[tuple[str, float]], cmp: CompareResult,
                   out: dict[str, Any], spread: list[dict] | None,
                   args: argparse.Namespace) -> None:
    best = min((v for _, v in rows), default=None)
    if rows:
        print(f"{model}: one interleaved run, {args.rounds} rounds, {args.threads} thread(s)")
    else:
        print(f"{model}: nothing timed here (no target runs on this machine)")
    for k, v in rows:
        rel = f"{v / best:6.2f}x" if best else ""
        print(f"  {k:14s} {fmt_ms(v):>14s}  {rel}")
    for k, e in out["single_errors"].items():
        print(f"  {k:14s} failed: {' '.join(str(e).split())[:300]}")
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


def _print_board(model: str, out: dict[str, Any], args: argparse.Namespace) -> int:
    rows = list(out["simulated_s"].items())
    if args.plot and rows:
        notes = [f"{k}: no figure: {' '.join(str(e).split())}" for k, e in out["errors"].items()]
        out["plot"] = str(plot_bars(rows, Path(args.plot), f"{model}: simulated latency",
                                    notes=notes))
    if args.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    best = min((v for _, v in rows), default=None)
    w = max([14, *(len(k) for k in (*out["simulated_s"], *out["errors"]))])  # -a16 names
    print(f"{model}: {out['figures']}; transitions {out['transition']}")
    for k, v in rows:
        print(f"  {k:{w}s} {fmt_ms(v):>14s}  {v / best:6.2f}x  (simulated)" if best else k)
    for k, e in out["errors"].items():
        print(f"  {k:{w}s} no figure: {' '.join(e.split())[:200]}")
    if out.get("vela_whole_source"):
        print(f"vela-whole split: {out['vela_whole_source']}")
    if "plot" in out:
        print(f"plot: {out['plot']}")
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
            cells.append(f"{fmt_ms(v):>13s}{mark}" if v is not None else f"{'-':>14s}")
        print(f"  {r['spread']:6.2f}x  {label[:40]:40s} " + " ".join(cells))
    if any(r.get("in_plan") for r in spread):
        print("  * = chosen by the plan")


def _newest_ok_costs(table_dir: Path) -> dict[str, float]:
    """Fingerprint -> median seconds of its newest ok row in the cost table at ``table_dir``."""
    if not table_dir.is_dir():
        raise FileNotFoundError(f"{table_dir}: no cost table directory")
    tbl = CostTable(table_dir).read(columns=["fingerprint", "status", "median", "created_at"])
    newest: dict[str, tuple[Any, float]] = {}
    for fp, st, med, ts in zip(*(tbl.column(c).to_pylist() for c in
                                 ("fingerprint", "status", "median", "created_at"))):
        if st == "ok" and med is not None and (fp not in newest or ts > newest[fp][0]):
            newest[fp] = (ts, float(med))
    return {fp: cost for fp, (_, cost) in newest.items()}


def _spread_row(cand: CandidatePartition, costs: dict[str, float], in_plan: list[str]
                ) -> dict[str, Any]:
    """The row of one sub-graph (``cand``'s nodes) with its cost per target."""
    nodes = tuple(cand.node_names)
    lo, hi = min(costs.values()), max(costs.values())
    ops = list(dict.fromkeys(cand.op_types))
    return {
        "label": (nodes[0] if len(nodes) == 1 else f"{nodes[0]}..{nodes[-1]}")
        + f" ({len(nodes)}: {'/'.join(ops)[:40]})",
        "nodes": list(nodes),
        "structural_hash": cand.sub_graph.structural_hash,
        "costs_s": dict(sorted(costs.items())),
        "fastest": min(costs, key=costs.__getitem__),
        "spread": hi / lo if lo > 0 else float("inf"),
        "occurrences": 1,
        "in_plan": in_plan,
    }


def subgraph_spread(graph: DataflowGraph, targets: Sequence[Target], table_dir: Path,
                    plan_parts: set[tuple[tuple[str, ...], str]] | None = None) -> list[dict]:
    """The same sub-graph's measured cost on each target, largest spread (max/min) first.

    Sub-graphs are the model's candidates (phase 1 + 2 for ``targets``); a candidate's cost on
    a target is the newest ok row of the table with its fingerprint (the fingerprint already
    includes the target, so every cost compared belongs to exactly this sub-graph structure).
    Repeated structures (the layers of a transformer) appear once, with their count.
    """
    newest = _newest_ok_costs(table_dir)
    by_mask: dict[int, dict[str, Any]] = {}  # mask -> its candidate and {target: cost}
    for c in all_candidates(graph, build_specs(targets, RuleOptions())):
        cost = newest.get(c.fingerprint)
        if cost is not None:
            by_mask.setdefault(c.mask, {"cand": c, "costs": {}})["costs"][c.target.id] = cost
    groups: dict[str, dict] = {}
    for d in by_mask.values():
        if len(d["costs"]) < 2:
            continue
        c = d["cand"]
        key = c.sub_graph.structural_hash + "|" + ",".join(sorted(d["costs"]))
        nodes = tuple(c.node_names)
        in_plan = sorted(t for t in d["costs"] if plan_parts and (nodes, t) in plan_parts)
        g = groups.get(key)
        if g is None:
            groups[key] = _spread_row(c, d["costs"], in_plan)
        else:
            g["occurrences"] += 1
            g["in_plan"] = sorted(set(g["in_plan"]) | set(in_plan))
    return sorted(groups.values(), key=lambda r: (-r["spread"], r["label"]))
