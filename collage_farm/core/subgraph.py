"""SubGraph: a set of dataflow nodes as a bitset over post-DFS indices.

The search keeps thousands of candidate sub-graphs in flight (RFC 0062, "SubGraph"), so a
sub-graph is just an integer bitset plus lazily cached derived sets: *entry* (inside nodes with
an input from outside), *exit* (inside nodes whose output is used outside or is a graph output),
*input* (outside nodes feeding inside) and *output* (outside nodes fed from inside). Validity is
checked against a `SubGraphConfig`: convexity (no path leaves the sub-graph and re-enters, which
would make it impossible to run as one unit), a depth limit, an exit limit, and whether an exit
may also feed inside nodes ("taps").

`extract` builds a standalone ONNX model for measuring a candidate without rewriting the whole
model: it copies the inside nodes, the initializers they read and the value infos of boundary
tensors from the shape-inferred model. It never re-runs shape inference, so it costs well under
a millisecond on typical candidates.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property

import onnx
from onnx import helper

from collage_farm.core.feeds import copy_input_values
from collage_farm.core.graph import MAX_IR_VERSION, DataflowGraph, Node, numel


@dataclass(frozen=True)
class SubGraphConfig:
    """Limits a sub-graph must respect to be valid (``None`` = unlimited)."""

    max_depth: int | None = None
    max_exits: int | None = None
    allow_taps: bool = True


def iter_bits(mask: int) -> Iterator[int]:
    """Indices of the set bits of ``mask``, ascending."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def mask_of(indices: Iterable[int]) -> int:
    m = 0
    for i in indices:
        m |= 1 << i
    return m


class SubGraph:
    """A set of nodes of one `DataflowGraph`, with cached boundary sets."""

    __slots__ = ("__dict__", "graph", "mask")

    def __init__(self, graph: DataflowGraph, mask: int) -> None:
        if mask <= 0:
            raise ValueError("a sub-graph needs at least one node")
        if mask >> len(graph.nodes):
            raise ValueError("sub-graph mask has bits beyond the graph's nodes")
        self.graph = graph
        self.mask = mask

    @staticmethod
    def of(graph: DataflowGraph, indices: Iterable[int]) -> SubGraph:
        return SubGraph(graph, mask_of(indices))

    # --- set behaviour -----------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubGraph) and other.graph is self.graph and other.mask == self.mask

    def __hash__(self) -> int:
        return hash(self.mask)

    def __len__(self) -> int:
        return self.mask.bit_count()

    def __contains__(self, index: int) -> bool:
        return bool(self.mask >> index & 1)

    def __repr__(self) -> str:
        return f"SubGraph({self.indices})"

    @cached_property
    def indices(self) -> tuple[int, ...]:
        return tuple(iter_bits(self.mask))

    @property
    def first(self) -> int:
        """The smallest post-DFS index inside (candidates are indexed by it)."""
        return (self.mask & -self.mask).bit_length() - 1

    @property
    def nodes(self) -> list[Node]:
        return [self.graph.nodes[i] for i in self.indices]

    def overlaps(self, other: SubGraph | int) -> bool:
        m = other.mask if isinstance(other, SubGraph) else other
        return bool(self.mask & m)

    def union(self, other: SubGraph) -> SubGraph:
        """Disjoint union (raises if the two overlap)."""
        if other.graph is not self.graph:
            raise ValueError("sub-graphs of different graphs")
        if self.mask & other.mask:
            raise ValueError("union of overlapping sub-graphs")
        return SubGraph(self.graph, self.mask | other.mask)

    # --- boundary sets (bitsets) -----------------------------------------------------------
    @cached_property
    def _boundary(self) -> tuple[int, int, int, int]:
        g = self.graph
        inside = self.mask
        entry = exit_ = inputs = outputs = 0
        for i in self.indices:
            n = g.nodes[i]
            for p in n.preds:
                if not inside >> p & 1:
                    entry |= 1 << i
                    inputs |= 1 << p
            external = n.is_external
            for s in n.succs:
                if not inside >> s & 1:
                    external = True
                    outputs |= 1 << s
            if external:
                exit_ |= 1 << i
            if not n.preds or any(
                t and t in g.graph_inputs for t in n.inputs + n.implicit_inputs
            ):
                entry |= 1 << i
        return entry, exit_, inputs, outputs

    @property
    def entry_mask(self) -> int:
        return self._boundary[0]

    @property
    def exit_mask(self) -> int:
        return self._boundary[1]

    @property
    def input_mask(self) -> int:
        return self._boundary[2]

    @property
    def output_mask(self) -> int:
        return self._boundary[3]

    # --- validity ----------------------------------------------------------------------
    @cached_property
    def is_convex(self) -> bool:
        """No path from inside leaves the sub-graph and comes back in."""
        reach = 0
        desc = self.graph.descendants
        for o in iter_bits(self.output_mask):
            reach |= desc[o] | (1 << o)
        return not reach & self.mask

    @cached_property
    def depth(self) -> int:
        """Nodes on the longest path inside the sub-graph."""
        d: dict[int, int] = {}
        inside = self.mask
        best = 0
        for i in self.indices:
            here = 1 + max((d[p] for p in self.graph.nodes[i].preds if inside >> p & 1), default=0)
            d[i] = here
            best = max(best, here)
        return best

    @property
    def num_exits(self) -> int:
        return self.exit_mask.bit_count()

    @cached_property
    def has_taps(self) -> bool:
        """An exit node that also feeds an inside node."""
        for i in iter_bits(self.exit_mask):
            if any(self.mask >> s & 1 for s in self.graph.nodes[i].succs):
                return True
        return False

    def is_valid(self, config: SubGraphConfig = SubGraphConfig()) -> bool:
        return self.why_invalid(config) is None

    def why_invalid(self, config: SubGraphConfig = SubGraphConfig()) -> str | None:
        if config.max_depth is not None and self.depth > config.max_depth:
            return f"depth {self.depth} > {config.max_depth}"
        if config.max_exits is not None and self.num_exits > config.max_exits:
            return f"{self.num_exits} exits > {config.max_exits}"
        if not config.allow_taps and self.has_taps:
            return "has taps"
        if not self.is_convex:
            return "not convex"
        return None

    # --- tensors at the boundary -----------------------------------------------------------
    @cached_property
    def input_tensors(self) -> tuple[str, ...]:
        """Runtime tensors read from outside (graph inputs or other nodes), in first-use order."""
        g = self.graph
        produced_inside = {o for n in self.nodes for o in n.outputs if o}
        seen: dict[str, None] = {}
        for n in self.nodes:
            for t in n.inputs + n.implicit_inputs:
                if t and t not in produced_inside and t not in g.initializers and t not in seen:
                    seen[t] = None
        return tuple(seen)

    @cached_property
    def output_tensors(self) -> tuple[str, ...]:
        """Tensors produced inside and used outside or returned by the model."""
        g = self.graph
        inside = self.mask
        outs: list[str] = []
        graph_outs = set(g.graph_outputs)
        for n in self.nodes:
            for o in n.outputs:
                if not o:
                    continue
                users = g.consumers.get(o, ())
                if o in graph_outs or any(not inside >> u & 1 for u in users):
                    outs.append(o)
        return tuple(outs)

    @cached_property
    def initializer_names(self) -> tuple[str, ...]:
        g = self.graph
        seen: dict[str, None] = {}
        for n in self.nodes:
            for t in n.inputs + n.implicit_inputs:
                if t in g.initializers:
                    seen[t] = None
        return tuple(seen)

    def boundary_bytes(self) -> tuple[int, int]:
        """Bytes entering and leaving the sub-graph per run."""
        t = self.graph.tensors
        return (
            sum(t[x].nbytes for x in self.input_tensors if x in t),
            sum(t[x].nbytes for x in self.output_tensors if x in t),
        )

    def own_bytes(self) -> int:
        """Bytes one run of the sub-graph touches: its weights, inputs and every output."""
        t = self.graph.tensors
        names = set(self.initializer_names) | set(self.input_tensors)
        for n in self.nodes:
            names.update(o for o in n.outputs if o)
        return sum(t[x].nbytes for x in names if x in t)

    def rest_of_network_bytes(self) -> int:
        """Bytes the rest of the model touches between two runs of this sub-graph.

        In a pipeline run again and again, what a partition finds in the caches is what the
        other partitions left: the model's weights and activations minus its own. ``network``
        measurement mode evicts this much before each timed run (`runners.measure`).
        """
        return max(0, self.graph.total_bytes - self.own_bytes())

    # --- structural hash (fingerprints) ------------------------------------------------------
    @cached_property
    def structural_hash(self) -> str:
        """Hash of op types, attributes, boundary shapes/dtypes and internal topology.

        Node names and weight values do not enter (so repeated layers collide); small non-float
        constants do (a Reshape's target shape changes semantics), as do all tensor shapes.
        """
        g = self.graph
        local = {i: k for k, i in enumerate(self.indices)}
        ext_index: dict[str, int] = {}
        h = hashlib.sha256()
        for i in self.indices:
            n = g.nodes[i]
            parts: list[str] = [n.domain, n.op_type]
            for k in sorted(n.attrs):
                parts.append(f"{k}={n.attrs[k]!r}")
            for t in n.inputs + n.implicit_inputs:
                if not t:
                    parts.append("_")
                    continue
                info = g.tensors.get(t)
                sig = f"{info.shape}:{info.elem_type}" if info else "?"
                p = g.producer.get(t)
                if p is not None and p in local:
                    parts.append(f"n{local[p]}.{g.nodes[p].outputs.index(t)}")
                elif t in g.initializers:
                    init = g.initializers[t]
                    small = init.data_type != onnx.TensorProto.FLOAT and numel(init) <= 64
                    val = onnx.numpy_helper.to_array(init).tobytes().hex() if small else ""
                    parts.append(f"w{sig}{val}")
                else:
                    k = ext_index.setdefault(t, len(ext_index))
                    parts.append(f"x{k}{sig}")
            outs = []
            for o in n.outputs:
                info = g.tensors.get(o)
                exported = o in self.output_tensors
                outs.append(f"{info.shape if info else '?'}:{'E' if exported else ''}")
            parts.append("->" + ",".join(outs))
            h.update("|".join(parts).encode())
            h.update(b"\n")
        return h.hexdigest()[:32]

    # --- extraction ------------------------------------------------------------------------
    def extract(self, name: str | None = None) -> onnx.ModelProto:
        """A standalone ONNX model computing this sub-graph; tensor names are the original's."""
        g = self.graph
        src = g.model
        vi: dict[str, onnx.ValueInfoProto] = {}

        def value_info(t: str) -> onnx.ValueInfoProto:
            info = g.tensors.get(t)
            if info is None:
                return helper.make_empty_tensor_value_info(t)
            return helper.make_tensor_value_info(t, info.elem_type, list(info.shape))

        inputs = [value_info(t) for t in self.input_tensors]
        outputs = [value_info(t) for t in self.output_tensors]
        for n in self.nodes:
            for o in n.outputs:
                if o and o in g.tensors and o not in self.output_tensors:
                    vi[o] = value_info(o)
        graph = onnx.GraphProto()
        graph.name = name or f"{g.name}_sub"
        graph.node.extend(n.proto for n in self.nodes)
        graph.initializer.extend(g.initializers[t] for t in self.initializer_names)
        graph.input.extend(inputs)
        graph.output.extend(outputs)
        graph.value_info.extend(vi.values())
        m = onnx.ModelProto()
        m.ir_version = min(src.ir_version or MAX_IR_VERSION, MAX_IR_VERSION)
        m.opset_import.extend(src.opset_import)
        m.producer_name = "collage-farm"
        m.graph.CopyFrom(graph)
        copy_input_values(src, m, self.input_tensors)  # fixed values travel with the inputs
        return m

