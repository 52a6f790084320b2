"""OpenVINO on the CPU ("openvino"), reading ONNX bytes through its ONNX frontend.

Why measured this way: OpenVINO and ONNX Runtime (`runners.ort`) are the two graph compilers
every CPU node offers, they live in one process, and their per-model latencies differ in both
directions by model, so a Collage mix is worth searching for; for that search to be honest the
two are timed the same way, with the per-call overhead of the Python bindings taken out.
``Core().read_model`` reads the ONNX bytes, compiled for ``CPU`` with ``INFERENCE_NUM_THREADS``
= threads, ``INFERENCE_PRECISION_HINT`` = the target's ``precision`` option (default f32:
otherwise bf16 on CPUs that have it, not comparable), the LATENCY hint and one stream; inputs
are bound once with ``ov.Tensor(x, shared_memory=True)`` and the timed call is ``req.infer()``
without arguments (``infer([x])`` costs 100-150 us of Python conversion per call).

Plan partitions (`OpenVinoToolchain.runtime`) are compiled by the same `_compile` as
candidates, so plans and candidates run identically configured models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from collage_farm.core.target import CPU0
from runners.base import Capabilities, Kind
from runners.kernels import OPENVINO_OPS, OnnxOpTableCapabilities
from runners.onnx_base import OnnxToolchainBase, Prepared, error_text
from runners.profile import Profiler
from runners.profilers import OpenVinoCountersProfiler
from runners.runtime import PartitionRuntime, RuntimeInput

if TYPE_CHECKING:
    from collage_farm.core.target import Target

__all__ = ["OpenVinoToolchain"]


class OpenVinoToolchain(OnnxToolchainBase):
    """OpenVINO on the CPU, reading the ONNX bytes through its ONNX frontend."""

    name = "openvino"
    device_kind = "cpu"
    device = "CPU"

    def __init__(self) -> None:
        super().__init__()
        self._core: Any = None

    def _get_core(self) -> Any:
        if self._core is None:
            import openvino as ov

            self._core = ov.Core()
        return self._core

    def capabilities(self) -> Capabilities:
        return OnnxOpTableCapabilities(self.name, OPENVINO_OPS)

    def available(self) -> str | None:
        try:
            import openvino  # noqa: F401
        except ImportError as e:
            return f"openvino not installed ({e})"
        try:
            devices = self._get_core().available_devices
        except Exception as e:
            return f"openvino Core() failed: {error_text(e, 300)}"
        if self.device not in devices:
            return f"openvino sees no {self.device} device (has {devices})"
        return None

    def version(self) -> str:
        import openvino as ov

        return f"openvino {ov.__version__}"

    def profiler(self) -> Profiler:
        """Per-layer performance counters (`runners.profilers.OpenVinoCountersProfiler`)."""
        return OpenVinoCountersProfiler(self)

    def compile_profiled(self, onnx_bytes: bytes, target: Target, threads: int) -> Any:
        """The model compiled exactly as candidates are, with performance counters on."""
        return self._compile(onnx_bytes, target, threads, perf_count=True).compiled

    def _compile(self, onnx_bytes: bytes, target: Target, threads: int,
                 perf_count: bool = False) -> Any:
        core = self._get_core()
        model = core.read_model(onnx_bytes)
        config = {
            "INFERENCE_NUM_THREADS": max(1, threads),
            "INFERENCE_PRECISION_HINT": str(target.option("precision", "f32")),
            "PERFORMANCE_HINT": "LATENCY",
            "NUM_STREAMS": 1,
        }
        if perf_count:
            config["PERF_COUNT"] = True
        compiled = core.compile_model(model, self.device, config)
        return _OvHandle(compiled, [o.get_any_name() for o in model.outputs],
                         [i.get_any_name() for i in model.inputs])

    def _build_details(self, handle: Any) -> tuple[tuple[str, object], ...]:
        cm = handle.compiled
        try:
            prec = cm.get_property("INFERENCE_PRECISION_HINT")
            prec = prec.to_string() if hasattr(prec, "to_string") else str(prec)
            return (("inference_num_threads", int(cm.get_property("INFERENCE_NUM_THREADS"))),
                    ("precision", prec))
        except Exception:
            return ()

    def _prepare(self, handle: Any, feeds: dict[str, np.ndarray], target: Target | None
                 ) -> Prepared:
        import openvino as ov

        req = handle.compiled.create_infer_request()
        keep: list[object] = [req]
        for name, x in feeds.items():
            arr = np.asarray(x, order="C")  # not ascontiguousarray: it makes a 0-d input 1-d
            t = ov.Tensor(arr, shared_memory=True)
            keep += [arr, t]
            req.set_tensor(name, t)
        req.infer()  # first run allocates outputs; counts as a warm-up run

        def outputs() -> dict[str, np.ndarray]:
            return handle.read_outputs(req)

        return Prepared(req.infer, None, outputs, (("shared_inputs", True),), keep)

    def _run(self, handle: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        prepared = self._prepare(handle, dict(feeds), None)
        assert prepared.outputs is not None
        return prepared.outputs()


    # --- plan partitions -----------------------------------------------------------------
    def runtime(self, inp: RuntimeInput) -> PartitionRuntime:
        """The partition compiled exactly as candidates are (`_compile`), bound to the
        executor's buffers as shared-memory ``ov.Tensor``s on its inputs *and* outputs."""
        import openvino as ov

        target = inp.target_on(self.name, CPU0)
        handle = self._compile(inp.onnx_bytes, target, inp.threads)
        compiled, in_names = handle.compiled, handle.input_names
        out_ports = list(compiled.outputs)
        wanted = set(inp.outputs)
        port_names = [([n for n in p.get_names() if n in wanted] or [p.get_any_name()])[0]
                      for p in out_ports]
        req = compiled.create_infer_request()

        def plain(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            res = req.infer({n: np.asarray(feeds[n], order="C") for n in in_names})
            return {port_names[i]: np.array(res[p], copy=True) for i, p in enumerate(out_ports)}

        def bind(buffers: dict[str, Any]) -> Callable[[], None]:
            # a request per binding: two executors sharing this runtime (plan refinement times
            # the current and the candidate plan side by side) must not rebind each other's
            r = compiled.create_infer_request()
            for n in in_names:
                r.set_tensor(n, ov.Tensor(buffers[n], shared_memory=True))
            for i, n in enumerate(port_names):
                r.set_output_tensor(i, ov.Tensor(buffers[n], shared_memory=True))
            return r.infer

        precision = str(target.option("precision", "f32"))
        return PartitionRuntime.of(inp, self.name, Kind.MEASURED, f"openvino {precision}",
                                   plain, bind,
                                   precision={"f16": "fp16", "bf16": "bf16"}.get(precision,
                                                                                 "fp32"))

@dataclass
class _OvHandle:
    compiled: Any
    output_names: list[str]  # the ONNX model's output names
    input_names: list[str] = field(default_factory=list)  # the ONNX model's input names

    def read_outputs(self, req: Any) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        for i, port in enumerate(self.compiled.outputs):
            names = port.get_names()
            wanted = [n for n in self.output_names if n in names] or [port.get_any_name()]
            data = np.array(req.get_output_tensor(i).data, copy=True)
            for n in wanted:
                out[n] = data
        return out
