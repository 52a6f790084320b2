"""A plan's graph as a compact sequence: repeated blocks collapsed, for drawing and tables.

A 400-node transformer drawn node by node is unreadable; drawn as "embeddings, one encoder
layer x12, pooler" it fits a screen. `plan_flow` lists the plan's nodes in execution order (the
plan's partitions in order, each partition's nodes in its ONNX file's order: a topological
order of the whole graph) as `FlowNode`s, and `collapse` folds every run of structurally
identical consecutive blocks into one `Repeat`:

* two nodes are alike when they have the same op type, the same target, the same partition
  boundary (whether the node starts a partition) and the same inputs *relative to their own
  position* (the producer 1, 2, ... nodes back, or a graph input or weight), so a residual
  block's skip edge is part of what must repeat; a block's first node may differ in the
  boundary only (twelve layers in one partition repeat although the first starts it, and so
  do twelve layers that are a partition each);
* at each position the period that covers the most nodes wins (ties: the shortest), so twelve
  encoder layers become one ``Repeat`` of count 12, and five alike ``Relu`` in a row one of 5;
* a repeated block's body is collapsed again (one level), so a layer's own runs fold too.

`Repeat.members` keeps, per repetition, the node names it stands for, so a table row for a
collapsed node can gather that node's figures from every repetition.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from collage_farm.core.plan import Plan

__all__ = ["MAX_PERIOD", "FlowNode", "Repeat", "collapse", "plan_flow", "structure_keys"]

#: the longest block `collapse` looks for (nodes); longer repeats are left expanded
MAX_PERIOD = 400


@dataclass(frozen=True)
class FlowNode:
    """One node of the plan: name, op type, partition id and target, and where its inputs come
    from (`structure_keys`: offsets back to producers, or ``-1`` for a graph input/weight)."""

    name: str
    op: str
    part: str
    target: str
    inputs: tuple[int, ...]
    starts_part: bool


@dataclass(frozen=True)
class Repeat:
    """``body`` (nodes and, one level down, repeats) occurring ``count`` times in a row;
    ``members[r]`` the node names of repetition ``r`` in body order; ``parts`` the partitions
    all repetitions span (the body is drawn with the first repetition's)."""

    body: tuple[FlowNode | Repeat, ...]
    count: int
    members: tuple[tuple[str, ...], ...]
    parts: int = 1  # partitions the repetitions span together

    @property
    def size(self) -> int:
        """Nodes in one repetition."""
        return len(self.members[0])


def plan_flow(plan: Plan, files: Mapping[str, Path]) -> list[FlowNode]:
    """Every node of ``plan`` in execution order with its partition and input offsets."""
    raw: list[tuple[str, str, str, str, tuple[str, ...], tuple[str, ...]]] = []
    for p in plan.partitions:
        m = onnx.load(str(files[p.id]), load_external_data=False)
        for i, n in enumerate(m.graph.node):
            raw.append((n.name or f"{p.id}/{n.op_type}_{i}", n.op_type, p.id, p.target,
                        tuple(x for x in n.input if x), tuple(x for x in n.output if x)))
    where = {o: k for k, r in enumerate(raw) for o in r[5]}
    out: list[FlowNode] = []
    for k, (name, op, part, target, ins, _) in enumerate(raw):
        offs = tuple(k - where[x] if x in where and where[x] < k else -1 for x in ins)
        out.append(FlowNode(name, op, part, target, offs, k == 0 or raw[k - 1][2] != part))
    return out


def structure_keys(nodes: Sequence[FlowNode | Repeat], boundaries: bool = True) -> list[int]:
    """One small integer per item: equal exactly when two items are alike (module doc);
    ``boundaries=False`` ignores whether a node starts a partition."""
    ids: dict[Hashable, int] = {}

    def key(x: FlowNode | Repeat) -> Hashable:
        if isinstance(x, FlowNode):
            return (x.op, x.target, x.inputs, x.starts_part and boundaries)
        return ("repeat", x.count, tuple(key(b) for b in x.body))

    return [ids.setdefault(key(x), len(ids)) for x in nodes]


def _alike(full: Sequence[int], base: Sequence[int], a: int, b: int, p: int) -> bool:
    """Blocks of ``p`` items at ``a`` and ``b`` alike: their first items up to a partition
    starting there, the rest exactly (`structure_keys`)."""
    return base[a] == base[b] and full[a + 1:a + p] == full[b + 1:b + p]


def _best_period(full: Sequence[int], base: Sequence[int], i: int, max_period: int
                 ) -> tuple[int, int]:
    """(period, count) of the run of alike blocks starting at ``i`` covering the most items
    (count 1 when nothing repeats)."""
    n = len(full)
    best = (1, 1)
    for p in range(1, min(max_period, (n - i) // 2) + 1):
        if not _alike(full, base, i, i + p, p):
            continue
        c = 2
        while i + (c + 1) * p <= n and _alike(full, base, i, i + c * p, p):
            c += 1
        if p * c > best[0] * best[1]:
            best = (p, c)
    return best


def collapse(nodes: Sequence[FlowNode], max_period: int = MAX_PERIOD, depth: int = 2
             ) -> list[FlowNode | Repeat]:
    """``nodes`` with every run of alike blocks folded into a `Repeat` (module doc); bodies are
    collapsed again down to ``depth`` levels."""
    full, base = structure_keys(nodes), structure_keys(nodes, boundaries=False)
    out: list[FlowNode | Repeat] = []
    i = 0
    while i < len(nodes):
        p, c = _best_period(full, base, i, max_period)
        if c == 1:
            out.append(nodes[i])
            i += 1
            continue
        body = list(nodes[i:i + p])
        members = tuple(tuple(x.name for x in nodes[i + r * p:i + (r + 1) * p])
                        for r in range(c))
        inner = collapse(body, max_period, depth - 1) if depth > 1 and p > 1 else body
        parts = len({x.part for x in nodes[i:i + p * c]})
        out.append(Repeat(tuple(inner), c, members, parts))
        i += p * c
    return out
