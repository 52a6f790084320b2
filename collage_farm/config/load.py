"""Merging a system file with an app file into one `FarmConfig` (`load_config`).

The merge rules are the package docstring's: the system declares the world, the app selects
targets, overrides options (locked ones may only repeat), derives variants, pins nodes, sets
candidate limits and a what-if transition scale. The system's links and launch overheads become
a `ConfiguredTransitionModel`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collage_farm.config.options import override_options
from collage_farm.config.reader import Reader, check_name, check_schema, join_key, load_yaml
from collage_farm.config.schema import (
    APP_KEYS,
    PIN_KEYS,
    VARIANT_KEYS,
    DeviceSpec,
    FarmConfig,
    SubgraphLimits,
)
from collage_farm.config.systems import (
    SystemSpec,
    builtin_system_path,
    builtin_systems,
    device_ref,
    read_limits,
    read_system,
)
from collage_farm.core.pins import Pin
from collage_farm.core.target import ConfigError, Target, variant_base
from collage_farm.core.transition import DEFAULT_LINKS, ConfiguredTransitionModel, Link

__all__ = ["builtin_system_for", "load_config"]


@dataclass
class _Merged:
    """The system's targets and settings with an app's changes applied (none without an app)."""

    targets: dict[str, Target]
    descriptions: dict[str, str]
    selected: tuple[str, ...]
    limits: dict[str, Any]
    description: str
    app_name: str | None = None
    pins: tuple[Pin, ...] = ()
    scale: float = 1.0
    sources: tuple[str, ...] = field(default_factory=tuple)


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
        app_top, app_file = load_yaml(app, APP_KEYS)
    ar = Reader(app_file or "<app>")
    if app is not None:
        check_schema(ar, app_top)
    app_system = ar.value(app_top, "system", "", "str") if app is not None else None
    sysc = _choose_system(ar, system, builtin_system, app_system)
    if app_system is not None and app_system != sysc.name:
        raise ar.error("system", f"conflict: the app is for system {app_system!r} but the "
                       f"system file {sysc.file} is {sysc.name!r}", [sysc.name])
    m = _Merged(targets=dict(sysc.targets), descriptions=dict(sysc.target_descriptions),
                selected=tuple(sysc.targets), limits=dict(sysc.limits),
                description=sysc.description,
                sources=(sysc.file,) + ((app_file,) if app_file else ()))
    if app is not None:
        _merge_app(ar, app, app_top, sysc, m)
    return FarmConfig(
        system_name=sysc.name, targets=m.targets, selected=m.selected, devices=sysc.devices,
        transition=_transition_model(sysc, m.scale), pins=m.pins,
        subgraph_limits=SubgraphLimits(**m.limits), links=sysc.links,
        launch_s=dict(sysc.launch_s), host=sysc.host, app_name=m.app_name,
        description=m.description, sources=m.sources, target_descriptions=m.descriptions,
    )


def builtin_system_for(targets: Sequence[Target]) -> FarmConfig | None:
    """The first built-in system (by name) that declares every one of ``targets`` as it is
    (same toolchain, device and options), or a catalogue variant of it (the same less its
    `VARIANT_OPTIONS`, e.g. ``ethos-u65-256-a16``), or None: the board that ``--targets``
    names without a system file, whose transition model then applies."""
    def base(t: Target) -> tuple:
        b = variant_base(t)
        return (b.toolchain, b.device, b.options, b.calibration)

    for name in builtin_systems():
        cfg = load_config(builtin_system=name)
        declared = set(cfg.targets.values())
        bases = {base(t) for t in declared}
        if all(t in declared or (variant_base(t) is not t and base(t) in bases)
               for t in targets):
            return cfg
    return None


def _choose_system(ar: Reader, system: str | Path | None, builtin_system: str | None,
                   app_system: str | None) -> SystemSpec:
    """The system file given, else the built-in one named by the flag or by the app."""
    if system is not None:
        return read_system(system)
    name = builtin_system or app_system
    if name is None:
        raise ConfigError("no system: give --system FILE, --builtin-system NAME or "
                          "'system:' in the app file", key="system",
                          allowed=builtin_systems())
    if builtin_system is None and name not in builtin_systems():
        raise ar.error("system", f"no system file given and {name!r} is not a built-in "
                       "system", builtin_systems())
    return read_system(builtin_system_path(name), expect_name=name)


def _merge_app(ar: Reader, app: str | Path, top: Mapping[str, Any], sysc: SystemSpec,
               m: _Merged) -> None:
    """Apply an app file's keys to ``m`` (merge rules 1-4 of the package docstring)."""
    m.app_name = ar.value(top, "app", "", "str", default=Path(app).stem)
    m.description = ar.value(top, "description", "", "str", default=m.description)
    # option overrides of system targets
    for tname, body in ar.mapping(top.get("options"), "options", None).items():
        path = join_key("options", tname)
        if tname not in sysc.targets:
            raise ar.error(path, f"unknown target {tname!r} (not declared by system "
                           f"{sysc.name!r})", list(sysc.targets))
        m.targets[tname] = override_options(ar, path, sysc.targets[tname], body or {},
                                            sysc.file)
    _read_variants(ar, top.get("variants"), sysc, m)
    m.selected = _read_selection(ar, top.get("targets"), m.targets)
    m.pins = _read_pins(ar, top.get("pins"), sysc.devices, m.targets)
    m.limits.update(read_limits(ar, top.get("subgraph")))
    tr = ar.mapping(top.get("transition"), "transition", ("scale",))
    m.scale = ar.value(tr, "scale", "transition", "number", default=1.0, minimum=0)


def _read_variants(ar: Reader, raw: object, sysc: SystemSpec, m: _Merged) -> None:
    """``variants:``: new targets derived from system ones, added to ``m.targets``."""
    for vname, body in ar.mapping(raw, "variants", None).items():
        path = join_key("variants", vname)
        check_name(ar, path, vname, "variant")
        if vname in m.targets:
            raise ar.error(path, f"conflict: {vname!r} is already a target of system "
                           f"{sysc.name!r}; give the variant another name",
                           ["a name not in: " + ", ".join(m.targets)])
        vb = ar.mapping(body, path, VARIANT_KEYS)
        base = ar.value(vb, "base", path, "str", required=True, choices=list(sysc.targets))
        t = override_options(ar, join_key(path, "options"), m.targets[base],
                             vb.get("options") or {}, sysc.file)
        m.targets[vname] = Target(vname, t.toolchain, t.device, t.options)
        m.descriptions[vname] = ar.value(vb, "description", path, "str",
                                         default=f"variant of {base}")


def _transition_model(sysc: SystemSpec, scale: float) -> ConfiguredTransitionModel:
    """The system's links and launch overheads, times the app's what-if ``scale``."""
    return ConfiguredTransitionModel(
        links=dict(DEFAULT_LINKS),
        launch=dict(sysc.launch_s),
        handoff_bytes_per_s=sysc.handoff_bytes_per_s,
        scale=float(scale),
        device_links={(x.src, x.dst): Link(x.latency_s, x.bytes_per_s) for x in sysc.links},
        host=sysc.host,
        label=f"analytic:{sysc.name}" + ("" if scale == 1.0 else f"x{scale:g}"),
    )


def _read_selection(r: Reader, raw: object, targets: Mapping[str, Target]) -> tuple[str, ...]:
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


def _read_pins(r: Reader, raw: object, devices: Mapping[str, DeviceSpec],
               targets: Mapping[str, Target]) -> tuple[Pin, ...]:
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
            device = device_ref(r, join_key(path, "device"), b["device"], devices,
                                allow_kind=True)
        else:
            target = r.value(b, "target", path, "str", choices=list(targets))
        optional = r.value(b, "optional", path, "bool", default=False)
        out.append(Pin(node=node, op=op, device=device, target=target, optional=optional,
                       origin=f"{r.file}: {path}"))
    return tuple(out)

