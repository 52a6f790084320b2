"""Last-level-cache (LLC) domains: which cores of a host share a last-level cache.

Why the farm cares: a candidate is timed with the cache state its measure mode asks for
(``network`` mode evicts up to twice the last-level cache before each run). Two runners on cores
of one LLC domain evict each other's working sets, so their numbers are biased against those of
a runner measuring alone (``bench/results/farm-vm.md``: +24% median on 2 cores of one L3). The
farm therefore measures one candidate at a time per LLC domain unless told otherwise
(`collage_farm.farm.slots`).

Detection reads Linux sysfs: each ``cpu<N>/cache/index<K>`` directory with ``level`` 3 names the
cores sharing that cache in ``shared_cpu_list`` (the kernel's cpulist format, ``0-3,8-11``).
Only level 3 counts: a virtual machine often shows private L1/L2 caches and hides the L3 its
cores share, and taking its L2 for the last level would put a runner on every core. No level-3
entry (sysfs absent, or a machine whose caches it does not describe) gives one domain per host.

How a node declares its domains to the farm: a Ray custom resource per domain, named after its
measurement cores (`domain_resource`): ``cpu_llc_0to7`` for cores 0-7, ``cpu_llc_0to3_8to11`` for
``0-3,8-11`` (Ray resource names cannot hold ``-`` or ``,``), with the value 1. Runners measuring
in a domain hold all of it between them, so no second farm lands a runner in it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

LLC_RESOURCE_PREFIX = "cpu_llc_"
_LLC_RE = re.compile(r"^cpu_llc_(\d+(?:to\d+)?(?:_\d+(?:to\d+)?)*)$")
_CPU_DIR_RE = re.compile(r"^cpu(\d+)$")

Domain = tuple[int, ...]


def parse_cpulist(text: str) -> Domain:
    """The cores of a kernel cpulist (``"0-3,8,10-11"``), sorted; ValueError when malformed."""
    cores: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a cpulist: {text!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first:
            raise ValueError(f"not a cpulist: {text!r}")
        cores.update(range(first, last + 1))
    return tuple(sorted(cores))


def _ranges(cores: Iterable[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for c in sorted(set(cores)):
        if out and c == out[-1][1] + 1:
            out[-1] = (out[-1][0], c)
        else:
            out.append((c, c))
    return out


def domain_resource(domain: Iterable[int]) -> str:
    """The Ray resource naming an LLC domain: ``cpu_llc_0to7``, ``cpu_llc_0to3_8to11``."""
    parts = [str(a) if a == b else f"{a}to{b}" for a, b in _ranges(domain)]
    if not parts:
        raise ValueError("an LLC domain has at least one core")
    return LLC_RESOURCE_PREFIX + "_".join(parts)


def parse_domain_resource(name: str) -> Domain | None:
    """The cores a ``cpu_llc_*`` resource names; None for any other (or a malformed) name."""
    m = _LLC_RE.match(name)
    if m is None:
        return None
    cores: set[int] = set()
    for part in m.group(1).split("_"):
        lo, _, hi = part.partition("to")
        first, last = int(lo), int(hi or lo)
        if last < first:
            return None
        cores.update(range(first, last + 1))
    return tuple(sorted(cores))


def llc_domains(cores: Iterable[int], sys_root: str | Path = "/sys") -> tuple[Domain, ...]:
    """The LLC domains of ``cores`` on this host, each restricted to ``cores``, by first core.

    Read from ``<sys_root>/devices/system/cpu/cpu<N>/cache/index*/`` (level 3 only); a core
    sysfs says nothing about joins the domain of the host's other undescribed cores, so with no
    level-3 entry at all the answer is one domain of every core (one domain per host).
    """
    wanted = sorted(set(cores))
    base = Path(sys_root) / "devices" / "system" / "cpu"
    found: dict[Domain, None] = {}
    undescribed: list[int] = []
    for c in wanted:
        shared = _level3_shared(base / f"cpu{c}")
        if shared is None:
            undescribed.append(c)
        else:
            found[tuple(x for x in shared if x in wanted) or (c,)] = None
    domains = _disjoint(found)
    if undescribed:
        domains.append(tuple(c for c in undescribed if not any(c in d for d in domains)))
    return tuple(sorted((d for d in domains if d), key=lambda d: d[0]))


def _level3_shared(cpu_dir: Path) -> Domain | None:
    """The cores sharing ``cpu_dir``'s level-3 cache, or None when sysfs does not say."""
    try:
        entries = sorted(cpu_dir.joinpath("cache").glob("index*"))
    except OSError:
        return None
    for idx in entries:
        try:
            if idx.joinpath("level").read_text().strip() != "3":
                continue
            return parse_cpulist(idx.joinpath("shared_cpu_list").read_text())
        except (OSError, ValueError):
            continue
    return None


def _disjoint(domains: Iterable[Domain]) -> list[Domain]:
    """Merge overlapping core sets (sysfs of one cache seen from different cores agrees, but a
    damaged or partial tree must still give each core exactly one domain)."""
    merged: list[set[int]] = []
    for d in domains:
        s = set(d)
        for m in [m for m in merged if m & s]:
            s |= m
            merged.remove(m)
        merged.append(s)
    return [tuple(sorted(m)) for m in merged]


def node_domains(resources: Mapping[str, float], slot_cores: Iterable[int]
                 ) -> tuple[tuple[Domain, str | None], ...]:
    """A node's LLC domains from its Ray resources: (slot cores in the domain, its resource).

    ``slot_cores`` are the cores the node advertises a ``cpu_slot_<i>`` for. A declared domain
    (``cpu_llc_*``) keeps the slot cores it spans; slot cores no declaration covers form one
    more domain without a resource (a node that declares none: one domain per host).
    """
    slots = sorted(set(slot_cores))
    out: list[tuple[Domain, str | None]] = []
    covered: set[int] = set()
    for name in sorted(resources):
        cores = parse_domain_resource(name)
        if cores is None:
            continue
        mine = tuple(c for c in slots if c in cores and c not in covered)
        if mine:
            out.append((mine, name))
            covered.update(mine)
    rest = tuple(c for c in slots if c not in covered)
    if rest:
        out.append((rest, None))
    return tuple(sorted(out, key=lambda d: d[0][0]))
