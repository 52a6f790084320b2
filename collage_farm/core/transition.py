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
* ``cut_s(target)``: once per partition fed by another partition, a property of the *model*
  and the target: measured per campaign by `collage_farm.probes.cutcost` (each chunk of the model
  inside chains where its neighbours run on other toolchains vs on its own), `WithCutCosts`.

`AnalyticTransitionModel` is a documented default (fixed latencies, bandwidths per device pair).
`measured_transition_model` fills the same interface from the cost table's transition rows
(`runners.transitions` measures them: the boundary excess of chained identity partitions per
toolchain, copies per device pair), measuring what is missing when the campaign can measure;
the analytic or configured model answers what no row covers.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collage_farm.core.target import Target, VirtualDevice


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

    def cut_s(self, target: Target) -> float:
        """Cost of entering a partition on ``target`` from another partition of *this model*
        (once per partition fed by another one; graph inputs are not cuts): what a cut costs
        beyond its candidates' own measurements, e.g. caches and layouts the previous
        toolchain left. 0 unless measured for the model (`collage_farm.probes.cutcost`)."""
        return 0.0


@dataclass(frozen=True)
class WithCutCosts(TransitionModel):
    """``base`` plus measured per-target cut costs for one model (`collage_farm.probes.cutcost`)."""

    base: TransitionModel
    cuts: Mapping[str, float]  # target id -> seconds per cut into a partition on it

    @property
    def label(self) -> str:  # type: ignore[override]
        return f"{self.base.label}+cuts"

    def launch_s(self, target: Target) -> float:
        return self.base.launch_s(target)

    def handoff_s(self, target: Target, nbytes: int) -> float:
        return self.base.handoff_s(target, nbytes)

    def transfer_s(self, src: VirtualDevice, dst: VirtualDevice, nbytes: int) -> float:
        return self.base.transfer_s(src, dst, nbytes)

    def cut_s(self, target: Target) -> float:
        return max(0.0, float(self.cuts.get(target.id, 0.0))) + self.base.cut_s(target)


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


# ----------------------------------------------------------------------------------------
# measured transition models from cost-table rows (runners.transitions writes them)


def transition_samples(rows: Iterable[Any], mode: str | None = None,
                       device: str | None = None) -> list[Any]:
    """`collage_farm.config.TransitionSample` list from cost-table transition rows.

    ``rows``: `CostRow` objects (any fingerprints; non-transition and failed rows are skipped).
    ``mode``: only ``iso`` rows measured in this measurement mode (the boundary excess is
    relative to how candidates were measured); ``device``: only rows of this device
    description (None: any device, the newest row wins: offline reuse on another machine).
    Launch rows (call floors) give no sample: every candidate's cost already contains one call.
    """
    from collage_farm.config import TransitionSample
    from runners.base import canonical_mode
    from runners.transitions import parse_fingerprint

    newest: dict[tuple, Any] = {}
    for r in rows:
        info = parse_fingerprint(str(r.fingerprint))
        if info is None or not r.ok or (device is not None and r.device != device):
            continue
        if mode is not None and info["kind"] == "iso":
            try:
                if r.config.measure_mode != canonical_mode(mode):
                    continue
            except ValueError:
                continue
        key = tuple(sorted(info.items()))
        old = newest.get(key)
        if old is None or r.created_at > old.created_at:
            newest[key] = r
    iso: dict[tuple[str, str, int], float] = {}
    pipe: dict[tuple[str, str, int], float] = {}
    out = []
    for key, r in newest.items():
        info = dict(key)
        if info["kind"] == "copy":
            out.append(TransitionSample("transfer", float(r.seconds), nbytes=info["nbytes"],
                                        src=info["src"], dst=info["dst"]))
        elif info["kind"] in ("iso", "pipe"):
            k = (info["toolchain"], info["device"].split(":")[0], info["nbytes"])
            (iso if info["kind"] == "iso" else pipe)[k] = float(r.seconds)
    for k in sorted(set(iso) & set(pipe)):
        tc, dev_kind, nb = k
        out.append(TransitionSample("handoff", pipe[k] - 2.0 * iso[k], nbytes=nb,
                                    toolchain=tc, device_kind=dev_kind))
    return out


def _transition_rows(table: Any) -> list[Any]:
    import pyarrow.compute as pc

    return table.rows(pc.starts_with(pc.field("fingerprint"), "transition:"))


def _scale_of(model: TransitionModel) -> tuple[TransitionModel, float]:
    """(model without its what-if scale, the scale): measured costs get the same what-if."""
    import dataclasses

    from collage_farm.config import ScaledTransitionModel

    if isinstance(model, ScaledTransitionModel):
        base, f = _scale_of(model.base)
        return base, f * model.factor
    if isinstance(model, AnalyticTransitionModel) and model.scale != 1.0:
        return dataclasses.replace(model, scale=1.0), model.scale
    return model, 1.0


def measured_transition_model(
    table: Any,
    targets: Sequence[Target],
    *,
    measure: bool = False,
    config: Any = None,
    fallback: TransitionModel | None = None,
    host: VirtualDevice | None = None,
    campaign_id: str = "",
    sizes: Sequence[int] | None = None,
) -> TransitionModel:
    """The transition model of a campaign: measured rows where they exist, ``fallback`` else.

    ``table``: a cost-table directory or `CostTable`. With ``measure`` (a campaign that can
    measure: the farm estimator), toolchains of ``targets`` that lack rows for this machine and
    ``config``'s mode are measured here (`runners.transitions`, in this process: the embedded
    farm's host) and the rows written to the table; copies between the targets' devices and
    the host are measured where this machine has both. Without ``measure`` (offline) the rows
    of any machine are used, newest first. ``fallback`` (the configured or analytic model)
    answers what no row covers; a what-if scale on it applies to the measured model too.
    ``sizes``: hand-off probe sizes in bytes (default `runners.transitions.HANDOFF_SIZES`).
    Returns ``fallback`` unchanged when there are no usable rows.
    """
    from collage_farm.config import MeasuredTransitionModel, scale_transitions
    from collage_farm.costtable import CostTable, CostTableWriter, row_from_result
    from runners.base import MeasureConfig

    config = config or MeasureConfig()
    base, factor = _scale_of(fallback or AnalyticTransitionModel())
    tab = table if isinstance(table, CostTable) else CostTable(table)
    device: str | None = None
    if measure:
        from runners.base import DeviceDescription
        from runners.transitions import (
            PROBED_TOOLCHAINS,
            measure_copies,
            measure_toolchain_transitions,
        )

        device = DeviceDescription.host_cpu().describe()
        have = transition_samples(_transition_rows(tab), config.measure_mode, device)
        have_tc = {(s.toolchain, s.device_kind) for s in have if s.kind == "handoff"}
        todo = {}
        for t in targets:
            if (t.toolchain in PROBED_TOOLCHAINS and t.device.kind == "cpu"
                    and (t.toolchain, t.device.kind) not in have_tc):
                todo.setdefault((t.toolchain, t.device.label), t)
        hostdev = host or VirtualDevice("cpu", 0)
        have_copy = {(s.src, s.dst) for s in have if s.kind == "transfer"}
        pairs = []
        for t in targets:
            for a, b in ((hostdev, t.device), (t.device, hostdev)):
                if not a.same_memory(b) and (a.label, b.label) not in have_copy:
                    pairs.append((a, b))
        pairs = list(dict.fromkeys(pairs))
        kw = {} if sizes is None else {"sizes": tuple(sizes)}
        if todo or pairs:
            with CostTableWriter(tab.path, campaign_id=campaign_id) as w:
                for t in todo.values():
                    for res in measure_toolchain_transitions(t, config, **kw):
                        w.append(row_from_result(res, campaign_id=campaign_id,
                                                 model="transitions", nodes=[],
                                                 op_types=["Identity"]))
                for res in measure_copies(pairs, config, **kw):
                    w.append(row_from_result(res, campaign_id=campaign_id, model="transitions",
                                             nodes=[], op_types=["copy"]))
    rows = _transition_rows(tab)
    samples = transition_samples(rows, config.measure_mode, device)
    if not samples and device is not None:  # measured nothing usable here: any machine's rows
        samples = transition_samples(rows, config.measure_mode, None)
    if not samples:
        return fallback or base
    host_dev = host if host is not None else getattr(base, "host", None)
    model: TransitionModel = MeasuredTransitionModel.from_samples(samples, base, host_dev)
    return scale_transitions(model, factor) if factor != 1.0 else model
