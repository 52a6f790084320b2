"""Partition rules: how each target proposes candidate partitions (RFC 0062, phases 1-2).

Following the RFC, a small algebra of *base* rules that read the dataflow graph and *combinator*
rules that transform the candidates of sub-rules gives every toolchain style its candidates:

* base: `OpPredicatePartitionRule` (one candidate per node a toolchain supports),
  `SegmentPartitionRule` (runs of the topological order between thin cuts, whole model too),
  `OpCallByKindPartitionRule` (nodes of fusable kinds), `PatternPartitionRule` (DAG patterns such
  as Conv->Add->Relu), `HostPartitionRule` (cheap shape arithmetic left to the host);
* combinators: `UnionPartitionRule`, `CombinePartitionRule` (grow candidates by joining
  neighbours when a `CombinerRule` allows it, as TVM's FuseOps does, or join-anything for graph
  compilers), `OnlyValidPartitionRule` (SubGraphConfig limits), `CompositePartitionRule` and
  `PrimitivePartitionRule` (labels).

`default_spec(target, capabilities)` builds the usual rule tree for a target from its
toolchain's style: a *library* toolchain gets single operators and known patterns; a *graph
compiler* gets every convex region of supported nodes up to a depth.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import DataflowGraph, Node, OpKind
from collage_farm.core.subgraph import SubGraph, SubGraphConfig, iter_bits
from collage_farm.core.target import Target

log = logging.getLogger(__name__)

NodePredicate = Callable[[Node, DataflowGraph], bool]


def _all_nodes(node: Node, graph: DataflowGraph) -> bool:
    return True


@dataclass(frozen=True)
class PartitionSpec:
    """A partition rule paired with the target its candidates are for."""

    rule: PartitionRule
    target: Target

    def candidates(self, graph: DataflowGraph) -> list[CandidatePartition]:
        return self.rule.candidates(graph, self)


class PartitionRule(abc.ABC):
    """Finds candidate partitions for a target in a dataflow graph.

    Contract: `candidates` returns candidates whose target is ``spec.target``, with no two
    equal sub-graphs; candidates may overlap. Rules are immutable and reusable across graphs.
    """

    name: str = "rule"

    @abc.abstractmethod
    def candidates(self, graph: DataflowGraph, spec: PartitionSpec) -> list[CandidatePartition]:
        """All candidates this rule proposes."""

    def __str__(self) -> str:
        return self.name


def _dedup(cands: Sequence[CandidatePartition]) -> list[CandidatePartition]:
    seen: dict[int, CandidatePartition] = {}
    for c in cands:
        seen.setdefault(c.mask, c)
    return list(seen.values())


# ------------------------------------------------------------------------------------------
# base rules


@dataclass(frozen=True)
class OpPredicatePartitionRule(PartitionRule):
    """A singleton candidate for every node the predicate accepts (a toolchain's capability)."""

    predicate: NodePredicate = _all_nodes
    name: str = "op_predicate"

    def candidates(self, graph: DataflowGraph, spec: PartitionSpec) -> list[CandidatePartition]:
        return [
            CandidatePartition(SubGraph(graph, 1 << n.index), spec.target, self.name)
            for n in graph.nodes
            if self.predicate(n, graph)
        ]


@dataclass(frozen=True)
class OpCallByKindPartitionRule(PartitionRule):
    """A singleton candidate for every node of a fusable kind (<= ``max_kind``)."""

    max_kind: OpKind = OpKind.OUT_ELEMWISE_FUSABLE
    predicate: NodePredicate = _all_nodes
    name: str = "op_call_by_kind"

    def candidates(self, graph: DataflowGraph, spec: PartitionSpec) -> list[CandidatePartition]:
        return [
            CandidatePartition(SubGraph(graph, 1 << n.index), spec.target, self.name)
            for n in graph.nodes
            if n.kind <= self.max_kind and self.predicate(n, graph)
        ]


@dataclass(frozen=True)
class Pattern:
    """A DAG pattern over ONNX ops: ``op_types`` at the root, ``inputs`` matched positionally
    against the producers of the node's inputs (``None`` in ``op_types`` = wildcard that matches
    any tensor, produced inside or not, and adds no node)."""

    op_types: tuple[str, ...] | None = None
    inputs: tuple[Pattern, ...] = ()
    commutative: bool = False

    def match(self, graph: DataflowGraph, node: Node) -> int | None:
        """Bitset of matched nodes rooted at ``node``, or None."""
        if self.op_types is None:
            return 0
        if node.op_type not in self.op_types:
            return None
        if not self.inputs:
            return 1 << node.index
        orders = [self.inputs]
        if self.commutative and len(self.inputs) == 2:
            orders.append((self.inputs[1], self.inputs[0]))
        for order in orders:
            mask = 1 << node.index
            ok = True
            for pat, tensor in zip(order, node.inputs):
                if pat.op_types is None:
                    continue
                p = graph.producer.get(tensor)
                sub = None if p is None else pat.match(graph, graph.nodes[p])
                if sub is None:
                    ok = False
                    break
                mask |= sub
            if ok and len(order) <= len(node.inputs):
                return mask
        return None


def op(types: str, *inputs: Pattern, commutative: bool = False) -> Pattern:
    """``op("Relu", op("Add", op("Conv"), ANY, commutative=True))``; ``types`` may be "A|B"."""
    return Pattern(tuple(types.split("|")), tuple(inputs), commutative)


ANY = Pattern(None)


@dataclass(frozen=True)
class PatternPartitionRule(PartitionRule):
    """A candidate for every sub-graph matching ``pattern`` (matches may overlap)."""

    pattern: Pattern
    predicate: NodePredicate = _all_nodes
    name: str = "pattern"

    def candidates(self, graph: DataflowGraph, spec: PartitionSpec) -> list[CandidatePartition]:
        out = []
        for n in graph.nodes:
            m = self.pattern.match(graph, n)
            if m and all(self.predicate(graph.nodes[i], graph) for i in iter_bits(m)):
                out.append(CandidatePartition(SubGraph(graph, m), spec.target, self.name))
        return _dedup(out)


_HOST_OPS = frozenset(
    "Shape Size Gather Unsqueeze Squeeze Concat Slice Cast Range ConstantOfShape Reshape "
    "Add Sub Mul Div Equal Where Expand".split()
)


@dataclass(frozen=True)
class HostPartitionRule(PartitionRule):
    """Candidates for shape arithmetic that can be left behind on the host.

    Nodes computing on small integer tensors (the output of ``Shape`` and friends) are cheap
    anywhere; offering them as host singletons keeps them from splitting accelerator regions.
    """

    max_elements: int = 16
    name: str = "host"

    def candidates(self, graph: DataflowGraph, spec: PartitionSpec) -> list[CandidatePartition]:
        out = []
        for n in graph.nodes:
            if n.op_type not in _HOST_OPS:
                continue
            infos = [i for i in graph.output_infos(n) if i is not None]
            if infos and all(
                i.dtype in ("int64", "int32") and i.size <= self.max_elements for i in infos
            ):
                sg = SubGraph(graph, 1 << n.index)
                out.append(CandidatePartition(sg, spec.target, self.name))
        return out


@dataclass(frozen=True)
class SegmentPartitionRule(PartitionRule):
    """Runs of consecutive post-DFS nodes between *cut points*, for graph compilers.

    A contiguous interval of a topological order is always convex (a path between two of its
    nodes only visits indices in between). A cut point is a position where at most
    ``max_live`` node outputs are still needed later, so a segment between two cut points has
    a thin boundary. Offering every segment between cut points (the whole model included)
    lets the search compare one-toolchain-for-everything against mixes of large pieces, not
    just small fused regions whose launch and hand-off penalties add up.
    """

    predicate: NodePredicate = _all_nodes
    max_live: int = 1
    max_cuts: int = 64
    name: str = "segment"

    def cut_points(self, graph: DataflowGraph) -> list[int]:
        n = len(graph.nodes)
        delta = [0] * (n + 1)
        for nd in graph.nodes:
            last = max(nd.succs, default=nd.index)
            if nd.is_external:
                last = n
            if last > nd.index:
                delta[nd.index] += 1
                delta[last] -= 1  # live on (index, last): counted at positions index..last-1
        cuts, live = [], 0
        for k in range(n - 1):
            live += delta[k]
            if live <= self.max_live:
                cuts.append(k)
        if len(cuts) > self.max_cuts:  # keep them evenly spread
            step = len(cuts) / self.max_cuts
            cuts = [cuts[int(i * step)] for i in range(self.max_cuts)]
        return [-1, *cuts, n - 1]

    def candidates(self, graph: DataflowGraph, spec: PartitionSpec) -> list[CandidatePartition]:
        n = len(graph.nodes)
        bad = [0] * (n + 1)  # prefix counts of unsupported nodes
        for nd in graph.nodes:
            bad[nd.index + 1] = bad[nd.index] + (0 if self.predicate(nd, graph) else 1)
        cuts = self.cut_points(graph)
        out = []
        for a in range(len(cuts) - 1):
            lo = cuts[a] + 1
            for b in range(a + 1, len(cuts)):
                hi = cuts[b]
                if bad[hi + 1] - bad[lo]:
                    break  # every longer segment from lo contains the unsupported node
                if hi - lo < 1:
                    continue  # singletons come from the other rules
                mask = ((1 << (hi + 1)) - 1) ^ ((1 << lo) - 1)
                out.append(CandidatePartition(SubGraph(graph, mask), spec.target, self.name))
        return out


# ------------------------------------------------------------------------------------------
# combinators


@dataclass(frozen=True)
class UnionPartitionRule(PartitionRule):
    sub_rules: tuple[PartitionRule, ...]
    name: str = "union"

    def candidates(self, graph: DataflowGraph, spec: PartitionSpec) -> list[CandidatePartition]:
        return _dedup([c for r in self.sub_rules for c in r.candidates(graph, spec)])


@dataclass(frozen=True)
class OnlyValidPartitionRule(PartitionRule):
    sub_rule: PartitionRule
    config: SubGraphConfig = SubGraphConfig()
    name: str = "only_valid"

    def candidates(self, graph: DataflowGraph, spec: PartitionSpec) -> list[CandidatePartition]:
        return [c for c in self.sub_rule.candidates(graph, spec)
                if c.sub_graph.is_valid(self.config)]


@dataclass(frozen=True)
class CompositePartitionRule(PartitionRule):
    """Labels the sub-rule's candidates as a composite (a library call), e.g. ``conv_add_relu``."""

    label: str
    sub_rule: PartitionRule
    name: str = "composite"

    def candidates(self, graph: DataflowGraph, spec: PartitionSpec) -> list[CandidatePartition]:
        return [replace(c, composite=self.label, rule=f"composite:{self.label}")
                for c in self.sub_rule.candidates(graph, spec)]


@dataclass(frozen=True)
class PrimitivePartitionRule(PartitionRule):
    """Marks the sub-rule's candidates as partitions (kernels) handed to the toolchain whole."""

    sub_rule: PartitionRule
    name: str = "primitive"

    def candidates(self, graph: DataflowGraph, spec: PartitionSpec) -> list[CandidatePartition]:
        return [replace(c, rule=f"primitive({c.rule})")
                for c in self.sub_rule.candidates(graph, spec)]


class CombinerRule(abc.ABC):
    """Decides whether an upstream and a downstream sub-graph may be joined."""

    @abc.abstractmethod
    def allows(self, graph: DataflowGraph, up: int, down: int) -> bool:
        """``up`` feeds ``down`` (bitsets); may they become one candidate?"""


@dataclass(frozen=True)
class AllCombinerRule(CombinerRule):
    """Join anything (graph compilers take arbitrary convex regions)."""

    def allows(self, graph: DataflowGraph, up: int, down: int) -> bool:
        return True


@dataclass(frozen=True)
class KindCombinerRule(CombinerRule):
    """Join when every edge from ``up`` to ``down`` goes from a node of kind <= ``up_max`` to a
    node of kind <= ``down_max`` (TVM FuseOps style, e.g. out-elemwise-fusable -> broadcast)."""

    up_max: OpKind
    down_max: OpKind
    up_min: OpKind = OpKind.ELEMWISE
    down_min: OpKind = OpKind.ELEMWISE

    def allows(self, graph: DataflowGraph, up: int, down: int) -> bool:
        found = False
        for i in iter_bits(up):
            n = graph.nodes[i]
            for s in n.succs:
                if down >> s & 1:
                    if not (self.up_min <= n.kind <= self.up_max):
                        return False
                    k = graph.nodes[s].kind
                    if not (self.down_min <= k <= self.down_max):
                        return False
                    found = True
        return found


# TVM's default fusion combiners.
TVM_COMBINERS: tuple[CombinerRule, ...] = (
    KindCombinerRule(OpKind.OUT_ELEMWISE_FUSABLE, OpKind.BROADCAST,
                     up_min=OpKind.OUT_ELEMWISE_FUSABLE),
    KindCombinerRule(OpKind.BROADCAST, OpKind.COMM_REDUCE, down_min=OpKind.COMM_REDUCE),
    KindCombinerRule(OpKind.INJECTIVE, OpKind.INJECTIVE),
)


@dataclass(frozen=True)
class CombinePartitionRule(PartitionRule):
    """Grows candidates by joining neighbouring sub-candidates, keeping every intermediate size.

    Starting from the sub-rule's candidates, each round joins a candidate with one *base*
    candidate that touches it (an edge between them) when some combiner allows the join and the
    result is valid under ``config``; all results (not just the largest) are kept. Rounds stop at
    a fixpoint, at ``max_rounds``, or when ``max_candidates`` is reached (logged).
    """

    sub_rule: PartitionRule
    combiners: tuple[CombinerRule, ...] = (AllCombinerRule(),)
    config: SubGraphConfig = SubGraphConfig(max_depth=4)
    max_rounds: int = 64
    max_candidates: int = 20000
    name: str = "combine"

    def candidates(self, graph: DataflowGraph, spec: PartitionSpec) -> list[CandidatePartition]:
        base = _dedup(self.sub_rule.candidates(graph, spec))
        base_masks = [c.mask for c in base]
        by_node: dict[int, list[int]] = {}
        for k, m in enumerate(base_masks):
            for i in iter_bits(m):
                by_node.setdefault(i, []).append(k)
        result: dict[int, CandidatePartition] = {c.mask: c for c in base}
        frontier = list(base_masks)
        join_all = any(isinstance(c, AllCombinerRule) for c in self.combiners)
        nodes = graph.nodes
        for _ in range(self.max_rounds):
            new: list[int] = []
            for m in frontier:
                sg = SubGraph(graph, m)
                neighbour_nodes = sg.input_mask | sg.output_mask
                for nb in iter_bits(neighbour_nodes):
                    for k in by_node.get(nb, ()):
                        b = base_masks[k]
                        if b & m:
                            continue
                        u = m | b
                        if u in result:
                            continue
                        if not join_all and not self._allowed(graph, m, b, nodes):
                            continue
                        usg = SubGraph(graph, u)
                        if not usg.is_valid(self.config):
                            continue
                        result[u] = CandidatePartition(usg, spec.target, self.name)
                        new.append(u)
                        if len(result) >= self.max_candidates:
                            log.warning(
                                "%s: candidate cap %d reached for %s on %s; raise max_candidates "
                                "or lower max_depth", self.name, self.max_candidates,
                                spec.target.id, graph.name)
                            return list(result.values())
            if not new:
                break
            frontier = new
        return list(result.values())

    def _allowed(self, graph: DataflowGraph, a: int, b: int, nodes: list[Node]) -> bool:
        # direction: whichever feeds the other (both directions may exist only if invalid)
        a_feeds_b = any(b >> s & 1 for i in iter_bits(a) for s in nodes[i].succs)
        up, down = (a, b) if a_feeds_b else (b, a)
        return any(c.allows(graph, up, down) for c in self.combiners)


# ------------------------------------------------------------------------------------------
# phase 1: default specs per toolchain style

#: patterns a library-style toolchain offers as composites
LIBRARY_PATTERNS: dict[str, Pattern] = {
    "conv_add_relu": op("Relu", op("Add", op("Conv"), ANY, commutative=True)),
    "conv_relu": op("Relu|Clip", op("Conv")),
    "conv_add": op("Add", op("Conv"), ANY, commutative=True),
    "matmul_add": op("Add", op("MatMul"), ANY, commutative=True),
    "matmul_add_relu": op("Relu", op("Add", op("MatMul"), ANY, commutative=True)),
    "gemm_relu": op("Relu", op("Gemm")),
}


@dataclass(frozen=True)
class RuleOptions:
    """Knobs of the default rule trees."""

    max_depth: int = 4
    max_exits: int | None = 2
    allow_taps: bool = False
    max_candidates: int = 20000
    segments: bool = True  # graph compilers also get segments between cut points
    max_cuts: int = 64
    patterns: dict[str, Pattern] = field(default_factory=lambda: dict(LIBRARY_PATTERNS))


def default_rule(style: str, predicate: NodePredicate, options: RuleOptions = RuleOptions()
                 ) -> PartitionRule:
    """The RFC's typical rule tree for a toolchain style ("graph", "library" or "fuseops")."""
    cfg = SubGraphConfig(options.max_depth, options.max_exits, options.allow_taps)
    singles = OpPredicatePartitionRule(predicate)
    if style == "library":
        composites = tuple(
            CompositePartitionRule(label, PatternPartitionRule(p, predicate))
            for label, p in options.patterns.items()
        )
        return PrimitivePartitionRule(OnlyValidPartitionRule(UnionPartitionRule(
            (singles, *composites)), cfg))
    if style == "fuseops":
        return PrimitivePartitionRule(OnlyValidPartitionRule(CombinePartitionRule(
            singles, TVM_COMBINERS, cfg, max_candidates=options.max_candidates), cfg))
    if style == "graph":
        regions = OnlyValidPartitionRule(CombinePartitionRule(
            singles, (AllCombinerRule(),), cfg, max_candidates=options.max_candidates), cfg)
        if not options.segments:
            return PrimitivePartitionRule(regions)
        return PrimitivePartitionRule(UnionPartitionRule(
            (regions, SegmentPartitionRule(predicate, max_cuts=options.max_cuts))))
    raise ValueError(f"unknown toolchain style {style!r} (graph, library, fuseops)")


def default_spec(target: Target, predicate: NodePredicate, style: str = "graph",
                 options: RuleOptions = RuleOptions()) -> PartitionSpec:
    return PartitionSpec(default_rule(style, predicate, options), target)


def all_candidates(graph: DataflowGraph, specs: Sequence[PartitionSpec]
                   ) -> list[CandidatePartition]:
    """Phase 2: every spec's candidates, deduplicated per (sub-graph, target)."""
    out: dict[tuple[int, Target], CandidatePartition] = {}
    for spec in specs:
        for c in spec.candidates(graph):
            out.setdefault((c.mask, c.target), c)
    return list(out.values())
