"""Lower bounds for the two halves of a simulated Ethos-U board, from multiply-accumulates.

Why separate bounds: the generic roofline (`estimators.analytic`) must hold for every device of
a kind, so for an Ethos-U NPU it assumes 1 GHz and divides convolutions by a Winograd factor, and
for a Cortex-M host (a ``cpu`` device) it assumes a 5 GHz AVX-512 core. Both bounds are then far
below what Vela or the host's cycle model say, and the lazy search (`collage_farm.core.search`)
ends up compiling nearly every candidate of a model. The two toolchains' costs are *formulas of
known hardware*, so a bound can use that hardware:

* **NPU** (toolchain ``vela``): Vela's cycle estimate of a sub-graph is at least its MACs over
  the accelerator's MACs per cycle (``ethos-u55-128``: 128; a U65-512 is two cores of 256),
  divided by the core clock of the target's Vela system config (read from the ``vela.ini`` that
  ships with Vela, `runners.vela_facts`). Vela has no Winograd or FFT path: a convolution is
  its direct MACs on the MAC array, at best at full utilisation. Unit tests compare this bound
  with Vela's own estimate on every candidate of zoo models.
* **host** (toolchain ``cortex-m``): the cycle model of `runners.host_model` charges every MAC
  at least its cheapest kernel rate (CMSIS-NN's 0.25 cycles per int8 MAC), and a sub-graph that
  has any MAC emits at least one operator (its dispatch cost); bytes and the fp32 boundary
  are left out (fusion can remove operators and bytes, never MACs).

MACs are counted on the ONNX nodes (`node_macs`: Conv, ConvTranspose, Gemm, MatMul); every
other node counts 0. None from `embedded_bound_s` means "not one of these toolchains".
"""

from __future__ import annotations

import math

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import DataflowGraph, Node
from collage_farm.core.target import Target
from runners.host_model import host_model
from runners.vela_facts import VELA_DEFAULTS, accelerator_family, vela_ini_sections

__all__ = ["embedded_bound_s", "node_macs", "npu_macs_per_s"]


def _shape(graph: DataflowGraph, name: str) -> tuple[int, ...] | None:
    info = graph.tensors.get(name) if name else None
    return info.shape if info is not None else None


def _numel(shape: tuple[int, ...] | None) -> int:
    return math.prod(max(int(d), 0) for d in shape) if shape else 0


def node_macs(node: Node, graph: DataflowGraph) -> int:
    """Multiply-accumulates any implementation of ``node`` performs (direct form)."""
    op = node.op_type
    if op in ("Conv", "ConvTranspose") and len(node.inputs) > 1:
        w = _shape(graph, node.inputs[1])
        if not w:
            return 0
        per = _numel(w[1:])  # per output (Conv) / per input (ConvTranspose) element
        side = node.outputs[0] if op == "Conv" else node.inputs[0]
        return _numel(_shape(graph, side)) * per
    if op in ("MatMul", "Gemm") and len(node.inputs) > 1:
        a = _shape(graph, node.inputs[0])
        if not a:
            return 0
        k = a[0] if op == "Gemm" and node.attrs.get("transA", 0) else a[-1]
        return _numel(_shape(graph, node.outputs[0])) * int(k)
    return 0


def npu_macs_per_s(target: Target) -> float | None:
    """MACs per second of the target's NPU at full utilisation (None when unknown)."""
    accel = str(target.option("accelerator_config", target.name))
    try:
        macs = int(accel.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return None
    system = str(target.option("system_config", None)
                 or VELA_DEFAULTS[accelerator_family(accel)][0])
    clock = vela_ini_sections()[2].get(system)
    return macs * clock if clock else None


def embedded_bound_s(candidate: CandidatePartition) -> float | None:
    """A lower bound of the candidate's Vela or host-model cost in seconds (module docstring);
    None for other toolchains or an unknown configuration."""
    t = candidate.target
    if t.toolchain not in ("vela", "cortex-m"):
        return None
    g = candidate.sub_graph.graph
    macs = sum(node_macs(n, g) for n in candidate.sub_graph.nodes)
    if t.toolchain == "vela":
        rate = npu_macs_per_s(t)
        return None if rate is None else macs / rate
    try:
        host = host_model(str(t.option("core", "cortex-m55")))
    except ValueError:
        return None
    cheapest = min(k.cycles_per_mac for k in (*host.int8.values(), *host.fp32.values(),
                                              host.int8_default, host.fp32_default)
                   if k.cycles_per_mac > 0)
    cycles = macs * cheapest + (host.cycles_per_op if macs else 0.0)
    return host.seconds(cycles)

