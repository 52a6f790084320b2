"""Run a plan directory end to end, check it against the whole model, time it.

Why: a plan is only a claim until it runs. The search adds up isolated sub-graph costs; the field
notes ("Mixing ORT and OpenVINO") found mixes that the estimates called 9% faster running
0.87-1.00x of the best single toolchain, because cuts cost real time (layout reorders, lost
fusion) and isolated warm runs are optimistic. So this module (1) executes the partitions in file
order, wiring tensors by name, (2) checks the outputs against the original model run whole in
ONNX Runtime CPU, and (3) times the plan with the same loop as candidates
(`runners.measure.time_callable`), interleaved with every single-toolchain whole model
(A B C, B C A, ... rounds: the machines drift by ~10% between phases of one process), giving the
**additive error** ((measured - sum of estimates) / measured) and the **apparent loss** against
the best single toolchain measured in the same run.

Binding: after one discovery pass (plain ``run`` calls, learning every tensor's shape and dtype)
every tensor gets one buffer, allocated once: host tensors are numpy arrays shared by producer
and consumers (ORT binds them by pointer with IOBinding, OpenVINO wraps them as shared-memory
``ov.Tensor`` on its inputs *and* outputs); a tensor produced by a CUDA/TensorRT partition and
read only by CUDA/TensorRT partitions stays on the device as an ``OrtValue``. The timed call is
then just the partitions' run calls, with no per-call Python conversion or copies.

Tolerances follow the loosest arithmetic among the plan's partitions (`PRECISIONS`), since a
check must fail on wiring errors, not on a toolchain doing what it was asked:

- fp32: ``|got - ref| <= 1e-4 + 1e-3 * |ref|`` (ORT and OpenVINO reorder float sums; 1e-3 is
  far above that and far below any real wiring error);
- tf32 (ORT's CUDA EP and TensorRT on Ampere and later by default: products with a 10-bit
  mantissa; measured on an H100, resnet18's logits differ from ORT CPU by up to 1.1e-3 absolute,
  10% relative on a near-zero logit): rtol=1e-2, atol=1e-2 x max|ref|;
- fp16 (TensorRT ``fp16``, OpenVINO ``precision: f16``): rtol=2e-2, atol=2e-2 x max|ref|;
- bf16 (OpenVINO ``precision: bf16``): rtol=5e-2, atol=5e-2 x max|ref|;
- int8 (Ethos-U via its int8 TFLite): rtol=0.1, atol=0.1 x max|ref|.

Ethos-U (``vela``) partitions cannot run on this hardware: their latency is the simulated cost
from the plan's ``estimated_s`` (`Timing.simulated_s`), and their numerics come from the int8
TFLite model (`runners.tflite.convert`) run in LiteRT when both are installed, else
from the fp32 ONNX partition in ORT (said so in `PartitionRuntime.numerics`).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from collage_farm.core.plan import Plan, PlanError, load_plan
from runners.base import MeasureConfig, Summary
from runners.measure import time_callable

__all__ = [
    "FP32_ATOL",
    "FP32_RTOL",
    "PRECISIONS",
    "QUANT_ATOL_FRAC",
    "QUANT_RTOL",
    "CompareResult",
    "ExecutionMismatch",
    "Interleaved",
    "PartitionRuntime",
    "PlanExecutor",
    "Single",
    "Timing",
    "compare_interleaved",
    "loosest",
    "measure_interleaved",
    "measure_interleaved_rounds",
    "measure_single",
    "ort_multi_ep",
    "reference_model",
    "single_executor",
    "tolerance_label",
]

FP32_RTOL = 1e-3
FP32_ATOL = 1e-4
QUANT_RTOL = 0.1
QUANT_ATOL_FRAC = 0.1  # of max |reference|
# precision -> (rtol, atol, atol is a fraction of max|ref|); ordered loosest last
PRECISIONS: dict[str, tuple[float, float, bool]] = {
    "fp32": (FP32_RTOL, FP32_ATOL, False),
    "tf32": (1e-2, 1e-2, True),
    "fp16": (2e-2, 2e-2, True),
    "bf16": (5e-2, 5e-2, True),  # OpenVINO's bf16 hint: an 8-bit mantissa
    "int8": (QUANT_RTOL, QUANT_ATOL_FRAC, True),
}


def loosest(precisions: Sequence[str]) -> str:
    """The loosest of ``precisions`` (fp32 when empty); unknown names count as fp16."""
    order = list(PRECISIONS)
    return max(precisions, key=lambda p: order.index(p) if p in order else 2, default="fp32")


def tolerance_label(precision: str) -> str:
    rtol, atol, rel = PRECISIONS.get(precision, PRECISIONS["fp16"])
    return f"{precision} (rtol={rtol:g}, atol={atol:g}{'*max|ref|' if rel else ''})"

GPU_TOOLCHAINS = ("ort-cuda", "ort-tensorrt")
SIMULATED_TOOLCHAINS = ("vela",)


class ExecutionMismatch(AssertionError):
    """The plan's outputs differ from the whole model's beyond tolerance."""

    def __init__(self, output: str, max_abs: float, max_rel: float, detail: str = "") -> None:
        self.output = output
        self.max_abs = max_abs
        self.max_rel = max_rel
        msg = (f"output {output!r} differs from the whole model: max abs error {max_abs:.3g}, "
               f"max rel error {max_rel:.3g}")
        super().__init__(msg + (f" ({detail})" if detail else ""))


# ----------------------------------------------------------------------------------------
# one partition on one toolchain


@dataclass
class PartitionRuntime:
    """A partition's compiled session and its bound step."""

    id: str
    target: str
    toolchain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    estimated_s: float
    kind: str  # "measured" | "simulated"
    numerics: str  # how outputs are computed ("ort-cpu fp32", "openvino f32", "litert int8", ...)
    plain: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    bind: Callable[[dict[str, Any]], Callable[[], None]]
    precision: str = "fp32"  # its arithmetic, for the output check: a key of PRECISIONS
    step: Callable[[], None] | None = None

    @property
    def on_gpu(self) -> bool:
        return self.toolchain in GPU_TOOLCHAINS


def _target_options(plan: Plan, target_id: str) -> dict[str, Any]:
    for t in plan.targets:
        if isinstance(t, dict) and t.get("id") == target_id:
            return dict(t.get("options") or {})
    return {}


def _ort_session(data: bytes, providers: list[Any], threads: int) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = max(1, threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    return ort.InferenceSession(data, so, providers=providers)


def _ort_providers(toolchain: str, options: Mapping[str, Any]) -> list[Any]:
    if toolchain == "ort-cpu":
        return ["CPUExecutionProvider"]
    from runners.cuda import trt_cache_dir  # noqa: F401 - import check for the GPU module
    from runners.registry import get_toolchain

    why = get_toolchain(toolchain).available()
    if why:
        raise PlanError(f"toolchain {toolchain} cannot run here: {why}")
    from collage_farm.core.target import CUDA0, Target

    tc = get_toolchain(toolchain)
    return tc._provider_list(Target.make(toolchain, toolchain, CUDA0, options))  # type: ignore[attr-defined]


def _ort_runtime(pid: str, target: str, toolchain: str, data: bytes, inputs: Sequence[str],
                 outputs: Sequence[str], est: float, options: Mapping[str, Any], threads: int
                 ) -> PartitionRuntime:
    import onnxruntime as ort

    sess = _ort_session(data, _ort_providers(toolchain, options), threads)
    if toolchain != "ort-cpu" and toolchain_ep(toolchain) not in sess.get_providers():
        raise PlanError(f"partition {pid}: {toolchain_ep(toolchain)} not active in the session "
                        f"(active: {sess.get_providers()})")
    in_names = [i.name for i in sess.get_inputs()]
    out_names = [o.name for o in sess.get_outputs()]

    def plain(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        res = sess.run(out_names, {n: feeds[n] for n in in_names})
        return {n: np.asarray(v) for n, v in zip(out_names, res)}

    def bind(buffers: dict[str, Any]) -> Callable[[], None]:
        io = sess.io_binding()
        for n in in_names:
            _ort_bind(io, n, buffers[n], output=False)
        for n in out_names:
            _ort_bind(io, n, buffers[n], output=True)
        io.synchronize_inputs()
        run = sess.run_with_iobinding
        if toolchain == "ort-cpu":
            return lambda: run(io)

        def gpu_step() -> None:
            run(io)
            io.synchronize_outputs()

        return gpu_step

    del ort
    precision = _ort_precision(toolchain, options)
    return PartitionRuntime(pid, target, toolchain, tuple(inputs), tuple(outputs), est,
                            "measured", f"{toolchain} {precision}", plain, bind,
                            precision=precision)


def _ort_precision(toolchain: str, options: Mapping[str, Any]) -> str:
    if toolchain == "ort-cpu":
        return "fp32"
    from collage_farm.core.target import CUDA0, Target
    from runners.registry import get_toolchain

    tc = get_toolchain(toolchain)
    return str(tc.precision(Target.make(toolchain, toolchain, CUDA0, options)))  # type: ignore[attr-defined]


def toolchain_ep(toolchain: str) -> str:
    return {"ort-cpu": "CPUExecutionProvider", "ort-cuda": "CUDAExecutionProvider",
            "ort-tensorrt": "TensorrtExecutionProvider"}.get(toolchain, "")


def _ort_bind(io: Any, name: str, buf: Any, *, output: bool) -> None:
    if isinstance(buf, np.ndarray):
        fn = io.bind_output if output else io.bind_input
        fn(name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
    else:  # a device OrtValue
        (io.bind_ortvalue_output if output else io.bind_ortvalue_input)(name, buf)


_OV_CORE: Any = None


def _ov_core() -> Any:
    global _OV_CORE
    if _OV_CORE is None:
        import openvino as ov

        _OV_CORE = ov.Core()
    return _OV_CORE


def _ov_runtime(pid: str, target: str, data: bytes, inputs: Sequence[str],
                outputs: Sequence[str], est: float, options: Mapping[str, Any], threads: int
                ) -> PartitionRuntime:
    import openvino as ov

    core = _ov_core()
    model = core.read_model(data)
    precision = str(options.get("precision", "f32"))
    compiled = core.compile_model(model, "CPU", {
        "INFERENCE_NUM_THREADS": max(1, threads),
        "INFERENCE_PRECISION_HINT": precision,
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
    })
    in_names = [p.get_any_name() for p in model.inputs]
    out_ports = list(compiled.outputs)
    wanted = set(outputs)
    port_names = [([n for n in p.get_names() if n in wanted] or [p.get_any_name()])[0]
                  for p in out_ports]
    req = compiled.create_infer_request()

    def plain(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        res = req.infer({n: np.ascontiguousarray(feeds[n]) for n in in_names})
        return {port_names[i]: np.array(res[p], copy=True) for i, p in enumerate(out_ports)}

    def bind(buffers: dict[str, Any]) -> Callable[[], None]:
        # a request per binding: two executors sharing this runtime (plan refinement times the
        # current and the candidate plan side by side) must not rebind each other's tensors
        r = compiled.create_infer_request()
        for n in in_names:
            r.set_tensor(n, ov.Tensor(buffers[n], shared_memory=True))
        for i, n in enumerate(port_names):
            r.set_output_tensor(i, ov.Tensor(buffers[n], shared_memory=True))
        return r.infer

    return PartitionRuntime(pid, target, "openvino", tuple(inputs), tuple(outputs), est,
                            "measured", f"openvino {precision}", plain, bind,
                            precision={"f16": "fp16", "bf16": "bf16"}.get(precision, "fp32"))


def _generic_runtime(pid: str, target: str, toolchain: str, data: bytes, inputs: Sequence[str],
                     outputs: Sequence[str], est: float, options: Mapping[str, Any],
                     threads: int) -> PartitionRuntime:
    """Any registry toolchain with ``build`` + ``run_outputs`` (LiteRT and later ones)."""
    from collage_farm.core.target import CPU0, Target
    from runners.base import BuildInput
    from runners.registry import get_toolchain

    tc = get_toolchain(toolchain)
    why = tc.available()
    if why:
        raise PlanError(f"partition {pid}: toolchain {toolchain} cannot run here: {why}")
    run_outputs = getattr(tc, "run_outputs", None)
    if run_outputs is None:
        raise PlanError(f"partition {pid}: toolchain {toolchain} has no run_outputs()")
    t = Target.make(target, toolchain, CPU0, options)
    build = tc.build(BuildInput(f"exec-{pid}", t, data, label=pid))
    if not build.ok:
        raise PlanError(f"partition {pid}: {toolchain} build failed: {build.error}")

    def plain(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        res = run_outputs(build, {n: feeds[n] for n in inputs}, threads)
        return {n: np.asarray(res[n]) for n in outputs}

    def bind(buffers: dict[str, Any]) -> Callable[[], None]:
        ins = {n: buffers[n] for n in inputs}
        outs = {n: buffers[n] for n in outputs}

        def step() -> None:
            res = run_outputs(build, ins, threads)
            for n, b in outs.items():
                np.copyto(b, np.asarray(res[n]).reshape(b.shape))

        return step

    return PartitionRuntime(pid, target, toolchain, tuple(inputs), tuple(outputs), est,
                            "measured", f"{toolchain}", plain, bind)


def _calibrate(data: bytes, feeds: Mapping[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """(min, max) of every tensor of a partition on ``feeds`` (fp32 ORT, all nodes exposed)."""
    m = onnx.load_from_string(data)
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have:
                m.graph.output.append(onnx.ValueInfoProto(name=o))
                have.add(o)
    sess = _ort_session(m.SerializeToString(), ["CPUExecutionProvider"], 1)
    names = [o.name for o in sess.get_outputs()]
    ins = {i.name: feeds[i.name] for i in sess.get_inputs()}
    out = {k: (float(np.min(v)), float(np.max(v))) for k, v in ins.items()}
    for n, v in zip(names, sess.run(names, ins)):
        a = np.asarray(v)
        if a.size and a.dtype.kind == "f":
            out[n] = (float(a.min()), float(a.max()))
    return out


def _simulated_runtime(pid: str, target: str, toolchain: str, data: bytes,
                       inputs: Sequence[str], outputs: Sequence[str], est: float,
                       threads: int) -> PartitionRuntime:
    """Ethos-U: int8 TFLite in LiteRT when available (else fp32 ORT); latency simulated."""
    fp32 = _ort_runtime(pid, target, "ort-cpu", data, inputs, outputs, est, {}, threads)
    fp32.toolchain, fp32.kind, fp32.numerics = toolchain, "simulated", "ort-cpu fp32 stand-in"
    try:
        from ai_edge_litert.interpreter import Interpreter

        from runners.tflite import convert
    except ImportError:
        return fp32

    state: dict[str, Any] = {}

    def plain(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "model" not in state:  # calibrate on the first feeds, then convert once
            conv = convert(data, "int8", _calibrate(data, feeds))
            interp = Interpreter(model_content=conv.tflite, num_threads=max(1, threads))
            interp.allocate_tensors()
            state["model"], state["interp"] = conv, interp
        conv, interp = state["model"], state["interp"]
        for s in conv.inputs:
            interp.set_tensor(s.index, s.to_tflite(feeds[s.name]))
        interp.invoke()
        return {s.name: s.from_tflite(interp.get_tensor(s.index)) for s in conv.outputs}

    def safe_plain(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if state.get("failed"):
            return fp32.plain(feeds)
        try:
            return plain(feeds)  # conversion errors surface here
        except Exception as e:  # unsupported op, missing range: fp32 numerics, said so
            state["failed"] = f"{type(e).__name__}: {e}"
            rt.numerics = f"ort-cpu fp32 stand-in (int8 TFLite failed: {state['failed'][:120]})"
            rt.precision = "fp32"
            return fp32.plain(feeds)

    def bind(buffers: dict[str, Any]) -> Callable[[], None]:
        def step() -> None:  # never timed (simulated); keeps data flowing for run()
            res = safe_plain({n: buffers[n] for n in inputs})
            for n in outputs:
                np.copyto(buffers[n], np.asarray(res[n]).reshape(buffers[n].shape))

        return step

    rt = PartitionRuntime(pid, target, toolchain, tuple(inputs), tuple(outputs), est,
                          "simulated", "litert int8 (runners.tflite)", safe_plain, bind,
                          precision="int8")
    return rt


def make_runtime(pid: str, target: str, toolchain: str, data: bytes, inputs: Sequence[str],
                 outputs: Sequence[str], est: float, options: Mapping[str, Any] | None = None,
                 threads: int = 1) -> PartitionRuntime:
    """A partition runtime for ``toolchain``; raises `PlanError` when it cannot run here."""
    opts = dict(options or {})
    threads = int(opts.get("threads", threads) or threads)
    if toolchain in ("ort-cpu", *GPU_TOOLCHAINS):
        return _ort_runtime(pid, target, toolchain, data, inputs, outputs, est, opts, threads)
    if toolchain == "openvino":
        return _ov_runtime(pid, target, data, inputs, outputs, est, opts, threads)
    if toolchain in SIMULATED_TOOLCHAINS:
        return _simulated_runtime(pid, target, toolchain, data, inputs, outputs, est, threads)
    return _generic_runtime(pid, target, toolchain, data, inputs, outputs, est, opts, threads)


# ----------------------------------------------------------------------------------------
# the executor


@dataclass(frozen=True)
class Timing:
    """End-to-end latency: measured parts (timed together) plus simulated parts (added)."""

    summary: Summary  # of the measured partitions' run, end to end
    simulated_s: float
    measured_partitions: tuple[str, ...]
    simulated_partitions: tuple[str, ...]

    @property
    def total_s(self) -> float:
        return self.summary.median + self.simulated_s

    def to_json(self) -> dict:
        return {"total_s": self.total_s, "measured_s": self.summary.median,
                "simulated_s": self.simulated_s,
                "measured_partitions": list(self.measured_partitions),
                "simulated_partitions": list(self.simulated_partitions),
                "summary": dataclasses.asdict(self.summary)}


class PlanExecutor:
    """Loads a plan directory and runs its partitions in file order, tensors wired by name.

    ``threads`` is the intra-op thread count of every session (1 by default, like candidates).
    ``model`` (path or ModelProto) is the original model for `check`; else plan.json's
    ``source`` (``zoo:NAME`` rebuilt with `collage_farm.zoo.build`, ``pkg:NAME`` from its pip
    package, or a path).
    """

    def __init__(self, plan_dir: str | Path, *, threads: int = 1,
                 model: str | os.PathLike | onnx.ModelProto | None = None,
                 shapes: Mapping[str, Sequence[int]] | None = None) -> None:
        self.plan_dir = Path(plan_dir)
        self.plan, self.files = load_plan(plan_dir)
        self.threads = threads
        self.model_arg = model
        self.shapes = dict(shapes or {})
        self.partitions: list[PartitionRuntime] = []
        if not self.plan.partitions:
            raise PlanError(f"plan {self.plan_dir}: no partitions")
        for p in self.plan.partitions:
            f = self.files[p.id]
            try:
                data = f.read_bytes()
            except OSError as e:
                raise PlanError(f"partition {p.id}: cannot read {f} "
                                f"({e.strerror or e})") from None
            tc = p.toolchain or _toolchain_of_target(self.plan, p.target)
            try:
                self.partitions.append(make_runtime(
                    p.id, p.target, tc, data, p.inputs, p.outputs, p.estimated_s,
                    _target_options(self.plan, p.target), threads))
            except PlanError:
                raise
            except Exception as e:  # a corrupt or swapped file: the toolchain's own words
                why = " ".join(str(e).split())  # OpenVINO's errors span lines
                raise PlanError(f"partition {p.id}: {f.name} does not load on {tc} "
                                f"({type(e).__name__}: {why[:300]})") from None
        try:
            self._input_specs = _input_specs(self.files.values(), self.plan.graph_inputs)
        except Exception as e:
            raise PlanError(f"plan {self.plan_dir}: its graph inputs are not read by its "
                            f"partition files ({type(e).__name__}: {str(e)[:200]})") from None
        self._buffers: dict[str, Any] | None = None
        self._shapes_bound: dict[str, tuple[int, ...]] = {}
        self._keep: list[Any] = []
        self._steps: list[Callable[[], None]] = []

    @classmethod
    def from_runtimes(cls, runtimes: Sequence[PartitionRuntime], graph_inputs: Sequence[str],
                      graph_outputs: Sequence[str], model_bytes: bytes | onnx.ModelProto
                      ) -> PlanExecutor:
        """An executor over given runtimes (whole models, in-memory plans being refined).

        Runtimes may be shared between executors: each executor binds its own steps.
        """
        self = cls.__new__(cls)
        self.plan_dir = Path(".")
        self.plan = Plan(model="", targets=(), partitions=(), estimated_total_s=0.0,
                         graph_inputs=tuple(graph_inputs), graph_outputs=tuple(graph_outputs))
        self.files = {}
        self.threads = 1
        self.model_arg = (model_bytes if isinstance(model_bytes, onnx.ModelProto)
                          else onnx.load_from_string(model_bytes))
        self.shapes = {}
        self.partitions = list(runtimes)
        self._input_specs = _input_specs_model(self.model_arg, graph_inputs)
        self._buffers = None
        self._shapes_bound = {}
        self._keep = []
        self._steps = []
        return self

    # --- feeds and buffers -------------------------------------------------------------
    def random_feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded feeds for the graph inputs (same scheme as `graph.random_inputs`)."""
        rng = np.random.default_rng(seed)
        feeds = {}
        for name, (shape, dtype) in self._input_specs.items():
            shape = tuple(self.shapes.get(name, shape))
            if dtype.kind == "f":
                feeds[name] = rng.standard_normal(shape).astype(dtype)
            elif dtype.kind in "iu":
                feeds[name] = rng.integers(0, 4, size=shape).astype(dtype)
            elif dtype.kind == "b":
                feeds[name] = rng.integers(0, 2, size=shape).astype(bool)
            else:
                feeds[name] = np.zeros(shape, dtype=dtype)
        return feeds

    def _bind(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        shapes = {k: tuple(np.shape(v)) for k, v in feeds.items()}
        if self._buffers is not None and shapes == self._shapes_bound:
            return self._buffers
        # discovery pass: plain runs learn every tensor's shape and dtype
        env: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in feeds.items()}
        for rt in self.partitions:
            missing = [n for n in rt.inputs if n not in env]
            if missing:
                raise PlanError(f"partition {rt.id} needs {missing} that no earlier partition "
                                f"or graph input provides (partitions out of order?)")
            env.update(rt.plain(env))
        self._discovered = env
        gpu_producers = {n for rt in self.partitions if rt.on_gpu for n in rt.outputs}
        readers: dict[str, list[PartitionRuntime]] = {}
        for rt in self.partitions:
            for n in rt.inputs:
                readers.setdefault(n, []).append(rt)
        outs = set(self.plan.graph_outputs)
        buffers: dict[str, Any] = {}
        for name, val in env.items():
            on_dev = (name in gpu_producers and name not in outs
                      and all(r.on_gpu for r in readers.get(name, [])))
            if on_dev:
                import onnxruntime as ort

                buffers[name] = ort.OrtValue.ortvalue_from_shape_and_type(
                    val.shape, val.dtype, "cuda", 0)
            else:
                buffers[name] = np.ascontiguousarray(np.array(val, copy=True))
        self._steps = []
        for rt in self.partitions:
            rt.step = rt.bind(buffers)  # the latest binding, for callers holding a runtime
            self._steps.append(rt.step)
        self._buffers, self._shapes_bound = buffers, shapes
        return buffers

    def _load_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        buffers = self._bind(feeds)
        for k, v in feeds.items():
            if k in buffers:
                np.copyto(buffers[k], np.asarray(v, dtype=buffers[k].dtype))
        return buffers

    # --- run / check / measure ---------------------------------------------------------
    def run(self, feeds: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run every partition once on ``feeds`` (default: seeded random); graph outputs."""
        feeds = self.random_feeds() if feeds is None else feeds
        buffers = self._load_feeds(feeds)
        for step in self._steps:
            step()
        return {n: np.array(buffers[n], copy=True) for n in self.plan.graph_outputs}

    @property
    def precision(self) -> str:
        """The loosest arithmetic among the partitions: what the output check tolerates."""
        return loosest([rt.precision for rt in self.partitions])

    def target_options(self, target_id: str) -> dict[str, Any]:
        """The options the plan records for ``target_id`` (what its partitions were built with)."""
        return _target_options(self.plan, target_id)

    def reference(self) -> onnx.ModelProto:
        return reference_model(self.plan, self.model_arg, self.plan_dir, self.shapes)

    def check(self, feeds: Mapping[str, np.ndarray] | None = None,
              model: str | os.PathLike | onnx.ModelProto | None = None) -> dict[str, float]:
        """Compare with the original model run whole in ORT CPU; max abs error per output.

        Raises `ExecutionMismatch` naming the first output out of tolerance.
        """
        feeds = self.random_feeds() if feeds is None else feeds
        ref_model = reference_model(self.plan, model if model is not None else self.model_arg,
                                    self.plan_dir, self.shapes)
        sess = _ort_session(ref_model.SerializeToString(), ["CPUExecutionProvider"], self.threads)
        names = [o.name for o in sess.get_outputs()]
        want = [n for n in self.plan.graph_outputs if n in names] or names
        ref = dict(zip(want, sess.run(want, {i.name: feeds[i.name] for i in sess.get_inputs()})))
        got = self.run(feeds)
        return compare_outputs(got, ref, precision=self.precision)

    def measure(self, config: MeasureConfig | None = None,
                feeds: Mapping[str, np.ndarray] | None = None) -> Timing:
        """End-to-end latency; inputs bound once, simulated partitions added, not timed."""
        config = config or MeasureConfig()
        fn = self.timed_callable(feeds)
        samples, medians = time_callable(fn, config)
        return self.timing(Summary.of(samples, medians))

    def timed_callable(self, feeds: Mapping[str, np.ndarray] | None = None
                       ) -> Callable[[], None]:
        """The measured partitions' steps as one call (binds ``feeds`` once)."""
        self._load_feeds(self.random_feeds() if feeds is None else feeds)
        steps = [st for rt, st in zip(self.partitions, self._steps) if rt.kind == "measured"]
        buffers = self._buffers  # bound by pointer: must live as long as the callable

        def run_all() -> None:
            for s in steps:
                s()

        run_all.buffers = buffers  # type: ignore[attr-defined]
        return run_all

    def timing(self, summary: Summary) -> Timing:
        return Timing(
            summary=summary,
            simulated_s=sum(rt.estimated_s for rt in self.partitions if rt.kind == "simulated"),
            measured_partitions=tuple(rt.id for rt in self.partitions if rt.kind == "measured"),
            simulated_partitions=tuple(rt.id for rt in self.partitions
                                       if rt.kind == "simulated"),
        )

    def measure_in_chain(self, runs: int, *, warmup: int = 0,
                         feeds: Mapping[str, np.ndarray] | None = None
                         ) -> tuple[list[float], dict[str, list[float]]]:
        """``runs`` runs of the whole chain; (chain seconds per run, each measured partition's
        seconds per run *inside* the running chain, by partition id).

        Unlike `measure_partitions` (each partition again and again on its own), every sample
        here finds the caches and layouts its real neighbours left. Callers interleave chains
        and take medians; ``warmup`` runs are not recorded."""
        if not self._steps or feeds is not None:
            self._load_feeds(self.random_feeds() if feeds is None else feeds)
        steps = [(rt.id, step) for rt, step in zip(self.partitions, self._steps)
                 if rt.kind == "measured"]
        clock = time.perf_counter_ns
        totals: list[float] = []
        per: dict[str, list[float]] = {pid: [] for pid, _ in steps}
        for r in range(warmup + runs):
            times = []
            start = clock()
            for _pid, step in steps:
                a = clock()
                step()
                times.append(clock() - a)
            end = clock()
            if r >= warmup:
                totals.append((end - start) * 1e-9)
                for (pid, _), dt in zip(steps, times):
                    per[pid].append(dt * 1e-9)
        return totals, per

    def measure_partitions(self, config: MeasureConfig | None = None,
                           feeds: Mapping[str, np.ndarray] | None = None) -> dict[str, float]:
        """Each measured partition timed alone inside the bound pipeline (median seconds)."""
        config = config or MeasureConfig()
        self._load_feeds(self.random_feeds() if feeds is None else feeds)
        out = {}
        for rt, step in zip(self.partitions, self._steps):
            if rt.kind == "measured":
                s, _ = time_callable(step, config)
                out[rt.id] = float(statistics.median(s))
            else:
                out[rt.id] = rt.estimated_s
        return out


def _toolchain_of_target(plan: Plan, target_id: str) -> str:
    for t in plan.targets:
        if isinstance(t, dict) and t.get("id") == target_id:
            return str(t.get("toolchain", ""))
    from collage_farm.core.target import get_target

    return get_target(target_id).toolchain


def _vi_spec(vi: onnx.ValueInfoProto) -> tuple[tuple[int, ...], np.dtype] | None:
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        return None
    # a dynamic dim (no value, 0 or paddle2onnx's -1) gets 1 unless the caller binds it
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1
            for d in tt.shape.dim]
    return tuple(dims), np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))


def _input_specs(files: Any, graph_inputs: Sequence[str]
                 ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    specs: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
    want = set(graph_inputs)
    for f in files:
        m = onnx.load(str(f), load_external_data=False)
        for vi in m.graph.input:
            if vi.name in want and vi.name not in specs:
                s = _vi_spec(vi)
                if s is not None:
                    specs[vi.name] = s
    return {n: specs[n] for n in graph_inputs if n in specs}


def _input_specs_model(model: onnx.ModelProto, graph_inputs: Sequence[str]
                       ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    out = {}
    for vi in model.graph.input:
        if vi.name in graph_inputs:
            s = _vi_spec(vi)
            if s is not None:
                out[vi.name] = s
    return out


def _load_model_file(path: Path) -> onnx.ModelProto:
    """``onnx.load`` with its failures as `PlanError` naming the file."""
    try:
        return onnx.load(str(path), load_external_data=True)
    except Exception as e:  # DecodeError, OSError, missing external data, ...
        raise PlanError(f"the original model {path} is not a readable ONNX model "
                        f"({type(e).__name__}: {str(e)[:200]})") from None


def reference_model(plan: Plan, model: str | os.PathLike | onnx.ModelProto | None,
                    plan_dir: Path | None = None,
                    shapes: Mapping[str, Sequence[int]] | None = None) -> onnx.ModelProto:
    """The original model: the given one, else plan.json's ``source`` (zoo:NAME, pkg:NAME or
    a path).

    A ``pkg:`` model's inputs are bound as the campaign bound them (plan.json's ``shapes``,
    the entry's defaults for the rest), overridden by ``shapes``: its file has dynamic dims,
    and whole-model runs on each toolchain need static ones.
    """
    if isinstance(model, onnx.ModelProto):
        return model
    if model is not None:
        return _load_model_file(Path(model))
    source = str(plan.extra.get("source") or "")
    if source.startswith("zoo:"):
        from collage_farm import zoo

        layers = plan.extra.get("layers")
        return zoo.build(source[4:], **({} if layers is None else {"layers": int(layers)}))
    from collage_farm.zoo import packaged

    if source.startswith(packaged.PREFIX):
        bound = {**(plan.extra.get("shapes") or {}), **(shapes or {})}
        return packaged.reference_model(source[len(packaged.PREFIX):], bound)
    if source:
        p = Path(source)
        if not p.is_absolute() and plan_dir is not None and not p.exists():
            p = plan_dir / p
        if p.exists():
            return _load_model_file(p)
    raise PlanError(f"plan {plan.model!r}: the original model is unknown (source "
                    f"{source!r} not found); pass it explicitly (--model FILE)")


def compare_outputs(got: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray], *,
                    precision: str = "fp32") -> dict[str, float]:
    """Max abs error per output; raises `ExecutionMismatch` outside ``precision``'s tolerance.

    ``precision`` is a key of `PRECISIONS` (unknown names are held to fp16's tolerance).
    """
    rtol0, atol0, relative = PRECISIONS.get(precision, PRECISIONS["fp16"])
    errors: dict[str, float] = {}
    for name, r in ref.items():
        if name not in got:
            raise ExecutionMismatch(name, float("inf"), float("inf"), "missing from the plan")
        g = np.asarray(got[name])
        r = np.asarray(r)
        if g.shape != r.shape:
            raise ExecutionMismatch(name, float("inf"), float("inf"),
                                    f"shape {g.shape} vs {r.shape}")
        if r.dtype.kind not in "fc":
            bad = int(np.count_nonzero(g != r))
            if bad:
                raise ExecutionMismatch(name, float(bad), 1.0, f"{bad} elements differ")
            errors[name] = 0.0
            continue
        g64, r64 = g.astype(np.float64), r.astype(np.float64)
        diff = np.abs(g64 - r64)
        max_abs = float(np.nanmax(diff)) if diff.size else 0.0
        max_rel = float(np.nanmax(diff / np.maximum(np.abs(r64), 1e-12))) if diff.size else 0.0
        rtol = rtol0
        atol = atol0 * float(np.max(np.abs(r64)) or 1.0) if relative else atol0
        label = f"{precision} tolerance rtol={rtol:g}, atol={atol:.3g}"
        nan_differs = bool(np.isnan(g64).any() != np.isnan(r64).any())
        if nan_differs or not np.all(diff <= atol + rtol * np.abs(r64)):
            raise ExecutionMismatch(name, max_abs, max_rel, label)
        errors[name] = max_abs
    return errors


# ----------------------------------------------------------------------------------------
# whole models on one toolchain, interleaved measurement


def single_executor(model: str | os.PathLike | onnx.ModelProto, toolchain: str, *,
                    threads: int = 1, options: Mapping[str, Any] | None = None,
                    shapes: Mapping[str, Sequence[int]] | None = None) -> PlanExecutor:
    """The whole model as one partition on ``toolchain`` (same binding as plans)."""
    from collage_farm.core.graph import load_graph

    g = load_graph(model, shapes)
    data = g.model.SerializeToString()
    rt = make_runtime(f"whole-{toolchain}", toolchain, toolchain, data, g.graph_inputs,
                      g.graph_outputs, 0.0, options, threads)
    return PlanExecutor.from_runtimes([rt], g.graph_inputs, g.graph_outputs, data)


def measure_single(model: str | os.PathLike | onnx.ModelProto, toolchain: str,
                   config: MeasureConfig | None = None, *, threads: int = 1) -> Summary:
    """Latency of the whole model on one toolchain."""
    return single_executor(model, toolchain, threads=threads).measure(config).summary


@dataclass(frozen=True)
class Interleaved:
    """One interleaved run: each callable's summary and its round medians, in round order.

    Round ``i`` of every callable ran within one turn of the rotation (A B C, then B C A, ...),
    so the ratio of two callables' round-``i`` medians is free of the drift between turns:
    `collage_farm.postsearch.noise.paired` compares plans on those ratios.
    """

    summaries: dict[str, Summary]
    rounds: dict[str, tuple[float, ...]]


def measure_interleaved(fns: Mapping[str, Callable[[], None]], config: MeasureConfig
                        ) -> dict[str, Summary]:
    """Time several callables in interleaved rounds (A B C, B C A, ...), one round each turn.

    Each turn is one `time_callable` round (``rounds=1``); warm-up runs happen once per
    callable before the first round; rounds whose median is off by more than ``outlier_ratio``
    are re-run once at the end, interleaved too. `measure_interleaved_rounds` also returns the
    round medians.
    """
    return measure_interleaved_rounds(fns, config).summaries


def measure_interleaved_rounds(fns: Mapping[str, Callable[[], None]], config: MeasureConfig
                               ) -> Interleaved:
    """`measure_interleaved`, with each callable's round medians kept in round order.

    An outlier round re-run at the end replaces that round's median in place, so pairing by
    round index stays (that one pair is further apart in time, which only widens the spread).
    """
    names = list(fns)
    one = dataclasses.replace(config, rounds=1, warmup_runs=0, outlier_ratio=0.0)
    for n in names:
        for _ in range(max(0, config.warmup_runs)):
            fns[n]()
    rounds = max(1, config.rounds)
    samples: dict[str, list[list[float]]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            s, _ = time_callable(fns[n], one)
            samples[n].append(s)
    if rounds >= 2 and config.outlier_ratio > 0:
        for n in names:
            meds = [statistics.median(s) for s in samples[n]]
            center = statistics.median(meds)
            for i, m in enumerate(meds):
                if center > 0 and abs(m - center) / center > config.outlier_ratio:
                    samples[n][i], _ = time_callable(fns[n], one)
    out, per_round = {}, {}
    for n in names:
        flat = [x for s in samples[n] for x in s]
        per_round[n] = tuple(statistics.median(s) for s in samples[n])
        out[n] = Summary.of(flat, per_round[n])
    return Interleaved(out, per_round)


@dataclass
class CompareResult:
    """One interleaved run: the plan (if any) and whole models per target."""

    singles: dict[str, float] = field(default_factory=dict)  # `Single.label` -> median seconds
    single_errors: dict[str, str] = field(default_factory=dict)
    plan: Timing | None = None
    estimated_total_s: float | None = None
    ort_multi_ep: dict[str, Any] = field(default_factory=dict)

    @property
    def best_single(self) -> tuple[str, float] | None:
        if not self.singles:
            return None
        k = min(self.singles, key=lambda n: self.singles[n])
        return k, self.singles[k]

    @property
    def additive_error(self) -> float | None:
        if self.plan is None or self.estimated_total_s is None:
            return None
        return (self.plan.total_s - self.estimated_total_s) / self.plan.total_s

    @property
    def apparent_loss(self) -> float | None:
        """plan / best single - 1 (positive: the plan is slower than the best single)."""
        b = self.best_single
        if self.plan is None or b is None:
            return None
        return self.plan.total_s / b[1] - 1.0

    def to_json(self) -> dict:
        b = self.best_single
        return {
            "singles_s": self.singles,
            "single_errors": self.single_errors,
            "best_single": b[0] if b else None,
            "best_single_s": b[1] if b else None,
            "plan_measured_s": self.plan.total_s if self.plan else None,
            "plan_timing": self.plan.to_json() if self.plan else None,
            "estimated_total_s": self.estimated_total_s,
            "additive_error": self.additive_error,
            "apparent_loss": self.apparent_loss,
            "ort_multi_ep": self.ort_multi_ep,
        }


def ort_multi_ep(model: str | os.PathLike | onnx.ModelProto, threads: int = 1
                 ) -> tuple[PlanExecutor | None, str]:
    """ORT's own assignment over [TensorRT, CUDA, CPU]; (executor, note) or (None, why not)."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        return None, f"onnxruntime missing ({e})"
    have = ort.get_available_providers()
    if "CUDAExecutionProvider" not in have:
        return None, ("does not apply: this onnxruntime has only "
                      f"{', '.join(have)}; ORT's multi-EP assignment needs the CUDA/TensorRT EPs")
    from runners.cuda import cuda_devices, load_tensorrt, preload_cuda

    devs = cuda_devices()
    if isinstance(devs, str):
        return None, f"does not apply: {devs}"
    preload_cuda()
    # TensorRT only where its libraries load: else ORT prints an EP error and retries without it
    providers = [p for p in ("TensorrtExecutionProvider", "CUDAExecutionProvider") if p in have
                 and (p != "TensorrtExecutionProvider" or load_tensorrt() is None)]
    from collage_farm.core.graph import load_graph

    g = load_graph(model)
    data = g.model.SerializeToString()
    sess = _ort_session(data, [*providers, "CPUExecutionProvider"], threads)
    out_names = [o.name for o in sess.get_outputs()]

    def plain(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(out_names, sess.run(out_names, dict(feeds))))

    def bind(buffers: dict[str, Any]) -> Callable[[], None]:
        io = sess.io_binding()
        for i in sess.get_inputs():
            _ort_bind(io, i.name, buffers[i.name], output=False)
        for n in out_names:
            _ort_bind(io, n, buffers[n], output=True)

        def step() -> None:
            sess.run_with_iobinding(io)
            io.synchronize_outputs()

        return step

    rt = PartitionRuntime("ort-multi-ep", "ort-multi-ep", "ort-multi-ep", g.graph_inputs,
                          g.graph_outputs, 0.0, "measured", "ort " + ",".join(providers), plain,
                          bind, precision="tf32")  # ORT's CUDA EP default (use_tf32=1)
    return (PlanExecutor.from_runtimes([rt], g.graph_inputs, g.graph_outputs, data),
            f"providers {sess.get_providers()}")


@dataclass(frozen=True)
class Single:
    """A whole model to time in `compare_interleaved`: shown as ``label`` (a target's name),
    built by ``toolchain`` with ``options`` (the target's: a TensorRT fp16 variant and its
    fp32 sibling are two singles, not one toolchain's defaults twice)."""

    label: str
    toolchain: str
    options: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def of(target: Any) -> Single:
        """The single of a `collage_farm.core.target.Target`."""
        return Single(target.id, target.toolchain, tuple(target.options))


def compare_interleaved(model: str | os.PathLike | onnx.ModelProto | None,
                        singles: Sequence[str | Single], config: MeasureConfig | None = None,
                        *, plan: PlanExecutor | None = None, threads: int = 1,
                        multi_ep: bool = True) -> CompareResult:
    """Plan (optional) and whole models, measured in one interleaved run.

    ``singles``: `Single` entries, or bare toolchain ids (labelled by the id, default options).
    """
    config = config or MeasureConfig()
    res = CompareResult()
    fns: dict[str, Callable[[], None]] = {}
    keep: list[PlanExecutor] = []
    if model is None and plan is not None:
        model = plan.reference()
    if model is not None:
        wanted = {s.label: s for s in (x if isinstance(x, Single) else Single(x, x)
                                        for x in singles)}
        for label, one in wanted.items():
            if one.toolchain in SIMULATED_TOOLCHAINS:
                res.single_errors[label] = "simulated toolchain: no whole-model measurement"
                continue
            try:
                ex = single_executor(model, one.toolchain, threads=threads,
                                     options=dict(one.options) or None)
                fns[label] = ex.timed_callable()
                keep.append(ex)
            except Exception as e:
                res.single_errors[label] = f"{type(e).__name__}: {str(e)[:300]}"
        if multi_ep:
            ex_m, note = ort_multi_ep(model, threads)
            res.ort_multi_ep = {"applies": ex_m is not None, "note": note}
            if ex_m is not None:
                try:
                    fns["ort-multi-ep"] = ex_m.timed_callable()
                    keep.append(ex_m)
                except Exception as e:
                    res.ort_multi_ep = {"applies": True, "note": f"failed: {e}"}
    if plan is not None:
        fns["plan"] = plan.timed_callable()
        res.estimated_total_s = plan.plan.estimated_total_s
    summaries = measure_interleaved(fns, config)
    for n, s in summaries.items():
        if n == "plan":
            assert plan is not None
            res.plan = plan.timing(s)
        elif n == "ort-multi-ep":
            res.ort_multi_ep["measured_s"] = s.median
        else:
            res.singles[n] = s.median
    return res
