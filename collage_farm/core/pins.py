"""Pins: user constraints that keep chosen nodes on a chosen device or target.

Why pins. The search picks whatever is fastest, but a deployment may have reasons the cost
model does not see: an operator that must stay on the CPU for numerical parity, a layer that has
to run on the NPU because the host is busy, a debugging session that wants one block on one
toolchain. A pin says so: nodes selected by name glob (``fnmatch``, case-sensitive) and/or op
type go only to candidates whose target is on the given device or is the given target.

Semantics:

* A pin selects nodes by ``node`` (a glob over node names, ``"attn_*"``) and/or ``op`` (a glob
  over op types, ``"Softmax"``); with both, a node must match both.
* It allows targets by ``device`` or ``target`` (exactly one): ``device`` is a device kind
  (``"cpu"``: any CPU), ``kind:id`` (``"cuda:0"``, any memory scope of that device) or a full
  label (``"cpu:0/mcu"``); ``target`` is a target name.
* A node matched by several pins must satisfy all of them.
* A candidate is kept only when its target satisfies every pin of every node it covers
  (`filter_candidates`). Pins only remove candidates, so a pinned plan can never be cheaper than
  the unpinned one; the difference is the cost of the constraint.

Errors come before any measurement (`check_pins`, and `filter_candidates` which the campaign
calls right after phase 2), as `ConfigError` (`collage_farm.core.target`, re-exported by
`collage_farm.config`) naming the node and the pins:

* a pinned node that no given target can satisfy (conflicting pins, or a target not selected);
* a pinned node left with no candidate at all (its allowed targets' toolchains cannot run it);
* a pin that matches no node of the model. This is an error, not a warning: a glob with a typo
  would otherwise silently constrain nothing while the user believes it holds. Mark a pin
  ``optional: true`` when an app file is shared by models that do not all have such nodes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Protocol

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.target import ConfigError, Target, VirtualDevice

__all__ = ["Pin", "PinSet", "check_pins", "device_matches", "filter_candidates"]


class _NodeLike(Protocol):
    name: str
    op_type: str


def device_matches(spec: str, device: VirtualDevice) -> bool:
    """Whether ``device`` is the one ``spec`` names (kind, ``kind:id`` or full label)."""
    if "/" in spec:
        return device.label == spec or (
            spec.endswith("/global") and device.label == spec[: -len("/global")])
    if ":" in spec:
        return f"{device.kind}:{device.device_id}" == spec
    return device.kind == spec


@dataclass(frozen=True)
class Pin:
    """Nodes matching ``node``/``op`` may only run on ``device`` (or as ``target``)."""

    node: str | None = None  # glob over node names
    op: str | None = None  # glob over op types
    device: str | None = None  # "cpu", "cuda:0", "cpu:0/mcu"
    target: str | None = None  # a target name
    optional: bool = False  # matching no node is fine
    origin: str = field(default="", compare=False)  # "app.yaml: pins[0]", for messages

    def __post_init__(self) -> None:
        if self.node is None and self.op is None:
            raise ValueError("a pin needs 'node' (name glob) and/or 'op' (op type)")
        if (self.device is None) == (self.target is None):
            raise ValueError("a pin names exactly one of 'device' or 'target'")

    def matches(self, node: _NodeLike) -> bool:
        return (self.node is None or fnmatchcase(node.name, self.node)) and (
            self.op is None or fnmatchcase(node.op_type, self.op))

    def allows(self, target: Target) -> bool:
        if self.target is not None:
            return target.name == self.target
        assert self.device is not None
        return device_matches(self.device, target.device)

    def describe(self) -> str:
        sel = " ".join(f"{k}={v!r}" for k, v in (("node", self.node), ("op", self.op)) if v)
        to = f"device {self.device}" if self.device is not None else f"target {self.target}"
        where = f" ({self.origin})" if self.origin else ""
        return f"pin {sel} -> {to}{where}"

    def __str__(self) -> str:
        return self.describe()


@dataclass(frozen=True)
class PinSet:
    """A collection of pins, asked per node and per candidate."""

    pins: tuple[Pin, ...] = ()

    @staticmethod
    def of(pins: PinSet | Iterable[Pin] | None) -> PinSet:
        if pins is None:
            return PinSet()
        return pins if isinstance(pins, PinSet) else PinSet(tuple(pins))

    def __len__(self) -> int:
        return len(self.pins)

    def __iter__(self) -> Iterator[Pin]:
        return iter(self.pins)

    def __bool__(self) -> bool:
        return bool(self.pins)

    def for_node(self, node: _NodeLike) -> tuple[Pin, ...]:
        return tuple(p for p in self.pins if p.matches(node))

    def allowed(self, node: _NodeLike, target: Target) -> bool:
        """True when ``target`` satisfies every pin that matches ``node``."""
        return all(p.allows(target) for p in self.pins if p.matches(node))

    def candidate_allowed(self, candidate: CandidatePartition) -> bool:
        t = candidate.target
        return all(self.allowed(n, t) for n in candidate.sub_graph.nodes)

    def unmatched(self, nodes: Iterable[_NodeLike]) -> list[Pin]:
        """Non-optional pins that match none of ``nodes``."""
        nodes = list(nodes)
        return [p for p in self.pins if not p.optional and not any(p.matches(n) for n in nodes)]


def _pins_text(pins: Sequence[Pin]) -> str:
    return "; ".join(p.describe() for p in pins)


def _check_unmatched(ps: PinSet, nodes: Sequence[_NodeLike], graph_name: str) -> None:
    bad = ps.unmatched(nodes)
    if bad:
        p = bad[0]
        ops = sorted({n.op_type for n in nodes})
        allowed = ([f"node names such as {', '.join(n.name for n in nodes[:5])}"
                    + (", ..." if len(nodes) > 5 else "")] if p.node else []) + (
            [f"op types: {', '.join(ops)}"] if p.op else [])
        raise ConfigError(f"{p.describe()} matches no node of model {graph_name!r} "
                          "(mark it optional: true if that is expected)",
                          key="pins", allowed=allowed)


def check_pins(graph: object, targets: Sequence[Target], pins: PinSet | Iterable[Pin] | None
               ) -> dict[str, tuple[Pin, ...]]:
    """Fail early when pins cannot hold; return the pinned nodes and their pins by node name.

    ``graph`` is a `DataflowGraph` (anything with ``.nodes`` and ``.name``). Raises `ConfigError`
    when a non-optional pin matches no node, or a pinned node has no target among ``targets``
    that satisfies all its pins. Toolchain support is checked later by `filter_candidates`.
    """
    ps = PinSet.of(pins)
    if not ps:
        return {}
    nodes = list(graph.nodes)  # type: ignore[attr-defined]
    name = getattr(graph, "name", "model")
    _check_unmatched(ps, nodes, name)
    known = {t.name for t in targets}
    for p in ps:
        if p.target is not None and p.target not in known:
            raise ConfigError(f"{p.describe()} names a target that is not being searched",
                              key="pins", allowed=sorted(known))
    pinned: dict[str, tuple[Pin, ...]] = {}
    for n in nodes:
        mine = ps.for_node(n)
        if not mine:
            continue
        pinned[n.name] = mine
        if not any(all(p.allows(t) for p in mine) for t in targets):
            raise ConfigError(
                f"node {n.name!r} ({n.op_type}) is pinned by {_pins_text(mine)}, and no target "
                "satisfies all of them", key="pins",
                allowed=[f"{t.name}@{t.device.label}" for t in targets])
    return pinned


def filter_candidates(candidates: Sequence[CandidatePartition],
                      pins: PinSet | Iterable[Pin] | None, *, check: bool = True
                      ) -> list[CandidatePartition]:
    """Keep the candidates whose target satisfies every pin of every node they cover.

    With ``check`` (the default) it also raises `ConfigError`, before anything is measured, when
    a non-optional pin matches no node, or when the pins leave a node that had candidates with
    none (naming the node, its pins and the targets that could have run it).
    """
    ps = PinSet.of(pins)
    cands = list(candidates)
    if not ps or not cands:
        return cands
    graph = cands[0].sub_graph.graph
    nodes = graph.nodes
    if check:
        _check_unmatched(ps, nodes, getattr(graph, "name", "model"))
    node_pins = {n.index: ps.for_node(n) for n in nodes}
    pinned_mask = 0
    for i, mine in node_pins.items():
        if mine:
            pinned_mask |= 1 << i
    kept = []
    allowed_cache: dict[tuple[int, Target], bool] = {}
    for c in cands:
        m = c.mask & pinned_mask
        ok = True
        while m and ok:
            low = m & -m
            i = low.bit_length() - 1
            key = (i, c.target)
            got = allowed_cache.get(key)
            if got is None:
                got = all(p.allows(c.target) for p in node_pins[i])
                allowed_cache[key] = got
            ok = got
            m ^= low
        if ok:
            kept.append(c)
    if check:
        before = after = 0
        for c in cands:
            before |= c.mask
        for c in kept:
            after |= c.mask
        lost = before & ~after
        if lost:
            i = (lost & -lost).bit_length() - 1
            n = nodes[i]
            had = sorted({f"{c.target.name}@{c.target.device.label}" for c in cands
                          if c.mask >> i & 1})
            if node_pins[i]:
                why = (f"is pinned by {_pins_text(node_pins[i])}, but no candidate of an allowed "
                       "target covers it (its allowed targets' toolchains cannot run it, or no "
                       "such target is being searched)")
            else:
                why = ("is not pinned, but every candidate covering it also covers a pinned node "
                       "on a target the pins forbid")
            raise ConfigError(f"node {n.name!r} ({n.op_type}) {why}; targets that could run it",
                              key="pins", allowed=had)
    return kept
