"""Helpers shared by the test modules: reference ONNX Runtime runs of whole models."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import onnxruntime as ort

from collage_farm.core.graph import DataflowGraph


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
