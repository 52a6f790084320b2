"""``collage-farm targets``: see which systems and targets exist, and what a config merges to.

Why a command of its own: targets come from layered YAML (a system file, an app file, built-in
systems), and the measure key decides which cost-table rows a target can reuse. Before spending
hours of device time a user should be able to see exactly which targets, options, devices, pins
and transition links a configuration resolves to, and whether two spellings of a target share
measurements. ``targets list`` shows the built-in systems (or a merged configuration with
``--system/--app/--builtin-system``); ``targets show NAME`` shows one system or target in full.
Both take ``--json``.

`add_config_args` and `config_from_args` are the shared plumbing for every command that reads a
configuration (``tune``, ``compare``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from collage_farm.config import ConfigError, FarmConfig, builtin_systems, load_config
from collage_farm.core.target import BUILTIN_TARGETS, Target
from runners.options import effective_options
from runners.registry import get_toolchain

__all__ = ["add_config_args", "add_targets_parser", "config_from_args", "run_targets",
           "toolchain_unavailable"]


class _DefaultTargets(str):
    """Marks a ``--targets`` value that the user did not type (so an app's selection wins)."""

    __slots__ = ()


def add_config_args(parser: argparse.ArgumentParser, *, see_also: bool = True) -> None:
    """Add ``--system FILE``, ``--app FILE`` and ``--builtin-system NAME`` to ``parser``
    (``see_also``: the group's title points to ``targets list``, which ``targets`` itself
    does not need).

    If ``parser`` already has a ``--targets`` option with a default, that default is marked, so
    that with a configuration an untyped ``--targets`` falls back to the app's selection.
    """
    g = parser.add_argument_group("target configuration" + (
        " (see `collage-farm targets list`)" if see_also else ""))
    g.add_argument("--system", metavar="FILE", help="system YAML: devices, toolchains, links")
    g.add_argument("--app", metavar="FILE",
                   help="app YAML: targets to search, options, pins, limits")
    g.add_argument("--builtin-system", metavar="NAME",
                   help=f"a built-in system: {', '.join(_safe_builtin_systems())}")
    for action in parser._actions:
        if action.dest == "targets" and isinstance(action.default, str):
            parser.set_defaults(targets=_DefaultTargets(action.default))


def _safe_builtin_systems() -> list[str]:
    try:
        return builtin_systems()
    except OSError:  # pragma: no cover - package data missing
        return []


def config_from_args(args: argparse.Namespace) -> FarmConfig | None:
    """The merged configuration the arguments name, or ``None`` when they name none.

    When a configuration is given and ``--targets`` was left at its default, ``args.targets``
    is cleared so that ``cfg.resolve_targets(args.targets)`` gives the app's selection.
    """
    system = getattr(args, "system", None)
    app = getattr(args, "app", None)
    builtin = getattr(args, "builtin_system", None)
    if system is None and app is None and builtin is None:
        return None
    cfg = load_config(system, app, builtin_system=builtin)
    if isinstance(getattr(args, "targets", None), _DefaultTargets):
        args.targets = None
    return cfg


def add_targets_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("targets", help="built-in systems, targets and merged configs")
    ts = p.add_subparsers(dest="targets_cmd", required=True)
    ls = ts.add_parser("list", help="built-in systems and their targets, or a merged config",
                       description="List the built-in systems and their targets (toolchain, "
                       "device, measure key, options), or, with --system/--app/"
                       "--builtin-system, the targets, devices, pins and links that "
                       "configuration merges to.")
    ls.add_argument("--json", action="store_true", help="print JSON")
    ls.add_argument("--check", action="store_true",
                    help="also say which targets can build and measure on this machine, and "
                    "why not (imports every toolchain: a node's readiness check)")
    add_config_args(ls, see_also=False)
    sh = ts.add_parser("show", help="one system or target: devices, toolchains, options, "
                                    "measure key")
    sh.add_argument("name", help="a built-in system or a target name")
    sh.add_argument("--json", action="store_true", help="print JSON")
    add_config_args(sh, see_also=False)


def run_targets(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if args.targets_cmd == "list":
        data = _list_data(cfg)
        if getattr(args, "check", False):
            _annotate_available(data)
        print(json.dumps(data, indent=2, default=str) if args.json else _list_text(data, cfg))
        return 0
    if args.targets_cmd == "show":
        data = _show_data(args.name, cfg)
        print(json.dumps(data, indent=2, default=str) if args.json else _show_text(data))
        return 0
    raise ConfigError(f"unknown targets command {args.targets_cmd!r}", allowed=["list", "show"])


# ------------------------------------------------------------------------------------------


def _link_line(lk: dict[str, Any]) -> str:
    """One link of a configuration's JSON view as text."""
    head = f"  link {lk['from']} -> {lk['to']}: {lk['latency_s'] * 1e6:g} us"
    if lk.get("bytes_per_s") is None:
        return head + " (shared memory: no copy)"
    return head + f" + bytes / {lk['bytes_per_s'] / 1e9:g} GB/s"


def _catalogue_target(t: Target) -> dict[str, Any]:
    return {"name": t.name, "toolchain": t.toolchain, "device": t.device.label,
            "options": dict(t.options), "effective_options": effective_options(t),
            "measure_key": t.measure_key}


def _list_data(cfg: FarmConfig | None) -> dict[str, Any]:
    if cfg is not None:
        return {"config": cfg.to_dict()}
    systems = {}
    in_systems: set[str] = set()
    for name in builtin_systems():
        c = load_config(builtin_system=name)
        systems[name] = {"description": c.description,
                         "targets": {n: c.target_dict(n) for n in c.targets}}
        in_systems.update(c.targets)
    others = {n: _catalogue_target(t) for n, t in BUILTIN_TARGETS.items() if n not in in_systems}
    return {"systems": systems, "other_builtin_targets": others}


def _target_line(d: dict[str, Any]) -> str:
    opts = ",".join(f"{k}={v}" for k, v in d["options"].items())
    mark = "*" if d.get("selected") else " "
    here = ("" if "available" not in d
            else f"  [here: {'yes' if d['available'] is None else 'no'}]")
    return (f"  {mark} {d['name']:<18} {d['toolchain']:<13} {d['device']:<12} "
            f"{d['measure_key']:<24} {opts}{here}").rstrip()


def _target_dicts(data: dict[str, Any]) -> list[dict[str, Any]]:
    if "config" in data:
        return list(data["config"]["targets"].values())
    out = [t for s in data["systems"].values() for t in s["targets"].values()]
    return out + list(data["other_builtin_targets"].values())


def _annotate_available(data: dict[str, Any]) -> None:
    """Add ``available`` (None or why not) to every target, each toolchain asked once."""
    why: dict[str, str | None] = {}
    for t in _target_dicts(data):
        if t["toolchain"] not in why:
            why[t["toolchain"]] = toolchain_unavailable(t["toolchain"])
        t["available"] = why[t["toolchain"]]
    data["unavailable_toolchains"] = {k: v for k, v in why.items() if v is not None}


def _list_text(data: dict[str, Any], cfg: FarmConfig | None) -> str:
    out: list[str] = []
    if cfg is not None:
        c = data["config"]
        app = f", app {c['app']}" if c["app"] else ""
        out.append(f"system {c['system']}{app}: {c['description']}".rstrip(": "))
        out.append(f"  from: {', '.join(c['sources'])}")
        out.append(f"  host: {c['host']}; transition model: {c['transition']}")
        out.append("  devices:")
        for n, d in c["devices"].items():
            extra = ", ".join(x for x in (
                d["model"], f"{d['memory_mib']:g} MiB" if d["memory_mib"] else "",
                f"{d['clock_hz'] / 1e6:g} MHz" if d["clock_hz"] else "") if x)
            out.append(f"    {n:<8} {d['label']:<12} {extra}")
        out.append("  targets (* = selected):")
        out += [_target_line(t) for t in c["targets"].values()]
        if c["pins"]:
            out.append("  pins:")
            out += [f"    {p}" for p in c["pins"]]
        out.append(f"  subgraph limits: {c['subgraph_limits']}")
        out += [_link_line(lk) for lk in c["links"]]
        return "\n".join(out + _unavailable_text(data))
    for name, s in data["systems"].items():
        out.append(f"{name}: {s['description']}")
        out += [_target_line({**t, "selected": False}) for t in s["targets"].values()]
    if data["other_builtin_targets"]:
        out.append("other built-in targets (usable with --targets; no built-in system file):")
        out += [_target_line(t) for t in data["other_builtin_targets"].values()]
    return "\n".join(out + _unavailable_text(data))


def _unavailable_text(data: dict[str, Any]) -> list[str]:
    bad = data.get("unavailable_toolchains") or {}
    return ([f"not available here: {k}: {v}" for k, v in bad.items()]
            if "unavailable_toolchains" in data else [])


def toolchain_unavailable(toolchain: str) -> str | None:
    """None when ``toolchain`` can build and measure on this machine, else why not (what
    ``targets list --check`` prints)."""
    try:
        return get_toolchain(toolchain).available()
    except Exception as e:  # an unknown or broken toolchain is an answer, not a crash
        return f"{type(e).__name__}: {e}"


def _show_data(name: str, cfg: FarmConfig | None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "system": None, "target": None}
    if cfg is not None:
        if name == cfg.system_name:
            out["system"] = cfg.to_dict()
        if name in cfg.targets:
            out["target"] = cfg.target_dict(name)
            dev = cfg.device_of(name)
            if dev is not None:
                out["target"]["device_detail"] = {
                    "name": dev.name, "model": dev.model, "memory_mib": dev.memory_mib,
                    "clock_hz": dev.clock_hz}
            out["target"]["systems"] = [cfg.system_name]
            out["target"]["available"] = toolchain_unavailable(out["target"]["toolchain"])
        if out["system"] is None and out["target"] is None:
            raise ConfigError(f"{name!r} is neither the system nor a target of this "
                              "configuration", key="name",
                              allowed=[cfg.system_name, *cfg.targets])
        return out
    systems = builtin_systems()
    if name in systems:
        out["system"] = load_config(builtin_system=name).to_dict()
    found_in = []
    for s in systems:
        c = load_config(builtin_system=s)
        if name in c.targets:
            found_in.append(s)
            if out["target"] is None:
                out["target"] = c.target_dict(name)
    if out["target"] is None and name in BUILTIN_TARGETS:
        out["target"] = _catalogue_target(BUILTIN_TARGETS[name])
    if out["target"] is not None:
        out["target"]["systems"] = found_in
        out["target"]["builtin"] = name in BUILTIN_TARGETS
        out["target"]["available"] = toolchain_unavailable(out["target"]["toolchain"])
    if out["system"] is None and out["target"] is None:
        known = sorted(set(systems) | set(BUILTIN_TARGETS) | {
            n for s in systems for n in load_config(builtin_system=s).targets})
        raise ConfigError(f"unknown system or target {name!r}", key="name", allowed=known)
    return out


def _show_text(data: dict[str, Any]) -> str:
    out: list[str] = []
    s = data["system"]
    if s is not None:
        out.append(f"system {s['system']}: {s['description']}")
        for n, d in s["devices"].items():
            out.append(f"  device {n} = {d['label']} ({d['kind']}"
                       + (f", {d['model']}" if d["model"] else "")
                       + (f", {d['memory_mib']:g} MiB" if d["memory_mib"] else "")
                       + (f", {d['clock_hz'] / 1e6:g} MHz" if d["clock_hz"] else "")
                       + (", host" if d["host"] else "") + ")")
            for t in d["targets"]:
                td = s["targets"][t]
                out.append(f"    target {t}: toolchain {td['toolchain']}, options "
                           f"{td['options']}, measure key {td['measure_key']}")
        out += [_link_line(lk) for lk in s["links"]]
    t = data["target"]
    if t is not None:
        out.append(f"target {t['name']}")
        out.append(f"  toolchain:         {t['toolchain']}")
        out.append(f"  device:            {t['device']}")
        out.append(f"  options:           {t['options']}")
        out.append(f"  effective options: {t['effective_options']}")
        out.append(f"  measure key:       {t['measure_key']}")
        if "launch_s" in t:
            out.append(f"  launch overhead:   {t['launch_s'] * 1e6:g} us")
        if t.get("systems"):
            out.append(f"  in systems:        {', '.join(t['systems'])}")
        if t.get("description"):
            out.append(f"  description:       {t['description']}")
        if "available" in t:
            out.append(f"  available here:    {t['available'] or 'yes'}")
    return "\n".join(out)
