"""Static tensor types of a bound model: ONNX shape inference, then one probe run if needed.

Shape inference runs once per model with large weights swapped for data-less stand-ins. A
tensor it leaves without a concrete shape (data-dependent sizes, custom-domain ops) is
learnt by running the model once in ONNX Runtime on seeded random inputs, in a child process
(a malformed model can crash ONNX Runtime itself).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

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


#: the probe's child: reads the model and its feeds from the directory given, runs them in
#: ONNX Runtime (CPU, no graph optimisation), prints each wanted output's shape and dtype
_PROBE_CHILD = """
import json, sys
import numpy as np
import onnxruntime as ort
d = sys.argv[1]
want = json.load(open(d + "/want.json"))
so = ort.SessionOptions()
so.log_severity_level = 3
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
try:
    sess = ort.InferenceSession(d + "/probe.onnx", so, providers=["CPUExecutionProvider"])
    feeds = dict(np.load(d + "/feeds.npz"))
    outs = sess.run(want, feeds)
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
    sys.exit(0)
print(json.dumps({"found": [[list(np.asarray(a).shape), np.asarray(a).dtype.str] for a in outs]}))
"""
#: seconds the probe's child may take before it counts as hung
PROBE_TIMEOUT_S = 300.0


def probe_shapes(model: onnx.ModelProto, missing: list[str]) -> dict[str, TensorInfo]:
    """Run the model once in ONNX Runtime with ``missing`` as extra outputs to learn shapes.

    The run happens in a child process: a malformed model can crash ONNX Runtime itself (a
    segmentation fault, not an exception), and that must be a `ModelError` for the user, not
    the end of the campaign's process."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    for name in missing:
        if name not in have:
            probe.graph.output.add().name = name
    probe.ir_version = min(probe.ir_version, MAX_IR_VERSION)
    node = next((n for n in model.graph.node if missing[0] in n.output), None)
    made_by = (f", output of node {node.name!r} ({node.domain + ':' if node.domain else ''}"
               f"{node.op_type})" if node is not None else "")

    def fail(why: str) -> ModelError:
        return ModelError(
            f"could not determine shapes of {len(missing)} tensors (e.g. {missing[0]!r}"
            f"{made_by}) statically or by running the model once; declare them in the "
            f"model's value_info: {why}")

    with tempfile.TemporaryDirectory(prefix="collage-shapes-") as d:
        try:
            Path(d, "probe.onnx").write_bytes(probe.SerializeToString())
            np.savez(Path(d, "feeds.npz"), **random_feeds(model))
        except Exception as e:  # feeds of a type numpy cannot hold, a model too large
            raise fail(f"{type(e).__name__}: {e}") from None
        Path(d, "want.json").write_text(json.dumps(list(missing)))
        try:
            done = subprocess.run([sys.executable, "-c", _PROBE_CHILD, d], capture_output=True,
                                  text=True, timeout=PROBE_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise fail(f"ONNX Runtime did not finish in {PROBE_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        what = f"the probe exited with status {done.returncode}"
        if done.returncode < 0:
            try:
                what = f"ONNX Runtime crashed ({signal.Signals(-done.returncode).name})"
            except ValueError:  # a signal Python has no name for
                what = f"ONNX Runtime crashed (signal {-done.returncode})"
        raise fail(f"{what}: {' '.join(done.stderr.split())[-300:]}")
    try:
        reply = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise fail(f"unreadable probe output {done.stdout[-200:]!r}") from None
    if "error" in reply:
        raise fail(reply["error"])
    found = {}
    for name, (shape, dtype) in zip(missing, reply["found"]):
        found[name] = TensorInfo(name, tuple(int(x) for x in shape),
                                 helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    return found
