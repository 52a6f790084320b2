"""An ONNX model's node order and tensor topology, for mapping profilers' kernels to nodes.

`OnnxTopology` reads a model's nodes in order (a node without a name is named
``<op_type>_<index>``, as the rest of the project names it) with the runtime tensors each reads
and writes; `attach_unassigned` and `groups_from` turn a profiler's kernels, once anchored on
some nodes, into groups of nodes; `medians` is each key's median. Used by the per-operator
profilers (`runners.profilers`) and the prefix profiler (`runners.profile`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["OnnxTopology", "attach_unassigned", "groups_from", "medians"]


@dataclass(frozen=True)
class OnnxTopology:
    """The node names of an ONNX model in order, and who produces and consumes each tensor."""

    names: tuple[str, ...]
    inputs: Mapping[str, tuple[str, ...]]  # node -> its runtime input tensors
    outputs: Mapping[str, tuple[str, ...]]  # node -> its output tensors
    producer: Mapping[str, str]  # tensor -> node
    consumers: Mapping[str, tuple[str, ...]]  # tensor -> nodes

    @staticmethod
    def of(onnx_bytes: bytes) -> OnnxTopology:
        import onnx  # lazily: the worker imports this module before its thread environment

        model = onnx.load_from_string(onnx_bytes)
        inits = {i.name for i in model.graph.initializer}
        names: list[str] = []
        ins: dict[str, tuple[str, ...]] = {}
        outs: dict[str, tuple[str, ...]] = {}
        producer: dict[str, str] = {}
        consumers: dict[str, list[str]] = {}
        for i, node in enumerate(model.graph.node):
            name = node.name or f"{node.op_type}_{i}"
            names.append(name)
            ins[name] = tuple(t for t in node.input if t and t not in inits)
            outs[name] = tuple(t for t in node.output if t)
            for t in outs[name]:
                producer[t] = name
            for t in ins[name]:
                consumers.setdefault(t, []).append(name)
        return OnnxTopology(tuple(names), ins, outs, producer,
                            {k: tuple(v) for k, v in consumers.items()})

    def producers_of(self, node: str) -> list[str]:
        return [self.producer[t] for t in self.inputs[node] if t in self.producer]

    def consumers_of(self, node: str) -> list[str]:
        return [c for t in self.outputs[node] for c in self.consumers.get(t, ())]


def attach_unassigned(topo: OnnxTopology, group_of: dict[str, int]) -> None:
    """Give the nodes no kernel named to the group they were most likely fused into, in place.

    In topological order, a node without a group joins its only consumer's group when that
    consumer has one (a Conv fused into the Relu the kernel is named after), else the group of
    its producer whose outputs only it reads (an Add and Relu fused into the Conv before
    them). A node neither rule places stays without a group: the profile does not account
    for it.
    """
    for _ in range(2):  # a second pass places nodes whose consumer was placed after them
        for n in topo.names:
            if n in group_of:
                continue
            cons = set(topo.consumers_of(n))
            if len(cons) == 1:
                (c,) = cons
                if c in group_of:
                    group_of[n] = group_of[c]
                    continue
            for p in topo.producers_of(n):
                if p in group_of and set(topo.consumers_of(p)) == {n}:
                    group_of[n] = group_of[p]
                    break


def groups_from(topo: OnnxTopology, seconds: Mapping[int, float], group_of: Mapping[str, int]
                ) -> tuple[tuple[tuple[str, ...], float], ...]:
    """(nodes, seconds) per group id, nodes in model order, groups in first-node order."""
    members: dict[int, list[str]] = {}
    for n in topo.names:
        if n in group_of:
            members.setdefault(group_of[n], []).append(n)
    return tuple((tuple(m), float(seconds.get(g, 0.0))) for g, m in members.items())


def medians(samples: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """The median of each key's samples (keys with none are left out)."""
    return {k: float(statistics.median(v)) for k, v in samples.items() if len(v)}
