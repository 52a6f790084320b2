"""ONNX Runtime: one session builder for candidates and plans, its plan runtime, the CPU EP.

Why one builder: a plan's estimate adds candidate costs, and `collage_farm.execute` checks it by
timing the plan, so candidates and plan partitions must run in identically configured
sessions. `session_options` is that configuration, used by every ONNX Runtime session of the
project (candidates in `OrtCpuToolchain` and the CUDA/TensorRT toolchains, plan partitions,
the executor's whole-model reference and ORT's own multi-EP assignment): graph optimisation
level ALL, ``intra_op_num_threads`` = the thread count (`MeasureConfig.threads` for candidates,
the executor's ``threads`` or the target's ``threads`` option for plans), one inter-op thread,
sequential execution, errors only in the log, and no spin-waiting (`NO_SPINNING`).

Threads: with more than one intra-op thread ONNX Runtime keeps a pool whose threads spin-wait
after each parallel section by default (``session.intra_op.allow_spinning`` = 1); they keep
burning a core after ``run`` returns. On this project's 2-core CPU nodes, measured with
``bench/mixed_plans.py`` at 2 threads (one process per setting, in turns, load 4-5; resnet18 at
64 px cut in 3 chunks): with spinning a process spent 0.65-1.15 CPU seconds per wall second
*sleeping* right after a run (0.00 without), a plan alternating OpenVINO and ORT chunks ran in
16.6-20.4 ms end to end (6.2-6.7 ms without: the OpenVINO chunks competed with the spinning
pool) and even ORT's whole model ran in 13.8-14.6 ms (6.9-7.3 ms without). A partition timed
alone competes only with its own session's pool, so the plan's additive error grew too (that
mix: 45-46% with spinning, 12-18% without; medians of paired rounds). With one thread
(campaigns' default) there is no pool and nothing changes. Both spin settings are off in every
session, candidates and plans alike.

Measurement (``ort-cpu``): the timed call is ``run_with_iobinding`` with inputs bound once as
OrtValues and outputs bound to preallocated OrtValues (~3 us floor instead of ~7.5 us for
``run()``). Target option ``iobinding=False`` times plain ``run()`` instead (kept for the
overhead comparison).

Plans (`ort_runtime`): the executor's buffers are bound by pointer (host numpy arrays) or as
device ``OrtValue``s, so the timed step is only ``run_with_iobinding`` (plus
``synchronize_outputs`` on a GPU).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from collage_farm.core.target import CPU0, VirtualDevice
from runners.base import Capabilities, Kind
from runners.kernels import ORT_CPU_KERNELS, OnnxOpTableCapabilities
from runners.onnx_base import OnnxToolchainBase, Prepared, option_bool
from runners.profile import Profiler
from runners.profilers import OrtTraceProfiler
from runners.runtime import PartitionRuntime, RuntimeInput

if TYPE_CHECKING:
    from collage_farm.core.target import Target

__all__ = ["NO_SPINNING", "OrtCpuToolchain", "ort_bind", "ort_runtime", "ort_session",
           "session_options"]


#: session config entries of every session: pool threads block instead of spin-waiting
#: (module docstring, "Threads")
NO_SPINNING: dict[str, str] = {"session.intra_op.allow_spinning": "0",
                               "session.inter_op.allow_spinning": "0"}


def session_options(threads: int) -> Any:
    """The ``SessionOptions`` of every ONNX Runtime session (module docstring)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = max(1, threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    for key, value in NO_SPINNING.items():
        so.add_session_config_entry(key, value)
    return so


def ort_session(data: bytes, providers: list[Any], threads: int) -> Any:
    """An ``InferenceSession`` over ONNX bytes with `session_options` and ``providers``."""
    import onnxruntime as ort

    return ort.InferenceSession(data, session_options(threads), providers=providers)


def ort_bind(io: Any, name: str, buf: Any, *, output: bool) -> None:
    """Bind ``buf`` to ``name``: a host numpy array by pointer, else a (device) OrtValue."""
    if isinstance(buf, np.ndarray):
        fn = io.bind_output if output else io.bind_input
        fn(name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
    else:
        (io.bind_ortvalue_output if output else io.bind_ortvalue_input)(name, buf)


def ort_runtime(sess: Any, inp: RuntimeInput, toolchain: str, numerics: str, *,
                precision: str, on_gpu: bool = False, sync_outputs: bool = False
                ) -> PartitionRuntime:
    """A plan runtime over a session: ``plain`` runs it on named arrays, ``bind`` binds the
    executor's buffers with IOBinding (inputs synchronised once); the step waits for the
    outputs when ``sync_outputs`` (a GPU session)."""
    in_names = [i.name for i in sess.get_inputs()]
    out_names = [o.name for o in sess.get_outputs()]

    def plain(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        res = sess.run(out_names, {n: feeds[n] for n in in_names})
        return {n: np.asarray(v) for n, v in zip(out_names, res)}

    def bind(buffers: dict[str, Any]) -> Callable[[], None]:
        io = sess.io_binding()
        for n in in_names:
            ort_bind(io, n, buffers[n], output=False)
        for n in out_names:
            ort_bind(io, n, buffers[n], output=True)
        io.synchronize_inputs()
        run = sess.run_with_iobinding
        if not sync_outputs:
            return lambda: run(io)

        def synced_step() -> None:
            run(io)
            io.synchronize_outputs()

        return synced_step

    return PartitionRuntime.of(inp, toolchain, Kind.MEASURED, numerics, plain, bind,
                               precision=precision, on_gpu=on_gpu)


class OrtCpuToolchain(OnnxToolchainBase):
    """ONNX Runtime, CPU execution provider."""

    name = "ort-cpu"
    device_kind = "cpu"
    providers: tuple[str, ...] = ("CPUExecutionProvider",)

    def capabilities(self) -> Capabilities:
        return OnnxOpTableCapabilities(self.name, ORT_CPU_KERNELS)

    def available(self) -> str | None:
        try:
            import onnxruntime as ort
        except ImportError as e:
            return f"onnxruntime not installed ({e})"
        missing = [p for p in self.providers if p not in ort.get_available_providers()]
        if missing:
            return f"onnxruntime {ort.__version__} lacks {', '.join(missing)}"
        return None

    def version(self) -> str:
        import onnxruntime as ort

        return f"onnxruntime {ort.__version__}"

    def _provider_list(self, target: Target) -> list[Any]:
        return list(self.providers)

    def precision(self, target: Target) -> str:
        """The arithmetic this target runs fp32 graphs with (the plan check's tolerance)."""
        return "fp32"

    def _compile(self, onnx_bytes: bytes, target: Target, threads: int) -> Any:
        return ort_session(onnx_bytes, self._provider_list(target), threads)

    def profiler(self) -> Profiler:
        """ONNX Runtime session profiling (`runners.profilers.OrtTraceProfiler`)."""
        return OrtTraceProfiler(self)

    def profiling_session(self, onnx_bytes: bytes, target: Target, threads: int,
                          trace_prefix: str, optimized_path: str) -> Any:
        """A session configured exactly as candidates' (`session_options`, this target's
        providers) with profiling on: its trace goes to ``trace_prefix``*, the optimised
        model it runs to ``optimized_path`` (its graph: the weights go to a file beside it,
        so reading the graph back does not parse a transformer's few hundred MB again)."""
        import onnxruntime as ort

        so = session_options(threads)
        so.enable_profiling = True
        so.profile_file_prefix = trace_prefix
        so.optimized_model_filepath = optimized_path
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name",
            os.path.basename(optimized_path) + ".weights")
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        return ort.InferenceSession(onnx_bytes, so, providers=self._provider_list(target))

    def _build_details(self, handle: Any) -> tuple[tuple[str, object], ...]:
        return (("providers", ",".join(handle.get_providers())),)

    def _bind_device(self) -> tuple[str, int]:
        """Where inputs and outputs are bound: ("cpu", 0) here, ("cuda", id) in runners.cuda."""
        return ("cpu", 0)

    def _prepare(self, handle: Any, feeds: dict[str, np.ndarray], target: Target | None
                 ) -> Prepared:
        import onnxruntime as ort

        sess = handle
        names = [o.name for o in sess.get_outputs()]
        first = sess.run(names, feeds)  # learns output shapes; counts as a warm-up run
        if target is not None and not option_bool(target, "iobinding", True):
            def plain() -> Any:
                return sess.run(names, feeds)

            def plain_outputs() -> dict[str, np.ndarray]:
                return dict(zip(names, (np.asarray(x) for x in sess.run(names, feeds))))

            return Prepared(plain, None, plain_outputs, (("iobinding", False),), [feeds])
        device, dev_id = self._bind_device()
        io = sess.io_binding()
        keep: list[object] = [feeds]
        for name, x in feeds.items():
            v = ort.OrtValue.ortvalue_from_numpy(np.asarray(x, order="C"), device, dev_id)
            keep.append(v)
            io.bind_ortvalue_input(name, v)
        for name, out in zip(names, first):
            if isinstance(out, np.ndarray) and out.dtype != object:
                v = ort.OrtValue.ortvalue_from_shape_and_type(out.shape, out.dtype, device,
                                                              dev_id)
                keep.append(v)
                io.bind_ortvalue_output(name, v)
            else:  # sequences, maps, strings: let ORT allocate per run
                io.bind_output(name, "cpu")
        io.synchronize_inputs()

        def run() -> None:
            # no RunOptions: onnxruntime 1.31's Python wrapper inspects a given RunOptions on
            # every call (WebGPU graph-capture check), which costs ~25 us; None costs nothing
            sess.run_with_iobinding(io)

        def outputs() -> dict[str, np.ndarray]:
            return dict(zip(names, (np.array(v.numpy()) for v in io.get_outputs())))

        return Prepared(run, io.synchronize_outputs if device != "cpu" else None, outputs,
                        (("iobinding", True), ("bind_device", device)), keep)

    def _run(self, handle: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o.name for o in handle.get_outputs()]
        return dict(zip(names, (np.asarray(x) for x in handle.run(names, dict(feeds)))))

    # --- plan partitions -----------------------------------------------------------------
    def runtime_device(self) -> VirtualDevice:
        """The device a plan partition's target is on (the CUDA EPs: the worker's GPU 0)."""
        return CPU0

    def runtime(self, inp: RuntimeInput) -> PartitionRuntime:
        """The partition as a session compiled exactly as candidates are (`_compile`: same
        session options and providers), bound with IOBinding (`ort_runtime`)."""
        target = inp.target_on(self.name, self.runtime_device())
        sess = self._compile(inp.onnx_bytes, target, inp.threads)
        on_gpu = self._bind_device()[0] != "cpu"
        precision = self.precision(target)
        return ort_runtime(sess, inp, self.name, f"{self.name} {precision}",
                           precision=precision, on_gpu=on_gpu, sync_outputs=on_gpu)
