"""Helpers shared by the test modules: reference ONNX Runtime runs of whole models, and a
scripted measurement service (the `MeasurementService` contract, steady scripted costs)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

import numpy as np
import onnx
import onnxruntime as ort

from collage_farm.core.graph import DataflowGraph
from collage_farm.core.target import Target
from estimators.sources import MeasurementService
from runners.base import DeviceDescription, MeasureRequest, MeasureResult, Status, Summary


def cpu_session(model: onnx.ModelProto, *, optimize: bool = True) -> ort.InferenceSession:
    """A quiet single-thread ONNX Runtime CPU session of ``model`` (``optimize=False``: graph
    optimisations off, so every node runs as written)."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def all_tensors(g: DataflowGraph, feeds: Mapping[str, np.ndarray], *,
                optimize: bool = True) -> dict[str, np.ndarray]:
    """Every node output of a loaded model, by name, from one ONNX Runtime run of the whole
    model with each of them made a graph output (the reference a sub-graph is checked against)."""
    m = onnx.ModelProto()
    m.CopyFrom(g.model)
    del m.graph.output[:]
    names = [o for n in g.nodes for o in n.outputs if o]
    for t in names:
        info = g.tensors[t]
        m.graph.output.append(
            onnx.helper.make_tensor_value_info(t, info.elem_type, list(info.shape)))
    m.ir_version = min(m.ir_version, 10)
    return dict(zip(names, cpu_session(m, optimize=optimize).run(names, dict(feeds))))


SCRIPTED_DEVICE = DeviceDescription("cpu", "scripted", 1)


class ScriptedService(MeasurementService):
    """Measures every request at ``seconds`` (steady rounds), or at ``per_target[target id]``
    where given, and records the progress calls."""

    def __init__(self, seconds: float = 1e-3, per_target: Mapping[str, float] | None = None
                 ) -> None:
        self.seconds = seconds
        self.per_target = dict(per_target or {})
        self.measured: list[str] = []
        self.progress: list[tuple] = []
        self.closed = False

    def measure(self, requests: Iterable[MeasureRequest]) -> Iterator[MeasureResult]:
        for r in requests:
            self.measured.append(r.fingerprint)
            samples = (self.per_target.get(r.target.id, self.seconds),) * 3
            yield MeasureResult(r.fingerprint, r.target, Status.OK, r.config, samples=samples,
                                summary=Summary.of(samples, samples), device=SCRIPTED_DEVICE,
                                toolchain_version="1")

    def describe(self, target: Target) -> tuple[DeviceDescription | None, str] | None:
        return SCRIPTED_DEVICE, "1"

    def expect(self, total: int, hits: int = 0, kinds: Mapping[str, int] | None = None) -> None:
        self.progress.append(("expect", total, hits, dict(kinds or {})))

    def settle(self) -> None:
        self.progress.append(("settle",))

    def finish(self) -> None:
        self.progress.append(("finish",))

    def close(self) -> None:
        self.closed = True
