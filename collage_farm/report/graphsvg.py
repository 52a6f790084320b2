"""The plan's graph as inline SVG: compact, wrapped like text, repeated blocks drawn once.

`graph_svg` draws the collapsed flow (`collage_farm.report.flow`): one box per node in execution
order, left to right and wrapping at `WIDTH`, each box outlined in its target's colour and
labelled with its op type; each partition is a band of its target's colour behind its boxes,
labelled with its id where it starts; a `Repeat` is a dashed frame with its count ("x12")
around its body, drawn once. Hovering a box shows its node name, partition and target (SVG
``<title>``). The SVG scales down with the page (``max-width:100%``), so it never makes the page
wider than the window; no script, no font or image is fetched.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import dataclass, field

from collage_farm.report.flow import FlowNode, Repeat

__all__ = ["WIDTH", "graph_svg"]

WIDTH = 1160  # drawing units (px at full size)
_ROW = 52  # row height
_BOX_W, _BOX_H, _GAP = 74, 20, 4
_BADGE_W = 30
_e = html.escape


@dataclass
class _Canvas:
    """Placed shapes, in drawing order per layer (bands, frames, boxes)."""

    bands: list[str] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)
    boxes: list[str] = field(default_factory=list)
    x: float = 0.0
    row: int = 0
    row_end: float = 0.0  # where the previous row ended
    band: tuple[str, str, float, int] | None = None  # open: partition, target, x, row
    last_part: str = ""

    @property
    def y(self) -> float:
        return self.row * _ROW


def _fits(c: _Canvas, w: float, colors: Mapping[str, str]) -> None:
    """Move to a new row when ``w`` more units do not fit on this one (the band ends here)."""
    if c.x > 0 and c.x + w > WIDTH:
        _close_band(c, colors)
        c.row_end = c.x
        c.row += 1
        c.x = 0.0


def _band_at(c: _Canvas, n: FlowNode, colors: Mapping[str, str]) -> None:
    """Close the open band unless it is ``n``'s partition on this row; open ``n``'s."""
    if c.band is not None and (c.band[0] != n.part or c.band[3] != c.row):
        _close_band(c, colors)
    if c.band is None:
        c.band = (n.part, n.target, c.x, c.row)
        if n.part != c.last_part:  # the partition starts here: its id on the band
            c.boxes.append(f"<text x='{c.x + 2:.0f}' y='{c.y + 10:.0f}' font-size='9' "
                           f"fill='#333'>{_e(n.part)} · {_e(n.target)}</text>")
        c.last_part = n.part


def _close_band(c: _Canvas, colors: Mapping[str, str]) -> None:
    if c.band is None:
        return
    part, target, x0, row = c.band
    c.bands.append(f"<rect x='{x0:.0f}' y='{row * _ROW + 1}' width='{max(c.x - x0 - 2, 4):.0f}'"
                   f" height='{_ROW - 4}' rx='4' fill='{colors.get(target, '#999')}' "
                   f"fill-opacity='0.22'><title>partition {_e(part)} on {_e(target)}</title>"
                   "</rect>")
    c.band = None


def _node(c: _Canvas, n: FlowNode, colors: Mapping[str, str]) -> None:
    _fits(c, _BOX_W + _GAP, colors)
    _band_at(c, n, colors)
    op = n.op if len(n.op) <= 11 else n.op[:10] + "…"
    col = colors.get(n.target, "#999")
    y = c.y + 22
    c.boxes.append(
        f"<g><title>{_e(n.name)} ({_e(n.op)}), partition {_e(n.part)} on {_e(n.target)}"
        f"</title><rect x='{c.x:.0f}' y='{y:.0f}' width='{_BOX_W}' height='{_BOX_H}' rx='3' "
        f"fill='#fff' stroke='{col}' stroke-width='2'/><text x='{c.x + _BOX_W / 2:.0f}' "
        f"y='{y + 14:.0f}' font-size='10' text-anchor='middle' fill='#222'>{_e(op)}</text></g>")
    c.x += _BOX_W + _GAP


def _repeat(c: _Canvas, r: Repeat, colors: Mapping[str, str], depth: int) -> None:
    """A dashed frame per row the repeat spans, its count badge first."""
    inset = 12 + 3 * depth
    _fits(c, _BADGE_W + _BOX_W + 2 * _GAP, colors)
    start_x = c.x
    c.boxes.append(f"<g><title>block of {r.size} nodes repeated {r.count} times, in "
                   f"{r.parts} partition{'' if r.parts == 1 else 's'}</title>"
                   f"<rect x='{c.x + 2:.0f}' y='{c.y + 24:.0f}' width='{_BADGE_W - 4}' "
                   f"height='16' rx='8' fill='#444'/><text x='{c.x + _BADGE_W / 2:.0f}' "
                   f"y='{c.y + 36:.0f}' font-size='10' text-anchor='middle' fill='#fff'>"
                   f"×{r.count}</text></g>")
    c.x += _BADGE_W
    for item in r.body:
        row = c.row
        _item(c, item, colors, depth + 1)
        if c.row != row:  # the frame wrapped: close the part on the row before
            _frame(c.frames, start_x, c.row_end, row, inset)
            start_x = 0.0
    _frame(c.frames, start_x, c.x, c.row, inset)


def _frame(frames: list[str], x0: float, x1: float, row: int, inset: int) -> None:
    frames.append(f"<rect x='{x0 - 1:.0f}' y='{row * _ROW + inset:.0f}' "
                  f"width='{max(x1 - x0 - 2, 4):.0f}' height='{_ROW - 2 * inset + 6}' rx='5' "
                  "fill='none' stroke='#555' stroke-dasharray='4 3'/>")


def _item(c: _Canvas, item: FlowNode | Repeat, colors: Mapping[str, str], depth: int) -> None:
    if isinstance(item, FlowNode):
        _node(c, item, colors)
    else:
        _repeat(c, item, colors, depth)


def graph_svg(items: list[FlowNode | Repeat], colors: Mapping[str, str], title: str) -> str:
    """``items`` (`collage_farm.report.flow.collapse`) as one inline ``<svg>`` element;
    ``colors``: target -> colour."""
    c = _Canvas()
    for item in items:
        _item(c, item, colors, 0)
    _close_band(c, colors)
    height = (c.row + 1) * _ROW
    return (f"<svg class='graph' role='img' viewBox='0 0 {WIDTH} {height}' width='{WIDTH}' "
            f"height='{height}' xmlns='http://www.w3.org/2000/svg' "
            f"font-family='system-ui,sans-serif'><title>{_e(title)}</title>"
            + "".join(c.bands) + "".join(c.frames) + "".join(c.boxes) + "</svg>")
