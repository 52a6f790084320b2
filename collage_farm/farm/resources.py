"""Measurement slots: what this machine has, and which runner actors a cluster's nodes can hold.

A runner actor is "this slot of that node". Slots are the resources the nodes advertise (see
``cluster.yaml``):

* ``cpu_slot_<i>`` (one per core ``i`` of a node): a CPU runner holding ``{"CPU": 1,
  "cpu_slot_<i>": 1}``, pinned to core ``i`` (Ray resources are logical; the actor pins itself
  with ``os.sched_setaffinity``) and with ``CUDA_VISIBLE_DEVICES`` emptied. If no node of the
  cluster advertises any ``cpu_slot_*`` (a plain cluster), every node's ``CPU`` count gives
  unpinned CPU runners instead, with a warning.
* ``GPU``: a CUDA runner per GPU holding ``{"GPU": 1}`` (Ray sets ``CUDA_VISIBLE_DEVICES``),
  pinned to a core of its own where the embedded Ray kept one (`LocalResources.gpu_cores`).
* ``ethosu_sim``: an Ethos-U (Vela) runner per slot. Vela's estimate is deterministic (cycles
  / clock), so these hold no CPU and need no exclusive core; on a real cluster they live on
  their own node type.

No build task runs outside the runners: with every core of a measurement node owned by a pinned
runner, a free-floating build task would share a core with some runner's timing loop.
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
                    kinds: Iterable[str]) -> LocalResources:
    """Detect cores/GPUs here: a ``cpu_slot_<core>`` per measurement core, a core kept per GPU.

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
    if ethosu:
        res[ETHOSU_RESOURCE] = float(ethosu)
    return LocalResources(n, gpus, res, gpu_cores)


def plan_runners(nodes: Sequence[Mapping[str, Any]], kinds_by_toolchain: Mapping[str, str],
                 *, build_timeout_s: float = 300.0,
                 gpu_cores: Mapping[str, Sequence[int]] | None = None) -> list[RunnerSpec]:
    """One `RunnerSpec` per measurement slot the alive ``nodes`` (``ray.nodes()``) advertise."""
    by_kind: dict[str, list[str]] = {}
    for tc, kind in sorted(kinds_by_toolchain.items()):
        by_kind.setdefault(kind, []).append(tc)
    alive = sorted((n for n in nodes if n.get("Alive", True)), key=lambda n: n["NodeID"])
    any_slots = any(CPU_SLOT_RE.match(k) for n in alive for k in n.get("Resources", {}))
    specs: list[RunnerSpec] = []
    gpu_cores = gpu_cores or {}
    for node in alive:
        res = node.get("Resources", {})
        nid = node["NodeID"]
        short = nid[:8]
        if "cpu" in by_kind:
            tcs = tuple(by_kind["cpu"])
            slots = sorted(int(m.group(1)) for k in res if (m := CPU_SLOT_RE.match(k)))
            for s in slots:
                specs.append(RunnerSpec(f"cpu-{short}-{s}", "cpu", nid, tcs, (s,), 1.0, 0.0,
                                        ((f"cpu_slot_{s}", 1.0),), build_timeout_s))
            if not any_slots:
                for i in range(int(res.get("CPU", 0))):
                    specs.append(RunnerSpec(f"cpu-{short}-u{i}", "cpu", nid, tcs, (), 1.0, 0.0,
                                            (), build_timeout_s))
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
    if "cpu" in by_kind and not any_slots and any(s.kind == "cpu" for s in specs):
        log.warning("farm: no node advertises cpu_slot_* resources; CPU runners are not pinned "
                    "to cores (see cluster.yaml)")
    return specs
