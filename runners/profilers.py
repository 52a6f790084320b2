"""The per-operator profilers of the toolchains (`runners.profile.Profiler` implementations).

* `OrtTraceProfiler` (ONNX Runtime, CPU and CUDA execution providers): the session is created
  with `runners.ort.session_options` plus ``enable_profiling`` and an ``optimized_model_filepath``;
  after the runs, ``end_profiling()`` gives a JSON trace whose ``Node`` events named
  ``<kernel>_kernel_time`` carry each kernel's ``dur`` (microseconds). Kernels are the
  *optimised* graph's nodes: fusions are named after one of their ONNX nodes with a suffix
  (``conv1/relu_nchwc``, ``fc/matmul/MatMulAddFusion``) or get a new name (``Gelu``,
  ``SkipLayerNormalization``, ``ReorderOutput``). `kernel_groups` maps them back.
  On a GPU the Node events time the kernel's launch on the host, not its execution; the
  profile's sum against the whole run tells (a campaign then measures that target's
  candidates in isolation).
* `OpenVinoCountersProfiler` (OpenVINO CPU): compiled with ``PERF_COUNT``; after each run
  ``InferRequest.get_profiling_info()`` gives every executed layer's ``real_time``, and the
  runtime model's layers carry ``originalLayersNames`` (the ONNX nodes fused into them).
* `PrefixProfiler` (LiteRT, or any toolchain without a per-operator timer, and every
  toolchain's fallback; it lives in `runners.profile` and is re-exported here): the model cut
  into prefixes at thin cuts (positions of the topological order where the fewest tensors
  cross), each prefix built and timed warm by the toolchain itself; a segment costs the
  difference of the two prefixes around it. Segments are the profile's groups.
* `ConvertedPrefixProfiler` (LiteRT): the same prefixes, each cut from one lowering of the
  whole model by the in-repo TFLite converter instead of converted on its own.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runners.base import BuildResult, MeasureConfig, Status
from runners.onnx_base import feeds_for, seed_of
from runners.profile import OperatorProfile, PrefixProfiler, ProfileMethod, Profiler, thin_cuts
from runners.tflite.prefix import Lowered
from runners.tflite.result import ConversionError
from runners.topology import OnnxTopology, attach_unassigned, groups_from, medians

if TYPE_CHECKING:
    from runners.ort import OrtCpuToolchain

__all__ = ["ConvertedPrefixProfiler", "Kernel", "OpenVinoCountersProfiler", "OrtTraceProfiler",
           "PrefixProfiler", "kernel_groups", "longest_known_prefix", "ort_kernel_times",
           "thin_cuts"]

KERNEL_SUFFIX = "_kernel_time"


@dataclass(frozen=True)
class Kernel:
    """One executed kernel (an ORT optimised node, an OpenVINO runtime layer).

    ``anchors``: the ONNX nodes its name or runtime info names; ``inputs`` / ``outputs``: the
    tensors (or, for OpenVINO, layer tokens) it reads and writes, which tell its neighbours.
    """

    name: str
    seconds: float
    anchors: tuple[str, ...] = ()
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


def longest_known_prefix(name: str, known: set[str]) -> str | None:
    """The longest known node name that is ``name`` or ``name`` cut before a ``/`` or ``_``."""
    if name in known:
        return name
    for i in range(len(name) - 1, 0, -1):
        if name[i] in "/_" and name[:i] in known:
            return name[:i]
    return None


def _root(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def _anchor_groups(topo: OnnxTopology, kernels: Sequence[Kernel]) -> dict[str, int]:
    """ONNX node -> kernel index from the kernels' anchors; kernels naming a common node are
    one group (the root index)."""
    parent = list(range(len(kernels)))
    owner: dict[str, int] = {}
    for i, k in enumerate(kernels):
        for a in k.anchors:
            if a in owner:
                parent[_root(parent, i)] = _root(parent, owner[a])
            else:
                owner[a] = i
    return {n: _root(parent, i) for n, i in owner.items()}


def _walk_back(topo: OnnxTopology, k: Kernel, gid: int, group_of: dict[str, int]) -> None:
    """Give ``k`` (named after no ONNX node) the unplaced ONNX nodes between its ONNX-named
    input and output tensors."""
    stops = set(k.inputs)
    todo = [topo.producer[t] for t in k.outputs if t in topo.producer]
    while todo:
        n = todo.pop()
        if n in group_of:
            continue
        group_of[n] = gid
        todo += [topo.producer[t] for t in topo.inputs[n]
                 if t not in stops and t in topo.producer]


def _neighbour_group(i: int, kernels: Sequence[Kernel], gid_of: Sequence[int],
                     members: set[int], onnx_tensors: set[str]) -> int | None:
    """The group of the nearest kernel that has ONNX nodes: its producers first when it reads
    a tensor of the toolchain's own (a reorder back from a blocked layout belongs to the
    kernel that wrote that layout), else its consumers first (a reorder into one)."""
    readers: dict[str, list[int]] = {}
    writers: dict[str, list[int]] = {}
    for j, k in enumerate(kernels):
        for t in k.inputs:
            readers.setdefault(t, []).append(j)
        for t in k.outputs:
            writers.setdefault(t, []).append(j)
    producers_first = any(t not in onnx_tensors for t in kernels[i].inputs)
    seen = {i}
    frontier = [i]
    for _ in range(4):
        nxt: list[int] = []
        for j in frontier:
            after = [c for t in kernels[j].outputs for c in readers.get(t, ())]
            before = [p for t in kernels[j].inputs for p in writers.get(t, ())]
            near = before + after if producers_first else after + before
            for c in near:
                if c in seen:
                    continue
                if gid_of[c] in members:
                    return gid_of[c]
                seen.add(c)
                nxt.append(c)
        frontier = nxt
    return None


def kernel_groups(topo: OnnxTopology, kernels: Sequence[Kernel]
                  ) -> tuple[tuple[tuple[tuple[str, ...], float], ...], float]:
    """(groups, unattributed seconds) of ``kernels`` over the ONNX model ``topo``.

    Anchored kernels own their anchors (kernels sharing one merge); a kernel named after no
    node owns the nodes between its ONNX-named inputs and outputs; the nodes left join a
    neighbour's group (`attach_unassigned`); a kernel that still owns no node (a layout
    reorder) adds its time to its nearest neighbour's group, else to the unattributed time.
    """
    group_of = _anchor_groups(topo, kernels)
    gid_of = [group_of[k.anchors[0]] if k.anchors and k.anchors[0] in group_of else i
              for i, k in enumerate(kernels)]
    for i, k in enumerate(kernels):
        if not any(a in group_of for a in k.anchors):
            _walk_back(topo, k, i, group_of)
    attach_unassigned(topo, group_of)
    members = set(group_of.values())
    onnx_tensors = set(topo.producer) | {t for ins in topo.inputs.values() for t in ins}
    seconds: dict[int, float] = {}
    unattributed = 0.0
    for i, k in enumerate(kernels):
        g: int | None = gid_of[i]
        if g not in members:
            g = _neighbour_group(i, kernels, gid_of, members, onnx_tensors)
        if g is None:
            unattributed += k.seconds
        else:
            seconds[g] = seconds.get(g, 0.0) + k.seconds
    return groups_from(topo, seconds, group_of), unattributed


# ----------------------------------------------------------------------------------------
# ONNX Runtime


def ort_kernel_times(trace: Sequence[Mapping[str, Any]], warmup: int) -> dict[str, float]:
    """Median seconds per kernel name from an ORT profiling trace, the first ``warmup`` runs of
    each kernel left out."""
    samples: dict[str, list[float]] = {}
    for e in trace:
        name = str(e.get("name", ""))
        if e.get("cat") != "Node" or not name.endswith(KERNEL_SUFFIX):
            continue
        samples.setdefault(name[: -len(KERNEL_SUFFIX)], []).append(float(e["dur"]) * 1e-6)
    return medians({k: v[warmup:] or v for k, v in samples.items()})


def _calibration_model() -> bytes:
    """A one-node model (``Add`` of a 1-element tensor to itself): its kernel time is the
    profiler's own per-kernel bookkeeping."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Add", ["x", "x"], ["y"], name="add")],
                              "profiler_calibration", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model.SerializeToString()


class OrtTraceProfiler(Profiler):
    """ONNX Runtime session profiling (module docstring).

    A kernel's traced ``dur`` includes the profiler's own bookkeeping (the event's argument
    strings are built inside the timed span: ~5-10 us a kernel here, which is most of a tiny
    model's run). `kernel_overhead_s` measures it once on a one-node model with the same
    session options and providers, and it is subtracted from every kernel (floored at 0).
    """

    method = ProfileMethod.ORT_TRACE
    warmup = 3

    def __init__(self, toolchain: OrtCpuToolchain) -> None:
        self.toolchain = toolchain
        self._overhead: dict[tuple, float] = {}

    def _trace(self, onnx_bytes: bytes, target: Any, threads: int, feeds: Mapping[str, Any],
               runs: int, between: Callable[[], None] | None = None
               ) -> tuple[list[dict], Any]:
        """The trace of ``runs`` runs after the warm-ups (``between`` called before each of
        those), and the optimised model."""
        import onnx

        with tempfile.TemporaryDirectory(prefix="ortprof") as d:
            sess = self.toolchain.profiling_session(
                onnx_bytes, target, threads, os.path.join(d, "trace"),
                os.path.join(d, "optimized.onnx"))
            for i in range(self.warmup + runs):
                if between is not None and i >= self.warmup:
                    between()
                sess.run(None, dict(feeds))
            with open(sess.end_profiling()) as f:
                trace = json.load(f)
            optimized = onnx.load(os.path.join(d, "optimized.onnx"), load_external_data=False)
        return trace, optimized

    def kernel_overhead_s(self, target: Any, threads: int) -> float:
        """The profiler's bookkeeping per kernel (class docstring), measured once."""
        import numpy as np

        key = (target.measure_key, threads)
        if key not in self._overhead:
            trace, _ = self._trace(_calibration_model(), target, threads,
                                   {"x": np.ones(1, np.float32)}, 200)
            times = ort_kernel_times(trace, self.warmup)
            self._overhead[key] = min(times.values()) if times else 0.0
        return self._overhead[key]

    def profile(self, build: BuildResult, onnx_bytes: bytes, config: MeasureConfig,
                runs: int, between: Callable[[], None] | None = None) -> OperatorProfile:
        threads = max(1, int(config.threads))
        feeds = feeds_for(onnx_bytes, seed_of(build.fingerprint))
        overhead = self.kernel_overhead_s(build.target, threads)
        trace, optimized = self._trace(onnx_bytes, build.target, threads, feeds, runs, between)
        times = {k: max(0.0, v - overhead)
                 for k, v in ort_kernel_times(trace, self.warmup).items()}
        topo = OnnxTopology.of(onnx_bytes)
        known = set(topo.names)
        kernels = []
        for n in optimized.graph.node:
            anchor = longest_known_prefix(n.name, known)
            kernels.append(Kernel(n.name, times.pop(n.name, 0.0),
                                  (anchor,) if anchor else (), tuple(x for x in n.input if x),
                                  tuple(x for x in n.output if x)))
        groups, unattributed = kernel_groups(topo, kernels)
        stray = sum(times.values())  # kernels the optimised model does not name
        return OperatorProfile(self.method, groups, unattributed + stray, runs,
                               kernels=len(kernels),
                               notes=f"{len(kernels)} kernels for {len(topo.names)} nodes; "
                               f"{overhead * 1e6:.1f} us profiler overhead per kernel "
                               "subtracted")


# ----------------------------------------------------------------------------------------
# OpenVINO


class OpenVinoCountersProfiler(Profiler):
    """OpenVINO per-layer performance counters (module docstring)."""

    method = ProfileMethod.OPENVINO_COUNTERS
    warmup = 3

    def __init__(self, toolchain: Any) -> None:
        self.toolchain = toolchain

    def profile(self, build: BuildResult, onnx_bytes: bytes, config: MeasureConfig,
                runs: int, between: Callable[[], None] | None = None) -> OperatorProfile:
        compiled = self.toolchain.compile_profiled(onnx_bytes, build.target,
                                                   max(1, int(config.threads)))
        req = compiled.create_infer_request()
        feeds = feeds_for(onnx_bytes, seed_of(build.fingerprint))
        samples: dict[str, list[float]] = {}
        for i in range(self.warmup + runs):
            if between is not None and i >= self.warmup:
                between()
            req.infer(feeds)
            if i < self.warmup:
                continue
            for p in req.get_profiling_info():
                samples.setdefault(p.node_name, []).append(p.real_time.total_seconds())
        times = medians(samples)
        topo = OnnxTopology.of(onnx_bytes)
        known = set(topo.names)
        kernels = []
        for op in compiled.get_runtime_model().get_ordered_ops():
            name = op.get_friendly_name()
            info = op.get_rt_info()
            orig = str(info["originalLayersNames"].astype(str)) \
                if "originalLayersNames" in info else ""
            anchors = tuple(x for x in orig.split(",") if x in known)
            ins = tuple(i.get_source_output().get_node().get_friendly_name()
                        for i in op.inputs())
            kernels.append(Kernel(name, times.pop(name, 0.0), anchors, ins, (name,)))
        groups, unattributed = kernel_groups(topo, kernels)
        return OperatorProfile(self.method, groups, unattributed + sum(times.values()), runs,
                               kernels=len(kernels),
                               notes=f"{len(kernels)} runtime layers for {len(topo.names)} "
                               "nodes")


class ConvertedPrefixProfiler(PrefixProfiler):
    """`PrefixProfiler` for a toolchain that runs the in-repo converter's fp32 TFLite (LiteRT):
    the prefixes are cut from one lowering of the whole model (`runners.tflite.prefix.Lowered.
    prefix`) instead of being extracted and converted one by one, so each is exactly the whole
    model's kernels up to its cut, and a transformer's weights are parsed and lowered once.

    ``lower(onnx_bytes)`` gives the whole model's `Lowered` (the toolchain may hand back the
    one its build of the same bytes made). A prefix's build carries the whole build's
    ``feed_specs`` (same inputs, same feeds); its artifact kind is the whole build's. A prefix
    with no operator of its own (its nodes all folded away at conversion) is extracted and
    built as `PrefixProfiler` builds it. ``prefix_lowering_s`` in `steps` is the lowering's
    share of ``prefix_build_s``."""

    def __init__(self, toolchain: Any, lower: Callable[[bytes], Lowered],
                 segments: int = 6) -> None:
        super().__init__(toolchain, segments)
        self.lower = lower
        self.lowering_s = 0.0

    def _prefix_builds(self, build: BuildResult, onnx_bytes: bytes, topo: OnnxTopology,
                       cuts: Sequence[int]) -> Iterator[BuildResult]:
        t0 = time.perf_counter()
        lowered = self.lower(onnx_bytes)
        self.lowering_s = time.perf_counter() - t0
        feeds = tuple((k, v) for k, v in build.details if k == "feed_specs")
        model = None
        for i, p in enumerate(cuts):
            try:
                data = lowered.prefix(topo.names[:p])
            except ConversionError:  # no operator of its own (folded nodes): extracted
                if model is None:
                    import onnx

                    model = onnx.load_from_string(onnx_bytes)
                yield self._prefix_build(build, model, topo.names[:p], f"p{i}")
                continue
            yield BuildResult(f"{build.fingerprint}:p{i}", build.target, Status.OK,
                              artifact=data, artifact_kind=build.artifact_kind,
                              details=(*feeds, ("tflite_bytes", len(data))))

    def profile(self, build: BuildResult, onnx_bytes: bytes, config: MeasureConfig,
                runs: int, between: Callable[[], None] | None = None) -> OperatorProfile:
        prof = super().profile(build, onnx_bytes, config, runs, between)
        self.steps["prefix_lowering_s"] = self.lowering_s
        return prof
