"""The headline of the report: the written plan, its measured latency, its speed-up over each
single toolchain measured in the same run (with the 95% interval), at a glance.

`headline_html` reads a campaign summary (``plan_measured_s``, ``singles_measured_s``,
``written_plan_vs``: the written plan against every other plan of the never-worse run, round by
round, `collage_farm.report.summary.story_keys`) or, for ``collage-farm run --report``, the run's
figures (``plan_measured_s``, ``singles_s``: one run, no interval). Each compared plan is one
row: its measured latency as a bar (the written plan's in red), and the written plan's speed-up
over it with the interval. A plan that was not measured end to end gets its estimate, said so.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["headline_html", "speedup_words"]

_e = html.escape
MINE = "this is the written plan"


def speedup_words(ratio: float, low: float | None = None, high: float | None = None,
                  pairs: int = 0) -> str:
    """The written plan against another from ``ratio`` = written / other (time):
    "1.55× faster (95% interval 1.51–1.59×, 7 paired rounds)"; an interval that crosses 1
    reads "not beyond noise: 1.30× faster in the median (95% interval 0.39–1.52×, ...)"."""
    if not math.isfinite(ratio) or ratio <= 0:
        return "not comparable"
    faster = ratio <= 1.0
    head = f"{1 / ratio:.2f}× faster" if faster else f"{ratio:.2f}× slower"
    if low is None or high is None or not (low > 0 and high > 0):
        return head + " (one run, no interval)"
    lo, hi = (1 / high, 1 / low) if faster else (low, high)
    if low <= 1.0 <= high:  # the interval holds "as fast": no side is beyond noise
        head = f"not beyond noise: {head} in the median"
    return f"{head} (95% interval {lo:.2f}–{hi:.2f}×, {pairs} paired rounds)"


def _rows(summary: Mapping[str, Any], measured: Mapping[str, Any] | None, written: str
          ) -> tuple[float | None, list[tuple[str, float, str]]]:
    """(the written plan's measured seconds, [(plan, measured seconds, speed-up words)])."""
    m = measured or {}
    plan_s = summary.get("plan_measured_s", m.get("plan_measured_s"))
    singles = dict(summary.get("singles_measured_s") or m.get("singles_s") or {})
    vs = summary.get("written_plan_vs") or {}
    rows: list[tuple[str, float, str]] = []
    for name, v in singles.items():
        if v is None:
            continue
        cmp = vs.get(name)
        if isinstance(cmp, Mapping) and cmp.get("ratio") is not None:
            words = speedup_words(float(cmp["ratio"]), cmp.get("low"), cmp.get("high"),
                                  int(cmp.get("pairs") or 0))
        elif plan_s and name not in vs and abs(float(v) - float(plan_s)) < 1e-15:
            words = MINE
        else:
            words = speedup_words(float(plan_s) / float(v)) if plan_s else "-"
        rows.append((f"{name} whole", float(v), words))
    extra = {"dijkstra": "dijkstra_measured_s", "refined": "refined_measured_s"}
    for name, key in extra.items():
        cmp, v = vs.get(name), summary.get(key)
        if isinstance(cmp, Mapping) and v is not None and cmp.get("ratio") is not None:
            rows.append((str(cmp.get("plan") or name), float(v), speedup_words(
                float(cmp["ratio"]), cmp.get("low"), cmp.get("high"),
                int(cmp.get("pairs") or 0))))
    if plan_s is not None and not any(r[2] == MINE for r in rows):
        rows.append((written, float(plan_s), MINE))
    rows.sort(key=lambda r: r[1])
    return (float(plan_s) if plan_s is not None else None), rows


def headline_html(written: str, summary: Mapping[str, Any],
                  measured: Mapping[str, Any] | None, estimated_s: float | None) -> list[str]:
    """The headline block (module doc) for the written plan labelled ``written``."""
    plan_s, rows = _rows(summary, measured, written)
    h = [f"<p class='plan'>Written plan: {_e(written)}</p>"]
    if plan_s is None:
        est = "-" if estimated_s is None else f"{estimated_s * 1e3:.4g} ms"
        h.append(f"<p class='big'>{_e(est)}</p><p class='note'>the search's estimate "
                 "(not measured end to end)</p>")
        return h
    h.append(f"<p class='big'>{plan_s * 1e3:.4g} ms</p><p class='note'>measured end to end; "
             "below, each plan timed in the same interleaved run</p>")
    if not rows:
        return h
    top = max([plan_s] + [r[1] for r in rows])
    h.append("<table class='vs' id='speedups'><colgroup><col style='width:28%'>"
             "<col style='width:30%'><col style='width:12%'><col style='width:30%'></colgroup>"
             "<tr><th>plan</th><th>measured latency</th><th>ms</th>"
             "<th>written plan vs it</th></tr>")
    for name, v, words in rows:
        mine = " mine" if words == MINE else ""
        h.append(f"<tr><td>{_e(name)}</td><td><span class='bar{mine}' "
                 f"style='width:{100 * v / top:.1f}%'></span></td>"
                 f"<td class='num'>{v * 1e3:.4g}</td><td>{_e(words)}</td></tr>")
    h.append("</table>")
    return h
