"""Phase 3: Dijkstra over covered-node sets (RFC 0062).

A search state is the set of dataflow nodes already covered; the start covers nothing and the
goal covers everything. An edge applies a candidate that (a) does not overlap the covered set,
(b) contains the first uncovered node (applying C then D equals D then C, so one order is
enough), and (c) reads only tensors already produced: every producer of its inputs is covered.
Rule (c) is stricter than the RFC: it makes the search order an execution order, so no plan can
contain partitions that depend on each other in a cycle (two convex partitions can), and it
tells every edge on which device each of its inputs lives.

Edge cost = candidate cost + transition penalty: a launch per partition, a hand-off per tensor
crossing its boundary, a transfer per input that lives on a device not sharing memory with
the candidate's, and a cut charge, by the bytes of the tensors it reads from other partitions,
when another partition feeds it (see `collage_farm.core.transition`). Because transfers depend
on where inputs were produced, a state also remembers the device of each covered node whose
output is still needed; when all targets share one memory that part of the key is empty and
states are plain sets.

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
from typing import NamedTuple

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.estimator import CostEstimator
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.subgraph import iter_bits
from collage_farm.core.target import CPU0, VirtualDevice
from collage_farm.core.transition import AnalyticTransitionModel, TransitionModel

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
                pen += transition.requantise_s(c.target, t[name].size if name in t else 0)
        for name in sg.output_tensors:
            nb = t[name].nbytes if name in t else 0
            pen += transition.handoff_s(c.target, nb)
            if name in graph_outs:
                pen += transition.transfer_s(c.target.device, HOST, nb)
            if any(not c.mask >> i & 1 for i in graph.consumers.get(name, ())):
                pen += transition.requantise_s(c.target, t[name].size if name in t else 0)
        if inputs:  # fed by another partition: a cut into this target, by the bytes entering
            pen += transition.cut_s(c.target, sum(nb for _, nb in inputs))
        edges.append(_Edge(
            cand=c, idx=k, mask=c.mask, need=sg.input_mask, device=c.target.device,
            static_penalty=pen, inputs=tuple(sorted(inputs)), graph_in_bytes=gin,
            produces_live=tuple(iter_bits(sg.exit_mask)),
        ))
    return edges


class SearchState(NamedTuple):
    """A Dijkstra state: the covered nodes, and where the still-needed ones left their outputs.

    ``covered`` is a node bitset. ``live`` lists ``(node, device)`` for every covered node
    whose outputs still have an uncovered consumer, sorted by node, when the targets do not all
    share one memory (transfers depend on it); it is empty otherwise, so states are plain sets.
    """

    covered: int
    live: tuple[tuple[int, VirtualDevice], ...] = ()


@dataclass(frozen=True)
class _Step:
    """A heap entry's payload (the heap orders ``(priority, tie, _Step)``; ties are unique, so
    steps are never compared). ``verified``: the edge's cost is known, so ``priority`` is the
    state's path cost; otherwise ``priority`` uses the edge's lower bound."""

    state: SearchState
    parent: SearchState | None
    edge: _Edge | None
    verified: bool
    penalty_s: float


#: how many unverified heap entries one estimator batch may take
BATCH = 512


class _Dijkstra:
    """One search: the edges grouped by first node, costs fetched in batches, the frontier."""

    def __init__(self, graph: DataflowGraph, edges: list[_Edge], estimator: CostEstimator,
                 transition: TransitionModel) -> None:
        self.graph = graph
        self.estimator = estimator
        self.transition = transition
        self.edges = edges
        self.n = len(graph.nodes)
        self.full = graph.all_mask
        self.by_first: list[list[_Edge]] = [[] for _ in range(self.n)]
        covered_any = 0
        for e in edges:
            self.by_first[e.cand.sub_graph.first].append(e)
            covered_any |= e.mask
        if covered_any != self.full:
            missing = next(i for i in range(self.n) if not covered_any >> i & 1)
            nd = graph.nodes[missing]
            raise NoCoverError(
                f"no candidate covers node {nd.name!r} ({nd.op_type}): no target supports it",
                nd.name,
            )
        # track devices only when some candidates do not share memory
        devices = {e.device for e in edges}
        self.track = any(not a.same_memory(b) for a in devices for b in devices)
        # consumers of each node's outputs, to know when a covered node stops mattering
        self.succ_mask = [0] * self.n
        for nd in graph.nodes:
            for s in nd.succs:
                self.succ_mask[nd.index] |= 1 << s
        self.costs: dict[str, Cost] = {}  # by fingerprint
        self.lb_cache: dict[str, float] = {}
        self.estimated = 0
        self.unknown = 0
        self.expanded = 0
        self.considered = 0
        self.furthest = 0
        self.best: dict[SearchState, float] = {}
        self.back: dict[SearchState, tuple[SearchState, _Edge, float]] = {}
        self.done: set[SearchState] = set()
        self.heap: list[tuple[float, int, _Step]] = []
        self.counter = itertools.count()

    # -- costs
    def fetch(self, batch: Sequence[_Edge]) -> None:
        """Ask the estimator, in one batch, for every edge's cost not yet known."""
        todo: dict[str, CandidatePartition] = {}
        for e in batch:
            fp = e.cand.fingerprint
            if fp not in self.costs and fp not in todo:
                todo[fp] = e.cand
        if not todo:
            return
        got = self.estimator.estimate(list(todo.values()))
        self.estimated += len(todo)
        for fp, c in zip(todo, got):
            if c.is_unknown:
                self.unknown += 1
            self.costs[fp] = c

    def edge_cost(self, e: _Edge) -> float:
        c = self.costs[e.cand.fingerprint]
        return c.seconds if c.is_known else math.inf

    def lower_bound(self, e: _Edge) -> float:
        fp = e.cand.fingerprint
        lb = self.lb_cache.get(fp)
        if lb is None:
            lbc = self.estimator.lower_bound(e.cand)
            lb = self.lb_cache[fp] = lbc.seconds if lbc.is_known else 0.0
        return lb

    def transfer(self, e: _Edge, devmap: dict[int, VirtualDevice]) -> float:
        """Copies of ``e``'s inputs produced on a device that does not share its memory."""
        if not self.track:
            return 0.0
        total = 0.0
        for p, nb in e.inputs:
            src = devmap.get(p, HOST)
            if not src.same_memory(e.device):
                total += self.transition.transfer_s(src, e.device, nb)
        return total

    # -- the frontier
    def push(self, priority: float, step: _Step) -> None:
        heapq.heappush(self.heap, (priority, next(self.counter), step))

    def first_uncovered(self, covered: int) -> int:
        low = ~covered & self.full
        return (low & -low).bit_length() - 1

    def next_state(self, state: SearchState, e: _Edge) -> SearchState:
        new_cov = state.covered | e.mask
        if not self.track:
            return SearchState(new_cov)
        live = {nd: d for nd, d in state.live if self.succ_mask[nd] & ~new_cov}
        for nd in e.produces_live:
            if self.succ_mask[nd] & ~new_cov:
                live[nd] = e.device
        return SearchState(new_cov, tuple(sorted(live.items(), key=lambda x: x[0])))

    def successors(self, state: SearchState, g: float) -> None:
        """Push every edge that may extend ``state`` (path cost ``g``): at its true cost when
        known, else at its lower bound, to be verified when popped."""
        covered = state.covered
        devmap = dict(state.live)
        for e in self.by_first[self.first_uncovered(covered)]:
            if e.mask & covered or (e.need & ~covered):
                continue
            self.considered += 1
            new = self.next_state(state, e)
            if new in self.done:
                continue
            pen = e.static_penalty + self.transfer(e, devmap)
            if e.cand.fingerprint in self.costs:
                c = self.edge_cost(e)
                if math.isinf(c):
                    continue
                pri = g + c + pen
                if pri < self.best.get(new, math.inf):
                    self.best[new] = pri
                    self.push(pri, _Step(new, state, e, True, pen))
            else:
                self.push(g + self.lower_bound(e) + pen, _Step(new, state, e, False, pen))

    def verify(self, priority: float, step: _Step) -> None:
        """Measure a popped unverified edge with its unmeasured siblings and the other
        unverified entries at the top of the heap (one batch), and push those that now have
        a finite cost at their true path cost."""
        assert step.edge is not None and step.parent is not None
        e = step.edge
        batch = [e] + [s for s in self.by_first[e.cand.sub_graph.first]
                       if s.cand.fingerprint not in self.costs]
        pending = [step]
        while self.heap and not self.heap[0][2].verified and len(batch) < BATCH:
            _p, _, other = heapq.heappop(self.heap)
            if other.state in self.done:
                continue
            pending.append(other)
            assert other.edge is not None
            batch.append(other.edge)
        self.fetch(batch)
        for st in pending:
            assert st.edge is not None and st.parent is not None
            c = self.edge_cost(st.edge)
            if math.isinf(c):
                continue
            g = self.best[st.parent] + c + st.penalty_s
            if g < self.best.get(st.state, math.inf):
                self.best[st.state] = g
                self.push(g, _Step(st.state, st.parent, st.edge, True, st.penalty_s))

    def run(self, lazy: bool) -> SearchState:
        """Pop states until the full cover; the state reached (raises `NoCoverError`)."""
        if not lazy:
            self.fetch(self.edges)
        start = SearchState(0)
        self.best[start] = 0.0
        self.push(0.0, _Step(start, None, None, True, 0.0))
        while self.heap:
            pri, _, step = heapq.heappop(self.heap)
            if step.state in self.done:
                continue
            if not step.verified:
                self.verify(pri, step)
                continue
            if pri > self.best.get(step.state, math.inf):
                continue
            self.done.add(step.state)
            if step.parent is not None and step.edge is not None:
                self.back[step.state] = (step.parent, step.edge, step.penalty_s)
            self.expanded += 1
            if step.state.covered == self.full:
                return step.state
            self.furthest = max(self.furthest, self.first_uncovered(step.state.covered))
            self.successors(step.state, pri)
        nd = self.graph.nodes[self.furthest]
        raise NoCoverError(
            f"no valid cover: the search could not get past node {nd.name!r} ({nd.op_type}); "
            f"every candidate containing it failed to build, overlaps, or needs inputs not yet "
            f"computed",
            nd.name,
        )

    # -- the answer
    def path(self, goal: SearchState) -> tuple[list[PlannedPartition], list[tuple[int, _Edge]]]:
        """The chosen partitions in execution order, and (covered-before, edge) per step."""
        parts: list[PlannedPartition] = []
        steps: list[tuple[int, _Edge]] = []
        k = goal
        while k in self.back:
            parent, e, pen = self.back[k]
            parts.append(PlannedPartition(e.cand, self.costs[e.cand.fingerprint], pen))
            steps.append((parent.covered, e))
            k = parent
        parts.reverse()
        steps.reverse()
        return parts, steps

    def alternatives(self, covered: int, chosen: _Edge) -> tuple[Alternative, ...]:
        """The runner-ups of ``chosen`` from the state that covered ``covered``."""
        alts = []
        for e in self.by_first[self.first_uncovered(covered)]:
            if e is chosen or e.mask & covered or (e.need & ~covered):
                continue
            fp = e.cand.fingerprint
            if fp in self.costs:
                c = self.costs[fp]
                status = "estimated" if c.is_known and math.isfinite(c.seconds) else "invalid"
                sec = c.seconds if status == "estimated" else math.inf
            elif fp in self.lb_cache:
                status, sec = "bound", self.lb_cache[fp]
            else:
                continue
            same = e.mask == chosen.mask
            alts.append(Alternative(e.cand.target.id, e.cand.label(), e.mask.bit_count(), same,
                                    sec, e.static_penalty, status))
        alts.sort(key=lambda a: (not a.same_nodes, a.status == "invalid",
                                 a.cost_s + a.penalty_s))
        return tuple(alts[:MAX_ALTS])


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
    if lazy is None:
        lazy = bool(estimator.has_lower_bound)
    d = _Dijkstra(graph, _prepare(graph, candidates, transition), estimator, transition)
    goal = d.run(lazy)
    parts, steps = d.path(goal)
    return SearchResult(
        partitions=tuple(parts),
        total_s=d.best[goal],
        states_expanded=d.expanded,
        candidates_considered=d.considered,
        candidates_estimated=d.estimated,
        distinct_estimated=len(d.costs),
        search_s=time.perf_counter() - t0,
        unknown_costs=d.unknown,
        lazy=lazy,
        alternatives=tuple(d.alternatives(cov, e) for cov, e in steps),
    )


def static_penalty_s(graph: DataflowGraph, candidate: CandidatePartition,
                     transition: TransitionModel) -> float:
    """The penalty the search charges ``candidate``'s edge, cross-device transfers aside."""
    return _prepare(graph, [candidate], transition)[0].static_penalty
