"""Measurement slots: what this machine has, and which runner actors a cluster's nodes can hold.

A runner actor is "this slot of that node". Slots are the resources the nodes advertise (see
``cluster.yaml``):

* ``cpu_slot_<i>`` (one per core ``i`` of a node) and ``cpu_llc_<cores>`` (one per
  last-level-cache domain, `collage_farm.farm.topology`): the CPU runners of a node are decided
  per host by `collage_farm.farm.slots` (by default one per LLC domain; a node declaring no
  domain is one domain). A CPU runner holds ``{"CPU": 1}``, the ``cpu_slot_<i>`` of every core
  of its share of the domain and its share of the domain's ``cpu_llc_*`` resource, is pinned to
  the first of those cores (Ray resources are logical; the actor pins itself with
  ``os.sched_setaffinity``) and has ``CUDA_VISIBLE_DEVICES`` emptied. If no node of the cluster
  advertises any ``cpu_slot_*`` (a plain cluster), each node's ``CPU`` count stands for one
  domain of unpinned CPU runners instead, with a warning.
* ``GPU``: a CUDA runner per GPU holding ``{"GPU": 1}`` (Ray sets ``CUDA_VISIBLE_DEVICES``),
  pinned to a core of its own where the embedded Ray kept one (`LocalResources.gpu_cores`).
* ``ethosu_sim``: an Ethos-U (Vela) runner per slot. Vela's estimate is deterministic (cycles
  / clock), so these hold no CPU and need no exclusive core; on a real cluster they live on
  their own node type.

No build task runs outside the runners: a runner builds each candidate right before measuring
it, in the same single-threaded actor on the same pinned core, so builds are as parallel as
measurements and never overlap a measurement of the same runner.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collage_farm.farm.messages import RunnerSpec
from collage_farm.farm.slots import BiasRecord, HostSlots, SlotPlan, host_slots, node_host
from collage_farm.farm.topology import domain_resource, llc_domains, node_domains
from runners.registry import device_kind_of, toolchain_names

log = logging.getLogger(__name__)

CPU_SLOT_RE = re.compile(r"^cpu_slot_(\d+)$")
ETHOSU_RESOURCE = "ethosu_sim"


def toolchain_kinds(names: Iterable[str] | None) -> dict[str, str]:
    """Device kind of each toolchain (all registered toolchains when ``names`` is None)."""
    if names is None:
        names = toolchain_names()
    out: dict[str, str] = {}
    for n in names:
        try:
            out[n] = device_kind_of(n)
        except Exception as e:
            log.warning("farm: toolchain %r is unknown here (%s); no runner will serve it", n, e)
    return out


def detect_gpus() -> int:
    """GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi -L``."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([d for d in vis.split(",") if d.strip() and d.strip() != "-1"])
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


@dataclass(frozen=True)
class LocalResources:
    """What an embedded Ray is started with, and which cores GPU runners get."""

    num_cpus: int
    num_gpus: int
    resources: dict[str, float]
    gpu_cores: tuple[int, ...]


def local_resources(num_cpus: int | None, num_gpus: int | None, ethosu_slots: int | None,
                    kinds: Iterable[str], sys_root: str = "/sys") -> LocalResources:
    """Detect cores/GPUs here: a ``cpu_slot_<core>`` per measurement core, a ``cpu_llc_*`` per
    last-level-cache domain of those cores (read under ``sys_root``), a core kept per GPU.

    ``num_cpus`` is the number of CPU measurement slots (default: every core this process may
    use, less one per GPU runner, since a GPU runner drives its GPU from a core of its own).
    """
    kinds = set(kinds)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
        range(os.cpu_count() or 1))
    gpus = num_gpus if num_gpus is not None else (detect_gpus() if "cuda" in kinds else 0)
    if num_cpus is None:
        n = len(cores) - gpus if len(cores) > gpus else len(cores)
    else:
        n = num_cpus
        if n > len(cores):
            log.warning("farm: %d CPU slots asked for but only %d cores usable; using %d",
                        n, len(cores), len(cores))
            n = len(cores)
    n = max(1, n)
    slot_cores = cores[:n]
    spare = cores[n:]
    gpu_cores = tuple(spare[i] if i < len(spare) else cores[-1] for i in range(gpus))
    ethosu = ethosu_slots if ethosu_slots is not None else (1 if "ethos-u" in kinds else 0)
    res: dict[str, float] = {f"cpu_slot_{c}": 1.0 for c in slot_cores}
    for domain in llc_domains(slot_cores, sys_root):
        res[domain_resource(domain)] = 1.0
    if ethosu:
        res[ETHOSU_RESOURCE] = float(ethosu)
    return LocalResources(n, gpus, res, gpu_cores)


CPU_SLOT_PREFIX = "cpu_slot_"


def _slot_cores(res: Mapping[str, Any]) -> list[int]:
    return sorted(int(m.group(1)) for k in res if (m := CPU_SLOT_RE.match(k)))


def plan_slots(nodes: Sequence[Mapping[str, Any]], *, forced: int | None = None,
               records: Mapping[str, BiasRecord] | None = None) -> SlotPlan:
    """The CPU runners of each alive node of ``nodes`` (``ray.nodes()``), and why.

    ``forced``: runners per host (``tune --slots``); ``records``: node id -> that host's
    concurrency-bias record (`collage_farm.farm.slots`). Nodes advertising ``cpu_slot_*`` get
    pinned runners per LLC domain; if no node does, each node's ``CPU`` count is one domain of
    unpinned runners.
    """
    alive = sorted((n for n in nodes if n.get("Alive", True)), key=lambda n: n["NodeID"])
    any_slots = any(CPU_SLOT_RE.match(k) for n in alive for k in n.get("Resources", {}))
    records = records or {}
    hosts: list[HostSlots] = []
    for node in alive:
        res = node.get("Resources", {})
        nid, rec = node["NodeID"], records.get(node["NodeID"])
        if any_slots:
            cores = _slot_cores(res)
            if cores:
                hosts.append(host_slots(nid, node_host(node), node_domains(res, cores),
                                        forced=forced, record=rec))
        elif int(res.get("CPU", 0)) >= 1:
            hosts.append(host_slots(nid, node_host(node),
                                    [(tuple(range(int(res["CPU"]))), None)],
                                    forced=forced, record=rec, pinned=False))
    return SlotPlan(tuple(hosts), forced)


def _cpu_specs(host: HostSlots, tcs: tuple[str, ...], build_timeout_s: float
               ) -> list[RunnerSpec]:
    short = host.node_id[:8]
    specs = []
    for i, slot in enumerate(host.runners):
        held = [(f"{CPU_SLOT_PREFIX}{c}", 1.0) for c in slot.cores]
        if slot.llc:
            held.append((slot.llc, slot.llc_share))
        name = f"cpu-{short}-{slot.cores[0]}" if slot.cores else f"cpu-{short}-u{i}"
        specs.append(RunnerSpec(name, "cpu", host.node_id, tcs, slot.cores[:1], 1.0, 0.0,
                                tuple(held), build_timeout_s))
    return specs


def plan_runners(nodes: Sequence[Mapping[str, Any]], kinds_by_toolchain: Mapping[str, str],
                 *, build_timeout_s: float = 300.0,
                 gpu_cores: Mapping[str, Sequence[int]] | None = None,
                 slots: SlotPlan | None = None) -> list[RunnerSpec]:
    """One `RunnerSpec` per runner the alive ``nodes`` (``ray.nodes()``) can hold.

    CPU runners as ``slots`` places them (default: `plan_slots` of ``nodes``, one per LLC
    domain); a CUDA runner per GPU; an Ethos-U runner per ``ethosu_sim``.
    """
    by_kind: dict[str, list[str]] = {}
    for tc, kind in sorted(kinds_by_toolchain.items()):
        by_kind.setdefault(kind, []).append(tc)
    alive = sorted((n for n in nodes if n.get("Alive", True)), key=lambda n: n["NodeID"])
    cpu_hosts = {h.node_id: h for h in (slots or plan_slots(alive)).hosts}
    specs: list[RunnerSpec] = []
    gpu_cores = gpu_cores or {}
    for node in alive:
        res = node.get("Resources", {})
        nid = node["NodeID"]
        short = nid[:8]
        if "cpu" in by_kind and nid in cpu_hosts:
            specs += _cpu_specs(cpu_hosts[nid], tuple(by_kind["cpu"]), build_timeout_s)
        if "cuda" in by_kind:
            cores = list(gpu_cores.get(nid, ()))
            for i in range(int(res.get("GPU", 0))):
                pin = (cores[i],) if i < len(cores) else ()
                specs.append(RunnerSpec(f"cuda-{short}-{i}", "cuda", nid, tuple(by_kind["cuda"]),
                                        pin, 0.0, 1.0, (), build_timeout_s))
        if "ethos-u" in by_kind:
            for i in range(int(res.get(ETHOSU_RESOURCE, 0))):
                specs.append(RunnerSpec(f"ethosu-{short}-{i}", "ethos-u", nid,
                                        tuple(by_kind["ethos-u"]), (), 0.0, 0.0,
                                        ((ETHOSU_RESOURCE, 1.0),), build_timeout_s))
    if any(s.kind == "cpu" and not s.cores for s in specs):
        log.warning("farm: no node advertises cpu_slot_* resources; CPU runners are not pinned "
                    "to cores (see cluster.yaml)")
    return specs
