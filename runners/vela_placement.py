"""Vela's own placement of a whole model: which nodes it puts on the NPU, which on the CPU, why.

What an Ethos-U user gets without Collage is one Vela compile of the whole int8 model: Vela
places every operator it supports on the NPU and leaves the rest to the Cortex-M host
("Passthrough"), logging its reason for each. `vela_placement` makes that compile and reads
the placement back per ONNX node:

1. the model is converted once to int8 TFLite by `runners.tflite` with the whole model's
   calibrated ranges. The converter writes some operators in float32 only (GATHER, the
   LayerNorm decomposition, a two-input BATCH_MATMUL, ...: `runners.tflite.convertible` says
   which). A model holding such nodes is compiled without them: the int8 part (every other
   node, the model's conversion-time constants included) is extracted as one model
   (`SubGraph.extract`, tensor names kept) and compiled once. In a real TFLite model those
   nodes would be float32 operators between QUANTIZE / DEQUANTIZE, which Vela always leaves to
   the CPU; here they are on the host with the converter's reason (source ``converter``), and
   every operator the converter does write in int8 is judged by Vela itself;
2. the flatbuffer is compiled by Vela (`runners.vela_estimate.vela_estimate`: Vela's C++ core,
   its optimised database read back per TFLite operator) with the NPU target's configuration,
   in a fresh worker child (`runners.isolation.WorkerProcess`): a Vela crash or hang costs the
   child and the placement (the caller falls back), never the campaign;
3. a node is on the CPU when any TFLite operator it is part of is a Vela ``Passthrough``, with
   Vela's own reason from its compile log (source ``vela``); a node that emits no operator (a
   conversion-time constant: shape arithmetic) is reported ``folded`` and placed on the NPU
   (it costs nothing anywhere).

`PlacementError` says in one line why the placement cannot be made (the conversion or the
compile fails, Vela is not installed): callers then fall back to the NPU target's capability
check. Vela is imported only by the compile (`runners.vela_estimate`).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass

from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.core.subgraph import SubGraph
from runners.isolation import WorkerError, WorkerProcess
from runners.tflite import ConversionError, ConvertedModel, convert, convertible
from runners.tflite.fold import _folded
from runners.vela_estimate import HOST_MODEL, HostModel, VelaConfig

__all__ = ["COMPILE_TIMEOUT_S", "NodePlacement", "PlacementError", "PlacementSource",
           "VelaPlacement", "isolated_estimate", "vela_placement"]

#: the longest a whole-model compile may take in its worker child (gpt2-2L's int8 part
#: compiles in well under a minute on a loaded 2-core machine)
COMPILE_TIMEOUT_S = 900.0


class PlacementSource(enum.Enum):
    """Where a node's placement comes from."""

    VELA = "vela"  # Vela compiled the node's operators: NPU, or CPU with Vela's reason
    CONVERTER = "converter"  # the int8 converter does not write it: on the CPU, float32
    FOLDED = "folded"  # a conversion-time constant: no operator at all
    # where no whole compile was made, or the split moved a node after it:
    CAPABILITY = "capability"  # the NPU target's capability check refused it
    GELU = "gelu"  # part of an exact-GELU chain, which the converter writes only whole


class PlacementError(RuntimeError):
    """The whole-model compile cannot be made; the message is one line."""


@dataclass(frozen=True)
class NodePlacement:
    """One ONNX node: on the NPU or not, why not (empty on the NPU), and who decided."""

    node: str
    op_type: str
    on_npu: bool
    reason: str
    source: PlacementSource


@dataclass(frozen=True)
class VelaPlacement:
    """Vela's placement of every node of a model (graph order) and the compile's figures."""

    nodes: tuple[NodePlacement, ...]
    compiled_nodes: int  # nodes in the compiled int8 model (the rest: ``converter``)
    tflite_ops: int
    cpu_ops: int  # TFLite operators Vela left on the CPU
    npu_cycles: int  # Vela's total cycles of the compiled model (simulated)
    accelerator: str
    compile_s: float  # conversion + Vela compile, wall seconds

    def placement_of(self, name: str) -> NodePlacement:
        for p in self.nodes:
            if p.node == name:
                return p
        raise KeyError(name)

    def describe(self) -> str:
        """One line: what was compiled and what Vela left on the CPU."""
        n = len(self.nodes)
        part = ("the whole model" if self.compiled_nodes == n else
                f"its int8 part ({self.compiled_nodes} of {n} nodes; "
                f"{n - self.compiled_nodes} float32-only nodes on the host)")
        host = sum(not p.on_npu for p in self.nodes if p.source is PlacementSource.VELA)
        return (f"one Vela compile of {part} for {self.accelerator}: {self.tflite_ops} TFLite "
                f"operators, {self.cpu_ops} left on the CPU by Vela ({host} nodes)")


def _int8_part(graph: DataflowGraph) -> tuple[int, dict[str, str]]:
    """The mask of the nodes the converter writes in int8, and the reason of every other."""
    mask, fp32_only = 0, {}
    for node in graph.nodes:
        why = convertible(node, graph, "int8")
        if why is None:
            mask |= 1 << node.index
        else:
            fp32_only[node.name] = why
    return mask, fp32_only


def _compiled_graph(graph: DataflowGraph, mask: int) -> DataflowGraph:
    """The int8 part as one model (the graph itself when it is all of it)."""
    if mask == graph.all_mask:
        return graph
    sub = SubGraph(graph, mask)
    return load_graph(sub.extract(f"{graph.name}_int8"), name=f"{graph.name}_int8")


def _npu_of_ops(ops: list[dict]) -> dict[str, tuple[bool, str]]:
    """Per ONNX node named by a TFLite operator: (on the NPU, Vela's reason when not)."""
    out: dict[str, tuple[bool, str]] = {}
    for rec in ops:
        for name in rec.get("nodes") or []:
            if rec.get("target") == "cpu":
                why = rec.get("vela_reason") or "Vela placed it on the CPU (no reason logged)"
                if out.get(name, (True, ""))[0]:
                    out[name] = (False, f"{rec.get('op')}: {why}")
            else:
                out.setdefault(name, (True, ""))
    return out


def isolated_estimate(tflite: bytes, cfg: VelaConfig, conv: ConvertedModel, host: HostModel,
                      timeout_s: float = COMPILE_TIMEOUT_S) -> dict:
    """Vela's estimate of ``tflite`` compiled in a fresh worker child (`runners.isolation`):
    Vela is native code and has segfaulted on malformed flatbuffers; in the campaign's own
    process that would end the campaign, here it costs the child. A crash, a hang past
    ``timeout_s`` or an error raises `PlacementError` (one line)."""
    try:
        with WorkerProcess(["vela"], threads=1, name="vela-placement") as worker:
            return worker.invoke("vela", "estimate", tflite, cfg, conv, host,
                                 timeout_s=timeout_s)
    except WorkerError as e:
        raise PlacementError(f"Vela compile of the model ({e.status.value}): "
                             f"{' '.join(str(e).split())[:200]}") from None


def vela_placement(graph: DataflowGraph, ranges: Mapping[str, tuple[float, float]],
                   cfg: VelaConfig, host: HostModel = HOST_MODEL,
                   timeout_s: float = COMPILE_TIMEOUT_S) -> VelaPlacement:
    """Vela's placement of ``graph`` compiled for ``cfg`` (module docstring); ``ranges``:
    the whole model's calibrated (min, max) per tensor.

    The compile runs in a worker child (`isolated_estimate`, at most ``timeout_s``). Raises
    `PlacementError` (one line) when the conversion or the compile fails, crashes or hangs."""
    t0 = time.perf_counter()
    mask, fp32_only = _int8_part(graph)
    if not mask:
        raise PlacementError("the int8 converter writes none of the model's nodes")
    try:
        part = _compiled_graph(graph, mask)
        conv = convert(part, "int8", ranges)
    except (ConversionError, ValueError) as e:
        raise PlacementError(f"int8 conversion of the model for Vela: "
                             f"{' '.join(str(e).split())[:200]}") from None
    est = isolated_estimate(conv.tflite, cfg, conv, host, timeout_s)
    placed = _npu_of_ops(est["ops"])
    nodes = []
    for node in graph.nodes:
        if node.name in fp32_only:
            p = NodePlacement(node.name, node.op_type, False,
                              f"not written in int8 by the converter ({fp32_only[node.name]})",
                              PlacementSource.CONVERTER)
        elif node.name in placed:
            on, why = placed[node.name]
            p = NodePlacement(node.name, node.op_type, on, why, PlacementSource.VELA)
        elif _folded(node, graph):
            p = NodePlacement(node.name, node.op_type, True, "", PlacementSource.FOLDED)
        else:
            raise PlacementError(f"{node.op_type} node {node.name!r} is in no TFLite operator "
                                 "of the compiled model")
        nodes.append(p)
    return VelaPlacement(tuple(nodes), bin(mask).count("1"), len(est["ops"]),
                         int(est["cpu_ops"]), int(est["total_cycles"]),
                         cfg.accelerator_config, time.perf_counter() - t0)
