"""``report.html``: one self-contained page per plan (inline CSS, PNGs as base64 data URIs).

No scripts and no external fetches, so the page opens offline and can be mailed or attached to
CI runs; the PNGs (`collage_farm.report.plots`) are written beside it too.

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

from collage_farm.core.calibration_data import describe as describe_calibration
from collage_farm.core.plan import Plan, load_plan
from collage_farm.report.ethos import ethos_section
from collage_farm.report.flow import FlowNode, collapse, plan_flow
from collage_farm.report.graphsvg import graph_svg
from collage_farm.report.headline import headline_html
from collage_farm.report.heatmap import heat_rows, heatmap_html
from collage_farm.report.labels import SUMMARY_KEYS, SUMMARY_LABELS, label, status_words
from collage_farm.report.nodecosts import node_costs
from collage_farm.report.plots import cost_chart, draw_plan_graph, plot_bars, target_colors
from collage_farm.report.summary import (
    Section,
    StoryLine,
    move_verdict,
    plan_label,
    plural,
    run_story,
)

__all__ = ["SUMMARY_KEYS", "SUMMARY_LABELS", "write_report"]

#: the heading of each part of the story
SECTION_TITLES = {Section.PLAN: "Written plan", Section.SINGLES: "Each toolchain alone",
                  Section.DECISION: "Decision", Section.ESTIMATE: "The search's estimate",
                  Section.HISTORY: "How the search got there"}

_CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;
color:#222;overflow-wrap:anywhere}
table{border-collapse:collapse;margin:0.5em 0 1.5em;max-width:100%}
td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left;vertical-align:top}
th{background:#f0f0f0;font-weight:600}.num{text-align:right;font-variant-numeric:tabular-nums;
white-space:nowrap}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
img,svg{max-width:100%;height:auto}img{border:1px solid #ddd}.warn{color:#a33}
.note{color:#555;font-size:13px}
.card{border:1px solid #bbb;border-radius:6px;padding:0.6em 1.2em;margin:1em 0;
background:#fafbfd}.card h3{margin:0.8em 0 0.2em;font-size:14px;color:#555}
.card p{margin:0.2em 0}.card .plan{font-size:18px;font-weight:600}
.big{font-size:28px;font-weight:700;margin:0.1em 0}
table.vs{width:100%;table-layout:fixed}table.vs td{border:none;border-bottom:1px solid #e4e4e4}
.bar{display:block;height:12px;border-radius:3px;background:#4e79a7}.bar.mine{background:#d62728}
table.heat{width:100%;table-layout:fixed}table.heat td{padding:2px 5px;font-size:12px}
td.node{overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
td.nodata{background:#e6e6e6;color:#777;font-size:11px;white-space:nowrap;overflow:hidden}
td.chosen{outline:2px solid #d62728;outline-offset:-2px}
.legend span{margin-right:1.2em;white-space:nowrap}
#partitions td:nth-child(-n+3),#partitions th:nth-child(-n+3){white-space:nowrap}
"""

_e = html.escape


@dataclass(frozen=True)
class _Page:
    """What the page's sections read: the plan directory, its plan and partition files'
    nodes in execution order (`plan_flow`), the summary, the run's figures, the cost table."""

    root: Path
    plan: Plan
    summary: Mapping[str, Any]
    measured: Mapping[str, Any] | None
    flow: list[FlowNode]
    cost_table: Path | None


def _png_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return _e(str(v))


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.4f}"


def _runner_up(alts: Sequence[Mapping[str, Any]]) -> str:
    """The best alternative the search had at this partition's state, and why it lost."""
    if not alts:
        return "-"
    a = alts[0]
    what = ("same nodes on " + _e(str(a.get("target"))) if a.get("same_nodes")
            else _e(str(a.get("label"))))
    status = a.get("status")
    cost = a.get("cost_s")
    if status == "invalid":
        return f"{what}: cannot build or run"
    if status == "bound":
        return f"{what}: pruned, lower bound {_ms(cost)} + {_ms(a.get('penalty_s'))}"
    return f"{what}: {_ms(cost)} + {_ms(a.get('penalty_s'))}"


def _header(plan: Plan, summary: Mapping[str, Any], n_targets: int) -> list[str]:
    h = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>collage-farm plan "
         f"{_e(plan.model)}</title><style>{_CSS}</style></head><body>",
         f"<h1>Plan for {_e(plan.model)}</h1>"]
    if "mock" in (plan.estimator or "") or summary.get("estimator") == "mock":
        h.append("<p class='warn'>Estimates come from the MOCK estimator: not measurements.</p>")
    trans = f", transitions <b>{_e(plan.transition)}</b>" if plan.transition else ""
    h.append(f"<p>{plural(len(plan.partitions), 'partition')} over "
             f"{plural(n_targets, 'target')}; costs from <b>{_e(plan.estimator)}</b>{trans}.</p>")
    cal = plan.extra.get("int8_calibration")
    if isinstance(cal, Mapping):
        h.append(f"<p id='calibration'>int8 builds calibrated on the whole model, "
                 f"{_e(describe_calibration(cal))}.</p>")
    return h


def _story_card(page: _Page) -> list[str]:
    """The headline (`collage_farm.report.headline`) and the story
    (`collage_farm.report.summary`, in its order) as the page's first card."""
    lines = _story_of(page.plan, page.summary, page.measured)
    h = ["<div class='card' id='story'>"]
    written = str(page.summary.get("written_plan") or _label(page.plan))
    h += headline_html(written, page.summary, page.measured, page.plan.estimated_total_s)
    last: Section | None = None
    for ln in lines:
        if ln.section is not last:
            h.append(f"<h3>{_e(SECTION_TITLES[ln.section])}</h3>")
            last = ln.section
        h.append(f"<p>{_e(ln.text)}</p>")
    h.append("</div>")
    return h


def _story_of(plan: Plan, summary: Mapping[str, Any], measured: Mapping[str, Any] | None
              ) -> list[StoryLine]:
    """The campaign's story when the summary carries one, else one told from ``measured``
    (``collage-farm run --report``)."""
    got = summary.get("story")
    if isinstance(got, list) and got:
        return [StoryLine(Section(d["section"]), str(d["text"])) for d in got
                if isinstance(d, Mapping) and d.get("section") in {x.value for x in Section}]
    return run_story(_label(plan), plan.estimated_total_s, plan.estimator, measured)


def _label(plan: Plan) -> str:
    return plan_label([(p.target, len(p.nodes)) for p in plan.partitions],
                      sum(len(p.nodes) for p in plan.partitions))


def _campaign(summary: Mapping[str, Any]) -> list[str]:
    """The campaign statistics (`SUMMARY_KEYS` present in ``summary``) and failures by status."""
    stats = [(k, summary[k]) for k in SUMMARY_KEYS if k in summary]
    if not stats:
        return []
    h = ["<h2>Campaign</h2><table id='campaign'>"
         + "".join(f"<tr><th>{_e(label(k))}</th><td class='num'>{_fmt(v)}"
                   "</td></tr>" for k, v in stats)
         + "</table>"]
    fbs = summary.get("failed_by_status") or {}
    if fbs:
        h.append("<p>Failures by status: " + ", ".join(
            f"{_e(status_words(str(k)))}: {_fmt(v)}" for k, v in sorted(fbs.items())) + "</p>")
    return h


def _measured_rows(plan: Plan, summary: Mapping[str, Any], measured: Mapping[str, Any]
                   ) -> list[tuple[str, str]]:
    """The end-to-end figures, each named by the plan it belongs to."""
    w = _label(plan)
    rows = [(f"written plan ({w}) measured (ms)", _ms(measured.get("plan_measured_s")))]
    if measured.get("simulated_part_s"):
        rows.append(("of which simulated (ms)", _ms(measured.get("simulated_part_s"))))
    rows.append((f"the search's estimate of the written plan ({w}) (ms)",
                 _ms(plan.estimated_total_s)))
    ae, al = measured.get("additive_error"), measured.get("apparent_loss")
    if ae is not None:
        rows.append((f"additive error of the written plan ({w}), (measured - estimated) / "
                     "measured", f"{ae:+.1%}"))
    for k, v in (measured.get("singles_s") or {}).items():
        rows.append((f"{k} whole, measured (ms)", _ms(v)))
    d = summary.get("dijkstra_plan")
    dl = f"Dijkstra plan ({d})" if d else "Dijkstra plan"
    if al is not None:
        mix = "refined plan" if (measured.get("mix_measured_s") is not None and measured.get(
            "mix_measured_s") == measured.get("refined_measured_s")) else dl
        if measured.get("dijkstra_measured_s") is None:  # `collage-farm run`: the plan itself
            mix = f"written plan ({w})"
        rows.append((f"apparent loss: {mix} vs {measured.get('best_single')} whole",
                     f"{al:+.1%}"))
    for key, name in (("dijkstra_measured_s", f"{dl} measured (ms)"),
                      ("refined_measured_s", "refined plan measured (ms)")):
        if measured.get(key) is not None:
            rows.append((name, _ms(measured[key])))
    return rows


def _measured(plan: Plan, summary: Mapping[str, Any], measured: Mapping[str, Any], root: Path
              ) -> list[str]:
    """The end-to-end table, the never-worse decision and the end-to-end bar chart."""
    h = ["<h2>Measured end to end</h2><table id='measured'>"]
    h += [f"<tr><th>{_e(a)}</th><td class='num'>{_e(b)}</td></tr>"
          for a, b in _measured_rows(plan, summary, measured)]
    h.append("</table>")
    if measured.get("never_worse"):
        h.append(f"<p id='never-worse'><b>Never worse:</b> {_e(str(measured['never_worse']))}"
                 "</p>")
    e2e = [(k, v) for k, v in ((f"Dijkstra plan ({summary.get('dijkstra_plan', '?')})",
                                 measured.get("dijkstra_measured_s")),
                                ("refined plan", measured.get("refined_measured_s")))
           if v is not None]
    e2e += [(f"{k} whole", v) for k, v in (measured.get("singles_s") or {}).items()
            if v is not None]
    if e2e:
        png = plot_bars(e2e, root / "report_e2e.png",
                        f"{plan.model}: measured end to end, one interleaved run")
        h.append(f"<img alt='end-to-end latency' src='{_png_uri(png)}'>")
    return h


def _refinement(ref: Mapping[str, Any]) -> list[str]:
    """Every measured refinement trial: the move, its result and the noise threshold."""
    if not ref.get("log"):
        return []
    h = [f"<h2>Refinement of the Dijkstra plan</h2><p>"
         f"{plural(int(ref.get('trials') or 0), 'measured trial')}, "
         f"{ref.get('accepted')} kept, {ref.get('invalid_skipped')} invalid moves "
         f"skipped, {_fmt(ref.get('elapsed_s'))} s (stopped: "
         f"{_e(str(ref.get('stopped_by')))}).</p><table id='refine'><tr><th>move</th>"
         "<th>result</th><th>plan before the move (ms)</th><th>with the move (ms)</th>"
         "<th>noise threshold</th></tr>"]
    for t in ref["log"]:
        thr = t.get("threshold")
        h.append(f"<tr><td>{_e(t['description'])}</td><td>{_e(move_verdict(t))}</td>"
                 f"<td class='num'>{_ms(t.get('current_s'))}</td><td class='num'>"
                 f"{_ms(t.get('candidate_s'))}</td><td class='num'>"
                 f"{'-' if thr is None else f'{thr:.1%}'}</td></tr>")
    h.append("</table>")
    return h


def _partitions(plan: Plan, measured: Mapping[str, Any] | None) -> list[str]:
    """One row per partition: target, size, ops, costs, and the runner-up it beat."""
    tcolor = target_colors(plan)
    per = (measured or {}).get("partition_measured_s") or {}
    sim = set((measured or {}).get("simulated_partitions") or [])
    h = ["<h2>Partitions</h2><table id='partitions'><tr><th>id</th><th>target</th>"
         "<th>nodes</th><th>ops</th><th>estimated (ms)</th><th>transition (ms)</th>"
         + ("<th>measured in the plan (ms)</th>" if per or sim else "")
         + "<th>runner-up (estimated ms + transition)</th></tr>"]
    runner_ups = plan.extra.get("runner_ups") or {}
    for p in plan.partitions:
        ops = ", ".join(dict.fromkeys(p.op_types))
        meas = ""
        if per or sim:
            meas = ("<td>simulated</td>" if p.id in sim
                    else f"<td class='num'>{_ms(per.get(p.id))}</td>")
        h.append(f"<tr><td>{_e(p.id)}</td><td><span class='sw' style='background:"
                 f"{tcolor[p.target]}'></span>{_e(p.target)}</td><td class='num'>{len(p.nodes)}"
                 f"</td><td>{_e(ops[:120])}</td><td class='num'>{_ms(p.estimated_s)}</td>"
                 f"<td class='num'>{_ms(p.penalty_s)}</td>{meas}"
                 f"<td>{_runner_up(runner_ups.get(p.id) or [])}</td></tr>")
    h.append("</table>")
    return h


def _graph(page: _Page) -> list[str]:
    """The plan's graph, compact (`collage_farm.report.graphsvg`), and the legend."""
    colors = target_colors(page.plan)
    items = collapse(page.flow)
    n = len(page.flow)
    h = [f"<h2>Graph</h2><p class='note'>{plural(n, 'node')} in execution order, left to "
         "right; bands are partitions, box outlines their targets; a dashed frame is a "
         "block repeated as many times as its badge says, drawn once. Hover a box for its "
         "node.</p>",
         graph_svg(items, colors, f"{page.plan.model}: {plural(n, 'node')} in "
                                  f"{plural(len(page.plan.partitions), 'partition')}"),
         "<p class='legend'>" + "".join(
             f"<span><span class='sw' style='background:{c}'></span>{_e(t)}: "
             f"{plural(sum(p.target == t for p in page.plan.partitions), 'partition')}</span>"
             for t, c in colors.items()) + "</p>"]
    return h


def _heatmap(page: _Page) -> list[str]:
    """Each node's cost on each target from the campaign's cost table
    (`collage_farm.report.heatmap`)."""
    h = ["<h2>Cost of each node by toolchain</h2>"]
    table = page.cost_table
    if table is None:
        why = ("mock costs are not measurements" if page.plan.estimator == "mock"
               or page.summary.get("estimator") == "mock" else "no cost table beside the plan")
        return [*h, f"<p class='note'>No per-node costs: {_e(why)}.</p>"]
    names = [f.name for f in page.flow]
    costs = node_costs(table, page.plan.model, names)
    targets = list(dict.fromkeys([t["id"] for t in page.plan.targets]
                                 + sorted({t for _, t in costs})))
    rows = heat_rows(collapse(page.flow), {f.name: f.op for f in page.flow})
    return [*h, heatmap_html(rows, targets, costs, page.plan.target_of_node())]


def _cost_table(root: Path, summary: Mapping[str, Any]) -> Path | None:
    """The campaign's cost table: the summary's ``cost_table``, else ``costs`` beside the
    plan; None when neither is a directory."""
    for p in (summary.get("cost_table"), root / "costs"):
        if p and Path(p).is_dir():
            return Path(p)
    return None


def write_report(plan_dir: str | Path, summary: dict, measured: dict | None = None) -> Path:
    """Write ``report.html`` (self-contained) and PNGs into ``plan_dir``; returns the HTML path.

    ``summary`` is the campaign summary (`run_tune`'s dict; the keys in `SUMMARY_KEYS` are
    shown when present; ``cost_table`` names the table the heat map reads, else ``costs``
    beside the plan). ``measured`` is what ``collage-farm run --json`` prints (keys
    ``plan_measured_s``, ``additive_error``, ``apparent_loss``, ``singles_s``, ``best_single``,
    optional ``partition_measured_s`` {id: seconds}); None when the plan was not run.
    """
    root = Path(plan_dir)
    plan, files = load_plan(root)
    page = _Page(root, plan, summary, measured, plan_flow(plan, files),
                 _cost_table(root, summary))
    graph_png = draw_plan_graph(plan, files, root / "report_graph.png")
    cost_png = cost_chart(plan, measured, root / "report_costs.png")
    # the page, top to bottom: one line per section
    h = _header(plan, summary, len(target_colors(plan)))
    h += _story_card(page)
    h += _graph(page)
    h += _heatmap(page)
    h += _partitions(plan, measured)
    h += ethos_section(plan)  # Ethos-U boards only (collage_farm.report.ethos)
    if measured:
        h += _measured(plan, summary, measured, root)
        h += _refinement(measured.get("refine") or {})
    elif summary.get("verify"):
        h.append(f"<p class='warn'>End-to-end check {_e(str(summary['verify']))}</p>")
    h += _campaign(summary)
    h.append(f"<h2>Costs per partition</h2><img alt='costs' src='{_png_uri(cost_png)}'>")
    h.append(f"<details><summary>Layered drawing of the graph (PNG)</summary><img alt='graph "
             f"coloured by target' src='{_png_uri(graph_png)}'></details>")
    h.append("</body></html>")
    out = root / "report.html"
    out.write_text("\n".join(h), encoding="utf-8")
    return out
