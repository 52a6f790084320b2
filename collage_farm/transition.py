"""Transition penalties: what it costs to cross a partition boundary.

Costs measured per candidate do not add up to a plan's latency: each partition pays a launch
(session call) overhead, each tensor crossing a boundary pays a hand-off (output copy, layout
reorder), and a tensor moving between devices pays a transfer (host<->GPU, CPU<->NPU). The
search charges these on its edges, so the Dijkstra plan already accounts for them:

* ``launch_s(target)``: once per partition;
* ``handoff_s(target, nbytes)``: per tensor entering or leaving a partition (graph inputs and
  outputs included), a property of the target alone;
* ``transfer_s(src, dst, nbytes)``: per tensor between two partitions on devices that do not
  share memory; the search knows both ends because its states remember the device of every
  covered node that borders uncovered ones.

`AnalyticTransitionModel` is a documented default (fixed latencies, bandwidths per device pair).
Measured models (issue 5) fill the same interface from a cost table.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field

from collage_farm.target import Target, VirtualDevice


class TransitionModel(abc.ABC):
    """Boundary costs in seconds; all non-negative (the search relies on it)."""

    label: str = "transition"

    @abc.abstractmethod
    def launch_s(self, target: Target) -> float:
        """Per-partition fixed cost of running one partition on ``target``."""

    @abc.abstractmethod
    def handoff_s(self, target: Target, nbytes: int) -> float:
        """Cost of one tensor of ``nbytes`` crossing into or out of a partition on ``target``."""

    @abc.abstractmethod
    def transfer_s(self, src: VirtualDevice, dst: VirtualDevice, nbytes: int) -> float:
        """Cost of moving ``nbytes`` from ``src`` to ``dst`` (0 when they share memory)."""


@dataclass(frozen=True)
class Link:
    """A copy cost model: fixed latency plus bytes over bandwidth."""

    latency_s: float
    bytes_per_s: float

    def cost(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bytes_per_s


# Defaults, stated so they can be checked: PCIe 4 x16 host<->GPU ~12 GB/s effective with
# ~10 us per cudaMemcpy call; an Ethos-U shares the SoC's SRAM/DRAM with its Cortex-M host (an
# AXI copy at ~1 GB/s, a few us of driver setup); ORT/OpenVINO session launch ~5-15 us per call.
DEFAULT_LINKS: dict[tuple[str, str], Link] = {
    ("cpu", "cuda"): Link(10e-6, 12e9),
    ("cuda", "cpu"): Link(10e-6, 12e9),
    ("cuda", "cuda"): Link(8e-6, 50e9),
    ("cpu", "ethos-u"): Link(5e-6, 1e9),
    ("ethos-u", "cpu"): Link(5e-6, 1e9),
}
DEFAULT_LAUNCH_S: dict[str, float] = {
    "ort-cpu": 8e-6,
    "openvino": 12e-6,
    "litert": 6e-6,
    "ort-cuda": 20e-6,
    "ort-tensorrt": 25e-6,
    "vela": 10e-6,
    "null": 5e-6,
}
# per-byte handoff: one extra read+write of the tensor at ~10 GB/s on a CPU
DEFAULT_HANDOFF_BYTES_PER_S = 10e9


@dataclass(frozen=True)
class AnalyticTransitionModel(TransitionModel):
    """Fixed numbers (documented above); ``scale`` multiplies every penalty (for what-ifs)."""

    links: Mapping[tuple[str, str], Link] = field(default_factory=lambda: dict(DEFAULT_LINKS))
    launch: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_LAUNCH_S))
    handoff_bytes_per_s: float = DEFAULT_HANDOFF_BYTES_PER_S
    scale: float = 1.0
    label: str = "analytic"

    def launch_s(self, target: Target) -> float:
        return self.scale * self.launch.get(target.toolchain, 10e-6)

    def handoff_s(self, target: Target, nbytes: int) -> float:
        return self.scale * nbytes / self.handoff_bytes_per_s

    def transfer_s(self, src: VirtualDevice, dst: VirtualDevice, nbytes: int) -> float:
        if src.same_memory(dst):
            return 0.0
        link = self.links.get((src.kind, dst.kind))
        if link is None:  # unknown pair: go through the host twice
            link = Link(20e-6, 5e9)
        return self.scale * link.cost(nbytes)


@dataclass(frozen=True)
class ZeroTransitionModel(TransitionModel):
    """No penalties: only for tests that compare against brute force on raw costs."""

    label: str = "zero"

    def launch_s(self, target: Target) -> float:
        return 0.0

    def handoff_s(self, target: Target, nbytes: int) -> float:
        return 0.0

    def transfer_s(self, src: VirtualDevice, dst: VirtualDevice, nbytes: int) -> float:
        return 0.0
