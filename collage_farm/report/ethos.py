"""The report's Ethos-U section: one small table per partition of a plan on an Ethos-U board.

Self-contained: `ethos_section` reads only the plan's per-partition ``ethos`` figures
(`collage_farm.postsearch.ethos_parts`, written into ``plan.json``) and returns HTML lines; a
plan without them (any other system) gives no lines. Per partition: its target and the Vela
options it was compiled with, NPU cycles (Vela's estimate, simulated) and host cycles (the
analytic Cortex-M cycle model), then every operator that runs on the host with the reason and
where the reason comes from (``vela``: Vela's own warning, from the partition's compile or
from the compile of the whole model; ``converter``: the int8 converter writes it in float32
only; ``capability``: the NPU target's check; ``search``: the NPU takes it, the plan is cheaper
without).
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from collage_farm.core.plan import Plan

__all__ = ["ethos_section"]


def _e(v: object) -> str:
    return escape(str(v), quote=True)


def _cycles(v: Any) -> str:
    return "-" if v is None else f"{float(v):,.0f}"


def _rows(fig: Mapping[str, Any]) -> list[str]:
    """The operators of one partition that run on the host, one row each."""
    out = []
    for f in fig.get("fallen_to_host") or []:
        out.append(f"<tr><td>{_e(', '.join(f.get('nodes') or []))}</td><td>{_e(f.get('op'))}"
                   f"</td><td>{_e(f.get('reason'))}</td><td>{_e(f.get('source'))}</td></tr>")
    for f in fig.get("on_host") or []:
        out.append(f"<tr><td>{_e(f.get('node'))}</td><td>{_e(f.get('op_type'))}</td>"
                   f"<td>{_e(f.get('reason'))}</td><td>{_e(f.get('source'))}</td></tr>")
    return out


def _partition(pid: str, target: str, fig: Mapping[str, Any]) -> list[str]:
    opts = ", ".join(f"{k}={v}" for k, v in (fig.get("options") or {}).items())
    head = (f"<h3>{_e(pid)} on {_e(target)} ({_e(fig.get('half'))})</h3>"
            f"<p>options: {_e(opts or '-')}"
            + (f"; Vela: {_e(fig['vela_config'])}" if fig.get("vela_config") else "")
            + f"; NPU cycles (simulated, Vela): {_cycles(fig.get('npu_cycles'))}"
            f"; host cycles (analytic cycle model): {_cycles(fig.get('host_cycles'))}</p>")
    rows = _rows(fig)
    if not rows:
        return [head, "<p>every operator on the NPU</p>"]
    return [head, "<table class='ethos'><tr><th>node(s)</th><th>operator</th>"
            "<th>why on the host</th><th>reason from</th></tr>", *rows, "</table>"]


def ethos_section(plan: Plan) -> list[str]:
    """HTML lines of the Ethos-U section (empty when no partition has ``ethos`` figures)."""
    parts = [p for p in plan.partitions if p.ethos]
    if not parts:
        return []
    h = ["<h2>Ethos-U partitions</h2><p>Per partition of this plan: simulated NPU cycles "
         "(Vela), analytic host cycles (Cortex-M cycle model), the Vela options it was "
         "compiled with, and why each host operator is not on the NPU.</p>"]
    for p in parts:
        h += _partition(p.id, p.target, p.ethos or {})
    return h
