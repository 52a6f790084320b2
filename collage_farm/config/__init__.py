"""Targets as composable configuration: a *system* file merged with an *app* file.

Why two files. Following the CompilationConfig discussion in TVM, what a deployment looks like
is written by two different people. A hardware vendor or cluster owner knows the devices (an
Ethos-U55-128 NPU next to a Cortex-M55; one CPU and two GPUs), which toolchains are installed on
each, and what it costs to move a tensor between them: that is the **system** file, written once
per machine. The user knows which of those targets to search, which toolchain options to try
(``fp16`` for TensorRT), which nodes must stay where (pins) and how large candidates may grow:
that is the **app** file, one per experiment. Keeping them apart lets one app run unchanged on
several systems and lets a system file be checked once and shared. Both are plain YAML read with
``yaml.safe_load``; nothing in them can run code.

Following TVM RFC 0038, a target is a toolchain on a *virtual device* (kind, id, memory scope),
never a device alone: ORT-CPU and OpenVINO share one CPU device (no copy between them), two GPUs
are two devices (a copy between them), an MCU host is ``cpu:0/mcu``.

System file schema (every key optional unless marked)::

    schema: 1                         # format version; only 1 exists
    system: gpu2                      # name (default: file stem)
    description: "one CPU, two GPUs"
    devices:                          # required, at least one; keys are device names
      host:
        kind: cpu                     # required: cpu | cuda | ethos-u
        id: 0                         # default 0
        memory_scope: global          # default global; "mcu" for a microcontroller's memory
        host: true                    # graph inputs/outputs live here (default: first cpu)
        model: "x86-64 server CPU"    # free text
        description: "..."
        memory_mib: 131072            # > 0
        clock_mhz: 3000               # > 0
        targets:                      # the toolchains installed on this device
          ort-cpu: {toolchain: ort-cpu}
      gpu0:
        kind: cuda
        targets:
          ort-tensorrt: {toolchain: ort-tensorrt, options: {fp16: false}}
    toolchains:                       # per-toolchain settings on this system
      ort-tensorrt: {launch_us: 25, options: {fp16: false}}
    links:                            # measured or datasheet copy costs between two devices
      - {from: host, to: gpu0, latency_us: 10, gb_per_s: 12}   # symmetric unless the
                                                               # reverse is declared too
    transition: {handoff_gb_per_s: 10}
    subgraph: {max_depth: 4, max_exits: 2, allow_taps: false}

A device may be referred to (in ``links`` and in app pins) by its name (``gpu0``), its label
(``cuda:0``, ``cpu:0/mcu``) or, in pins only, its kind (``cuda``: any GPU). A declared name wins
over a kind of the same spelling (a device named ``cpu`` means that device).

App file schema::

    schema: 1
    app: trt-fp16-study               # name (default: file stem)
    description: "..."
    system: gpu                       # which system this app is for; loads that built-in
                                      # system when no system file is given
    targets: [ort-cpu, ort-tensorrt]  # the selection to search (default: all, or "all")
    options:                          # per-target option overrides
      ort-tensorrt: {fp16: true}
    variants:                         # new targets derived from system ones
      ort-tensorrt-fp16: {base: ort-tensorrt, options: {fp16: true}}
    pins:                             # see collage_farm.core.pins
      - {node: "attn_*", device: cuda:0}
      - {op: Softmax, target: ort-cpu}
      - {node: "head/*", device: gpu0, optional: true}
    subgraph: {max_depth: 6, max_exits: 2, allow_taps: false}
    transition: {scale: 2.0}          # what-if: every transition penalty x2

Merge rules (what makes the two layers compose predictably):

1. The system declares the world. An app cannot add devices, links or toolchains; every name it
   uses (targets, ``variants.*.base``, pin devices and targets) must be declared by the system,
   otherwise `ConfigError` lists the declared names.
2. Options are resolved in this order, later wins: the toolchain's built-in defaults
   (`TOOLCHAIN_OPTIONS`), the system's ``toolchains.<tc>.options``, the system target's
   ``options``, then the app's ``options.<target>`` (or ``variants.<v>.options``).
3. Options that are hardware facts are *locked* (Vela's ``accelerator_config`` and
   ``system_config``): an app may repeat the system's value, but a different value is a
   conflict, reported with the one allowed value. A U55-128 board cannot become a U55-256 from
   an app file.
4. ``subgraph`` keys set in the app override the system's; ``transition.scale`` is app-only.
5. An app's ``system:`` must equal the loaded system's name (conflict otherwise); a variant may
   not reuse a system target's name; two targets may not share a name; two devices may not
   share a label.
6. Unknown keys are errors, never ignored: a typo (``fp61``) must not silently measure the wrong
   thing. Every `ConfigError` names the file, the dotted key path and the allowed values.

Target identity. A target's id is its name. Options are *canonical*: toolchain defaults marked
explicit (TensorRT ``fp16: false``) are always present, defaults that the toolchain applies by
itself (Vela's default system config and memory mode for each accelerator) are dropped when a
file states them. So a target spelled out in full and the same target left at defaults have the
same `Target.measure_key`, and the built-in systems' targets equal
`collage_farm.core.target.BUILTIN_TARGETS` entries of the same name. Runners get the full set back
with `effective_options`.

Transition costs. The system's links and per-toolchain launch overheads feed a
`ConfiguredTransitionModel` (an `AnalyticTransitionModel` with per device-pair links), exposed as
`FarmConfig.transition`. Anything implementing `TransitionModel` can replace it
(`FarmConfig.with_transition`), in particular `MeasuredTransitionModel`, built from the rows
runners will measure (copy time per device pair and size, launch time of an identity sub-model
per toolchain), falling back to the configured model where nothing was measured.
"""

from __future__ import annotations

import configparser
import dataclasses
import importlib.util
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from collage_farm.core.target import (
    CPU0,
    ETHOS_U_CONFIGS,
    Target,
    UnknownTargetError,
    VirtualDevice,
)
from collage_farm.core.transition import (
    DEFAULT_HANDOFF_BYTES_PER_S,
    DEFAULT_LAUNCH_S,
    DEFAULT_LINKS,
    AnalyticTransitionModel,
    Link,
    TransitionModel,
)

if TYPE_CHECKING:
    from collage_farm.core.pins import Pin, PinSet
    from collage_farm.core.rules import RuleOptions

__all__ = [
    "TOOLCHAIN_OPTIONS",
    "ConfigError",
    "ConfigTargetError",
    "ConfiguredTransitionModel",
    "DeviceSpec",
    "FarmConfig",
    "LinkSpec",
    "MeasuredTransitionModel",
    "OptionSpec",
    "ScaledTransitionModel",
    "SubgraphLimits",
    "TransitionSample",
    "builtin_system_path",
    "builtin_systems",
    "effective_options",
    "load_config",
    "scale_transitions",
]

SCHEMA_VERSION = 1
DEVICE_KINDS = ("cpu", "cuda", "ethos-u")

SYSTEM_KEYS = ("schema", "system", "description", "devices", "toolchains", "links",
               "transition", "subgraph")
APP_KEYS = ("schema", "app", "description", "system", "targets", "options", "variants", "pins",
            "subgraph", "transition")
DEVICE_KEYS = ("kind", "id", "memory_scope", "host", "model", "description", "memory_mib",
               "clock_mhz", "targets")
TARGET_KEYS = ("toolchain", "options", "description")
TOOLCHAIN_KEYS = ("launch_us", "options")
LINK_KEYS = ("from", "to", "latency_us", "gb_per_s", "symmetric")
SUBGRAPH_KEYS = ("max_depth", "max_exits", "allow_taps")
PIN_KEYS = ("node", "op", "device", "target", "optional")
VARIANT_KEYS = ("base", "options", "description")


# ------------------------------------------------------------------------------------------
# errors


class ConfigError(ValueError):
    """A configuration that cannot be used; says where (file, dotted key) and what is allowed."""

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None,
                 allowed: Iterable[object] | None = None) -> None:
        self.reason = message
        self.file = file
        self.key = key
        self.allowed = None if allowed is None else tuple(allowed)
        where = ": ".join(x for x in (file, key) if x)
        text = f"{where}: {message}" if where else message
        if self.allowed is not None:
            text += f" (allowed: {', '.join(map(str, self.allowed)) or 'none'})"
        super().__init__(text)


class ConfigTargetError(ConfigError, UnknownTargetError):
    """A target name the configuration does not define (also an `UnknownTargetError`)."""


# ------------------------------------------------------------------------------------------
# toolchain option schemas


@dataclass(frozen=True)
class OptionSpec:
    """One toolchain option: type, allowed values, default and whether an app may change it.

    ``default`` may depend on the other options (Vela's default system config depends on the
    accelerator). ``explicit`` defaults are always written into `Target.options`; the others are
    applied by the toolchain itself, so they are dropped from the options when stated (same
    measurement either way, same measure key).
    """

    kind: str  # "bool" | "int" | "number" | "str"
    doc: str
    choices: tuple[object, ...] | Callable[[Mapping[str, object]], tuple[object, ...]] | None = None
    minimum: float | None = None
    default: object | Callable[[Mapping[str, object]], object] = None
    explicit: bool = False
    locked: bool = False
    required: bool = False

    def default_for(self, options: Mapping[str, object]) -> object:
        return self.default(options) if callable(self.default) else self.default

    def choices_for(self, options: Mapping[str, object]) -> tuple[object, ...] | None:
        return self.choices(options) if callable(self.choices) else self.choices


# Vela's section names as shipped with ethos-u-vela 5.2 (used when Vela is not installed here).
_VELA_SYSTEM_CONFIGS = (
    "Ethos_U55_Deep_Embedded", "Ethos_U55_High_End_Embedded", "Ethos_U65_Embedded",
    "Ethos_U65_Mid_End", "Ethos_U65_High_End", "Ethos_U65_Client_Server",
)
_VELA_MEMORY_MODES = (
    "Sram_Only", "Shared_Sram", "Dedicated_Sram", "Dedicated_Sram_256KB",
    "Dedicated_Sram_384KB", "Dedicated_Sram_512KB",
)
# What Vela itself picks when no --system-config / --memory-mode is given
# (ArchitectureFeatures._set_default_sys_config / _set_default_mem_mode in Vela 5.2).
VELA_DEFAULTS = {
    "u55": ("Ethos_U55_High_End_Embedded", "Shared_Sram"),
    "u65": ("Ethos_U65_Client_Server", "Dedicated_Sram_384KB"),
}


def vela_ini_path() -> Path | None:
    """The vela.ini shipped with the installed ethos-u-vela, without importing Vela."""
    try:
        spec = importlib.util.find_spec("ethosu")
    except (ImportError, ValueError):
        return None
    for loc in (spec.submodule_search_locations or []) if spec else []:
        p = Path(loc) / "config_files" / "Arm" / "vela.ini"
        if p.is_file():
            return p
    return None


@lru_cache(maxsize=1)
def vela_ini_sections() -> tuple[tuple[str, ...], tuple[str, ...], dict[str, float]]:
    """(system configs, memory modes, core clock per system config) from the installed vela.ini.

    Falls back to the names of Vela 5.2 when Vela is not installed (an offline laptop).
    """
    path = vela_ini_path()
    if path is None:
        return _VELA_SYSTEM_CONFIGS, _VELA_MEMORY_MODES, {}
    ini = configparser.ConfigParser()
    ini.read(path)
    systems, modes, clocks = [], [], {}
    for sec in ini.sections():
        kind, _, name = sec.partition(".")
        if kind == "System_Config":
            systems.append(name)
            if ini.has_option(sec, "core_clock"):
                clocks[name] = float(ini.get(sec, "core_clock"))
        elif kind == "Memory_Mode":
            modes.append(name)
    return tuple(systems), tuple(modes), clocks


def _vela_family(options: Mapping[str, object]) -> str:
    acc = str(options.get("accelerator_config", ""))
    return "u65" if acc.startswith("ethos-u65") else "u55"


def _vela_system_configs(options: Mapping[str, object]) -> tuple[object, ...]:
    prefix = "Ethos_U65_" if _vela_family(options) == "u65" else "Ethos_U55_"
    return tuple(s for s in vela_ini_sections()[0] if s.startswith(prefix))


def _vela_memory_modes(options: Mapping[str, object]) -> tuple[object, ...]:
    return vela_ini_sections()[1]


# Option names are the ones the runners read (runners/cpu.py, runners/cuda.py, runners/null.py);
# defaults are the runners' own, so they are implicit (dropped when stated) except TensorRT's
# fp16, which the built-in catalogue states explicitly.
_ORT_COMMON = {
    "threads": OptionSpec("int", "intra-op threads of the session", minimum=1, default=1),
    "iobinding": OptionSpec("bool", "time run_with_iobinding (true) or plain run()",
                            default=True),
}
_ORT_CUDA = {
    **_ORT_COMMON,
    "cudnn_conv_algo_search": OptionSpec("str", "ORT CUDA EP convolution algorithm search",
                                         choices=("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
                                         default="EXHAUSTIVE"),
    "tf32": OptionSpec("bool", "TF32 math for fp32 convolutions and matrix products on Ampere "
                       "and later (CUDA EP use_tf32; false: strict fp32)", default=True),
}
TOOLCHAIN_OPTIONS: dict[str, dict[str, OptionSpec]] = {
    "ort-cpu": dict(_ORT_COMMON),
    "openvino": {
        "threads": OptionSpec("int", "INFERENCE_NUM_THREADS", minimum=1, default=1),
        "precision": OptionSpec("str", "INFERENCE_PRECISION_HINT", choices=("f32", "bf16", "f16"),
                                default="f32"),
    },
    "litert": {
        "threads": OptionSpec("int", "interpreter threads", minimum=1, default=1),
    },
    "ort-cuda": dict(_ORT_CUDA),
    "ort-tensorrt": {
        **_ORT_CUDA,
        "fp16": OptionSpec("bool", "TensorRT FP16 kernels (trt_fp16_enable)", default=False,
                           explicit=True),
        "max_workspace_bytes": OptionSpec("int", "trt_max_workspace_size", minimum=1),
    },
    "vela": {
        "accelerator_config": OptionSpec("str", "Vela --accelerator-config (the NPU itself)",
                                         choices=ETHOS_U_CONFIGS, locked=True, required=True),
        "system_config": OptionSpec(
            "str", "Vela --system-config: a System_Config section of vela.ini (the board)",
            choices=_vela_system_configs, locked=True,
            default=lambda o: VELA_DEFAULTS[_vela_family(o)][0]),
        "memory_mode": OptionSpec(
            "str", "Vela --memory-mode: a Memory_Mode section of vela.ini",
            choices=_vela_memory_modes, default=lambda o: VELA_DEFAULTS[_vela_family(o)][1]),
        "optimise": OptionSpec("str", "Vela --optimise", choices=("Performance", "Size"),
                               default="Performance"),
    },
    "null": {
        "speed": OptionSpec("number", "divides every fake cost", minimum=0, default=1.0),
        "sleep_s": OptionSpec("number", "sleep per measure (load tests)", minimum=0,
                              default=0.0),
        "fail_on": OptionSpec("str", "fault injection: fingerprint/label substring or '*'"),
        "crash_on": OptionSpec("str", "fault injection: fingerprint/label substring or '*'"),
        "hang_on": OptionSpec("str", "fault injection: fingerprint/label substring or '*'"),
        "leak_on": OptionSpec("str", "fault injection: fingerprint/label substring or '*'"),
        "leak_max_mb": OptionSpec("number", "where leak_on stops growing (then hangs)",
                                  minimum=0, default=4096.0),
        "crash_mode": OptionSpec("str", "how crash_on dies", choices=("abort", "segv", "exit"),
                                 default="abort"),
        "fault_phase": OptionSpec("str", "where faults fire",
                                  choices=("build", "measure", "both"), default="both"),
    },
}


def effective_options(target: Target) -> dict[str, object]:
    """A target's options with every default filled in (what a runner passes on)."""
    return _full(target.toolchain, dict(target.options))


def _toolchains() -> dict[str, str]:
    """Known toolchains -> device kind (from the runner registry, which imports nothing heavy)."""
    try:
        from runners.registry import TOOLCHAINS
    except ImportError:  # pragma: no cover - runners package missing
        return {"ort-cpu": "cpu", "openvino": "cpu", "litert": "cpu", "null": "cpu",
                "ort-cuda": "cuda", "ort-tensorrt": "cuda", "vela": "ethos-u"}
    return {name: e.device_kind for name, e in TOOLCHAINS.items()}


# ------------------------------------------------------------------------------------------
# transition models


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


def scale_transitions(model: TransitionModel, factor: float) -> TransitionModel:
    """``model`` with every penalty multiplied by ``factor`` (>= 0)."""
    if not (factor >= 0 and math.isfinite(factor)):
        raise ValueError(f"transition scale must be a finite number >= 0, got {factor!r}")
    if isinstance(model, AnalyticTransitionModel):
        return dataclasses.replace(model, scale=model.scale * factor)
    if isinstance(model, ScaledTransitionModel):
        return ScaledTransitionModel(model.base, model.factor * factor)
    return ScaledTransitionModel(model, factor)


@dataclass(frozen=True)
class TransitionSample:
    """One measured transition fact, as read from the cost table's transition rows.

    * ``kind="transfer"``: median seconds to copy ``nbytes`` from device ``src`` to ``dst``
      (labels such as ``cpu:0``, ``cuda:1``), timed with the device's own copy API;
    * ``kind="launch"``: a per-partition fixed cost to charge on ``toolchain`` (``device_kind``
      device), e.g. from a datasheet or a driver trace;
    * ``kind="handoff"``: the measured boundary excess on ``toolchain`` at ``nbytes``: two
      identity partitions chained, minus twice one alone (`runners.transitions`): what a chain
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


# ------------------------------------------------------------------------------------------
# configuration objects


@dataclass(frozen=True)
class SubgraphLimits:
    """Candidate limits (`SubGraphConfig`); ``max_depth=None`` leaves the CLI's default."""

    max_depth: int | None = None
    max_exits: int | None = 2
    allow_taps: bool = False


@dataclass(frozen=True)
class DeviceSpec:
    """A device declared by a system file."""

    name: str
    device: VirtualDevice
    model: str = ""
    description: str = ""
    memory_mib: float | None = None
    clock_hz: float | None = None
    host: bool = False
    targets: tuple[str, ...] = ()


@dataclass(frozen=True)
class LinkSpec:
    """A declared copy cost between two devices (one direction)."""

    src: str  # device label
    dst: str
    latency_s: float
    bytes_per_s: float
    origin: str = ""  # "file: links[i]" (or "... (reverse)")


@dataclass(frozen=True)
class FarmConfig:
    """A merged system + app configuration.

    ``targets``: every target the system offers (plus the app's variants), by name, with the
    app's option overrides applied; ``selected``: the app's choice (all when it makes none).
    """

    system_name: str
    targets: dict[str, Target]
    selected: tuple[str, ...]
    devices: dict[str, DeviceSpec]
    transition: TransitionModel
    pins: tuple[Pin, ...] = ()
    subgraph_limits: SubgraphLimits = SubgraphLimits()
    links: tuple[LinkSpec, ...] = ()
    launch_s: dict[str, float] = field(default_factory=dict)
    host: VirtualDevice | None = None
    app_name: str | None = None
    description: str = ""
    sources: tuple[str, ...] = ()
    target_descriptions: dict[str, str] = field(default_factory=dict)

    # --- views -------------------------------------------------------------------------
    @property
    def clocks(self) -> dict[str, float]:
        """Device name -> clock in Hz, for devices that declare one."""
        return {n: d.clock_hz for n, d in self.devices.items() if d.clock_hz is not None}

    @property
    def selected_targets(self) -> list[Target]:
        return [self.targets[n] for n in self.selected]

    @property
    def pin_set(self) -> PinSet:
        from collage_farm.core.pins import PinSet

        return PinSet(self.pins)

    def device_of(self, target: Target | str) -> DeviceSpec | None:
        """The declared device a target runs on."""
        t = self.targets[target] if isinstance(target, str) else target
        for d in self.devices.values():
            if d.device == t.device:
                return d
        return None

    def rule_options(self, default_max_depth: int = 4) -> RuleOptions:
        """The partition-rule options these limits give (imports the rules module)."""
        from collage_farm.core.rules import RuleOptions

        lim = self.subgraph_limits
        return RuleOptions(max_depth=lim.max_depth or default_max_depth,
                           max_exits=lim.max_exits, allow_taps=lim.allow_taps)

    def resolve_targets(self, spec: str | Iterable[str] | None = None) -> list[Target]:
        """Targets named in ``spec`` ("a,b", a list, "all"); ``None`` or "" gives the selection."""
        if spec is None or (isinstance(spec, str) and not spec.strip()):
            return self.selected_targets
        names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
        if [n for n in names if n] == ["all"]:
            return list(self.targets.values())
        out: list[Target] = []
        for n in names:
            if not n:
                continue
            t = self.targets.get(n)
            if t is None:
                raise ConfigTargetError(
                    f"unknown target {n!r} in system {self.system_name!r}",
                    key="--targets", allowed=list(self.targets))
            if t not in out:
                out.append(t)
        if not out:
            raise ConfigTargetError("no targets given", key="--targets", allowed=list(self.targets))
        return out

    # --- what-ifs ----------------------------------------------------------------------
    def with_transition(self, model: TransitionModel) -> FarmConfig:
        """The same configuration with another transition model (e.g. measured from a table)."""
        return dataclasses.replace(self, transition=model)

    def scale_transitions(self, factor: float) -> FarmConfig:
        """The same configuration with every transition penalty multiplied by ``factor``."""
        return self.with_transition(scale_transitions(self.transition, factor))

    def with_measured_transitions(self, samples: Iterable[TransitionSample]) -> FarmConfig:
        """Measured transition rows in front of the current model (which answers the rest)."""
        return self.with_transition(
            MeasuredTransitionModel.from_samples(samples, self.transition, self.host))

    # --- output ------------------------------------------------------------------------
    def target_dict(self, name: str) -> dict[str, Any]:
        t = self.targets[name]
        dev = self.device_of(t)
        return {
            "name": t.name,
            "toolchain": t.toolchain,
            "device": t.device.label,
            "device_name": dev.name if dev else None,
            "options": dict(t.options),
            "effective_options": effective_options(t),
            "measure_key": t.measure_key,
            "launch_s": self.transition.launch_s(t),
            "selected": name in self.selected,
            "description": self.target_descriptions.get(name, ""),
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able view (``collage-farm targets list --json``)."""
        return {
            "system": self.system_name,
            "app": self.app_name,
            "description": self.description,
            "sources": list(self.sources),
            "host": self.host.label if self.host else None,
            "devices": {
                n: {"label": d.device.label, "kind": d.device.kind, "id": d.device.device_id,
                    "memory_scope": d.device.memory_scope, "model": d.model,
                    "description": d.description, "memory_mib": d.memory_mib,
                    "clock_hz": d.clock_hz, "host": d.host, "targets": list(d.targets)}
                for n, d in self.devices.items()
            },
            "targets": {n: self.target_dict(n) for n in self.targets},
            "selected": list(self.selected),
            "pins": [p.describe() for p in self.pins],
            "subgraph_limits": dataclasses.asdict(self.subgraph_limits),
            "links": [{"from": x.src, "to": x.dst, "latency_s": x.latency_s,
                       "bytes_per_s": x.bytes_per_s} for x in self.links],
            "transition": self.transition.label,
        }


# ------------------------------------------------------------------------------------------
# reading YAML


class _Reader:
    """Type and key checks for one file, with errors that name the file and the dotted key."""

    def __init__(self, file: str) -> None:
        self.file = file

    def error(self, key: str, message: str, allowed: Iterable[object] | None = None
              ) -> ConfigError:
        return ConfigError(message, file=self.file, key=key or "<top>", allowed=allowed)

    def mapping(self, value: object, key: str, allowed: Sequence[str] | None,
                what: str = "a mapping") -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.error(key, f"expected {what}, got {type(value).__name__}",
                             allowed)
        for k in value:
            if not isinstance(k, str):
                raise self.error(key, f"keys must be strings, got {k!r}", allowed)
            if allowed is not None and k not in allowed:
                raise self.error(_join(key, k), f"unknown key {k!r}", allowed)
        return value

    def value(self, m: Mapping[str, Any], key: str, path: str, kind: str, *,
              default: object = None, required: bool = False,
              choices: Sequence[object] | None = None, minimum: float | None = None,
              positive: bool = False, nullable: bool = False) -> Any:
        full = _join(path, key)
        if key not in m:
            if required:
                raise self.error(full, "missing required key",
                                 choices if choices is not None else _KIND_ALLOWED[kind])
            return default
        v = m[key]
        if v is None and nullable:
            return None
        _check_type(self, full, v, kind, choices, minimum, positive)
        return v


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _type_ok(v: object, kind: str) -> bool:
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if kind == "str":
        return isinstance(v, str) and v != ""
    raise AssertionError(kind)


_KIND_ALLOWED = {"bool": ["true", "false"], "int": ["<integer>"], "number": ["<number>"],
                 "str": ["<string>"]}
_KIND_WORDS = {"bool": "true or false", "int": "an integer", "number": "a number",
               "str": "a non-empty string"}


def _check_type(r: _Reader, key: str, v: object, kind: str,
                choices: Sequence[object] | None, minimum: float | None, positive: bool) -> None:
    if not _type_ok(v, kind):
        raise r.error(key, f"expected {_KIND_WORDS[kind]}, got {v!r}",
                      choices if choices is not None else _KIND_ALLOWED[kind])
    if choices is not None and v not in choices:
        raise r.error(key, f"{v!r} is not allowed", choices)
    if minimum is not None and v < minimum:  # type: ignore[operator]
        raise r.error(key, f"{v!r} is below the minimum", [f">= {minimum:g}"])
    if positive and not v > 0:  # type: ignore[operator]
        raise r.error(key, f"{v!r} must be positive", ["> 0"])


def _find_duplicate_key(text: str) -> tuple[str, int] | None:
    """(key, line) of the first key repeated inside one mapping (safe_load keeps the last)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    if k.value in seen:
                        return k.value, k.start_mark.line + 1
                    seen.add(k.value)
                stack.append(v)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return None


def _load_yaml(source: str | Path, top_keys: Sequence[str], label: str | None = None
               ) -> tuple[dict[str, Any], str]:
    path = Path(source)
    name = label or str(source)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("no such file", file=name) from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read: {e}", file=name) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<yaml>"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"malformed YAML: {problem}; expected a mapping with top-level keys",
                          file=name, key=where, allowed=top_keys) from None
    dup = _find_duplicate_key(text)
    if dup is not None:
        raise ConfigError(f"key {dup[0]!r} appears twice in one mapping (line {dup[1]})",
                          file=name, key=dup[0], allowed=["each key once"])
    if data is None:
        data = {}
    r = _Reader(name)
    return r.mapping(data, "", top_keys, "a YAML mapping at the top level"), name


def _check_schema(r: _Reader, top: Mapping[str, Any]) -> None:
    r.value(top, "schema", "", "int", choices=(SCHEMA_VERSION,))


def _check_name(r: _Reader, key: str, name: object, what: str) -> str:
    if not isinstance(name, str) or not name or any(c in name for c in ", \t\n"):
        raise r.error(key, f"bad {what} name {name!r}: use letters, digits, '-', '_', '.'",
                      ["<name without commas or spaces>"])
    return name


# ------------------------------------------------------------------------------------------
# options


def _validate_options(r: _Reader, path: str, toolchain: str, raw: Mapping[str, Any]
                      ) -> dict[str, object]:
    """Check option names, types and values (choices may depend on the other options)."""
    specs = TOOLCHAIN_OPTIONS.get(toolchain, {})
    opts = dict(r.mapping(raw, path, list(specs)))
    for key, val in opts.items():
        s = specs[key]
        _check_type(r, _join(path, key), val, s.kind, None, s.minimum, False)
    for key, val in opts.items():
        choices = specs[key].choices_for(opts)
        if choices is not None and val not in choices:
            raise r.error(_join(path, key), f"{val!r} is not allowed for toolchain "
                          f"{toolchain!r}", choices)
    return opts


def _canonical(r: _Reader, path: str, toolchain: str, opts: Mapping[str, object]
               ) -> dict[str, object]:
    specs = TOOLCHAIN_OPTIONS.get(toolchain, {})
    out = dict(opts)
    for key, s in specs.items():
        if s.required and key not in out:
            choices = s.choices_for(out)
            raise r.error(_join(path, key), f"toolchain {toolchain!r} needs option {key!r}",
                          choices if choices is not None else _KIND_ALLOWED[s.kind])
        d = s.default_for(out)
        if s.explicit and key not in out and d is not None:
            out[key] = d
        elif not s.explicit and key in out and out[key] == d:
            del out[key]
    return out


def _full(toolchain: str, opts: Mapping[str, object]) -> dict[str, object]:
    out = dict(opts)
    for key, s in TOOLCHAIN_OPTIONS.get(toolchain, {}).items():
        if key not in out:
            d = s.default_for(out)
            if d is not None:
                out[key] = d
    return out


def _override(r: _Reader, path: str, base: Target, raw: Mapping[str, Any],
              system_file: str) -> Target:
    """``base`` with the app's option overrides (locked options may only repeat)."""
    specs = TOOLCHAIN_OPTIONS.get(base.toolchain, {})
    new = _validate_options(r, path, base.toolchain, raw)
    current = _full(base.toolchain, dict(base.options))
    for key, val in new.items():
        if specs[key].locked and current.get(key) != val:
            raise r.error(_join(path, key),
                          f"conflict: {system_file} sets {key}={current.get(key)!r} for target "
                          f"{base.name!r} and an app may not change it (a hardware fact)",
                          [current.get(key)])
    merged = {**dict(base.options), **new}
    merged = _validate_options(r, path, base.toolchain, merged)
    return Target.make(base.name, base.toolchain, base.device,
                       _canonical(r, path, base.toolchain, merged))


# ------------------------------------------------------------------------------------------
# the system file


@dataclass(frozen=True)
class _System:
    name: str
    file: str
    description: str
    devices: dict[str, DeviceSpec]
    targets: dict[str, Target]
    target_descriptions: dict[str, str]
    links: tuple[LinkSpec, ...]
    launch_s: dict[str, float]
    handoff_bytes_per_s: float
    host: VirtualDevice | None
    limits: dict[str, Any]


def _device_ref(r: _Reader, key: str, ref: object, devices: Mapping[str, DeviceSpec],
                *, allow_kind: bool = False) -> str:
    """A device name, label, "kind:id" or (``allow_kind``) kind -> a normalised spec string."""
    names = list(devices)
    labels = [d.device.label for d in devices.values()]
    kinds = sorted({d.device.kind for d in devices.values()})
    allowed = list(dict.fromkeys(names + labels + (kinds if allow_kind else [])))
    if not isinstance(ref, str) or not ref:
        raise r.error(key, f"expected a device, got {ref!r}", allowed)
    if ref in devices:
        return devices[ref].device.label
    for d in devices.values():
        if ref == d.device.label or ref == f"{d.device.kind}:{d.device.device_id}/global":
            return d.device.label
    short = [d for d in devices.values() if ref == f"{d.device.kind}:{d.device.device_id}"]
    if len(short) == 1:
        return short[0].device.label
    if len(short) > 1 and allow_kind:
        return ref  # "cpu:0" in a pin: any memory scope of that device
    if allow_kind and ref in kinds:
        return ref
    raise r.error(key, f"unknown device {ref!r}", allowed)


def _read_system(source: str | Path, label: str | None = None,
                 expect_name: str | None = None) -> _System:
    top, file = _load_yaml(source, SYSTEM_KEYS, label)
    r = _Reader(file)
    _check_schema(r, top)
    name = r.value(top, "system", "", "str", default=Path(source).stem)
    _check_name(r, "system", name, "system")
    if expect_name is not None and name != expect_name:
        raise r.error("system", f"built-in system file names itself {name!r}", [expect_name])
    description = r.value(top, "description", "", "str", default="")
    known_tc = _toolchains()

    # toolchains: launch overheads and option defaults
    launch = dict(DEFAULT_LAUNCH_S)
    tc_opts: dict[str, dict[str, object]] = {}
    for tc, body in r.mapping(top.get("toolchains"), "toolchains", None).items():
        path = _join("toolchains", tc)
        if tc not in known_tc:
            raise r.error(path, f"unknown toolchain {tc!r}", list(known_tc))
        b = r.mapping(body, path, TOOLCHAIN_KEYS)
        us = r.value(b, "launch_us", path, "number", minimum=0)
        if us is not None:
            launch[tc] = us * 1e-6
        tc_opts[tc] = _validate_options(r, _join(path, "options"), tc, b.get("options") or {})

    # devices and the targets installed on them
    raw_devices = r.mapping(top.get("devices"), "devices", None)
    if not raw_devices:
        raise r.error("devices", "a system declares at least one device", ["<device name>"])
    devices: dict[str, DeviceSpec] = {}
    targets: dict[str, Target] = {}
    descriptions: dict[str, str] = {}
    target_where: dict[str, str] = {}
    by_label: dict[str, str] = {}
    hosts: list[str] = []
    for dname, body in raw_devices.items():
        path = _join("devices", dname)
        _check_name(r, path, dname, "device")
        d = r.mapping(body, path, DEVICE_KEYS)
        kind = r.value(d, "kind", path, "str", required=True, choices=DEVICE_KINDS)
        dev_id = r.value(d, "id", path, "int", default=0, minimum=0)
        scope = r.value(d, "memory_scope", path, "str", default="global")
        if any(c in scope for c in ":/, "):
            raise r.error(_join(path, "memory_scope"), f"bad memory scope {scope!r}",
                          ["<name without ':', '/', ',' or spaces>"])
        vd = VirtualDevice(kind, dev_id, scope)
        if vd.label in by_label:
            raise r.error(path, f"conflict: device label {vd.label!r} is already used by "
                          f"device {by_label[vd.label]!r}; give it another id or memory_scope",
                          [f"a label other than {vd.label}"])
        by_label[vd.label] = dname
        if r.value(d, "host", path, "bool", default=False):
            hosts.append(dname)
        clock = r.value(d, "clock_mhz", path, "number", positive=True, nullable=True)
        tnames: list[str] = []
        for tname, tbody in r.mapping(d.get("targets"), _join(path, "targets"), None).items():
            tpath = _join(path, f"targets.{tname}")
            _check_name(r, tpath, tname, "target")
            if tname in targets:
                raise r.error(tpath, f"conflict: target {tname!r} is already declared at "
                              f"{target_where[tname]}", ["a unique target name"])
            tb = r.mapping(tbody, tpath, TARGET_KEYS)
            allowed_here = [t for t, k in known_tc.items() if k == kind]
            tc = r.value(tb, "toolchain", tpath, "str", required=True, choices=list(known_tc))
            if known_tc[tc] != kind:
                raise r.error(_join(tpath, "toolchain"),
                              f"toolchain {tc!r} runs on {known_tc[tc]!r} devices, not on "
                              f"{kind!r} device {dname!r}", allowed_here)
            own = _validate_options(r, _join(tpath, "options"), tc, tb.get("options") or {})
            merged = _validate_options(r, _join(tpath, "options"), tc,
                                       {**tc_opts.get(tc, {}), **own})
            opts = _canonical(r, _join(tpath, "options"), tc, merged)
            targets[tname] = Target.make(tname, tc, vd, opts)
            descriptions[tname] = r.value(tb, "description", tpath, "str", default="")
            target_where[tname] = tpath
            tnames.append(tname)
        devices[dname] = DeviceSpec(
            name=dname, device=vd,
            model=r.value(d, "model", path, "str", default=""),
            description=r.value(d, "description", path, "str", default=""),
            memory_mib=r.value(d, "memory_mib", path, "number", positive=True, nullable=True),
            clock_hz=None if clock is None else clock * 1e6,
            host=dname in hosts, targets=tuple(tnames),
        )
    if len(hosts) > 1:
        raise r.error(_join(f"devices.{hosts[1]}", "host"),
                      f"conflict: devices {', '.join(map(repr, hosts))} all say host: true",
                      [f"host: true on one device ({hosts[0]})"])
    host: VirtualDevice | None = None
    if hosts:
        host = devices[hosts[0]].device
    else:
        cpus = [d.device for d in devices.values() if d.device.kind == "cpu"]
        host = cpus[0] if cpus else None

    # links
    links: list[LinkSpec] = []
    raw_links = top.get("links") or []
    if not isinstance(raw_links, list):
        raise r.error("links", f"expected a list, got {type(raw_links).__name__}",
                      ["[{from, to, latency_us, gb_per_s, symmetric}]"])
    declared: dict[tuple[str, str], str] = {}
    parsed = []
    for i, body in enumerate(raw_links):
        path = f"links[{i}]"
        b = r.mapping(body, path, LINK_KEYS)
        src = _device_ref(r, _join(path, "from"),
                          r.value(b, "from", path, "str", required=True), devices)
        dst = _device_ref(r, _join(path, "to"), r.value(b, "to", path, "str", required=True),
                          devices)
        if src == dst:
            raise r.error(_join(path, "to"), f"a link needs two different devices, got "
                          f"{src!r} twice", [x for x in by_label if x != src])
        lat = r.value(b, "latency_us", path, "number", required=True, minimum=0) * 1e-6
        bw = r.value(b, "gb_per_s", path, "number", required=True, positive=True) * 1e9
        sym = r.value(b, "symmetric", path, "bool", default=True)
        if (src, dst) in declared:
            raise r.error(path, f"conflict: link {src} -> {dst} is already declared at "
                          f"{declared[(src, dst)]}", ["one link per direction"])
        declared[(src, dst)] = path
        parsed.append((src, dst, lat, bw, sym, path))
    for src, dst, lat, bw, _sym, path in parsed:
        links.append(LinkSpec(src, dst, lat, bw, f"{file}: {path}"))
    for src, dst, lat, bw, sym, path in parsed:
        if sym and (dst, src) not in declared:
            links.append(LinkSpec(dst, src, lat, bw, f"{file}: {path} (reverse)"))

    tr = r.mapping(top.get("transition"), "transition", ("handoff_gb_per_s",))
    handoff = r.value(tr, "handoff_gb_per_s", "transition", "number", positive=True)
    limits = _read_limits(r, top.get("subgraph"))
    return _System(
        name=name, file=file, description=description, devices=devices, targets=targets,
        target_descriptions=descriptions, links=tuple(links), launch_s=launch,
        handoff_bytes_per_s=DEFAULT_HANDOFF_BYTES_PER_S if handoff is None else handoff * 1e9,
        host=host, limits=limits,
    )


def _read_limits(r: _Reader, raw: object) -> dict[str, Any]:
    m = r.mapping(raw, "subgraph", SUBGRAPH_KEYS)
    out: dict[str, Any] = {}
    for key in ("max_depth", "max_exits"):
        if key in m:
            out[key] = r.value(m, key, "subgraph", "int", minimum=1, nullable=True)
    if "allow_taps" in m:
        out["allow_taps"] = r.value(m, "allow_taps", "subgraph", "bool")
    return out


# ------------------------------------------------------------------------------------------
# built-in systems


def _systems_dir() -> Any:
    return resources.files("collage_farm.config") / "systems"


def builtin_systems() -> list[str]:
    """Names of the system files shipped with the package."""
    return sorted(p.name[: -len(".yaml")] for p in _systems_dir().iterdir()
                  if p.name.endswith(".yaml"))


def builtin_system_path(name: str) -> Path:
    names = builtin_systems()
    if name not in names:
        raise ConfigError(f"unknown built-in system {name!r}", key="--builtin-system",
                          allowed=names)
    return Path(str(_systems_dir() / f"{name}.yaml"))


# ------------------------------------------------------------------------------------------
# merging


def load_config(system: str | Path | None = None, app: str | Path | None = None, *,
                builtin_system: str | None = None) -> FarmConfig:
    """Read and merge a system file (or a built-in system) with an optional app file.

    The system comes from ``system`` (a file), else ``builtin_system``, else the app's
    ``system:`` key naming a built-in system. Raises `ConfigError` on anything wrong.
    """
    if system is not None and builtin_system is not None:
        raise ConfigError("give a system file or a built-in system, not both",
                          key="--builtin-system",
                          allowed=["--system FILE", "--builtin-system NAME"])
    app_top: dict[str, Any] = {}
    app_file: str | None = None
    if app is not None:
        app_top, app_file = _load_yaml(app, APP_KEYS)
    ar = _Reader(app_file or "<app>")
    if app is not None:
        _check_schema(ar, app_top)
    app_system = ar.value(app_top, "system", "", "str") if app is not None else None

    if system is not None:
        sysc = _read_system(system)
    else:
        name = builtin_system or app_system
        if name is None:
            raise ConfigError("no system: give --system FILE, --builtin-system NAME or "
                              "'system:' in the app file", key="system",
                              allowed=builtin_systems())
        if builtin_system is None and name not in builtin_systems():
            raise ar.error("system", f"no system file given and {name!r} is not a built-in "
                           "system", builtin_systems())
        sysc = _read_system(builtin_system_path(name), expect_name=name)
    if app_system is not None and app_system != sysc.name:
        raise ar.error("system", f"conflict: the app is for system {app_system!r} but the "
                       f"system file {sysc.file} is {sysc.name!r}", [sysc.name])

    targets = dict(sysc.targets)
    descriptions = dict(sysc.target_descriptions)
    sources = (sysc.file,) + ((app_file,) if app_file else ())
    app_name = None
    selected: tuple[str, ...] = tuple(targets)
    pins: tuple[Pin, ...] = ()
    limits = dict(sysc.limits)
    scale = 1.0
    description = sysc.description
    if app is not None:
        app_name = ar.value(app_top, "app", "", "str", default=Path(app).stem)
        description = ar.value(app_top, "description", "", "str", default=description)
        # option overrides of system targets
        for tname, body in ar.mapping(app_top.get("options"), "options", None).items():
            path = _join("options", tname)
            if tname not in sysc.targets:
                raise ar.error(path, f"unknown target {tname!r} (not declared by system "
                               f"{sysc.name!r})", list(sysc.targets))
            targets[tname] = _override(ar, path, sysc.targets[tname], body or {}, sysc.file)
        # variants
        for vname, body in ar.mapping(app_top.get("variants"), "variants", None).items():
            path = _join("variants", vname)
            _check_name(ar, path, vname, "variant")
            if vname in targets:
                raise ar.error(path, f"conflict: {vname!r} is already a target of system "
                               f"{sysc.name!r}; give the variant another name",
                               ["a name not in: " + ", ".join(targets)])
            vb = ar.mapping(body, path, VARIANT_KEYS)
            base = ar.value(vb, "base", path, "str", required=True, choices=list(sysc.targets))
            b = targets[base]
            t = _override(ar, _join(path, "options"), b, vb.get("options") or {}, sysc.file)
            targets[vname] = Target(vname, t.toolchain, t.device, t.options)
            descriptions[vname] = ar.value(vb, "description", path, "str",
                                           default=f"variant of {base}")
        selected = _read_selection(ar, app_top.get("targets"), targets)
        pins = _read_pins(ar, app_top.get("pins"), sysc.devices, targets)
        limits.update(_read_limits(ar, app_top.get("subgraph")))
        tr = ar.mapping(app_top.get("transition"), "transition", ("scale",))
        scale = ar.value(tr, "scale", "transition", "number", default=1.0, minimum=0)

    lim = SubgraphLimits(**limits)
    model = ConfiguredTransitionModel(
        links=dict(DEFAULT_LINKS),
        launch=dict(sysc.launch_s),
        handoff_bytes_per_s=sysc.handoff_bytes_per_s,
        scale=float(scale),
        device_links={(x.src, x.dst): Link(x.latency_s, x.bytes_per_s) for x in sysc.links},
        host=sysc.host,
        label=f"analytic:{sysc.name}" + ("" if scale == 1.0 else f"x{scale:g}"),
    )
    return FarmConfig(
        system_name=sysc.name, targets=targets, selected=selected, devices=sysc.devices,
        transition=model, pins=pins, subgraph_limits=lim, links=sysc.links,
        launch_s=dict(sysc.launch_s), host=sysc.host, app_name=app_name,
        description=description, sources=sources, target_descriptions=descriptions,
    )


def _read_selection(r: _Reader, raw: object, targets: Mapping[str, Target]) -> tuple[str, ...]:
    if raw is None or raw == "all":
        return tuple(targets)
    if isinstance(raw, str):
        raw = [s.strip() for s in raw.split(",") if s.strip()]
    if not isinstance(raw, list) or not raw:
        raise r.error("targets", f"expected a list of target names or 'all', got {raw!r}",
                      list(targets))
    out: list[str] = []
    for i, n in enumerate(raw):
        if n not in targets:
            raise r.error(f"targets[{i}]", f"unknown target {n!r}", list(targets))
        if n not in out:
            out.append(n)
    return tuple(out)


def _read_pins(r: _Reader, raw: object, devices: Mapping[str, DeviceSpec],
               targets: Mapping[str, Target]) -> tuple[Pin, ...]:
    from collage_farm.core.pins import Pin

    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise r.error("pins", f"expected a list, got {type(raw).__name__}",
                      ["[{node|op, device|target, optional}]"])
    out = []
    for i, body in enumerate(raw):
        path = f"pins[{i}]"
        b = r.mapping(body, path, PIN_KEYS)
        node = r.value(b, "node", path, "str")
        op = r.value(b, "op", path, "str")
        if node is None and op is None:
            raise r.error(path, "a pin selects nodes by 'node' (name glob) and/or 'op' "
                          "(op type)", ["node", "op"])
        has_dev, has_tgt = "device" in b, "target" in b
        if has_dev == has_tgt:
            raise r.error(path, "a pin names exactly one of 'device' or 'target'",
                          ["device", "target"])
        device = target = None
        if has_dev:
            device = _device_ref(r, _join(path, "device"), b["device"], devices, allow_kind=True)
        else:
            target = r.value(b, "target", path, "str", choices=list(targets))
        optional = r.value(b, "optional", path, "bool", default=False)
        out.append(Pin(node=node, op=op, device=device, target=target, optional=optional,
                       origin=f"{r.file}: {path}"))
    return tuple(out)
