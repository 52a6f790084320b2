"""The per-node heat map: each node's cost on each toolchain, the winner of each row marked.

Rows follow the collapsed flow (`collage_farm.report.flow`) in execution order: a node of the
plan is one row; a node inside a repeated block is one row for all its repetitions ("x12": the
median over the repetitions that have a figure); above `MAX_ROWS` rows, consecutive rows are
merged into runs (their figures summed). Columns are the campaign's targets. A cell's colour is
its cost on one log scale for the whole table (light: cheap, dark: expensive); the figure comes
from `collage_farm.report.nodecosts` and says how it was obtained ("≈": a share of a larger
candidate; "◆": profiled in network; otherwise the node alone). A cell with no figure is grey
and says why ("no data", a failed row's status, or "in a 36-node block": measured only inside
larger candidates). The row's cheapest target is starred.
The table is plain HTML with fixed column widths, so a long node name is cut with an ellipsis
(its full name on hover) instead of widening the page.
"""

from __future__ import annotations

import html
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collage_farm.report.flow import FlowNode, Repeat
from collage_farm.report.labels import kind_words, status_words
from collage_farm.report.nodecosts import NodeCost, Source

__all__ = ["MAX_ROWS", "HeatRow", "heat_rows", "heatmap_html"]

MAX_ROWS = 120
#: light (cheap) to dark (expensive)
_RAMP = ((253, 231, 37), (94, 201, 98), (33, 145, 140), (59, 82, 139), (68, 1, 84))
_MARK = {Source.SHARE: "≈", Source.PROFILE: "◆", Source.SINGLE: ""}
_e = html.escape


@dataclass(frozen=True)
class HeatRow:
    """One row: its label, how many times it repeats, and per repetition the node names it
    covers (one node, or a run of several when rows were merged)."""

    label: str
    title: str
    count: int
    members: tuple[tuple[str, ...], ...]


def _rows_of(items: Sequence[FlowNode | Repeat], ops: Mapping[str, str]) -> list[HeatRow]:
    rows: list[HeatRow] = []
    for it in items:
        if isinstance(it, FlowNode):
            rows.append(HeatRow(f"{it.op} · {it.name}", it.name, 1, ((it.name,),)))
            continue
        for j in range(it.size):
            names = tuple((m[j],) for m in it.members)
            first = names[0][0]
            rows.append(HeatRow(f"{ops[first]} · {first}",
                                f"{first} (and {it.count - 1} more like it)", it.count, names))
    return rows


def _merge(rows: list[HeatRow]) -> list[HeatRow]:
    """Consecutive single rows merged into runs until at most `MAX_ROWS` remain."""
    if len(rows) <= MAX_ROWS:
        return rows
    k = math.ceil(len(rows) / MAX_ROWS)
    out: list[HeatRow] = []
    for i in range(0, len(rows), k):
        chunk = rows[i:i + k]
        if len(chunk) == 1:
            out.append(chunk[0])
            continue
        reps = min(r.count for r in chunk)
        members = tuple(tuple(n for r in chunk for n in r.members[rep]) for rep in range(reps))
        label = f"{chunk[0].label}…{chunk[-1].label} ({len(chunk)} rows)"
        out.append(HeatRow(label, f"{chunk[0].title} … {chunk[-1].title}", reps, members))
    return out


def heat_rows(items: Sequence[FlowNode | Repeat], ops: Mapping[str, str]) -> list[HeatRow]:
    """The heat map's rows for the collapsed flow ``items``; ``ops``: node name -> op type."""
    return _merge(_rows_of(items, ops))


def _cell(row: HeatRow, target: str, costs: Mapping[tuple[str, str], NodeCost]
          ) -> tuple[float | None, str, str]:
    """(seconds, mark, why-not) of ``row`` on ``target``: the median over repetitions whose
    every node has a figure; the worst source's mark; a failed status when none has one."""
    sums: list[float] = []
    worst = Source.SINGLE
    failed = ""
    for rep in row.members:
        got = [costs.get((n, target)) for n in rep]
        if all(c is not None and c.seconds is not None for c in got):
            sums.append(sum(c.seconds for c in got if c is not None and c.seconds is not None))
            for c in got:
                if c is not None and list(Source).index(c.source) > list(Source).index(worst):
                    worst = c.source
        else:
            failed = failed or next((_why(c) for c in got if c is not None), "")
    if not sums:
        return None, "", failed or "no data"
    return statistics.median(sums), _MARK.get(worst, ""), ""


def _why(c: NodeCost) -> str:
    """Why a node has no figure: a failed row's status, or the smallest candidate it was
    measured in."""
    if c.source is Source.COARSE:
        return f"in a {c.of_nodes}-node block"
    return status_words(c.status) if c.source is Source.FAILED else ""


def _colour(v: float, lo: float, hi: float) -> tuple[str, str]:
    """Background and text colour of ``v`` on the log scale from ``lo`` to ``hi``."""
    f = 0.0 if hi <= lo else (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
    f = min(1.0, max(0.0, f)) * (len(_RAMP) - 1)
    i = min(int(f), len(_RAMP) - 2)
    a, b = _RAMP[i], _RAMP[i + 1]
    rgb = tuple(round(a[k] + (b[k] - a[k]) * (f - i)) for k in range(3))
    return "#{:02x}{:02x}{:02x}".format(*rgb), ("#fff" if f > 2.0 else "#111")


def heatmap_html(rows: Sequence[HeatRow], targets: Sequence[str],
                 costs: Mapping[tuple[str, str], NodeCost], chosen: Mapping[str, str]) -> str:
    """The heat map as an HTML table (module doc); ``chosen``: node -> the plan's target."""
    cells = [[_cell(r, t, costs) for t in targets] for r in rows]
    vals = [v for line in cells for v, _, _ in line if v is not None and v > 0]
    lo, hi = (min(vals), max(vals)) if vals else (1.0, 1.0)
    kinds = sorted({kind_words(c.kind) for c in costs.values() if c.seconds is not None})
    tw = f"{62 / max(1, len(targets)):.1f}%"
    h = [f"<p class='note'>Cost of each node on each target (ms; {_e(', '.join(kinds) or '-')}"
         "). ≈ share of a larger candidate; ◆ profiled in network; ★ cheapest in the row; "
         "outlined in red: the plan's target. Grey: no figure.</p>",
         "<table id='heatmap' class='heat'><colgroup><col style='width:26%'>"
         "<col style='width:6%'>" + f"<col style='width:{tw}'>" * len(targets) + "</colgroup>"
         "<tr><th>node</th><th>×</th>" + "".join(f"<th>{_e(t)}</th>" for t in targets)
         + "</tr>"]
    for r, line in zip(rows, cells):
        known = [v for v, _, _ in line if v is not None]
        best = min(known) if known else None
        plan_t = chosen.get(r.members[0][0], "")
        h.append(f"<tr><td class='node' title='{_e(r.title)}'>{_e(r.label)}</td>"
                 f"<td class='num'>{'×' + str(r.count) if r.count > 1 else ''}</td>")
        for t, (v, mark, why) in zip(targets, line):
            box = " chosen" if t == plan_t and len(r.members[0]) == 1 else ""
            if v is None:
                h.append(f"<td class='nodata{box}'>{_e(why)}</td>")
                continue
            bg, fg = _colour(max(v, lo), lo, hi)
            star = " ★" if v == best and len(known) > 1 else ""
            h.append(f"<td class='num{box}' style='background:{bg};color:{fg}'>"
                     f"{mark}{v * 1e3:.3g}{star}</td>")
        h.append("</tr>")
    h.append("</table>")
    return "\n".join(h)
