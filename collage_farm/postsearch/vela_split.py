"""Vela's own NPU / host split of a model ("Vela whole"), read back from one Vela compile.

`vela_split` gives the split an Ethos-U user gets without Collage: the placement Vela itself
makes when it compiles the whole model (`runners.vela_placement.vela_placement`: one int8
conversion, one compile with the board's NPU configuration, every node placed where Vela put
its operators, with Vela's own reason for each one it left on the CPU; the nodes the int8
converter writes in float32 only are on the host with the converter's reason; on a 16x8 NPU
target, whose compile is still the int8 one, a Softmax over rows longer than the int16 kernel
resolves goes to the host too, `runners.ethosu.wide_softmax_why`). The split is
each maximal run of the model's (post-DFS, topological) node order on one half: a run of a
topological order is convex, so it is always a valid plan.

Where that compile cannot be made (the conversion or Vela fails on the whole model, Vela is
not installed), the split falls back to the NPU target's capability check
(`runners.ethosu.VelaCapabilities`: Vela's published constraints restated per node, a node it
folds into a constant going with the NPU), and `VelaSplit.note` says which source was used and
why. Either way, a node on the host must be one the host takes (else ValueError names it), and
the exact-GELU chain around an Erf (written by the converter only whole) goes to the host whole
(`runners.cortex_m.joint_groups`). `VelaSplit.disagreements` lists the nodes where the compile
and the capability check place a node differently (empty when they agree; a disagreement is a
bug in one of them).

Each split is computed once per graph object, board and calibration (a whole-model compile
costs seconds on the larger models; a campaign asks for the split several times).
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from collage_farm.core.calibration_data import CalibrationData
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.target import Target
from collage_farm.execute.builder import Part
from runners.calibration import calibrate
from runners.cortex_m import joint_groups
from runners.deterministic import wide_softmax_why
from runners.ethosu import vela_config
from runners.registry import capabilities_for_target
from runners.vela_placement import NodePlacement, PlacementSource, VelaPlacement, vela_placement

__all__ = ["Board", "SplitSource", "VelaSplit", "capability_split", "vela_split"]


class SplitSource(enum.Enum):
    """Where Vela whole's split comes from."""

    VELA_COMPILE = "vela-compile"  # one Vela compile of the whole model, read back
    CAPABILITY = "capability"  # the NPU target's capability check (the compile failed)


@dataclass(frozen=True)
class Board:
    """The two halves of an Ethos-U campaign: the NPU target Vela compiles for, and the host."""

    npu: Target
    host: Target


@dataclass(frozen=True)
class VelaSplit:
    """Vela whole's partitions (execution order), the source used and why, the host nodes."""

    parts: tuple[Part, ...]
    source: SplitSource
    note: str  # one line: which source, what was compiled (or why the compile failed)
    on_host: tuple[NodePlacement, ...]  # the host nodes, each with its reason and source
    disagreements: tuple[str, ...] = ()  # compile vs capability check, one line each

    def to_json(self) -> dict:
        return {"source": self.source.value, "note": self.note,
                "disagreements": list(self.disagreements),
                "on_host": {h.node: {"op_type": h.op_type, "reason": h.reason,
                                     "source": h.source.value} for h in self.on_host}}


def _capability(graph: DataflowGraph, board: Board) -> list[str | None]:
    """Per node (by index): None when the NPU target's check takes it, else its reason."""
    npu = capabilities_for_target(board.npu)
    return [npu.why_not(node, graph) for node in graph.nodes]


def _runs(graph: DataflowGraph, on_npu: Sequence[bool], board: Board) -> tuple[Part, ...]:
    """Each maximal run of nodes on one half, in graph order."""
    parts: list[Part] = []
    mask, run = 0, None
    for node, npu in zip(graph.nodes, on_npu):
        if npu != run and mask:
            parts.append(Part(mask, board.npu if run else board.host))
            mask = 0
        run = npu
        mask |= 1 << node.index
    if mask:
        parts.append(Part(mask, board.npu if run else board.host))
    return tuple(parts)


def _split(graph: DataflowGraph, board: Board,
           why: Sequence[tuple[str, PlacementSource] | None],
           source: SplitSource, note: str, disagreements: tuple[str, ...] = ()) -> VelaSplit:
    """The split of a per-node placement (``why[i]``: None on the NPU, else (reason,
    source)); ValueError names the first host node the host does not take."""
    host = capabilities_for_target(board.host)
    reasons = list(why)
    for group in joint_groups(graph):
        if any(reasons[i] is not None for i in group):
            for i in group:
                reasons[i] = reasons[i] or ("part of an exact-GELU chain (Erf), which the "
                                            "converter writes only whole", PlacementSource.GELU)
    on_host = []
    for node, r in zip(graph.nodes, reasons):
        if r is None:
            continue
        host_why = host.why_not(node, graph)
        if host_why is not None:
            raise ValueError(f"{node.op_type} node {node.name!r} runs on neither "
                             f"{board.npu.id} ({r[0]}) nor {board.host.id} ({host_why})")
        on_host.append(NodePlacement(node.name, node.op_type, False, r[0], r[1]))
    parts = _runs(graph, [r is None for r in reasons], board)
    return VelaSplit(parts, source, note, tuple(on_host), disagreements)


def capability_split(graph: DataflowGraph, board: Board, note: str = "") -> VelaSplit:
    """The split the NPU target's capability check derives (module docstring)."""
    why = [None if w is None else (w, PlacementSource.CAPABILITY)
           for w in _capability(graph, board)]
    return _split(graph, board, why, SplitSource.CAPABILITY,
                  note or f"{board.npu.id}'s capability check (no whole-model compile asked)")


def _compare(graph: DataflowGraph, placed: VelaPlacement, cap: Sequence[str | None]
             ) -> tuple[str, ...]:
    """Nodes the compile and the capability check place differently, one line each."""
    out = []
    for node, p, c in zip(graph.nodes, placed.nodes, cap):
        if p.on_npu != (c is None):
            out.append(f"{node.op_type} {node.name!r}: Vela compile "
                       + ("NPU" if p.on_npu else f"CPU ({p.reason})")
                       + "; capability check " + ("NPU" if c is None else f"host ({c})"))
    return tuple(out)


def _compiled_split(graph: DataflowGraph, board: Board,
                    calibration: CalibrationData | None) -> VelaSplit:
    cap = _capability(graph, board)
    try:
        placed = vela_placement(graph, calibrate(graph, data=calibration),
                                vela_config(board.npu))
    except Exception as e:  # conversion, compile, configuration, calibration: fall back
        msg = " ".join(str(e).split())[:200]
        return capability_split(graph, board, note=(
            f"{board.npu.id}'s capability check: the whole-model Vela compile could not be "
            f"made ({type(e).__name__}: {msg})"))
    why = [None if p.on_npu else (p.reason, p.source) for p in placed.nodes]
    compared = list(cap)
    moved = 0
    if board.npu.option("activations") == "int16":  # 16x8's own limit on the int8 compile
        for i, node in enumerate(graph.nodes):
            wide = wide_softmax_why(node, graph) if node.op_type == "Softmax" else None
            if why[i] is None and wide is not None:
                why[i] = (wide, PlacementSource.CAPABILITY)
                compared[i] = None  # the int8 compile cannot know it: not a disagreement
                moved += 1
    dis = _compare(graph, placed, compared)
    note = placed.describe() + (f"; {len(dis)} node(s) placed otherwise by the capability "
                                "check" if dis else "; the capability check agrees")
    if moved:
        note += (f"; {moved} Softmax node(s) over rows the 16x8 kernel does not resolve moved "
                 f"to the host (the compile is int8, {board.npu.id} is 16x8)")
    return _split(graph, board, why, SplitSource.VELA_COMPILE, note, dis)


_CACHE: weakref.WeakKeyDictionary[DataflowGraph, dict[tuple, VelaSplit]] = \
    weakref.WeakKeyDictionary()


def vela_split(graph: DataflowGraph, board: Board,
               calibration: CalibrationData | None = None) -> VelaSplit:
    """Vela's own split of ``graph`` on ``board`` (module docstring); ``calibration``: the
    int8 samples of the campaign (seeded random by default). Computed once per graph object,
    board and calibration.

    ValueError names the first node that neither the NPU nor the host takes."""
    calibration = calibration or CalibrationData.random()  # the campaigns' default
    key = (board.npu, board.host, calibration.key)
    per_graph = _CACHE.setdefault(graph, {})
    if key not in per_graph:
        per_graph[key] = _compiled_split(graph, board, calibration)
    return per_graph[key]

