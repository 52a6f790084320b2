"""The PNG figures of the report and of ``collage-farm compare``, drawn with matplotlib (Agg).

* `draw_plan_graph`: a plan's graph, each node a box coloured by its partition's target. The
  layout is `layered_layout` (nodes in reverse post-DFS order, each on the layer of its longest
  path from a source); above `MAX_DRAWN_NODES` nodes, partitions are drawn as blocks instead.
* `cost_chart`: estimated (and, when run, measured) cost per partition.
* `plot_bars`: horizontal bars of latencies (whole model per toolchain, the plan in red).
* `plot_spread`: grouped bars of each sub-graph's cost per target (``compare --cost-table``).

matplotlib is imported inside the drawing functions: it is slow to import, and most commands
(and ``--help``) never draw.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from collage_farm.core.plan import Plan

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MAX_DRAWN_NODES", "PALETTE", "cost_chart", "draw_plan_graph", "layered_layout",
           "plot_bars", "plot_spread", "target_colors"]

MAX_DRAWN_NODES = 150
PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
           "#ff9da7", "#9c755f", "#bab0ac"]


def target_colors(plan: Plan) -> dict[str, str]:
    """One `PALETTE` colour per target of ``plan``, in order of first use."""
    targets = list(dict.fromkeys(p.target for p in plan.partitions))
    return {t: PALETTE[i % len(PALETTE)] for i, t in enumerate(targets)}


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (no display needed)."""
    import matplotlib  # heavy: imported only when a figure is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Figure, path: Path, dpi: int) -> Path:
    plt = _pyplot()
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


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


def _post_order(names: Sequence[str], succ: Mapping[str, Sequence[str]]) -> list[str]:
    """Every node in DFS post order (iterative: deep graphs must not hit the recursion limit)."""
    seen: set[str] = set()
    post: list[str] = []
    for root in names:
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
    return post


def layered_layout(names: Sequence[str], edges: Sequence[tuple[str, str]]
                   ) -> dict[str, tuple[int, int]]:
    """(layer, position in layer) per node: longest-path layers over a post-DFS order."""
    succ: dict[str, list[str]] = {n: [] for n in names}
    pred: dict[str, list[str]] = {n: [] for n in names}
    for a, b in edges:
        if a in succ and b in succ and b not in succ[a]:
            succ[a].append(b)
            pred[b].append(a)
    order = list(reversed(_post_order(names, succ)))  # a topological order
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
    plt = _pyplot()
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
    return _save(fig, path, dpi=90)


def draw_plan_graph(plan: Plan, files: Mapping[str, Path], path: Path) -> Path:
    """Draw ``plan``'s graph coloured by target into ``path`` (PNG); ``files``: id -> ONNX file.

    Up to `MAX_DRAWN_NODES` nodes, one box per node labelled with its op and partition; above,
    one box per partition with its node count.
    """
    nodes = _plan_nodes(plan, files)
    tcolor = target_colors(plan)
    part_target = {p.id: p.target for p in plan.partitions}
    producer = {o: n for n in nodes for o in n.outputs}
    if len(nodes) <= MAX_DRAWN_NODES:
        edges = [(producer[i].name, n.name) for n in nodes for i in n.inputs if i in producer]
        labels = {n.name: f"{n.op} [{n.part}]" for n in nodes}
        colors = {n.name: tcolor[part_target[n.part]] for n in nodes}
        title = f"{plan.model}: {len(nodes)} nodes coloured by target"
    else:
        edges = sorted({(producer[i].part, n.part) for n in nodes for i in n.inputs
                        if i in producer and producer[i].part != n.part})
        sizes = {p.id: len(p.nodes) for p in plan.partitions}
        labels = {p.id: f"{p.id} {p.target} ({sizes[p.id]})" for p in plan.partitions}
        colors = {p.id: tcolor[p.target] for p in plan.partitions}
        title = f"{plan.model}: {len(nodes)} nodes in {len(plan.partitions)} partition blocks"
    return _draw(labels, colors, edges, tcolor, title, path)


def cost_chart(plan: Plan, measured: Mapping[str, Any] | None, path: Path) -> Path:
    """Estimated cost per partition (ms), beside the measured one where ``measured`` has
    ``partition_measured_s`` {id: seconds}; written to ``path`` (PNG)."""
    plt = _pyplot()
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
    return _save(fig, path, dpi=90)


def plot_spread(rows: list[dict], path: Path, model: str) -> Path:
    """Grouped horizontal bars: each sub-graph's cost per target (ms, log scale).

    ``rows`` are the sub-graph rows of ``collage-farm compare --cost-table`` (``label``,
    ``spread``, ``costs_s`` {target: seconds}); the parent directory of ``path`` is created.
    """
    plt = _pyplot()
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
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, path, dpi=100)


def plot_bars(rows: Sequence[tuple[str, float]], path: Path, title: str,
              notes: Sequence[str] = ()) -> Path:
    """A horizontal bar chart of latencies (``rows``: label, seconds; shown in ms).

    The bar labelled ``plan`` is red, a label ending in "(simulated)" orange, the others
    blue; ``notes`` (e.g. which targets failed and why) are printed under the chart, each cut
    to two lines. The parent directory of ``path`` is created.
    """
    plt = _pyplot()
    wrapped = [textwrap.shorten(n, 220, placeholder=" ...") for n in notes]
    lines = [ln for n in wrapped for ln in textwrap.wrap(n, 110)]
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * max(2, len(rows)) + 1 + 0.2 * len(lines)))
    names = [r[0] for r in rows]
    vals = [r[1] * 1e3 for r in rows]
    colors = ["#d62728" if n == "plan" else "#f28e2b" if n.endswith("(simulated)")
              else "#1f77b4" for n in names]
    ax.barh(names, vals, color=colors)
    for i, v in enumerate(vals):
        ax.text(v, i, f" {v:.3f}", va="center", fontsize=8)
    ax.set_xlabel("median latency (ms)")
    ax.set_title(title, fontsize=9)
    ax.invert_yaxis()
    if lines:
        fig.text(0.01, 0.01, "\n".join(lines), fontsize=7, va="bottom", ha="left",
                 color="#a33")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout(rect=(0, (0.15 * len(lines) + 0.05) / fig.get_figheight() if lines else 0,
                           1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
