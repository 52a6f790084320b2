"""A self-contained HTML report of a plan: graph coloured by target, partitions, costs.

Why: a plan directory is JSON and ONNX files; people decide with a picture and a table. The
report is one ``report.html`` (`collage_farm.report.html`) with its figures
(`collage_farm.report.plots`) embedded, and the PNGs written beside it. The campaign calls
`write_report(plan_dir, summary, measured)` after ``tune``; ``collage-farm run --report`` calls
it with the measured end-to-end numbers. ``collage-farm compare`` draws its charts with
`plot_bars` and `plot_spread`.
"""

from __future__ import annotations

from collage_farm.report.html import SUMMARY_KEYS, write_report
from collage_farm.report.plots import (
    MAX_DRAWN_NODES,
    cost_chart,
    draw_plan_graph,
    layered_layout,
    plot_bars,
    plot_spread,
)

__all__ = ["MAX_DRAWN_NODES", "SUMMARY_KEYS", "cost_chart", "draw_plan_graph", "layered_layout",
           "plot_bars", "plot_spread", "write_report"]
