"""Plans as (node set, target) parts, and the local moves between them.

A plan here is a sequence of `Part`s (`collage_farm.execute.builder`): each a node mask and
the target that runs it. This module turns a `SearchResult` into parts and back
(`parts_of`, `to_search_result`), orders parts so producers run first (`order_parts`), says
whether parts are a valid plan (`why_invalid`: every node in exactly one part, convex parts,
an acyclic part order, every node supported by its part's toolchain, pins respected), and
proposes the local moves refinement tries (`propose_moves`): merge two neighbouring parts onto
either one's target, switch a part's target, move a boundary node into its neighbour's part.
Simulated parts (Ethos-U) are never moved: they have no measured latency to improve.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.pins import PinSet
from collage_farm.core.search import PlannedPartition, SearchResult, static_penalty_s
from collage_farm.core.subgraph import SubGraph, iter_bits
from collage_farm.core.target import Target
from collage_farm.core.transition import AnalyticTransitionModel, TransitionModel
from collage_farm.execute import SIMULATED_TOOLCHAINS
from collage_farm.execute.builder import Part
from runners.registry import capabilities_for_target

log = logging.getLogger(__name__)

__all__ = ["Move", "default_supports", "order_parts", "parts_from_names", "parts_of",
           "plan_signature", "propose_moves", "to_search_result", "why_invalid"]


def parts_of(result: SearchResult) -> list[Part]:
    """The search result's partitions as parts, in its order."""
    return [Part(p.candidate.mask, p.candidate.target) for p in result.partitions]


def order_parts(graph: DataflowGraph, parts: Sequence[Part]) -> list[Part] | None:
    """Parts in an executable order (producers first), or None if they depend in a cycle."""
    owner: dict[int, int] = {}
    for k, p in enumerate(parts):
        for i in iter_bits(p.mask):
            owner[i] = k
    deps: list[set[int]] = [set() for _ in parts]
    for k, p in enumerate(parts):
        for i in iter_bits(p.mask):
            for q in graph.nodes[i].preds:
                o = owner.get(q, k)
                if o != k:
                    deps[k].add(o)
    out: list[Part] = []
    done: set[int] = set()
    pending = list(range(len(parts)))
    while pending:  # stable: keeps the given order where it is already executable
        k = next((k for k in pending if deps[k] <= done), None)
        if k is None:
            return None
        pending.remove(k)
        done.add(k)
        out.append(parts[k])
    return out


def why_invalid(graph: DataflowGraph, parts: Sequence[Part], pins: PinSet | None = None,
                supports: Callable[[Target, int], bool] | None = None) -> str | None:
    """None when ``parts`` is a valid plan, else why not.

    Valid: every node in exactly one part, every part convex, an acyclic partition order, every
    node supported by its part's toolchain (``supports(target, node_index)``, default: the
    toolchain's capabilities) and allowed by ``pins`` (a `collage_farm.core.pins.PinSet`).
    """
    seen = 0
    for p in parts:
        if p.mask & seen:
            return "a node is in two partitions"
        seen |= p.mask
    if seen != graph.all_mask:
        return "a node is in no partition"
    for p in parts:
        if not SubGraph(graph, p.mask).is_convex:
            return f"partition on {p.target.id} is not convex"
    if order_parts(graph, parts) is None:
        return "partitions depend on each other in a cycle"
    sup = supports or default_supports(graph)
    for p in parts:
        for i in iter_bits(p.mask):
            if not sup(p.target, i):
                return f"{p.target.id} does not support {graph.nodes[i].name}"
            if pins and not pins.allowed(graph.nodes[i], p.target):
                return f"pins keep {graph.nodes[i].name} off {p.target.id}"
    return None


def default_supports(graph: DataflowGraph) -> Callable[[Target, int], bool]:
    """``supports(target, node_index)`` from each toolchain's capabilities (memoised)."""
    cache: dict[tuple[str, int], bool] = {}

    def sup(t: Target, i: int) -> bool:
        k = (t.toolchain, i)
        if k not in cache:
            cache[k] = capabilities_for_target(t).supports(graph.nodes[i], graph)
        return cache[k]

    return sup


def plan_signature(parts: Sequence[Part]) -> frozenset[tuple[int, str]]:
    """What makes two plans the same plan: their (mask, target id) parts, in any order."""
    return frozenset((p.mask, p.target.id) for p in parts)


@dataclass(frozen=True)
class Move:
    """A proposed plan: ``kind`` (merge | switch | move-node), what it does, the new parts."""

    kind: str
    description: str
    parts: tuple[Part, ...]


def _neighbour_pairs(graph: DataflowGraph, parts: Sequence[Part]) -> list[tuple[int, int]]:
    owner = {i: k for k, p in enumerate(parts) for i in iter_bits(p.mask)}
    pairs: set[tuple[int, int]] = set()
    for k, p in enumerate(parts):
        for i in iter_bits(p.mask):
            for s in graph.nodes[i].succs:
                o = owner[s]
                if o != k:
                    pairs.add((k, o))
    return sorted(pairs)


def propose_moves(graph: DataflowGraph, parts: Sequence[Part], targets: Sequence[Target]
                  ) -> Iterator[Move]:
    """Local moves in the order they are tried (validity is checked by the caller).

    Order: merges of neighbours on different targets (each cut removed is a cut's cost saved;
    smaller partitions first, the likeliest losers), whole-partition target switches (smaller
    first), boundary-node moves, then merges of same-target neighbours (a launch saved).
    Simulated partitions are never touched.
    """
    measured = [t for t in targets if t.toolchain not in SIMULATED_TOOLCHAINS]
    fixed = {k for k, p in enumerate(parts) if p.target.toolchain in SIMULATED_TOOLCHAINS}
    pairs = [(a, b) for a, b in _neighbour_pairs(graph, parts) if a not in fixed
             and b not in fixed]

    def label(k: int) -> str:
        return f"p{k:03d}[{parts[k].target.id}, {parts[k].size()} nodes]"

    def without(*ks: int) -> list[Part]:
        return [p for j, p in enumerate(parts) if j not in ks]

    moves: list[tuple[tuple, Move]] = []
    for a, b in pairs:
        union = parts[a].mask | parts[b].mask
        same = parts[a].target == parts[b].target
        for t in dict.fromkeys((parts[a].target, parts[b].target)):
            rank = 3 if same else 0
            moves.append(((rank, min(parts[a].size(), parts[b].size()), a, b, t.id), Move(
                "merge", f"merge {label(a)} and {label(b)} on {t.id}",
                tuple([*without(a, b), Part(union, t)]))))
    for k, p in enumerate(parts):
        if k in fixed:
            continue
        for t in measured:
            if t != p.target:
                new = list(parts)
                new[k] = Part(p.mask, t)
                moves.append(((1, p.size(), k, 0, t.id), Move(
                    "switch", f"switch {label(k)} to {t.id}", tuple(new))))
    owner = {i: k for k, p in enumerate(parts) for i in iter_bits(p.mask)}
    for a, b in pairs:
        if parts[a].target == parts[b].target:
            continue
        # nodes of a that feed b, and nodes of b fed by a: move one across
        for src, dst, nodes in (
            (a, b, [i for i in iter_bits(parts[a].mask)
                    if any(owner[s] == b for s in graph.nodes[i].succs)]),
            (b, a, [i for i in iter_bits(parts[b].mask)
                    if any(owner[q] == a for q in graph.nodes[i].preds)]),
        ):
            for i in nodes:
                rest = parts[src].mask & ~(1 << i)
                new = [p for j, p in enumerate(parts) if j not in (src, dst)]
                if rest:
                    new.append(Part(rest, parts[src].target))
                new.append(Part(parts[dst].mask | 1 << i, parts[dst].target))
                moves.append(((2, parts[src].size(), src, i, parts[dst].target.id), Move(
                    "move-node", f"move {graph.nodes[i].name} from {label(src)} to {label(dst)}",
                    tuple(new))))
    moves.sort(key=lambda m: m[0])
    seen: set[frozenset] = {plan_signature(parts)}
    for _, m in moves:
        sig = plan_signature(m.parts)
        if sig not in seen:
            seen.add(sig)
            yield m


def parts_from_names(graph: DataflowGraph,
                     stored: Sequence[tuple[Sequence[str], str]], targets: Sequence[Target]
                     ) -> list[Part] | None:
    """Partitions given as ``(node names, target id)`` as `Part`s of ``graph``; None when a
    name is not a node of ``graph`` or a target id is not among ``targets``."""
    index = {n.name: n.index for n in graph.nodes}
    by_id = {t.id: t for t in targets}
    parts: list[Part] = []
    for names, tid in stored:
        if tid not in by_id or any(n not in index for n in names):
            return None
        parts.append(Part(sum(1 << index[n] for n in names), by_id[tid]))
    return parts


def to_search_result(graph: DataflowGraph, parts: Sequence[Part], base: SearchResult, *,
                     estimate: Callable[[list[CandidatePartition]], list[Cost]] | None = None,
                     transition: TransitionModel | None = None, rule: str = "refine"
                     ) -> SearchResult:
    """``parts`` as a `SearchResult`: partitions the search chose keep their cost, penalty and
    alternatives; new ones are costed by ``estimate`` (the campaign's estimator; unknown when
    absent) and charged the search's penalty. Statistics are the base search's."""
    transition = transition or AnalyticTransitionModel()
    ordered = order_parts(graph, parts)
    if ordered is None:
        raise ValueError("partitions depend on each other in a cycle")
    known = {(p.candidate.mask, p.candidate.target.id): (p, base.alternatives[k]
             if k < len(base.alternatives) else ())
             for k, p in enumerate(base.partitions)}
    new: list[CandidatePartition] = []
    for p in ordered:
        if (p.mask, p.target.id) not in known:
            new.append(CandidatePartition(SubGraph(graph, p.mask), p.target, rule=rule))
    costs: dict[int, Cost] = {}
    if new:
        got: list[Cost] = []
        if estimate is not None:
            try:
                got = list(estimate(new))
            except Exception as e:  # a missing cost must not lose the measured plan
                log.warning("refine: could not estimate %d new partitions: %s", len(new), e)
        for c, cost in zip(new, got or [Cost.unknown()] * len(new)):
            costs[id(c)] = cost
    planned: list[PlannedPartition] = []
    alts = []
    it = iter(new)
    for p in ordered:
        hit = known.get((p.mask, p.target.id))
        if hit is not None:
            planned.append(hit[0])
            alts.append(hit[1])
            continue
        c = next(it)
        planned.append(PlannedPartition(c, costs[id(c)], static_penalty_s(graph, c, transition)))
        alts.append(())
    total = sum(pp.cost.seconds + pp.penalty_s for pp in planned)
    return dataclasses.replace(base, partitions=tuple(planned), total_s=total,
                               alternatives=tuple(alts))
