"""System files: the devices, the toolchains installed on them and the links between them.

`read_system` reads one system file (the package docstring gives its schema) into a
`SystemSpec`; `builtin_systems` and `builtin_system_path` give the system files shipped with
the package (``collage_farm/config/systems/*.yaml``). Which toolchains exist, and on which
device kind each runs, is the runner registry's (`runners.registry.TOOLCHAINS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collage_farm.config.options import canonical_options, validate_options
from collage_farm.config.reader import Reader, check_name, check_schema, join_key, load_yaml
from collage_farm.config.schema import (
    DEVICE_KEYS,
    DEVICE_KINDS,
    LINK_KEYS,
    SUBGRAPH_KEYS,
    SYSTEM_KEYS,
    TARGET_KEYS,
    TOOLCHAIN_KEYS,
    DeviceSpec,
    LinkSpec,
)
from collage_farm.core.target import ConfigError, Target, VirtualDevice
from collage_farm.core.transition import DEFAULT_HANDOFF_BYTES_PER_S, DEFAULT_LAUNCH_S
from runners.registry import TOOLCHAINS

if TYPE_CHECKING:
    from importlib.abc import Traversable

__all__ = ["SystemSpec", "builtin_system_path", "builtin_systems", "device_ref", "read_limits",
           "read_system"]


@dataclass(frozen=True)
class SystemSpec:
    """One system file, read and checked (before any app file is merged in)."""

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


@dataclass(frozen=True)
class _Toolchains:
    """The toolchains a system may use and its per-toolchain settings."""

    kinds: dict[str, str]  # toolchain -> the device kind it runs on (the runner registry)
    launch_s: dict[str, float]
    options: dict[str, dict[str, object]]


@dataclass
class _Declared:
    """The devices and targets of a system file read so far (names are unique across them)."""

    devices: dict[str, DeviceSpec] = field(default_factory=dict)
    targets: dict[str, Target] = field(default_factory=dict)
    descriptions: dict[str, str] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)  # target -> the key that declared it
    by_label: dict[str, str] = field(default_factory=dict)  # device label -> device name
    hosts: list[str] = field(default_factory=list)


def device_ref(r: Reader, key: str, ref: object, devices: Mapping[str, DeviceSpec],
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


def read_system(source: str | Path, label: str | None = None,
                expect_name: str | None = None) -> SystemSpec:
    """Read and check one system file; ``expect_name``: the name a built-in file must give."""
    top, file = load_yaml(source, SYSTEM_KEYS, label)
    r = Reader(file)
    check_schema(r, top)
    name = r.value(top, "system", "", "str", default=Path(source).stem)
    check_name(r, "system", name, "system")
    if expect_name is not None and name != expect_name:
        raise r.error("system", f"built-in system file names itself {name!r}", [expect_name])
    description = r.value(top, "description", "", "str", default="")
    tcs = _read_toolchains(r, top.get("toolchains"))
    decl = _read_devices(r, top.get("devices"), tcs)
    links = _read_links(r, top.get("links"), decl.devices, file)
    tr = r.mapping(top.get("transition"), "transition", ("handoff_gb_per_s", "handoff_copy"))
    handoff = r.value(tr, "handoff_gb_per_s", "transition", "number", positive=True)
    if not r.value(tr, "handoff_copy", "transition", "bool", default=True):
        if handoff is not None:
            raise r.error("transition", "handoff_copy: false (partitions share one tensor "
                          "arena) leaves nothing for handoff_gb_per_s to price",
                          ["handoff_copy: false", "handoff_gb_per_s: N"])
        handoff = math.inf
    limits = read_limits(r, top.get("subgraph"))
    return SystemSpec(
        name=name, file=file, description=description, devices=decl.devices,
        targets=decl.targets, target_descriptions=decl.descriptions, links=links,
        launch_s=tcs.launch_s,
        handoff_bytes_per_s=DEFAULT_HANDOFF_BYTES_PER_S if handoff is None else handoff * 1e9,
        host=_host(decl), limits=limits,
    )


def _read_toolchains(r: Reader, raw: object) -> _Toolchains:
    """``toolchains:``: launch overheads and option defaults per toolchain."""
    known = {name: e.device_kind for name, e in TOOLCHAINS.items()}
    launch = dict(DEFAULT_LAUNCH_S)
    opts: dict[str, dict[str, object]] = {}
    for tc, body in r.mapping(raw, "toolchains", None).items():
        path = join_key("toolchains", tc)
        if tc not in known:
            raise r.error(path, f"unknown toolchain {tc!r}", list(known))
        b = r.mapping(body, path, TOOLCHAIN_KEYS)
        us = r.value(b, "launch_us", path, "number", minimum=0)
        if us is not None:
            launch[tc] = us * 1e-6
        opts[tc] = validate_options(r, join_key(path, "options"), tc, b.get("options") or {})
    return _Toolchains(known, launch, opts)


def _read_devices(r: Reader, raw: object, tcs: _Toolchains) -> _Declared:
    """``devices:`` and the targets installed on them."""
    raw_devices = r.mapping(raw, "devices", None)
    if not raw_devices:
        raise r.error("devices", "a system declares at least one device", ["<device name>"])
    decl = _Declared()
    for dname, body in raw_devices.items():
        _read_device(r, decl, tcs, dname, body)
    if len(decl.hosts) > 1:
        raise r.error(join_key(f"devices.{decl.hosts[1]}", "host"),
                      f"conflict: devices {', '.join(map(repr, decl.hosts))} all say host: true",
                      [f"host: true on one device ({decl.hosts[0]})"])
    return decl


def _read_device(r: Reader, decl: _Declared, tcs: _Toolchains, dname: str, body: object
                 ) -> None:
    path = join_key("devices", dname)
    check_name(r, path, dname, "device")
    d = r.mapping(body, path, DEVICE_KEYS)
    kind = r.value(d, "kind", path, "str", required=True, choices=DEVICE_KINDS)
    dev_id = r.value(d, "id", path, "int", default=0, minimum=0)
    scope = r.value(d, "memory_scope", path, "str", default="global")
    if any(c in scope for c in ":/, "):
        raise r.error(join_key(path, "memory_scope"), f"bad memory scope {scope!r}",
                      ["<name without ':', '/', ',' or spaces>"])
    vd = VirtualDevice(kind, dev_id, scope)
    if vd.label in decl.by_label:
        raise r.error(path, f"conflict: device label {vd.label!r} is already used by "
                      f"device {decl.by_label[vd.label]!r}; give it another id or memory_scope",
                      [f"a label other than {vd.label}"])
    decl.by_label[vd.label] = dname
    if r.value(d, "host", path, "bool", default=False):
        decl.hosts.append(dname)
    clock = r.value(d, "clock_mhz", path, "number", positive=True, nullable=True)
    tnames = [_read_target(r, decl, tcs, dname, vd, tname, tbody)
              for tname, tbody in r.mapping(d.get("targets"), join_key(path, "targets"),
                                            None).items()]
    decl.devices[dname] = DeviceSpec(
        name=dname, device=vd,
        model=r.value(d, "model", path, "str", default=""),
        description=r.value(d, "description", path, "str", default=""),
        memory_mib=r.value(d, "memory_mib", path, "number", positive=True, nullable=True),
        clock_hz=None if clock is None else clock * 1e6,
        host=dname in decl.hosts, targets=tuple(tnames),
    )


def _read_target(r: Reader, decl: _Declared, tcs: _Toolchains, dname: str, vd: VirtualDevice,
                 tname: str, tbody: object) -> str:
    """One target installed on device ``dname``; its name."""
    tpath = join_key(join_key("devices", dname), f"targets.{tname}")
    check_name(r, tpath, tname, "target")
    if tname in decl.targets:
        raise r.error(tpath, f"conflict: target {tname!r} is already declared at "
                      f"{decl.where[tname]}", ["a unique target name"])
    tb = r.mapping(tbody, tpath, TARGET_KEYS)
    allowed_here = [t for t, k in tcs.kinds.items() if k == vd.kind]
    tc = r.value(tb, "toolchain", tpath, "str", required=True, choices=list(tcs.kinds))
    if tcs.kinds[tc] != vd.kind:
        raise r.error(join_key(tpath, "toolchain"),
                      f"toolchain {tc!r} runs on {tcs.kinds[tc]!r} devices, not on "
                      f"{vd.kind!r} device {dname!r}", allowed_here)
    opath = join_key(tpath, "options")
    own = validate_options(r, opath, tc, tb.get("options") or {})
    merged = validate_options(r, opath, tc, {**tcs.options.get(tc, {}), **own})
    decl.targets[tname] = Target.make(tname, tc, vd, canonical_options(r, opath, tc, merged))
    decl.descriptions[tname] = r.value(tb, "description", tpath, "str", default="")
    decl.where[tname] = tpath
    return tname


def _host(decl: _Declared) -> VirtualDevice | None:
    """The device that says ``host: true``, else the first CPU, else none."""
    if decl.hosts:
        return decl.devices[decl.hosts[0]].device
    cpus = [d.device for d in decl.devices.values() if d.device.kind == "cpu"]
    return cpus[0] if cpus else None


def _read_links(r: Reader, raw: object, devices: Mapping[str, DeviceSpec], file: str
                ) -> tuple[LinkSpec, ...]:
    """``links:``, each declared direction first, then the implied reverses."""
    raw_links = raw or []
    if not isinstance(raw_links, list):
        raise r.error("links", f"expected a list, got {type(raw_links).__name__}",
                      ["[{from, to, latency_us, gb_per_s, symmetric}]"])
    labels = [d.device.label for d in devices.values()]
    declared: dict[tuple[str, str], str] = {}
    parsed = []
    for i, body in enumerate(raw_links):
        path = f"links[{i}]"
        b = r.mapping(body, path, LINK_KEYS)
        src = device_ref(r, join_key(path, "from"),
                         r.value(b, "from", path, "str", required=True), devices)
        dst = device_ref(r, join_key(path, "to"), r.value(b, "to", path, "str", required=True),
                         devices)
        if src == dst:
            raise r.error(join_key(path, "to"), f"a link needs two different devices, got "
                          f"{src!r} twice", [x for x in labels if x != src])
        lat = r.value(b, "latency_us", path, "number", required=True, minimum=0) * 1e-6
        shared = r.value(b, "shared_memory", path, "bool", default=False)
        if shared and "gb_per_s" in b:
            raise r.error(join_key(path, "gb_per_s"), "a shared_memory link copies nothing: "
                          "its hand-over is latency_us alone", ["latency_us"])
        bw = math.inf if shared else r.value(b, "gb_per_s", path, "number", required=True,
                                             positive=True) * 1e9
        sym = r.value(b, "symmetric", path, "bool", default=True)
        if (src, dst) in declared:
            raise r.error(path, f"conflict: link {src} -> {dst} is already declared at "
                          f"{declared[(src, dst)]}", ["one link per direction"])
        declared[(src, dst)] = path
        parsed.append((src, dst, lat, bw, sym, path))
    links = [LinkSpec(src, dst, lat, bw, f"{file}: {path}")
             for src, dst, lat, bw, _sym, path in parsed]
    links += [LinkSpec(dst, src, lat, bw, f"{file}: {path} (reverse)")
              for src, dst, lat, bw, sym, path in parsed if sym and (dst, src) not in declared]
    return tuple(links)


def read_limits(r: Reader, raw: object) -> dict[str, Any]:
    """``subgraph:``: the candidate limits a file sets (only the keys it states)."""
    m = r.mapping(raw, "subgraph", SUBGRAPH_KEYS)
    out: dict[str, Any] = {}
    for key in ("max_depth", "max_exits"):
        if key in m:
            out[key] = r.value(m, key, "subgraph", "int", minimum=1, nullable=True)
    if "allow_taps" in m:
        out["allow_taps"] = r.value(m, "allow_taps", "subgraph", "bool")
    return out


def _systems_dir() -> Traversable:
    return resources.files("collage_farm.config") / "systems"


def builtin_systems() -> list[str]:
    """Names of the system files shipped with the package."""
    return sorted(p.name[: -len(".yaml")] for p in _systems_dir().iterdir()
                  if p.name.endswith(".yaml"))


def builtin_system_path(name: str) -> Path:
    """The file of the built-in system ``name`` (`ConfigError` naming the others if none)."""
    names = builtin_systems()
    if name not in names:
        raise ConfigError(f"unknown built-in system {name!r}", key="--builtin-system",
                          allowed=names)
    return Path(str(_systems_dir() / f"{name}.yaml"))
