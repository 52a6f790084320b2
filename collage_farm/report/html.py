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
from pathlib import Path
from typing import Any

from collage_farm.core.plan import Plan, load_plan
from collage_farm.report.ethos import ethos_section
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

SUMMARY_KEYS = ("nodes", "candidates", "distinct_fingerprints", "costs_requested", "measured",
                "cache_hits", "pruned", "analytic", "failed", "states_expanded", "search_s",
                "post_search_s", "wall_s")

#: how the report names each of `SUMMARY_KEYS`
SUMMARY_LABELS = {
    "nodes": "model nodes", "candidates": "candidate partitions",
    "distinct_fingerprints": "distinct candidates (fingerprints)",
    "costs_requested": "costs asked for", "measured": "candidates measured now",
    "cache_hits": "costs answered by the cost table", "pruned": "pruned by the lower bound",
    "analytic": "analytic estimates", "failed": "candidates that failed",
    "states_expanded": "search states expanded", "search_s": "search time (s)",
    "post_search_s": "refine and never-worse time (s)", "wall_s": "campaign wall time (s)",
}

#: the heading of each part of the story
SECTION_TITLES = {Section.PLAN: "Written plan", Section.SINGLES: "Each toolchain alone",
                  Section.DECISION: "Decision", Section.ESTIMATE: "The search's estimate",
                  Section.HISTORY: "How the search got there"}

_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;
color:#222;overflow-wrap:anywhere}
table{border-collapse:collapse;margin:0.5em 0 1.5em;max-width:100%}
td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left;vertical-align:top}
th{background:#f0f0f0;font-weight:600}.num{text-align:right;font-variant-numeric:tabular-nums;
white-space:nowrap}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px}
img{max-width:100%;height:auto;border:1px solid #ddd}.warn{color:#a33}
.card{border:1px solid #bbb;border-radius:6px;padding:0.6em 1.2em;margin:1em 0;
background:#fafbfd}.card h3{margin:0.8em 0 0.2em;font-size:14px;color:#555}
.card p{margin:0.2em 0}.card .plan{font-size:18px;font-weight:600}
"""

_e = html.escape


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
    h.append(f"<p>{plural(len(plan.partitions), 'partition')} over "
             f"{plural(n_targets, 'target')}; costs from <b>{_e(plan.estimator)}</b>, "
             f"transitions <b>{_e(plan.transition)}</b>.</p>")
    return h


def _story_card(lines: Sequence[StoryLine]) -> list[str]:
    """The story (`collage_farm.report.summary`) as the page's headline card, in its order."""
    if not lines:
        return []
    h = ["<div class='card' id='story'>"]
    last: Section | None = None
    for ln in lines:
        if ln.section is not last:
            h.append(f"<h3>{_e(SECTION_TITLES[ln.section])}</h3>")
            last = ln.section
        cls = " class='plan'" if ln.section is Section.PLAN else ""
        h.append(f"<p{cls}>{_e(ln.text)}</p>")
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
         + "".join(f"<tr><th>{_e(SUMMARY_LABELS.get(k, k))}</th><td class='num'>{_fmt(v)}"
                   "</td></tr>" for k, v in stats)
         + "</table>"]
    fbs = summary.get("failed_by_status") or {}
    if fbs:
        h.append("<p>Failures by status: " + ", ".join(
            f"{_e(str(k))}: {_fmt(v)}" for k, v in sorted(fbs.items())) + "</p>")
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
    for key, label in (("dijkstra_measured_s", f"{dl} measured (ms)"),
                       ("refined_measured_s", "refined plan measured (ms)")):
        if measured.get(key) is not None:
            rows.append((label, _ms(measured[key])))
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
    cost_png = cost_chart(plan, measured, root / "report_costs.png")
    h = _header(plan, summary, len(target_colors(plan)))
    h += _story_card(_story_of(plan, summary, measured))
    h += _campaign(summary)
    if summary.get("verify") and not measured:
        h.append(f"<p class='warn'>End-to-end check {_e(str(summary['verify']))}</p>")
    if measured:
        h += _measured(plan, summary, measured, root)
        h += _refinement(measured.get("refine") or {})
    h.append(f"<h2>Graph</h2><img alt='graph coloured by target' src='{_png_uri(graph_png)}'>")
    h += _partitions(plan, measured)
    h += ethos_section(plan)  # Ethos-U boards only (collage_farm.report.ethos)
    h.append(f"<h2>Costs per partition</h2><img alt='costs' src='{_png_uri(cost_png)}'>")
    h.append("</body></html>")
    out = root / "report.html"
    out.write_text("\n".join(h), encoding="utf-8")
    return out
