"""In-memory plans over one graph: a plan as (node set, target) parts, and executors for them.

`Part` is one partition of a plan; `PlanBuilder` turns a sequence of parts into a
`PlanExecutor` without writing files, caching compiled sessions per (nodes, target) so that a
plan that differs from the last one in one or two partitions rebuilds only those.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from collage_farm.core.graph import DataflowGraph
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import Target
from collage_farm.execute import PlanExecutor, _ort_session, compare_outputs, make_runtime

__all__ = ["Part", "PlanBuilder"]


@dataclass(frozen=True)
class Part:
    """One partition of a plan: a node bitset over the graph and the target that runs it."""

    mask: int
    target: Target

    def size(self) -> int:
        return self.mask.bit_count()



class PlanBuilder:
    """Executors for in-memory plans over one graph, sessions cached per (nodes, target).

    The cache is what makes a trial cheap: a move changes one or two partitions, the others'
    compiled sessions are reused (each executor binds its own buffers and steps). Reference
    outputs (the whole model in ONNX Runtime CPU on seeded feeds) are computed once.
    """

    def __init__(self, graph: DataflowGraph, *, threads: int = 1) -> None:
        self.graph = graph
        self.threads = threads
        self._cache: dict[tuple[int, str], Any] = {}
        self._reference: dict[str, np.ndarray] | None = None
        self._feeds: dict[str, np.ndarray] | None = None

    def runtime(self, k: int, part: Part, estimated_s: float = 0.0) -> Any:
        key = (part.mask, part.target.id)
        rt = self._cache.get(key)
        if rt is None:
            sg = SubGraph(self.graph, part.mask)
            data = sg.extract(name=f"{self.graph.name}_p{k:03d}").SerializeToString()
            rt = make_runtime(f"p{k:03d}", part.target.id, part.target.toolchain, data,
                              sg.input_tensors, sg.output_tensors, estimated_s,
                              dict(part.target.options), self.threads)
            if part.target.toolchain in ("ort-cpu", "openvino"):  # bindings are independent
                self._cache[key] = rt
        return dataclasses.replace(rt, id=f"p{k:03d}", estimated_s=estimated_s)

    def executor(self, parts: Sequence[Part], estimates: Sequence[float] | None = None) -> Any:
        est = list(estimates) if estimates is not None else [0.0] * len(parts)
        rts = [self.runtime(k, p, e) for k, (p, e) in enumerate(zip(parts, est))]
        return PlanExecutor.from_runtimes(rts, self.graph.graph_inputs,
                                          self.graph.graph_outputs, self.graph.model)

    def feeds(self, ex: Any) -> dict[str, np.ndarray]:
        if self._feeds is None:
            self._feeds = ex.random_feeds()
        return self._feeds

    def check(self, ex: Any) -> dict[str, float]:
        """Numerics against the whole model in ORT CPU; raises `ExecutionMismatch`."""
        feeds = self.feeds(ex)
        if self._reference is None:
            sess = _ort_session(self.graph.model.SerializeToString(), ["CPUExecutionProvider"],
                                self.threads)
            names = [o.name for o in sess.get_outputs()]
            want = [n for n in self.graph.graph_outputs if n in names] or names
            vals = sess.run(want, {i.name: feeds[i.name] for i in sess.get_inputs()})
            self._reference = dict(zip(want, vals))
        return compare_outputs(ex.run(feeds), self._reference, precision=ex.precision)
