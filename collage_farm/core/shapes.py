"""Static tensor types of a bound model: ONNX shape inference, then one probe run if needed.

Shape inference runs once per model with large weights swapped for data-less stand-ins. A
tensor it leaves without a concrete shape (data-dependent sizes, custom-domain ops) is
learnt by running the model once in ONNX Runtime on seeded random inputs.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, shape_inference

from collage_farm.core.feeds import random_feeds
from collage_farm.core.tensors import (
    MAX_IR_VERSION,
    ModelError,
    TensorInfo,
    numel,
    static_info,
)

#: initializers larger than this (elements) are replaced by stand-ins during shape inference
_STAND_IN_ELEMENTS = 4096


def infer_tensors(model: onnx.ModelProto
                  ) -> tuple[onnx.ModelProto, dict[str, TensorInfo], list[str]]:
    """The shape-inferred model, every tensor's static type, and the names the probe settled.

    The returned model is ``model`` itself (value infos and outputs updated in place) when it
    has large initializers, else the copy shape inference returns. Raises `ModelError` when
    inference fails or a produced tensor's shape is found neither statically nor by the probe.
    """
    inferred = _infer_shapes(model)
    tensors: dict[str, TensorInfo] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(
        inferred.graph.output
    ):
        info = static_info(vi)
        if info is not None:
            tensors[vi.name] = info
    for t in inferred.graph.initializer:
        tensors[t.name] = TensorInfo(t.name, tuple(t.dims), t.data_type)
    produced = [o for n in inferred.graph.node for o in n.output if o]
    missing = [t for t in produced if t not in tensors]
    if missing:
        tensors.update(probe_shapes(inferred, missing))
    return inferred, tensors, missing


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX shape inference, once per model.

    Large weights are swapped for data-less stand-ins while it runs: inference needs their dims
    and types only, and serialising hundreds of MB of weights into the inference call dominated
    load time on transformer-sized models. With stand-ins, the inferred value infos and outputs
    are copied back into ``model``, which is returned.
    """
    g = model.graph
    heavy = [t for t in g.initializer if numel(t) > _STAND_IN_ELEMENTS]
    light = _with_stand_ins(model, heavy) if heavy else model
    try:
        inferred = shape_inference.infer_shapes(light, check_type=False, strict_mode=False,
                                                data_prop=True)
    except Exception as e:
        raise ModelError(f"shape inference failed: {e}") from None
    if not heavy:
        return inferred
    del g.value_info[:]
    g.value_info.extend(inferred.graph.value_info)
    del g.output[:]
    g.output.extend(inferred.graph.output)
    return model


def _with_stand_ins(model: onnx.ModelProto, heavy: list[onnx.TensorProto]) -> onnx.ModelProto:
    """A copy of ``model`` whose ``heavy`` initializers are graph inputs of their type."""
    g = model.graph
    keep = [t for t in g.initializer if numel(t) <= _STAND_IN_ELEMENTS]
    stand_ins = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                 for t in heavy]
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.graph.name = g.name
    light.graph.node.extend(g.node)
    light.graph.initializer.extend(keep)
    light.graph.input.extend(list(g.input) + [
        v for v in stand_ins if v.name not in {i.name for i in g.input}])
    light.graph.output.extend(g.output)
    light.graph.value_info.extend(g.value_info)
    return light


def probe_shapes(model: onnx.ModelProto, missing: list[str]) -> dict[str, TensorInfo]:
    """Run the model once in ONNX Runtime with ``missing`` as extra outputs to learn shapes."""
    import onnxruntime as ort  # local: ORT is heavy and only needed for odd models

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    for name in missing:
        if name not in have:
            probe.graph.output.add().name = name
    probe.ir_version = min(probe.ir_version, MAX_IR_VERSION)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        sess = ort.InferenceSession(
            probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
        outs = sess.run(missing, random_feeds(model))
    except Exception as e:
        node = next((n for n in model.graph.node if missing[0] in n.output), None)
        made_by = (f", output of node {node.name!r} ({node.domain + ':' if node.domain else ''}"
                   f"{node.op_type})" if node is not None else "")
        raise ModelError(
            f"could not determine shapes of {len(missing)} tensors (e.g. {missing[0]!r}"
            f"{made_by}) statically or by running the model once; declare them in the "
            f"model's value_info: {e}"
        ) from None
    found = {}
    for name, arr in zip(missing, outs):
        arr = np.asarray(arr)
        found[name] = TensorInfo(name, tuple(arr.shape), helper.np_dtype_to_tensor_dtype(arr.dtype))
    return found
