"""A self-contained HTML report of a plan: graph coloured by target, partitions, costs.

Why: a plan directory is JSON and ONNX files; people decide with a picture and a table. The
report is one ``report.html`` with inline CSS and images embedded as base64 data URIs (no
scripts, no external fetches), so it opens offline and can be mailed or attached to CI runs; the
PNGs are written beside it too. The graph drawing is a layered DAG layout computed here (nodes
in reverse post-DFS order, each on the layer of its longest path from a source, boxes and
arrows in matplotlib); above `MAX_DRAWN_NODES` nodes, partitions are drawn as blocks instead.
The campaign calls `write_report(plan_dir, summary, measured)` after ``tune``; ``collage-farm
run --report`` calls it with the measured end-to-end numbers.

What it shows is what a reader needs to trust or question a plan (Collage RFC, Appendix G):
per partition its nodes, target, estimated and measured cost and the search's runner-up there
(plan.json ``runner_ups``: the same nodes on another target first, so "why it won" is a
like-for-like comparison); the campaign's statistics; and, for measured campaigns, the
end-to-end figures (additive error, apparent loss), the never-worse decision with both
latencies and every refinement trial.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from collage_farm.core.plan import Plan, load_plan

__all__ = ["MAX_DRAWN_NODES", "layered_layout", "write_report"]

MAX_DRAWN_NODES = 150
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac"]
SUMMARY_KEYS = ("nodes", "candidates", "distinct_fingerprints", "costs_requested", "measured",
                "cache_hits", "pruned", "analytic", "failed", "states_expanded", "search_s",
                "post_search_s", "wall_s")


@dataclass(frozen=True)
class _Node:
    name: str
    op: str
    part: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _plan_nodes(plan: Plan, files: Mapping[str, Path]) -> list[_Node]:
    out = []
    for p in plan.partitions:
        m = onnx.load(str(files[p.id]), load_external_data=False)
        for i, n in enumerate(m.graph.node):
            out.append(_Node(n.name or f"{p.id}/{n.op_type}_{i}", n.op_type, p.id,
                             tuple(x for x in n.input if x), tuple(x for x in n.output if x)))
    return out


def layered_layout(names: Sequence[str], edges: Sequence[tuple[str, str]]
                   ) -> dict[str, tuple[int, int]]:
    """(layer, position in layer) per node: longest-path layers over a post-DFS order."""
    succ: dict[str, list[str]] = {n: [] for n in names}
    pred: dict[str, list[str]] = {n: [] for n in names}
    for a, b in edges:
        if a in succ and b in succ and b not in succ[a]:
            succ[a].append(b)
            pred[b].append(a)
    seen: set[str] = set()
    post: list[str] = []
    for root in names:  # iterative DFS, post order
        if root in seen:
            continue
        stack = [(root, iter(succ[root]))]
        seen.add(root)
        while stack:
            node, it = stack[-1]
            nxt = next((s for s in it if s not in seen), None)
            if nxt is None:
                stack.pop()
                post.append(node)
            else:
                seen.add(nxt)
                stack.append((nxt, iter(succ[nxt])))
    order = list(reversed(post))  # a topological order
    layer: dict[str, int] = {}
    for n in order:
        layer[n] = max((layer[p] + 1 for p in pred[n] if p in layer), default=0)
    pos: dict[str, tuple[int, int]] = {}
    count: dict[int, int] = {}
    for n in order:
        k = count.get(layer[n], 0)
        pos[n] = (layer[n], k)
        count[layer[n]] = k + 1
    return pos


def _draw(labels: Mapping[str, str], colors: Mapping[str, str], edges: Sequence[tuple[str, str]],
          legend: Mapping[str, str], title: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch, Patch

    names = list(labels)
    pos = layered_layout(names, edges)
    n_layers = 1 + max((p[0] for p in pos.values()), default=0)
    width = 1 + max((p[1] for p in pos.values()), default=0)
    fig, ax = plt.subplots(figsize=(max(5.0, 2.2 * width), max(3.0, 0.75 * n_layers + 1)))
    xy = {n: (float(p[1]) * 2.2, -float(p[0])) for n, p in pos.items()}
    for a, b in edges:
        if a in xy and b in xy:
            # an edge skipping layers in one column would run under the boxes: bend it
            skip = xy[a][0] == xy[b][0] and xy[a][1] - xy[b][1] > 1
            ax.annotate("", xy=(xy[b][0], xy[b][1] + 0.2), xytext=(xy[a][0], xy[a][1] - 0.2),
                        arrowprops={"arrowstyle": "->", "color": "#555", "lw": 0.8,
                                    "connectionstyle": "arc3,rad=0.5" if skip else "arc3"})
    for n in names:
        x, y = xy[n]
        ax.add_patch(FancyBboxPatch((x - 0.95, y - 0.2), 1.9, 0.4,
                                    boxstyle="round,pad=0.02", fc=colors[n], ec="#333", lw=0.6))
        ax.text(x, y, labels[n], ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(-1.2, 2.2 * width - 1.0)
    ax.set_ylim(-n_layers + 0.4, 0.6)
    ax.axis("off")
    ax.set_title(title, fontsize=9)
    ax.legend(handles=[Patch(color=c, label=t) for t, c in legend.items()], loc="upper right",
              fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def draw_plan_graph(plan: Plan, files: Mapping[str, Path], path: Path) -> Path:
    nodes = _plan_nodes(plan, files)
    targets = list(dict.fromkeys(p.target for p in plan.partitions))
    tcolor = {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(targets)}
    part_target = {p.id: p.target for p in plan.partitions}
    producer = {o: n for n in nodes for o in n.outputs}
    if len(nodes) <= MAX_DRAWN_NODES:
        edges = [(producer[i].name, n.name) for n in nodes for i in n.inputs if i in producer]
        labels = {n.name: f"{n.op} [{n.part}]" for n in nodes}
        colors = {n.name: tcolor[part_target[n.part]] for n in nodes}
        title = f"{plan.model}: {len(nodes)} nodes coloured by target"
    else:
        pedges = sorted({(producer[i].part, n.part) for n in nodes for i in n.inputs
                         if i in producer and producer[i].part != n.part})
        edges = pedges
        sizes = {p.id: len(p.nodes) for p in plan.partitions}
        labels = {p.id: f"{p.id} {p.target} ({sizes[p.id]})" for p in plan.partitions}
        colors = {p.id: tcolor[p.target] for p in plan.partitions}
        title = f"{plan.model}: {len(nodes)} nodes in {len(plan.partitions)} partition blocks"
    return _draw(labels, colors, edges, tcolor, title, path)


def _png_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.4f}"


def _cost_chart(plan: Plan, measured: Mapping[str, Any] | None, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = (measured or {}).get("partition_measured_s") or {}
    ids = [p.id for p in plan.partitions]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.35 * len(ids) + 2), 3))
    x = range(len(ids))
    ax.bar([i - 0.2 for i in x], [p.estimated_s * 1e3 for p in plan.partitions], 0.4,
           label="estimated")
    if per:
        ax.bar([i + 0.2 for i in x], [float(per.get(i_d, 0.0)) * 1e3 for i_d in ids], 0.4,
               label="measured")
    ax.set_xticks(list(x), ids, rotation=90, fontsize=7)
    ax.set_ylabel("ms")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em;display:block;overflow-x:auto}
td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}
th{background:#f0f0f0}.num{text-align:right;font-variant-numeric:tabular-nums}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
img{max-width:100%;border:1px solid #ddd}.warn{color:#a33}
"""


def _runner_up(alts: Sequence[Mapping[str, Any]]) -> str:
    """The best alternative the search had at this partition's state, and why it lost."""
    if not alts:
        return "-"
    a = alts[0]
    what = ("same nodes on " + html.escape(str(a.get("target"))) if a.get("same_nodes")
            else html.escape(str(a.get("label"))))
    status = a.get("status")
    cost = a.get("cost_s")
    if status == "invalid":
        return f"{what}: cannot build or run"
    if status == "bound":
        return f"{what}: pruned, lower bound {_ms(cost)} + {_ms(a.get('penalty_s'))}"
    return f"{what}: {_ms(cost)} + {_ms(a.get('penalty_s'))}"


def write_report(plan_dir: str | Path, summary: dict, measured: dict | None = None) -> Path:
    """Write ``report.html`` (self-contained) and PNGs into ``plan_dir``; returns the HTML path.

    ``summary`` is the campaign summary (`run_tune`'s dict; the keys in `SUMMARY_KEYS` are
    shown when present). ``measured`` is what ``collage-farm run --json`` prints (keys
    ``plan_measured_s``, ``additive_error``, ``apparent_loss``, ``singles_s``, ``best_single``,
    optional ``partition_measured_s`` {id: seconds}); None when the plan was not run.
    """
    root = Path(plan_dir)
    plan, files = load_plan(root)
    graph_png = draw_plan_graph(plan, files, root / "report_graph.png")
    cost_png = _cost_chart(plan, measured, root / "report_costs.png")
    targets = list(dict.fromkeys(p.target for p in plan.partitions))
    tcolor = {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(targets)}
    per = (measured or {}).get("partition_measured_s") or {}
    sim = set((measured or {}).get("simulated_partitions") or [])
    h: list[str] = []
    e = html.escape
    h.append(f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>collage-farm plan "
             f"{e(plan.model)}</title><style>{_CSS}</style></head><body>")
    h.append(f"<h1>Plan for {e(plan.model)}</h1>")
    if "mock" in (plan.estimator or "") or summary.get("estimator") == "mock":
        h.append("<p class='warn'>Estimates come from the MOCK estimator: not measurements.</p>")
    h.append(f"<p>{len(plan.partitions)} partitions over {len(targets)} target(s); estimator "
             f"<b>{e(plan.estimator)}</b>, transitions <b>{e(plan.transition)}</b>; estimated "
             f"total <b>{_ms(plan.estimated_total_s)} ms</b>.</p>")
    stats = [(k, summary[k]) for k in SUMMARY_KEYS if k in summary]
    if stats:
        h.append("<h2>Campaign</h2><table id='campaign'><tr>"
                 + "".join(f"<th>{e(k)}</th>" for k, _ in stats) + "</tr><tr>"
                 + "".join(f"<td class='num'>{_fmt(v)}</td>" for _, v in stats)
                 + "</tr></table>")
        fbs = summary.get("failed_by_status") or {}
        if fbs:
            h.append("<p>Failures by status: " + ", ".join(
                f"{e(str(k))}: {_fmt(v)}" for k, v in sorted(fbs.items())) + "</p>")
    if summary.get("verify") and not measured:
        h.append(f"<p class='warn'>End-to-end check {e(str(summary['verify']))}</p>")
    if measured:
        h.append("<h2>Measured end to end</h2><table id='measured'>")
        rows = [("plan measured (ms)", _ms(measured.get("plan_measured_s"))),
                ("of which simulated (ms)", _ms(measured.get("simulated_part_s"))),
                ("estimated total (ms)", _ms(plan.estimated_total_s))]
        ae, al = measured.get("additive_error"), measured.get("apparent_loss")
        if ae is not None:
            rows.append(("additive error (measured - estimated) / measured", f"{ae:+.1%}"))
        for k, v in (measured.get("singles_s") or {}).items():
            rows.append((f"whole model on {k} (ms)", _ms(v)))
        if al is not None:
            rows.append((f"apparent loss vs best single ({measured.get('best_single')})",
                         f"{al:+.1%}"))
        for key, label in (("dijkstra_measured_s", "Dijkstra plan measured (ms)"),
                           ("refined_measured_s", "refined plan measured (ms)"),
                           ("mix_measured_s", "mix kept for the never-worse check (ms)")):
            if measured.get(key) is not None:
                rows.append((label, _ms(measured[key])))
        h += [f"<tr><th>{e(a)}</th><td class='num'>{e(b)}</td></tr>" for a, b in rows]
        h.append("</table>")
        if measured.get("never_worse"):
            h.append(f"<p id='never-worse'><b>Never worse:</b> {e(str(measured['never_worse']))}"
                     "</p>")
        e2e = [(k, v) for k, v in (("Dijkstra plan", measured.get("dijkstra_measured_s")),
                                    ("refined plan", measured.get("refined_measured_s")))
               if v is not None]
        e2e += [(f"whole model on {k}", v) for k, v in (measured.get("singles_s") or {}).items()
                if v is not None]
        if e2e:
            from collage_farm.cli.run import plot_bars

            png = plot_bars(e2e, root / "report_e2e.png",
                            f"{plan.model}: measured end to end, one interleaved run")
            h.append(f"<img alt='end-to-end latency' src='{_png_uri(png)}'>")
        ref = measured.get("refine") or {}
        if ref.get("log"):
            h.append(f"<h2>Refinement</h2><p>{ref.get('trials')} measured trials, "
                     f"{ref.get('accepted')} kept, {ref.get('invalid_skipped')} invalid moves "
                     f"skipped, {_fmt(ref.get('elapsed_s'))} s (stopped: "
                     f"{e(str(ref.get('stopped_by')))}).</p><table id='refine'><tr><th>move</th>"
                     "<th>result</th><th>current (ms)</th><th>with move (ms)</th>"
                     "<th>noise</th></tr>")
            for t in ref["log"]:
                thr = t.get("threshold")
                h.append(f"<tr><td>{e(t['description'])}</td><td>{e(t['status'])}"
                         f"{(' ' + e(t['error'][:100])) if t.get('error') else ''}</td>"
                         f"<td class='num'>{_ms(t.get('current_s'))}</td><td class='num'>"
                         f"{_ms(t.get('candidate_s'))}</td><td class='num'>"
                         f"{'-' if thr is None else f'{thr:.1%}'}</td></tr>")
            h.append("</table>")
    h.append(f"<h2>Graph</h2><img alt='graph coloured by target' src='{_png_uri(graph_png)}'>")
    h.append("<h2>Partitions</h2><table id='partitions'><tr><th>id</th><th>target</th>"
             "<th>nodes</th><th>ops</th><th>estimated (ms)</th><th>transition (ms)</th>"
             + ("<th>measured in the plan (ms)</th>" if per or sim else "")
             + "<th>runner-up (estimated ms + transition)</th></tr>")
    runner_ups = plan.extra.get("runner_ups") or {}
    for p in plan.partitions:
        ops = ", ".join(dict.fromkeys(p.op_types))
        meas = ""
        if per or sim:
            meas = ("<td>simulated</td>" if p.id in sim
                    else f"<td class='num'>{_ms(per.get(p.id))}</td>")
        h.append(f"<tr><td>{e(p.id)}</td><td><span class='sw' style='background:"
                 f"{tcolor[p.target]}'></span>{e(p.target)}</td><td class='num'>{len(p.nodes)}"
                 f"</td><td>{e(ops[:120])}</td><td class='num'>{_ms(p.estimated_s)}</td>"
                 f"<td class='num'>{_ms(p.penalty_s)}</td>{meas}"
                 f"<td>{_runner_up(runner_ups.get(p.id) or [])}</td></tr>")
    h.append("</table>")
    h.append(f"<h2>Costs per partition</h2><img alt='costs' src='{_png_uri(cost_png)}'>")
    h.append("</body></html>")
    out = root / "report.html"
    out.write_text("\n".join(h), encoding="utf-8")
    return out
