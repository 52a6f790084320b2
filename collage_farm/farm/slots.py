"""How many CPU runners measure at once on each host: the slot decision, and why.

A measurement owns its device. By default a host gets one CPU runner per last-level-cache domain
(`collage_farm.farm.topology`): runners in one domain evict each other's cache and bias each
other's numbers. More runners per domain only where the bias was measured small:

* ``llc-domains`` (`SlotReason.LLC_DOMAINS`, the default): one runner per domain;
* ``measured-bias <= 2%`` (`SlotReason.MEASURED_BIAS`): ``bench/farm.py --record-bias`` timed
  the same candidates with one runner and with ``k`` runners sharing one domain on this host and
  found the median cost at most `BIAS_LIMIT` higher; the host gets ``k`` runners per domain;
* ``forced`` (`SlotReason.FORCED`, ``tune --slots N``): ``N`` runners per host, spread over its
  domains, whatever the bias.

Bias records (`BiasRecord`) live in one small JSON file (`bias_path`: ``$COLLAGE_SLOT_BIAS``,
else ``$XDG_CACHE_HOME/collage-farm/slot-bias.json``, else ``~/.cache/...``) read by the process
that starts the farm, keyed by host name and CPU model: a record applies to a node of that host
name whose CPU is that model. A damaged file is ignored with a warning (one runner per domain).
"""

from __future__ import annotations

import enum
import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from collage_farm.farm.topology import Domain

log = logging.getLogger(__name__)

BIAS_LIMIT = 0.02  # more runners per LLC domain only below this measured concurrency bias
BIAS_ENV = "COLLAGE_SLOT_BIAS"
_VERSION = 1


class SlotReason(enum.Enum):
    """Why a host has the CPU runners it has (the value is the summary's ``why``)."""

    LLC_DOMAINS = "llc-domains"
    MEASURED_BIAS = "measured-bias <= 2%"
    FORCED = "forced"


@dataclass(frozen=True)
class BiasRecord:
    """One concurrency-bias measurement of a host (``bench/farm.py --record-bias``).

    ``bias``: median over candidates of (cost with ``slots`` runners sharing one LLC domain) /
    (cost with one runner) - 1, measured side by side in one run.
    """

    host: str
    cpu: str
    bias: float
    slots: int  # runners sharing one LLC domain in the measurement
    candidates: int
    model: str
    mode: str  # the measure mode the candidates were timed in
    measured_at: str  # ISO 8601

    @property
    def key(self) -> str:
        return record_key(self.host, self.cpu)

    @property
    def allows_more(self) -> bool:
        return self.slots > 1 and self.bias <= BIAS_LIMIT

    def describe(self) -> str:
        return (f"concurrency bias {self.bias:+.1%} measured on {self.host} by bench/farm.py "
                f"({self.slots} runners sharing one LLC domain vs 1, {self.candidates} "
                f"{self.model} candidates, {self.mode} mode, {self.measured_at[:10]})")


def record_key(host: str, cpu: str) -> str:
    return f"{host}|{cpu}"


def bias_path() -> Path:
    """Where bias records are read and written (see the module docstring)."""
    env = os.environ.get(BIAS_ENV)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "collage-farm" / "slot-bias.json"


def load_bias_records(path: Path | None = None) -> dict[str, BiasRecord]:
    """Key (`record_key`) -> record; {} when the file is absent or damaged (warned)."""
    p = path or bias_path()
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("farm: ignoring the slot bias records in %s (%s); one CPU runner per "
                    "LLC domain", p, e)
        return {}
    out: dict[str, BiasRecord] = {}
    try:
        for key, rec in dict(raw.get("records") or {}).items():
            r = BiasRecord(**rec)
            if r.key == key:
                out[key] = r
    except (TypeError, AttributeError, ValueError) as e:
        log.warning("farm: ignoring the slot bias records in %s (%s); one CPU runner per "
                    "LLC domain", p, e)
        return {}
    return out


def save_bias_record(rec: BiasRecord, path: Path | None = None) -> Path:
    """Add or replace ``rec`` in the records file (atomically); the file's path."""
    p = path or bias_path()
    records = load_bias_records(p)
    records[rec.key] = rec
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"version": _VERSION,
                               "records": {k: asdict(v) for k, v in sorted(records.items())}},
                              indent=2) + "\n")
    os.replace(tmp, p)
    return p


@dataclass(frozen=True)
class RunnerSlot:
    """One CPU runner's place: the cores it holds (pinned to the first; empty: unpinned) and
    its share of its LLC domain's resource (when the node declares one)."""

    cores: tuple[int, ...]
    llc: str | None = None
    llc_share: float = 0.0


@dataclass(frozen=True)
class HostSlots:
    """The CPU runners of one node, and why it has that many."""

    node_id: str
    host: str
    domains: tuple[Domain, ...]
    runners: tuple[RunnerSlot, ...]
    why: SlotReason
    record: BiasRecord | None = None  # the host's bias measurement, where one exists
    pinned: bool = True  # False: a node without cpu_slot_* resources (runners not pinned)

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "node": self.node_id[:12], "slots": len(self.runners),
                "why": self.why.value, "llc_domains": [list(d) for d in self.domains],
                "bias": self.record.bias if self.record else None,
                "bias_slots": self.record.slots if self.record else None}

    def describe(self, forced: int | None) -> str:
        """One line: how many runners on this host, and the figure behind it."""
        n, d = len(self.runners), len(self.domains)
        head = f"host {self.host}: {n} CPU measurement slot{'s' if n != 1 else ''}"
        if self.why is SlotReason.FORCED:
            bias = (self.record.describe() if self.record else
                    "concurrency bias not measured here (`bench/farm.py --record-bias`)")
            return f"{head} forced by --slots {forced} ({d} LLC domain(s)); {bias}"
        if self.why is SlotReason.MEASURED_BIAS:
            assert self.record is not None
            return f"{head} over {d} LLC domain(s): {self.record.describe()} <= {BIAS_LIMIT:.0%}"
        tail = (f"; {self.record.describe()} > {BIAS_LIMIT:.0%}" if self.record
                and self.record.slots > 1 else "; more with `tune --slots N` or a bias <= "
                f"{BIAS_LIMIT:.0%} measured by `bench/farm.py --record-bias`")
        return f"{head}, one per last-level-cache domain ({d} domain(s)){tail}"


@dataclass(frozen=True)
class SlotPlan:
    """Every node's CPU runners."""

    hosts: tuple[HostSlots, ...]
    forced: int | None = None

    @property
    def why(self) -> SlotReason:
        """The campaign's reason: forced, else measured bias on any host, else LLC domains."""
        reasons = {h.why for h in self.hosts}
        for r in (SlotReason.FORCED, SlotReason.MEASURED_BIAS):
            if r in reasons:
                return r
        return SlotReason.LLC_DOMAINS

    def to_json(self, used: int | None = None) -> dict[str, Any]:
        """The summary's ``slots``: runners ``used`` (default: planned), why, and per host."""
        planned = sum(len(h.runners) for h in self.hosts)
        return {"used": planned if used is None else used, "why": self.why.value,
                "forced": self.forced, "per_host": [h.to_json() for h in self.hosts]}

    def log(self) -> None:
        """One line per host: info for the default, warning where more runners share a domain."""
        for h in self.hosts:
            level = logging.INFO if h.why is SlotReason.LLC_DOMAINS else logging.WARNING
            log.log(level, "farm: %s", h.describe(self.forced))


def per_domain_counts(domains: Sequence[Domain], forced: int | None,
                      record: BiasRecord | None) -> tuple[tuple[int, ...], SlotReason]:
    """Runners per domain (each at most the domain's cores) and the reason.

    ``forced``: that many per host, dealt to the domains in turn; else ``record.slots`` per
    domain where the record allows more; else one per domain.
    """
    sizes = [len(d) for d in domains]
    if forced is not None:
        counts = [0] * len(sizes)
        left = min(forced, sum(sizes))
        while left > 0:
            for i, size in enumerate(sizes):
                if left > 0 and counts[i] < size:
                    counts[i] += 1
                    left -= 1
        return tuple(counts), SlotReason.FORCED
    if record is not None and record.allows_more:
        return tuple(min(record.slots, s) for s in sizes), SlotReason.MEASURED_BIAS
    return tuple(min(1, s) for s in sizes), SlotReason.LLC_DOMAINS


def split_domain(cores: Domain, count: int) -> list[Domain]:
    """``cores`` cut into ``count`` contiguous groups of near-equal size (``count`` <= cores)."""
    n = len(cores)
    return [cores[i * n // count:(i + 1) * n // count] for i in range(count)]


def host_slots(node_id: str, host: str, domains: Sequence[tuple[Domain, str | None]], *,
               forced: int | None = None, record: BiasRecord | None = None,
               pinned: bool = True) -> HostSlots:
    """A node's CPU runners: ``domains`` as `topology.node_domains` gives them."""
    cores_of = [d for d, _ in domains]
    counts, why = per_domain_counts(cores_of, forced, record)
    if forced is not None and forced > sum(len(d) for d in cores_of):
        log.warning("farm: --slots %d asked for but host %s has %d measurement core(s); "
                    "using %d", forced, host, sum(len(d) for d in cores_of), sum(counts))
    runners: list[RunnerSlot] = []
    for (cores, res), count in zip(domains, counts):
        for group in split_domain(cores, count) if count else []:
            runners.append(RunnerSlot(group if pinned else (), res,
                                      _share(count) if res else 0.0))
    return HostSlots(node_id, host, tuple(cores_of), tuple(runners), why, record, pinned)


def _share(count: int) -> float:
    """Each of ``count`` runners' share of a domain resource, in Ray's 1e-4 granularity."""
    return math.floor(10_000 / count) / 10_000


def records_for_nodes(nodes: Sequence[Mapping[str, Any]], records: Mapping[str, BiasRecord],
                      cpu_of: Callable[[Mapping[str, Any]], str | None]
                      ) -> dict[str, BiasRecord]:
    """Node id -> the bias record of its host name and CPU model, for nodes that have one.

    ``cpu_of(node)`` gives a node's CPU model (None: unknown, no record applies); it is asked
    only for nodes whose host name some record carries.
    """
    hosts = {r.host for r in records.values()}
    out: dict[str, BiasRecord] = {}
    for node in nodes:
        host = node_host(node)
        if host not in hosts:
            continue
        cpu = cpu_of(node)
        rec = records.get(record_key(host, cpu)) if cpu is not None else None
        if rec is not None:
            out[node["NodeID"]] = rec
        else:
            log.info("farm: the slot bias records of host %s are for another CPU than %r; "
                     "not used", host, cpu)
    return out


def node_host(node: Mapping[str, Any]) -> str:
    """A ``ray.nodes()`` entry's host name (its address when Ray gives none)."""
    return str(node.get("NodeManagerHostname") or node.get("NodeManagerAddress") or "?")
