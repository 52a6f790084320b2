"""Per-tensor value ranges of the whole fp32 model, for int8 quantisation of candidates.

Why whole-model, once: an Ethos-U candidate is a sub-graph cut out of a model; quantising it
needs the (min, max) its tensors take *inside the model*, on realistic data, not on whatever a
candidate's own random inputs would produce (a sub-graph starting after a ReLU would otherwise
be calibrated on negative values it never sees). The Collage search asks for thousands of
candidates per model, many overlapping, so the ranges are measured once per model: one ONNX
Runtime CPU session over the fp32 model with every intermediate tensor exposed as a graph
output, run on the samples of a `collage_farm.core.calibration_data.CalibrationData` (by
default ``n_samples`` seeded random inputs, `collage_farm.core.graph.random_inputs`, seeds
``seed .. seed + n_samples - 1``; or the user's own data), recording per-tensor min and max over
all samples, and the per-channel means of the tensors a Conv / Gemm / MatMul reads
(`channel_means`: the 16x8 builds correct their biases with them). Every candidate then
picks its tensors' ranges by name (tensor names survive extraction), and so does every int8
partition a plan runs (`runners.runtime_sim`): the tensor between two int8 partitions gets one
range, the one the costed builds used, on both sides.

Caching: by a SHA-256 of the serialised model plus the samples' identity (seed and count, or
the data's SHA-256 and count: `CalibrationData.key`), in memory (per
process) and, when a cache directory is given (argument or ``COLLAGE_FARM_CALIBRATION_CACHE``),
as one JSON file per model written atomically (temp file + rename), so a resumed campaign and
parallel workers on one host reuse it.

Softmax inputs: a tensor read only by Softmax keeps at most `SOFTMAX_SPAN` of range below its
maximum. An additive attention mask (GPT-2's -10000) otherwise sets its int8 scale: one step of
the range [-10000, 4] is 39, more than the whole span of the unmasked scores, which all round to
the same value, and the softmax after it becomes uniform. Saturating at ``max - SOFTMAX_SPAN``
instead costs nothing a softmax can show: a score that far below the row's maximum has a
probability below e^-20 (2e-9) either way, far under one int8 step of the probabilities
(1/256), while the scores that matter keep a step of (span + max) / 255.

Random data is a stand-in for a real calibration set: the zoo's weights are scaled so that
activations stay O(1) on N(0, 1) inputs, which gives ranges of the right order; a campaign with
real data passes it (``--calibration-data``), and plan.json records which was used.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from collage_farm.core.calibration_data import CalibrationData, CalibrationSource
from collage_farm.core.graph import MAX_IR_VERSION, DataflowGraph, load_graph
from collage_farm.core.tensors import ModelError

__all__ = ["CACHE_ENV", "INT8_TOOLCHAINS", "MEAN_OPS", "SOFTMAX_SPAN", "calibrate",
           "channel_means", "clear_memory_cache", "model_key", "ranges_for"]

#: toolchains whose candidates are quantised to int8 with the whole model's ranges (Ethos-U's
#: NPU and its Cortex-M host): a campaign calibrates once when it searches one of them
INT8_TOOLCHAINS = frozenset({"vela", "cortex-m"})

CACHE_ENV = "COLLAGE_FARM_CALIBRATION_CACHE"
_FORMAT = 3  # bump when the file layout or the method changes (2: Softmax inputs capped;
#              3: per-channel means of weight inputs beside the ranges)
#: range kept below the maximum of a tensor read only by Softmax (module docstring)
SOFTMAX_SPAN = 20.0

#: ONNX ops whose first input's per-channel means the calibration records (the weights that
#: read them get their bias corrected for their rounding's mean shift, `runners.tflite.quant`)
MEAN_OPS = frozenset({"Conv", "Gemm", "MatMul"})

Ranges = dict[str, tuple[float, float]]
Means = dict[str, np.ndarray]

_lock = threading.Lock()
_memory: dict[str, tuple[Ranges, Means]] = {}

_FLOAT_TYPES = (1, 10, 11, 16)  # FLOAT, FLOAT16, DOUBLE, BFLOAT16


def model_key(graph: DataflowGraph, seed: int, n_samples: int,
              data: CalibrationData | None = None) -> str:
    """Cache key: hash of the model bytes and the samples' identity (``data``'s, else the
    seed and the sample count of random samples)."""
    data = data or CalibrationData.random(n_samples, seed)
    h = hashlib.sha256(graph.model.SerializeToString())
    h.update(f"{data.key}|v{_FORMAT}".encode())
    return h.hexdigest()


def clear_memory_cache() -> None:
    with _lock:
        _memory.clear()


def _float_tensors(graph: DataflowGraph) -> list[str]:
    names: list[str] = []
    seen: set[str] = set()
    for t in list(graph.graph_inputs) + [o for n in graph.nodes for o in n.outputs if o]:
        info = graph.tensors.get(t)
        if t in seen or info is None or info.elem_type not in _FLOAT_TYPES:
            continue
        seen.add(t)
        names.append(t)
    return names


def _mean_inputs(graph: DataflowGraph, names: list[str]) -> set[str]:
    """Float tensors that a `MEAN_OPS` node reads as its first input."""
    ok = set(names)
    return {n.inputs[0] for n in graph.nodes
            if n.op_type in MEAN_OPS and n.inputs and n.inputs[0] in ok}


def _channel_sum(arr: np.ndarray) -> np.ndarray | None:
    """Per-channel sum and count of ``arr`` (channel axis 1 of a rank-4 tensor, else the
    last): a [2, C] array, or None for a scalar."""
    a = np.asarray(arr, dtype=np.float64)
    if a.ndim == 0:
        return None
    a = np.moveaxis(a, 1, -1) if a.ndim == 4 else a
    a = a.reshape(-1, a.shape[-1])
    return np.stack([np.nan_to_num(a).sum(axis=0), np.full(a.shape[1], a.shape[0], np.float64)])


def _measure(graph: DataflowGraph, data: CalibrationData) -> tuple[Ranges, Means]:
    import onnxruntime as ort  # heavy: only where a model is actually run

    names = _float_tensors(graph)
    produced = [t for t in names if t not in graph.graph_inputs]
    probe = onnx.ModelProto()
    probe.CopyFrom(graph.model)
    have = {o.name for o in probe.graph.output}
    for t in produced:
        if t not in have:
            probe.graph.output.add().name = t
    probe.ir_version = min(probe.ir_version or MAX_IR_VERSION, MAX_IR_VERSION)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    # no fusion: every tensor must be computed as the ONNX graph defines it
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    sums: dict[str, np.ndarray] = {}
    mean_of = _mean_inputs(graph, names)

    def record(name: str, arr: np.ndarray) -> None:
        a = np.asarray(arr, dtype=np.float64)
        if name in mean_of and (cs := _channel_sum(a)) is not None:
            sums[name] = sums[name] + cs if name in sums else cs
        a = a[np.isfinite(a)]
        if a.size == 0:
            return
        mn, mx = float(a.min()), float(a.max())
        lo[name] = min(lo.get(name, mn), mn)
        hi[name] = max(hi.get(name, mx), mx)

    for i, feeds in enumerate(data.feeds(graph)):
        for name, arr in feeds.items():
            if name in names:
                record(name, arr)
        try:
            outs = sess.run(produced, feeds)
        except Exception as e:  # the user's data, out of what the model accepts
            if data.source is CalibrationSource.RANDOM:
                raise
            why = " ".join(str(e).split())[:200]
            raise ModelError(f"calibration data {data.path}: the model does not run on "
                             f"sample {i} ({type(e).__name__}: {why})") from None
        for name, arr in zip(produced, outs):
            record(name, arr)
    capped = _softmax_inputs(graph)
    ranges = {t: (max(lo[t], hi[t] - SOFTMAX_SPAN) if t in capped else lo[t], hi[t])
              for t in names if t in lo}
    return ranges, {t: s[0] / np.maximum(s[1], 1.0) for t, s in sums.items()}


def _softmax_inputs(graph: DataflowGraph) -> set[str]:
    """Tensors every reader of which is a Softmax (not graph outputs): their ranges are capped
    at `SOFTMAX_SPAN` below their maximum (module docstring)."""
    readers: dict[str, set[str]] = {}
    for n in graph.nodes:
        for t in n.inputs:
            if t:
                readers.setdefault(t, set()).add(n.op_type)
    outs = set(graph.graph_outputs)
    return {t for t, ops in readers.items() if ops == {"Softmax"} and t not in outs}


def calibrate(
    graph: DataflowGraph | onnx.ModelProto | bytes,
    seed: int = 0,
    n_samples: int = 8,
    cache_dir: str | os.PathLike[str] | None = None,
    data: CalibrationData | None = None,
) -> dict[str, tuple[float, float]]:
    """Per-tensor (min, max) of every float tensor (graph inputs and node outputs).

    Runs the whole fp32 model once per model and samples (cached; see the module docstring)
    on ``data``, else on ``n_samples`` random samples from ``seed``. A `ModelProto` or model
    bytes are loaded with `collage_farm.core.graph.load_graph` first. File data that does not
    fit the model raises `ModelError` (one line).
    """
    return dict(_calibrated(graph, seed, n_samples, cache_dir, data)[0])


def channel_means(graph: DataflowGraph | onnx.ModelProto | bytes, *,
                  data: CalibrationData | None = None,
                  cache_dir: str | os.PathLike[str] | None = None) -> dict[str, np.ndarray]:
    """Per-channel means (channel axis 1 of a rank-4 tensor, else the last) of every float
    tensor a Conv / Gemm / MatMul reads first (`MEAN_OPS`), over the samples `calibrate`
    uses (``data``, else its default random samples): the same run and cache, so the two
    always describe one calibration."""
    return dict(_calibrated(graph, 0, 8, cache_dir, data)[1])


def _calibrated(graph: DataflowGraph | onnx.ModelProto | bytes, seed: int, n_samples: int,
                cache_dir: str | os.PathLike[str] | None, data: CalibrationData | None
                ) -> tuple[Ranges, Means]:
    """Ranges and means of one calibration, from memory, the cache file or a run."""
    if not isinstance(graph, DataflowGraph):
        graph = load_graph(graph)
    data = data or CalibrationData.random(n_samples, seed)
    key = model_key(graph, seed, n_samples, data)
    with _lock:
        hit = _memory.get(key)
    if hit is not None:
        return hit
    where = cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV) or None
    path = Path(where) / f"ranges-{key[:32]}.json" if where else None
    found = _read_cache(path, key) if path is not None else None
    if found is None:
        found = _measure(graph, data)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps({
                "key": key, "model": graph.name, "calibration": data.to_json(),
                "ranges": {k: list(v) for k, v in found[0].items()},
                "means": {k: [float(x) for x in v] for k, v in found[1].items()}}))
            os.replace(tmp, path)
    with _lock:
        _memory[key] = found
    return found


def _read_cache(path: Path, key: str) -> tuple[Ranges, Means] | None:
    """A cache file's ranges and means, or None (absent, another key, damaged: re-measured
    and overwritten)."""
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text())
        if raw.get("key") != key:
            return None
        return ({k: (float(v[0]), float(v[1])) for k, v in raw["ranges"].items()},
                {k: np.asarray(v, np.float64) for k, v in raw["means"].items()})
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None


def ranges_for(graph: DataflowGraph, given: Mapping[str, tuple[float, float]]
               ) -> tuple[dict[str, tuple[float, float]], int]:
    """The ``given`` ranges (the whole model's), with every float tensor of ``graph`` that lacks
    one calibrated on ``graph`` itself (a build asked for outside a campaign); and how many were
    filled that way."""
    need = set(graph.graph_inputs) | {o for n in graph.nodes for o in n.outputs if o}
    missing = [t for t in need if t not in given]
    if not missing:
        return dict(given), 0
    own = calibrate(graph)
    out = dict(given)
    filled = 0
    for t in missing:
        if t in own:
            out[t] = own[t]
            filled += 1
    return out, filled
