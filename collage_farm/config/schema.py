"""What a merged configuration is: `FarmConfig`, its parts, and the keys each file may use.

The key tuples are the whole schema of the two files (the package docstring describes them):
a key not listed is an error, never ignored. `FarmConfig` is the result of merging a system file
with an app file (`collage_farm.config.load.load_config`): every target the system offers, the
app's selection, devices, links, pins, candidate limits and the transition model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from collage_farm.core.pins import Pin, PinSet
from collage_farm.core.rules import RuleOptions
from collage_farm.core.target import (
    BUILTIN_TARGETS,
    VARIANT_OPTIONS,
    ConfigError,
    Target,
    UnknownTargetError,
    VirtualDevice,
    variant_base,
)
from collage_farm.core.transition import (
    MeasuredTransitionModel,
    TransitionModel,
    TransitionSample,
    scale_transitions,
)
from runners.options import effective_options

__all__ = [
    "APP_KEYS",
    "DEVICE_KEYS",
    "DEVICE_KINDS",
    "LINK_KEYS",
    "PIN_KEYS",
    "SCHEMA_VERSION",
    "SUBGRAPH_KEYS",
    "SYSTEM_KEYS",
    "TARGET_KEYS",
    "TOOLCHAIN_KEYS",
    "VARIANT_KEYS",
    "ConfigTargetError",
    "DeviceSpec",
    "FarmConfig",
    "LinkSpec",
    "SubgraphLimits",
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
LINK_KEYS = ("from", "to", "latency_us", "gb_per_s", "symmetric", "shared_memory")
SUBGRAPH_KEYS = ("max_depth", "max_exits", "allow_taps")
PIN_KEYS = ("node", "op", "device", "target", "optional")
VARIANT_KEYS = ("base", "options", "description")


class ConfigTargetError(ConfigError, UnknownTargetError):
    """A target name the configuration does not define (also an `UnknownTargetError`)."""


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
    bytes_per_s: float  # math.inf for devices that share memory: no copy
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
        return PinSet(self.pins)

    def device_of(self, target: Target | str) -> DeviceSpec | None:
        """The declared device a target runs on."""
        t = self.targets[target] if isinstance(target, str) else target
        for d in self.devices.values():
            if d.device == t.device:
                return d
        return None

    def rule_options(self, default_max_depth: int = 4) -> RuleOptions:
        """The partition-rule options these limits give."""
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
            t = self.targets.get(n) or self.variant_of(n)
            if t is None:
                raise ConfigTargetError(
                    f"unknown target {n!r} in system {self.system_name!r}",
                    key="--targets", allowed=list(self.targets))
            if t not in out:
                out.append(t)
        if not out:
            raise ConfigTargetError("no targets given", key="--targets", allowed=list(self.targets))
        return out

    def variant_of(self, name: str) -> Target | None:
        """The catalogue variant ``name`` (one that adds `VARIANT_OPTIONS` to a catalogue
        target, e.g. ``ethos-u65-256-a16``) of this system's own target of that catalogue
        target (same toolchain, every catalogue option equal): the system's target on its
        device, its options plus the variant's, or None when ``name`` is no such variant."""
        cat = BUILTIN_TARGETS.get(name)
        if cat is None or variant_base(cat) is cat:
            return None
        base = dict(variant_base(cat).options)
        extra = {k: v for k, v in cat.options if k in VARIANT_OPTIONS}
        for t in self.targets.values():
            opts = dict(t.options)
            if t.toolchain == cat.toolchain and all(opts.get(k) == v for k, v in base.items()):
                return Target.make(name, t.toolchain, t.device, {**opts, **extra})
        return None

    def with_board_host(self, targets: list[Target]) -> list[Target]:
        """``targets`` plus the host device's targets when they name an NPU (Vela) and nothing
        on the host: on an Ethos-U board the host runs what the NPU cannot, whatever the
        selection says (without it a model with one operator the NPU lacks has no plan)."""
        if self.host is None or not any(t.toolchain == "vela" for t in targets) \
                or any(t.device == self.host for t in targets):
            return targets
        return targets + [t for t in self.targets.values() if t.device == self.host]

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
                       "bytes_per_s": x.bytes_per_s if math.isfinite(x.bytes_per_s) else None,
                       "shared_memory": not math.isfinite(x.bytes_per_s)}
                      for x in self.links],
            "transition": self.transition.label,
        }
