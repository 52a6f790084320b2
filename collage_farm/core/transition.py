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
  covered node that borders uncovered ones;
* ``cut_s(target, nbytes)``: once per partition fed by another partition, ``nbytes`` the
  bytes of the tensors entering it from other partitions, a property of the *model* and the
  target: measured per campaign by `collage_farm.probes.cutcost` (each chunk of the model
  inside chains where its neighbours run on other toolchains vs on its own, a
  `collage_farm.core.cutcharge.CutCharge` line in the bytes), `WithCutCosts`;
* ``requantise_s(target, elements)``: per tensor between two partitions, on the side of a
  target that computes in another precision than its neighbours (a 16x8 NPU partition among
  int8 ones on an Ethos-U board), `WithRequantise`.

`AnalyticTransitionModel` is a documented default (fixed latencies, bandwidths per device pair);
`ConfiguredTransitionModel` adds the per device-pair links and the host of a system file
(`collage_farm.config` builds it). `MeasuredTransitionModel` fits the same interface from
measured `TransitionSample`s (`collage_farm.probes.transitions` reads them from the cost table's
transition rows, which `runners.transitions` measures: the boundary excess of chained identity
partitions per toolchain, copies per device pair); its ``fallback`` (the analytic or configured
model) answers what no sample covers. `scale_transitions` multiplies every penalty (what-ifs).
"""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from collage_farm.core.cutcharge import CutCharge
from collage_farm.core.target import CPU0, Target, VirtualDevice

__all__ = [
    "DEFAULT_HANDOFF_BYTES_PER_S",
    "DEFAULT_LAUNCH_S",
    "DEFAULT_LINKS",
    "AnalyticTransitionModel",
    "CallsIncluded",
    "ConfiguredTransitionModel",
    "LayeredTransitionModel",
    "Link",
    "MeasuredTransitionModel",
    "Requantise",
    "ScaledTransitionModel",
    "TransitionModel",
    "TransitionSample",
    "WithCutCosts",
    "WithRequantise",
    "ZeroTransitionModel",
    "rebased",
    "scale_transitions",
    "split_scale",
]


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

    def cut_s(self, target: Target, nbytes: int | None = None) -> float:
        """Cost of entering a partition on ``target`` from another partition of *this model*
        (once per partition fed by another one; graph inputs are not cuts): what a cut costs
        beyond its candidates' own measurements, e.g. caches and layouts the previous
        toolchain left. ``nbytes``: the bytes of the tensors entering the partition from
        other partitions (None: not known; a per-target figure independent of size).
        0 unless measured for the model (`collage_farm.probes.cutcost`)."""
        return 0.0

    def requantise_s(self, target: Target, elements: int) -> float:
        """Cost of converting one tensor of ``elements`` that crosses between a partition on
        ``target`` and another partition of the plan (graph inputs and outputs are not
        crossings) from or to the precision the board's partitions exchange; charged on the
        ``target`` side of the crossing. 0 unless ``target`` computes in another precision
        than its neighbours (`WithRequantise`)."""
        return 0.0


@dataclass(frozen=True)
class Requantise:
    """One tensor's requantisation: a fixed cost (the operator's dispatch) plus a cost per
    element, in seconds."""

    fixed_s: float
    per_element_s: float

    def cost(self, elements: int) -> float:
        return max(0.0, self.fixed_s) + max(0.0, self.per_element_s) * max(0, int(elements))


@dataclass(frozen=True)
class LayeredTransitionModel(TransitionModel):
    """A model that adds one charge to ``base``: every penalty it does not override is
    ``base``'s (`WithRequantise`, `WithCutCosts`)."""

    base: TransitionModel

    def launch_s(self, target: Target) -> float:
        return self.base.launch_s(target)

    def handoff_s(self, target: Target, nbytes: int) -> float:
        return self.base.handoff_s(target, nbytes)

    def transfer_s(self, src: VirtualDevice, dst: VirtualDevice, nbytes: int) -> float:
        return self.base.transfer_s(src, dst, nbytes)

    def cut_s(self, target: Target, nbytes: int | None = None) -> float:
        return self.base.cut_s(target, nbytes)

    def requantise_s(self, target: Target, elements: int) -> float:
        return self.base.requantise_s(target, elements)


@dataclass(frozen=True)
class WithRequantise(LayeredTransitionModel):
    """``base`` plus a requantisation of every tensor crossing between a partition on one of
    ``charges``' targets (by id) and another partition: on an Ethos-U board whose partitions
    exchange int8 tensors, a 16x8 partition's (NPU or host) inputs from and outputs to them
    pass an int8 <-> int16 QUANTIZE on the host. Charged per target, not per pair: two adjacent
    partitions on such targets (which could exchange int16 directly) are charged too, a
    deliberate over-charge of a split the search has no reason to make."""

    charges: Mapping[str, Requantise] = field(default_factory=dict)

    @property
    def label(self) -> str:  # type: ignore[override]
        return f"{self.base.label}+requantise"

    def requantise_s(self, target: Target, elements: int) -> float:
        own = self.charges.get(target.id)
        return ((own.cost(elements) if own is not None else 0.0)
                + self.base.requantise_s(target, elements))


@dataclass(frozen=True)
class WithCutCosts(LayeredTransitionModel):
    """``base`` plus measured per-target cut costs for one model (`collage_farm.probes.cutcost`).

    A cut of known size into a target with a fitted ``charges`` line is charged by its bytes;
    otherwise (no bytes given, or a probe read back from rows that predate the fit) the
    target's one figure in ``cuts``."""

    #: target id -> seconds per cut into a partition on it
    cuts: Mapping[str, float] = field(default_factory=dict)
    #: target id -> seconds per cut by the bytes entering the partition
    charges: Mapping[str, CutCharge] = field(default_factory=dict)

    @property
    def label(self) -> str:  # type: ignore[override]
        return f"{self.base.label}+cuts"

    def cut_s(self, target: Target, nbytes: int | None = None) -> float:
        fit = self.charges.get(target.id)
        own = (fit.cost(nbytes) if fit is not None and nbytes is not None
               else max(0.0, float(self.cuts.get(target.id, 0.0))))
        return own + self.base.cut_s(target, nbytes)


@dataclass(frozen=True)
class CallsIncluded(LayeredTransitionModel):
    """``base`` without launch or hand-off charges on ``targets`` (by id).

    For targets whose candidate costs are shares of one in-network run of the whole model,
    timed by the plan executor (profile mode, `estimators.profiled`): the shares of a whole
    model add up to that run, which already made the partition's call and handed its graph
    inputs and outputs over, and a partition fed by another one pays the target's measured
    same-toolchain cut cost, which is the difference between a chain of such partitions and
    the whole model: one more call and the hand-offs of the tensors crossing the cut. Charging
    ``base``'s launch and hand-offs on top would count them twice (a one-partition plan of a
    40 us model was estimated 6 us, 16%, above the whole-model time it is made of). Transfers
    between devices, cut charges by bytes and requantisation stay ``base``'s."""

    targets: frozenset[str] = frozenset()

    @property
    def label(self) -> str:  # type: ignore[override]
        return f"{self.base.label}-calls"

    def launch_s(self, target: Target) -> float:
        return 0.0 if target.id in self.targets else self.base.launch_s(target)

    def handoff_s(self, target: Target, nbytes: int) -> float:
        return 0.0 if target.id in self.targets else self.base.handoff_s(target, nbytes)


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
    # an Ethos-U board's host operators run inside the one TFLM interpreter that also invokes
    # the NPU: a host partition makes no call of its own (per-operator overhead is in the
    # host's cycle model, runners.host_model)
    "cortex-m": 0.0,
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


# ----------------------------------------------------------------------------------------
# a system file's links, what-if scaling, and models fitted from measured samples


@dataclass(frozen=True)
class ConfiguredTransitionModel(AnalyticTransitionModel):
    """`AnalyticTransitionModel` plus per device-pair links and a host device from a system file.

    ``device_links`` is keyed by device labels (``("cuda:0", "cuda:1")``); pairs not listed fall
    back to the per-kind defaults. The search places graph inputs and outputs on ``cpu:0``;
    ``host`` says which declared device that is (an MCU host is ``cpu:0/mcu``).
    """

    device_links: Mapping[tuple[str, str], Link] = field(default_factory=dict)
    host: VirtualDevice | None = None
    label: str = "analytic+config"

    def _canon(self, dev: VirtualDevice) -> VirtualDevice:
        return self.host if self.host is not None and dev == CPU0 else dev

    def link(self, src: VirtualDevice, dst: VirtualDevice) -> Link | None:
        """The link used between two devices (None when they share memory)."""
        src, dst = self._canon(src), self._canon(dst)
        if src.same_memory(dst):
            return None
        got = self.device_links.get((src.label, dst.label))
        if got is None:
            got = self.links.get((src.kind, dst.kind), Link(20e-6, 5e9))
        return got

    def transfer_s(self, src: VirtualDevice, dst: VirtualDevice, nbytes: int) -> float:
        link = self.link(src, dst)
        return 0.0 if link is None else self.scale * link.cost(nbytes)


@dataclass(frozen=True)
class ScaledTransitionModel(TransitionModel):
    """Any transition model with every penalty multiplied by ``factor`` (what-if studies)."""

    base: TransitionModel
    factor: float

    @property
    def label(self) -> str:  # type: ignore[override]
        return f"{self.base.label}x{self.factor:g}"

    def launch_s(self, target: Target) -> float:
        return self.factor * self.base.launch_s(target)

    def handoff_s(self, target: Target, nbytes: int) -> float:
        return self.factor * self.base.handoff_s(target, nbytes)

    def transfer_s(self, src: VirtualDevice, dst: VirtualDevice, nbytes: int) -> float:
        return self.factor * self.base.transfer_s(src, dst, nbytes)

    def cut_s(self, target: Target, nbytes: int | None = None) -> float:
        return self.factor * self.base.cut_s(target, nbytes)

    def requantise_s(self, target: Target, elements: int) -> float:
        return self.factor * self.base.requantise_s(target, elements)


def rebased(model: TransitionModel, base: TransitionModel) -> TransitionModel:
    """``model``'s layers (`LayeredTransitionModel`s, outermost first) over ``base`` in place
    of the model under them: the charges a campaign layered on its transitions (cut costs,
    requantisation, calls included) kept when its measured transitions come later."""
    if isinstance(model, LayeredTransitionModel):
        return dataclasses.replace(model, base=rebased(model.base, base))
    return base


def scale_transitions(model: TransitionModel, factor: float) -> TransitionModel:
    """``model`` with every penalty multiplied by ``factor`` (>= 0)."""
    if not (factor >= 0 and math.isfinite(factor)):
        raise ValueError(f"transition scale must be a finite number >= 0, got {factor!r}")
    if isinstance(model, AnalyticTransitionModel):
        return dataclasses.replace(model, scale=model.scale * factor)
    if isinstance(model, ScaledTransitionModel):
        return ScaledTransitionModel(model.base, model.factor * factor)
    return ScaledTransitionModel(model, factor)


def split_scale(model: TransitionModel) -> tuple[TransitionModel, float]:
    """(``model`` without its what-if scale, the scale), so that a model built in front of it
    (measured costs) can be given the same what-if with `scale_transitions`."""
    if isinstance(model, ScaledTransitionModel):
        base, f = split_scale(model.base)
        return base, f * model.factor
    if isinstance(model, AnalyticTransitionModel) and model.scale != 1.0:
        return dataclasses.replace(model, scale=1.0), model.scale
    return model, 1.0


@dataclass(frozen=True)
class TransitionSample:
    """One measured transition fact, as read from the cost table's transition rows.

    * ``kind="transfer"``: median seconds to copy ``nbytes`` from device ``src`` to ``dst``
      (labels such as ``cpu:0``, ``cuda:1``), timed with the device's own copy API;
    * ``kind="launch"``: a per-partition fixed cost to charge on ``toolchain`` (``device_kind``
      device), e.g. from a datasheet or a driver trace;
    * ``kind="handoff"``: the measured boundary excess on ``toolchain`` at ``nbytes``: two
      identity partitions chained, minus twice one alone (`runners.transitions` measures it,
      `collage_farm.probes.transitions` reads it back): what a chain
      of partitions costs beyond the sum of its parts. May be negative (noise, or a mode whose
      isolated runs are pessimistic); the fit clamps what it charges at zero.
    """

    kind: str
    seconds: float
    nbytes: int = 0
    src: str = ""
    dst: str = ""
    toolchain: str = ""
    device_kind: str = ""


@dataclass(frozen=True)
class MeasuredTransitionModel(TransitionModel):
    """Transition costs fitted from measured rows; ``fallback`` answers what was not measured.

    Transfers: per (src, dst) label pair, latency + bytes / bandwidth fitted by least squares
    over the measured sizes (one size only: all of it is charged as bandwidth). Launches: the
    median per (toolchain, device kind). Hand-off excess (``handoff`` samples) per (toolchain,
    device kind): ``fixed + per_byte x nbytes`` by least squares; the fixed part becomes the
    launch penalty (one more partition is one more call) unless a ``launch`` sample says
    otherwise, and the per-byte part is split between the two sides of a boundary tensor (the
    search charges a hand-off when it leaves one partition and when it enters the next). Both
    are clamped at zero (the search needs non-negative penalties). Hand-offs of toolchains
    without samples come from ``fallback``.
    """

    fallback: TransitionModel
    links: Mapping[tuple[str, str], Link] = field(default_factory=dict)
    launches: Mapping[tuple[str, str], float] = field(default_factory=dict)
    host: VirtualDevice | None = None
    label: str = "measured"
    #: (toolchain, device kind) -> (fixed seconds, seconds per byte) of the boundary excess
    handoffs: Mapping[tuple[str, str], tuple[float, float]] = field(default_factory=dict)

    @staticmethod
    def from_samples(samples: Iterable[TransitionSample], fallback: TransitionModel,
                     host: VirtualDevice | None = None) -> MeasuredTransitionModel:
        pts: dict[tuple[str, str], list[tuple[int, float]]] = {}
        lau: dict[tuple[str, str], list[float]] = {}
        exc: dict[tuple[str, str], list[tuple[int, float]]] = {}
        for s in samples:
            if not math.isfinite(s.seconds):
                continue
            if s.kind == "handoff":
                exc.setdefault((s.toolchain, s.device_kind), []).append((s.nbytes, s.seconds))
                continue
            if s.seconds < 0:
                continue
            if s.kind == "transfer":
                pts.setdefault((s.src, s.dst), []).append((s.nbytes, s.seconds))
            elif s.kind == "launch":
                lau.setdefault((s.toolchain, s.device_kind), []).append(s.seconds)
            else:
                raise ValueError(f"unknown transition sample kind {s.kind!r} "
                                 "(transfer, launch, handoff)")
        links = {pair: _fit_link(p) for pair, p in pts.items()}
        launches = {k: sorted(v)[len(v) // 2] for k, v in lau.items()}
        handoffs = {k: _fit_line(p) for k, p in exc.items()}
        for k, (fixed, _per_byte) in handoffs.items():
            launches.setdefault(k, max(0.0, fixed))
        return MeasuredTransitionModel(fallback, links, launches, host, handoffs=handoffs)

    def launch_s(self, target: Target) -> float:
        got = self.launches.get((target.toolchain, target.device.kind))
        return self.fallback.launch_s(target) if got is None else got

    def handoff_s(self, target: Target, nbytes: int) -> float:
        got = self.handoffs.get((target.toolchain, target.device.kind))
        if got is None:
            return self.fallback.handoff_s(target, nbytes)
        return max(0.0, got[1]) * nbytes / 2.0

    def transfer_s(self, src: VirtualDevice, dst: VirtualDevice, nbytes: int) -> float:
        if self.host is not None:
            src = self.host if src == CPU0 else src
            dst = self.host if dst == CPU0 else dst
        if src.same_memory(dst):
            return 0.0
        link = self.links.get((src.label, dst.label))
        return self.fallback.transfer_s(src, dst, nbytes) if link is None else link.cost(nbytes)

    def cut_s(self, target: Target, nbytes: int | None = None) -> float:
        return self.fallback.cut_s(target, nbytes)

    def requantise_s(self, target: Target, elements: int) -> float:
        return self.fallback.requantise_s(target, elements)


def _fit_line(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of seconds over bytes; one size: (median, 0)."""
    xs = [float(b) for b, _ in points]
    ys = [s for _, s in points]
    n = len(points)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return sorted(ys)[n // 2], 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return my - slope * mx, slope


def _fit_link(points: Sequence[tuple[int, float]]) -> Link:
    xs = [float(b) for b, _ in points]
    ys = [s for _, s in points]
    n = len(points)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx > 0:
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
        if slope > 0:
            return Link(max(0.0, my - slope * mx), 1.0 / slope)
    # one size (or no growth with size): charge it all per byte, never below the measurement
    b = max(mx, 1.0)
    return Link(0.0, b / my) if my > 0 else Link(0.0, math.inf)
