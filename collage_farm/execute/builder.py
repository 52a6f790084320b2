"""In-memory plans over one graph: a plan as (node set, target) parts, and executors for them.

`Part` is one partition of a plan; `PlanBuilder` turns a sequence of parts into a
`PlanExecutor` without writing files, caching compiled sessions per (nodes, target) so that a
plan that differs from the last one in one or two partitions rebuilds only those.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collage_farm.core.calibration_data import CalibrationData
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import Target
from collage_farm.execute.executor import PlanExecutor, make_runtime
from collage_farm.execute.numerics import compare_outputs, reference_outputs
from runners.calibration import INT8_TOOLCHAINS, calibrate, channel_means
from runners.runtime import PartitionRuntime, WholeGraph

__all__ = ["Part", "PlanBuilder"]

#: the most extracted-model bytes a builder keeps for its other targets (a transformer's
#: whole model is a few hundred MB)
MAX_MODEL_BYTES = 1 << 30


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
    compiled sessions are reused (each executor binds its own buffers and steps). A node set's
    extracted ONNX model is kept too (up to `MAX_MODEL_BYTES`), for the same nodes on another
    target: the cut-cost probe builds every chunk and the whole model on every target, and
    extracting gpt2-2L's whole model takes ~2-3 s. Reference
    outputs (the whole model in ONNX Runtime CPU on seeded feeds) are computed once, by the
    ``ort-cpu`` whole-model session already cached when there is one (the cut-cost probe
    builds it: a second session of gpt2-2L's whole model took ~3 s). Partitions
    on int8 toolchains are quantised with the whole graph's ranges (`runners.calibration`,
    on ``calibration``'s samples: seeded random by default), as the campaign costed them.

    ``sliced`` executors (the cut-cost probe's chunks) hand every partition with the builder's
    `WholeGraph`: a toolchain that can cut one compilation of the whole graph (LiteRT,
    `Toolchain.slice_cuts`) builds the partition as a slice of it, compiled once per builder;
    such a session is cached apart from the partition compiled alone, except the whole
    model's (its slice is the whole compilation itself: the same operators).
    """

    def __init__(self, graph: DataflowGraph, *, threads: int = 1,
                 calibration: CalibrationData | None = None) -> None:
        self.graph = graph
        self.threads = threads
        self.calibration = calibration or CalibrationData.random()
        self._cache: dict[tuple[int, str, bool], PartitionRuntime] = {}
        self._models: OrderedDict[int, bytes] = OrderedDict()  # mask -> extracted model
        self._reference: dict[str, np.ndarray] | None = None
        self._feeds: dict[str, np.ndarray] | None = None
        self._ort_whole: PartitionRuntime | None = None  # ort-cpu's whole model, when built
        #: the graph's whole compilations, for sliced partitions (kept as long as the builder)
        self.whole = WholeGraph(graph)

    def runtime(self, k: int, part: Part, estimated_s: float = 0.0, *,
                sliced: bool = False) -> PartitionRuntime:
        """Partition ``k`` of a plan (id ``p<k>``), its session reused when cached;
        ``sliced``: possibly a slice of the whole graph's compilation (class docstring)."""
        key = (part.mask, part.target.id, sliced and part.mask != self.graph.all_mask)
        rt = self._cache.get(key)
        if rt is None:
            sg = SubGraph(self.graph, part.mask)
            data = self._model(k, sg)
            int8 = part.target.toolchain in INT8_TOOLCHAINS
            rt = make_runtime(f"p{k:03d}", part.target.id, part.target.toolchain, data,
                              sg.input_tensors, sg.output_tensors, estimated_s,
                              dict(part.target.options), self.threads,
                              tensor_ranges=calibrate(self.graph, data=self.calibration)
                              if int8 else None,
                              channel_means=channel_means(self.graph, data=self.calibration)
                              if int8 else None,
                              whole=self.whole if sliced else None,
                              nodes=[n.name for n in sg.nodes] if sliced else ())
            # bindings are independent: ORT and OpenVINO bind per executor, LiteRT's generic
            # runtime sets its inputs on every run (a conversion is seconds on a transformer)
            if part.target.toolchain in ("ort-cpu", "openvino", "litert"):
                self._cache[key] = rt
            if (part.mask == self.graph.all_mask and part.target.toolchain == "ort-cpu"
                    and not part.target.options and not sliced):
                self._ort_whole = rt  # the reference's session (`check`)
        return rt.renamed(f"p{k:03d}", estimated_s)

    def model_bytes(self, mask: int) -> bytes:
        """The node set ``mask`` extracted as an ONNX model, kept like a partition's (the
        campaign's profile requests send the whole model the cut-cost probe extracted)."""
        return self._model(0, SubGraph(self.graph, mask))

    def _model(self, k: int, sg: SubGraph) -> bytes:
        """``sg`` extracted as an ONNX model (named after the first plan position it had),
        kept for other targets; the oldest forgotten past `MAX_MODEL_BYTES`."""
        data = self._models.get(sg.mask)
        if data is None:
            data = sg.extract(name=f"{self.graph.name}_p{k:03d}").SerializeToString()
            self._models[sg.mask] = data
            while sum(map(len, self._models.values())) > MAX_MODEL_BYTES:
                self._models.popitem(last=False)
        return data

    def executor(self, parts: Sequence[Part], estimates: Sequence[float] | None = None, *,
                 sliced: bool = False) -> PlanExecutor:
        """An executor of ``parts`` in order (``sliced``: `runtime`)."""
        est = list(estimates) if estimates is not None else [0.0] * len(parts)
        rts = [self.runtime(k, p, e, sliced=sliced) for k, (p, e) in enumerate(zip(parts, est))]
        return PlanExecutor.from_runtimes(rts, self.graph.graph_inputs,
                                          self.graph.graph_outputs, self.graph.model)

    def feeds(self, ex: PlanExecutor) -> dict[str, np.ndarray]:
        if self._feeds is None:
            self._feeds = ex.random_feeds()
        return self._feeds

    def check(self, ex: PlanExecutor) -> dict[str, float]:
        """Numerics against the whole model in ORT CPU; raises `ExecutionMismatch`."""
        feeds = self.feeds(ex)
        if self._reference is None and self._ort_whole is not None:
            self._reference = PlanExecutor.from_runtimes(
                [self._ort_whole.renamed("reference", 0.0)], self.graph.graph_inputs,
                self.graph.graph_outputs, self.graph.model).run(feeds)
        if self._reference is None:
            self._reference = reference_outputs(self.graph.model, self.graph.graph_outputs,
                                                feeds, self.threads)
        return compare_outputs(ex.run(feeds), self._reference, precision=ex.precision)
