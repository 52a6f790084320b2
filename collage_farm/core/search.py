"""Phase 3: Dijkstra over covered-node sets (RFC 0062).

A search state is the set of dataflow nodes already covered; the start covers nothing and the
goal covers everything. An edge applies a candidate that (a) does not overlap the covered set,
(b) contains the first uncovered node (applying C then D equals D then C, so one order is
enough), and (c) reads only tensors already produced: every producer of its inputs is covered.
Rule (c) is stricter than the RFC: it makes the search order an execution order, so no plan can
contain partitions that depend on each other in a cycle (two convex partitions can), and it
tells every edge on which device each of its inputs lives.

Edge cost = candidate cost + transition penalty: a launch per partition, a hand-off per tensor
crossing its boundary, and a transfer per input that lives on a device not sharing memory with
the candidate's (see `collage_farm.core.transition`). Because transfers depend on where inputs were
produced, a state also remembers the device of each covered node whose output is still needed;
when all targets share one memory that part of the key is empty and states are plain sets.

Costs are asked from the estimator in batches. With an estimator that offers lower bounds,
edges are evaluated lazily: pushed with their bound, measured (in a batch with their siblings)
only when popped. Bounds never exceed true costs, so the result is still optimal, and a
candidate whose bound cannot beat the best cover is never measured (that is the pruning).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.subgraph import iter_bits
from collage_farm.core.target import CPU0, VirtualDevice
from collage_farm.core.transition import AnalyticTransitionModel, TransitionModel
from estimators.base import CostEstimator

HOST = CPU0
MAX_ALTS = 3


class NoCoverError(RuntimeError):
    """No combination of candidates covers the graph."""

    def __init__(self, message: str, node: str | None = None) -> None:
        super().__init__(message)
        self.node = node


@dataclass(frozen=True)
class PlannedPartition:
    """One partition of the chosen cover, with what the search charged for it."""

    candidate: CandidatePartition
    cost: Cost  # the candidate's own cost (estimate)
    penalty_s: float  # launch + hand-offs + transfers charged on its edge


@dataclass(frozen=True)
class Alternative:
    """A candidate the search could have applied instead of a chosen partition (why it won).

    ``same_nodes``: it covers exactly the chosen partition's nodes (another target), the
    like-for-like comparison; otherwise it starts at the same node and covers ``nodes`` nodes.
    ``status``: ``estimated`` (its cost is known), ``bound`` (never measured: its lower bound
    ``cost_s`` could not beat the plan, i.e. pruned) or ``invalid`` (failed to build or run).
    """

    target: str
    label: str
    nodes: int
    same_nodes: bool
    cost_s: float
    penalty_s: float
    status: str


@dataclass(frozen=True)
class SearchResult:
    partitions: tuple[PlannedPartition, ...]
    total_s: float
    states_expanded: int
    candidates_considered: int
    candidates_estimated: int
    distinct_estimated: int
    search_s: float
    unknown_costs: int = 0
    lazy: bool = False
    #: per chosen partition, the best alternatives from the same search state (runner-ups):
    #: same nodes on other targets first, then other candidates by cost; at most `MAX_ALTS`
    alternatives: tuple[tuple[Alternative, ...], ...] = ()

    @property
    def cost(self) -> Cost:
        return Cost(self.total_s)


@dataclass
class _Edge:
    cand: CandidatePartition
    idx: int
    mask: int
    need: int  # producers of inputs (must be covered)
    device: VirtualDevice
    static_penalty: float  # launch + hand-offs + graph-output transfers
    inputs: tuple[tuple[int, int], ...]  # (producer node, bytes) per input tensor
    graph_in_bytes: int  # bytes read from graph inputs (host)
    produces_live: tuple[int, ...] = field(default=())  # nodes whose outputs leave the candidate


def _prepare(graph: DataflowGraph, cands: Sequence[CandidatePartition],
             transition: TransitionModel) -> list[_Edge]:
    edges = []
    graph_outs = set(graph.graph_outputs)
    for k, c in enumerate(cands):
        sg = c.sub_graph
        t = graph.tensors
        pen = transition.launch_s(c.target)
        # one transfer per tensor that crosses memories (each is its own copy, with its own
        # latency); those from graph inputs start on the host and are charged here, those
        # from other partitions when the producer's device is known (`transfer` below)
        inputs: list[tuple[int, int]] = []
        gin = 0
        for name in sg.input_tensors:
            nb = t[name].nbytes if name in t else 0
            pen += transition.handoff_s(c.target, nb)
            p = graph.producer.get(name)
            if p is None:
                gin += nb
                pen += transition.transfer_s(HOST, c.target.device, nb)
            else:
                inputs.append((p, nb))
        for name in sg.output_tensors:
            nb = t[name].nbytes if name in t else 0
            pen += transition.handoff_s(c.target, nb)
            if name in graph_outs:
                pen += transition.transfer_s(c.target.device, HOST, nb)
        if inputs:  # fed by another partition: a cut into this target
            pen += transition.cut_s(c.target)
        edges.append(_Edge(
            cand=c, idx=k, mask=c.mask, need=sg.input_mask, device=c.target.device,
            static_penalty=pen, inputs=tuple(sorted(inputs)), graph_in_bytes=gin,
            produces_live=tuple(iter_bits(sg.exit_mask)),
        ))
    return edges


def search(
    graph: DataflowGraph,
    candidates: Sequence[CandidatePartition],
    estimator: CostEstimator,
    transition: TransitionModel | None = None,
    *,
    lazy: bool | None = None,
) -> SearchResult:
    """Find the least-cost cover of ``graph`` by non-overlapping ``candidates``.

    ``lazy``: evaluate edges lazily with the estimator's lower bounds (default: when the
    estimator says it has useful bounds, ``estimator.has_lower_bound``).
    """
    t0 = time.perf_counter()
    transition = transition or AnalyticTransitionModel()
    n = len(graph.nodes)
    full = graph.all_mask
    if lazy is None:
        lazy = bool(getattr(estimator, "has_lower_bound", False))

    edges = _prepare(graph, candidates, transition)
    by_first: list[list[_Edge]] = [[] for _ in range(n)]
    covered_any = 0
    for e in edges:
        by_first[e.cand.sub_graph.first].append(e)
        covered_any |= e.mask
    if covered_any != full:
        missing = next(i for i in range(n) if not covered_any >> i & 1)
        nd = graph.nodes[missing]
        raise NoCoverError(
            f"no candidate covers node {nd.name!r} ({nd.op_type}): no target supports it",
            nd.name,
        )

    # track devices only when some candidates do not share memory
    devices = {e.device for e in edges}
    track = any(not a.same_memory(b) for a in devices for b in devices)
    # consumers of each node's outputs, to know when a covered node stops mattering
    succ_mask = [0] * n
    for nd in graph.nodes:
        for s in nd.succs:
            succ_mask[nd.index] |= 1 << s

    costs: dict[str, Cost] = {}  # by fingerprint
    estimated = 0
    unknown = 0

    def fetch(batch: list[_Edge]) -> None:
        nonlocal estimated, unknown
        todo: dict[str, CandidatePartition] = {}
        for e in batch:
            fp = e.cand.fingerprint
            if fp not in costs and fp not in todo:
                todo[fp] = e.cand
        if not todo:
            return
        got = estimator.estimate(list(todo.values()))
        estimated += len(todo)
        for fp, c in zip(todo, got):
            if c.is_unknown:
                unknown += 1
            costs[fp] = c

    if not lazy:
        fetch(edges)

    def edge_cost(e: _Edge) -> float:
        c = costs[e.cand.fingerprint]
        return c.seconds if c.is_known else math.inf

    def transfer(e: _Edge, devmap: dict[int, VirtualDevice]) -> float:
        if not track:
            return 0.0
        total = 0.0
        for p, nb in e.inputs:
            src = devmap.get(p, HOST)
            if not src.same_memory(e.device):
                total += transition.transfer_s(src, e.device, nb)
        return total

    # state key: (covered mask, ((node, device), ...) for covered nodes with uncovered consumers)
    Key = tuple[int, tuple[tuple[int, VirtualDevice], ...]]
    start: Key = (0, ())
    best: dict[Key, float] = {start: 0.0}
    back: dict[Key, tuple[Key, _Edge, float]] = {}
    done: set[Key] = set()
    counter = itertools.count()
    # heap entry: (priority, tie, key, parent, edge, verified, penalty)
    heap: list[tuple[float, int, Key, Key | None, _Edge | None, bool, float]] = [
        (0.0, next(counter), start, None, None, True, 0.0)
    ]
    expanded = 0
    considered = 0
    furthest = 0
    lb_cache: dict[str, float] = {}

    def successors(key: Key, g: float) -> None:
        nonlocal considered
        covered, live = key
        devmap = dict(live)
        first = (~covered & full)
        first = (first & -first).bit_length() - 1
        for e in by_first[first]:
            if e.mask & covered or (e.need & ~covered):
                continue
            considered += 1
            new_cov = covered | e.mask
            if track:
                nl = {nd: d for nd, d in live if succ_mask[nd] & ~new_cov}
                for nd in e.produces_live:
                    if succ_mask[nd] & ~new_cov:
                        nl[nd] = e.device
                new_key: Key = (new_cov, tuple(sorted(nl.items(), key=lambda x: x[0])))
            else:
                new_key = (new_cov, ())
            if new_key in done:
                continue
            pen = e.static_penalty + transfer(e, devmap)
            fp = e.cand.fingerprint
            if fp in costs:
                c = edge_cost(e)
                if math.isinf(c):
                    continue
                pri = g + c + pen
                if pri < best.get(new_key, math.inf):
                    best[new_key] = pri
                    heapq.heappush(heap, (pri, next(counter), new_key, key, e, True, pen))
            else:
                lb = lb_cache.get(fp)
                if lb is None:
                    lbc = estimator.lower_bound(e.cand)
                    lb = lbc.seconds if lbc.is_known else 0.0
                    lb_cache[fp] = lb
                heapq.heappush(heap, (g + lb + pen, next(counter), new_key, key, e, False, pen))

    result_key: Key | None = None
    while heap:
        pri, _, key, parent, e, verified, pen = heapq.heappop(heap)
        if key in done:
            continue
        if not verified:
            assert e is not None and parent is not None
            # measure this edge and, in the same batch, its unmeasured siblings and any other
            # unverified entries at the top of the heap
            batch = [e] + [s for s in by_first[e.cand.sub_graph.first]
                           if s.cand.fingerprint not in costs]
            pending = [(pri, key, parent, e, pen)]
            while heap and not heap[0][5] and len(batch) < 512:
                p2, _, k2, par2, e2, _, pen2 = heapq.heappop(heap)
                if k2 in done:
                    continue
                pending.append((p2, k2, par2, e2, pen2))
                batch.append(e2)
            fetch(batch)
            for _p, k2, par2, e2, pen2 in pending:
                c = edge_cost(e2)
                if math.isinf(c):
                    continue
                g2 = best[par2] + c + pen2
                if g2 < best.get(k2, math.inf):
                    best[k2] = g2
                    heapq.heappush(heap, (g2, next(counter), k2, par2, e2, True, pen2))
            continue
        if pri > best.get(key, math.inf):
            continue
        done.add(key)
        if parent is not None and e is not None:
            back[key] = (parent, e, pen)
        expanded += 1
        cov = key[0]
        if cov == full:
            result_key = key
            break
        low = (~cov & full)
        furthest = max(furthest, (low & -low).bit_length() - 1)
        successors(key, pri)

    if result_key is None:
        nd = graph.nodes[furthest]
        raise NoCoverError(
            f"no valid cover: the search could not get past node {nd.name!r} ({nd.op_type}); "
            f"every candidate containing it failed to build, overlaps, or needs inputs not yet "
            f"computed",
            nd.name,
        )

    parts: list[PlannedPartition] = []
    steps: list[tuple[int, _Edge]] = []
    k = result_key
    while k in back:
        parent, e, pen = back[k]
        parts.append(PlannedPartition(e.cand, costs[e.cand.fingerprint], pen))
        steps.append((parent[0], e))
        k = parent
    parts.reverse()
    steps.reverse()

    def alternatives(covered: int, chosen: _Edge) -> tuple[Alternative, ...]:
        first = (~covered & full)
        first = (first & -first).bit_length() - 1
        alts = []
        for e in by_first[first]:
            if e is chosen or e.mask & covered or (e.need & ~covered):
                continue
            fp = e.cand.fingerprint
            if fp in costs:
                c = costs[fp]
                status = "estimated" if c.is_known and math.isfinite(c.seconds) else "invalid"
                sec = c.seconds if status == "estimated" else math.inf
            elif fp in lb_cache:
                status, sec = "bound", lb_cache[fp]
            else:
                continue
            same = e.mask == chosen.mask
            alts.append(Alternative(e.cand.target.id, e.cand.label(), e.mask.bit_count(), same,
                                    sec, e.static_penalty, status))
        alts.sort(key=lambda a: (not a.same_nodes, a.status == "invalid",
                                 a.cost_s + a.penalty_s))
        return tuple(alts[:MAX_ALTS])

    alts = tuple(alternatives(cov, e) for cov, e in steps)
    return SearchResult(
        partitions=tuple(parts),
        total_s=best[result_key],
        states_expanded=expanded,
        candidates_considered=considered,
        candidates_estimated=estimated,
        distinct_estimated=len(costs),
        search_s=time.perf_counter() - t0,
        unknown_costs=unknown,
        lazy=lazy,
        alternatives=alts,
    )


def static_penalty_s(graph: DataflowGraph, candidate: CandidatePartition,
                     transition: TransitionModel) -> float:
    """The penalty the search charges ``candidate``'s edge, cross-device transfers aside."""
    return _prepare(graph, [candidate], transition)[0].static_penalty
