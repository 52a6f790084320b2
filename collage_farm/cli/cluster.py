"""``collage-farm cluster check FILE``: validate a Ray cluster launcher config offline.

Why: a typo in ``cluster.yaml`` (``min_worker``, ``resorces``) is otherwise found by ``ray up``
minutes into provisioning, or never (a misspelled custom resource just gives the farm no
runners). This check runs without a cloud account and in CI:

1. YAML syntax (line and column of the error);
2. **Ray's own validation** (`collage_farm.farm.cluster`, the farm being the one package that
   imports ``ray``): Ray's ``prepare_config`` (merge with the provider's defaults, as ``ray
   up`` does) then ``validate_config`` (Ray's JSON schema). On a schema error every offending
   key is named with its path and, for a misspelling, the closest valid key. These are private
   Ray APIs: the project pins ``ray==2.60.0``.
3. the farm's own rules: some node type must advertise a runner resource (``cpu_slot_<i>``,
   ``GPU`` or ``ethosu_sim``); a node type's ``cpu_slot_*`` count must not exceed its ``CPU``;
   a last-level-cache domain resource must be spelled ``cpu_llc_<first>to<last>[_...]``;
   a resource that looks like a misspelled runner resource is an error; Ray token
   authentication must not be disabled in start commands; the dashboard should bind to
   localhost (warning).

Exit status 0 when valid (warnings allowed), 2 otherwise, as every user error of the CLI.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collage_farm.farm.cluster import autoscaler_schema, prepare_and_validate
from collage_farm.farm.topology import LLC_RESOURCE_PREFIX, parse_domain_resource

EXIT_OK = 0
EXIT_INVALID = 2
RUNNER_RESOURCES = ("cpu_slot_<i>", "GPU", "ethosu_sim")
_SLOT_RE = re.compile(r"^cpu_slot_(\d+)$")
_UNEXPECTED_RE = re.compile(r"'([^']+)'")


@dataclass
class CheckReport:
    """What the check found; ``errors`` empty means valid."""

    path: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    node_types: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


def _where(path: Iterable[object]) -> str:
    parts = [str(p) for p in path]
    return "/".join(parts) if parts else "(top level)"


def _describe_schema_error(err: Any) -> str:
    """One line naming the bad key of a jsonschema ValidationError."""
    where = _where(err.absolute_path)
    if err.validator == "additionalProperties":
        props = sorted((err.schema.get("properties") or {}).keys())
        inst = err.instance if isinstance(err.instance, Mapping) else {}
        bad = [k for k in inst if k not in props] or _UNEXPECTED_RE.findall(err.message)
        msgs = []
        for key in bad:
            close = difflib.get_close_matches(str(key), props, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            msgs.append(f"unknown key {key!r} at {where}{hint}")
        return "; ".join(msgs)
    if err.validator == "required":
        missing = _UNEXPECTED_RE.findall(err.message)
        key = missing[0] if missing else "?"
        return f"missing required key {key!r} at {where}"
    return f"bad value at {where}: {err.message}"


def _schema_errors(config: Mapping[str, Any]) -> list[str]:
    """Every schema error of ``config``, keys named (same schema file Ray validates with)."""
    import jsonschema

    validator = jsonschema.Draft7Validator(autoscaler_schema())
    errs = sorted(validator.iter_errors(dict(config)), key=lambda e: list(map(str, e.path)))
    out: list[str] = []
    for e in errs:
        line = _describe_schema_error(e)
        if line not in out:
            out.append(line)
    return out


def _farm_checks(config: Mapping[str, Any], report: CheckReport) -> None:
    types = config.get("available_node_types") or {}
    any_runner = False
    for name, nt in types.items():
        res = dict((nt or {}).get("resources") or {})
        report.node_types[str(name)] = {str(k): float(v) for k, v in res.items()
                                        if isinstance(v, (int, float))}
        slots = [k for k in res if _SLOT_RE.match(str(k))]
        if slots or res.get("GPU") or res.get("ethosu_sim"):
            any_runner = True
        cpu = res.get("CPU")
        if slots and isinstance(cpu, (int, float)) and len(slots) > cpu:
            report.errors.append(
                f"available_node_types/{name}: {len(slots)} cpu_slot_* resources but CPU={cpu}: "
                "one slot per core")
        for k in res:
            key = str(k)
            if key in ("CPU", "GPU", "memory", "object_store_memory", "ethosu_sim") or \
                    _SLOT_RE.match(key) or parse_domain_resource(key) is not None:
                continue
            if key.startswith(LLC_RESOURCE_PREFIX):
                report.errors.append(
                    f"available_node_types/{name}/resources: {key!r} is not an LLC domain "
                    "resource: cpu_llc_<first>to<last>, ranges joined by '_' (cpu_llc_0to7, "
                    "cpu_llc_0to3_8to11)")
                continue
            if difflib.get_close_matches(key, ["cpu_slot_0", "cpu_llc_0to7", "ethosu_sim",
                                               "GPU", "CPU"],
                                         n=1, cutoff=0.7) or key.lower().startswith(
                                             ("cpu_slot", "ethos")):
                report.errors.append(
                    f"available_node_types/{name}/resources: {key!r} looks like a misspelled "
                    f"runner resource; the farm knows {', '.join(RUNNER_RESOURCES)}")
    if types and not any_runner:
        report.errors.append("no node type advertises a runner resource "
                             f"({', '.join(RUNNER_RESOURCES)}): the farm would have no runner")
    starts = [str(c) for key in ("head_start_ray_commands", "worker_start_ray_commands")
              for c in (config.get(key) or [])]
    for cmd in starts:
        if re.search(r"RAY_AUTH_MODE=['\"]?disabled", cmd):
            report.errors.append("a start command disables Ray token authentication "
                                 "(RAY_AUTH_MODE=disabled); keep it on outside tests")
    head = " ".join(str(c) for c in (config.get("head_start_ray_commands") or []))
    if "ray start" in head and not re.search(r"--dashboard-host[= ](127\.0\.0\.1|localhost)",
                                             head):
        report.warnings.append("head_start_ray_commands: bind the dashboard to localhost "
                               "(--dashboard-host=127.0.0.1) and reach it over SSH")


def check_cluster_config(path: str | Path) -> CheckReport:
    """Validate a cluster launcher YAML file: syntax, Ray's validation, the farm's rules."""
    import yaml

    report = CheckReport(str(path))
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        report.errors.append(f"cannot read {p}: {e.strerror or e}")
        return report
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        report.errors.append(f"YAML syntax error{where}: {getattr(e, 'problem', None) or e}")
        return report
    if not isinstance(raw, dict):
        report.errors.append("a cluster config is a YAML mapping at the top level")
        return report

    # 1. the user's own keys against Ray's schema (before defaults hide a misspelled key)
    user_errors = _schema_errors(raw) if "provider" in raw else []
    # 2. Ray's own preparation and validation, exactly as `ray up` does
    try:
        prepared = prepare_and_validate(raw)
    except BaseException as e:  # jsonschema.ValidationError, ValueError, cli_logger.abort
        if isinstance(e, KeyboardInterrupt):
            raise
        ray_msg = getattr(e, "message", None) or str(e).splitlines()[0] if str(e) else \
            type(e).__name__
        if user_errors:
            report.errors.extend(user_errors)
        elif hasattr(e, "absolute_path"):
            report.errors.append(_describe_schema_error(e))
        else:
            report.errors.append(f"Ray rejects the config: {ray_msg}")
        return report
    if user_errors:  # Ray accepted it after merging defaults; the user's keys still matter
        report.errors.extend(user_errors)
        return report
    _farm_checks(prepared, report)
    return report


def _runner_summary(resources: Mapping[str, float]) -> str:
    slots = sum(1 for k in resources if _SLOT_RE.match(k))
    domains = sum(1 for k in resources if parse_domain_resource(k) is not None) or 1
    parts = [f"{slots} cpu slots in {domains} LLC domain(s)"] if slots else []
    parts += [f"{k} x{v:g}" for k, v in resources.items() if k in ("GPU", "ethosu_sim") and v]
    return ", ".join(parts) or "no runner resources"


def add_cluster_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("cluster", help="Ray cluster configs (cluster.yaml)")
    sub = p.add_subparsers(dest="cluster_cmd", required=True)
    c = sub.add_parser("check", help="validate a cluster launcher config offline "
                       "(Ray's schema + the farm's runner resources)")
    c.add_argument("file", help="cluster launcher YAML, e.g. cluster.yaml")
    c.add_argument("--json", action="store_true", help="print the report as JSON")


def run_cluster(args: argparse.Namespace) -> int:
    if getattr(args, "cluster_cmd", None) != "check":
        print("collage-farm cluster: use `cluster check FILE`", file=sys.stderr)
        return EXIT_INVALID
    import logging

    # prepare_config logs at INFO ("setting max workers ..."): not the user's business here
    logging.getLogger("ray.autoscaler").setLevel(logging.WARNING)
    report = check_cluster_config(args.file)
    if getattr(args, "json", False):
        print(json.dumps({"file": report.path, "ok": report.ok, "errors": report.errors,
                          "warnings": report.warnings, "node_types": report.node_types},
                         indent=2))
    else:
        for w in report.warnings:
            print(f"{report.path}: warning: {w}", file=sys.stderr)
        for e in report.errors:
            print(f"{report.path}: error: {e}", file=sys.stderr)
        if report.ok:
            kinds = ", ".join(f"{n} ({_runner_summary(r)})" for n, r in report.node_types.items())
            print(f"{report.path}: ok: valid Ray cluster config; node types: {kinds}")
    return EXIT_OK if report.ok else EXIT_INVALID
