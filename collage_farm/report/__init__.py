"""A self-contained HTML report of a plan: headline, compact graph, per-node heat map, costs.

Why: a plan directory is JSON and ONNX files; people decide with a picture and a table. The
report is one ``report.html`` (`collage_farm.report.html`, the page builder: one line per
section) with inline SVG and PNG figures, for people who would rather look than read:

* `collage_farm.report.headline`: the written plan, its measured latency and its speed-up over
  each single toolchain timed in the same run, with the 95% interval;
* `collage_farm.report.flow` and `collage_farm.report.graphsvg`: the graph in execution order,
  repeated blocks drawn once with their count, partitions as coloured bands;
* `collage_farm.report.nodecosts` and `collage_farm.report.heatmap`: each node's cost on each
  toolchain from the cost table, the cheapest per row starred;
* `collage_farm.report.labels`: words for every key shown; `collage_farm.report.summary`: the
  campaign's story; `collage_farm.report.plots`: the PNG charts (matplotlib).

The campaign calls `write_report(plan_dir, summary, measured)` after ``tune``; ``collage-farm
run --report`` calls it with the measured end-to-end numbers. ``collage-farm compare`` draws its
charts with `plot_bars` and `plot_spread`.
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
