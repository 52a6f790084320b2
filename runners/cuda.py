"""CUDA toolchains: ONNX Runtime's CUDA EP ("ort-cuda") and TensorRT EP ("ort-tensorrt").

Install (onnxruntime-gpu replaces onnxruntime: same import name, so uninstall first)::

    pip uninstall -y onnxruntime && pip install -e .[cuda]

Why measured this way: on a GPU the Python binding's per-call work and host<->device copies can
dwarf a small sub-graph's kernel time, and Collage compares sub-graphs of a few kernels. So
inputs are copied to the device once (``OrtValue.ortvalue_from_numpy(x, "cuda", 0)``), outputs
are bound to preallocated device OrtValues, and the timed call is ``run_with_iobinding``
followed by ``synchronize_outputs`` (ORT's ``Run`` already waits for its stream unless told not
to; the explicit sync keeps the timing honest if that default changes). Host<->device transfer
between partitions is the transition model's business, not the candidate's.

TensorRT: the TensorRT EP goes first, with the CUDA EP as fallback for nodes TensorRT rejects
(and the CPU EP last, as ORT requires). Engines are cached on disk
(``trt_engine_cache_enable``/``trt_engine_cache_path``, plus the timing cache) under target
option ``engine_cache_dir``, else ``$COLLAGE_TRT_CACHE``, else ``~/.cache/collage-farm/trt``:
engine builds take seconds to minutes and the same fingerprint is measured again and again
across campaigns. Target option ``fp16`` sets ``trt_fp16_enable``. A session in which the
requested EP is not active (libraries missing: ORT then silently falls back) is a build failure,
not a CUDA or CPU measurement filed under the wrong toolchain.

`available()` says why not when the installed onnxruntime lacks the EP or no GPU is visible
(the driver is asked through ``libcuda`` with ctypes; nothing heavy is imported). Capabilities
approximate the CUDA EP by ORT's CPU kernel table (ORT places nodes the GPU EPs lack on the
CPU EP, so such sub-graphs still build) with fp16 accepted; the runner's worker pins one GPU
with ``CUDA_VISIBLE_DEVICES``, so inside it the device id is 0.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runners.base import Capabilities, DeviceDescription
from runners.cpu import ORT_CPU_KERNELS, OnnxOpTableCapabilities, OrtCpuToolchain, option_bool

if TYPE_CHECKING:
    from collage_farm.target import Target

__all__ = ["OrtCudaToolchain", "OrtTensorRTToolchain", "cuda_devices", "trt_cache_dir"]

_INSTALL_HINT = "pip uninstall -y onnxruntime && pip install -e .[cuda]"


def _libcuda() -> Any:
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def cuda_devices() -> list[dict[str, Any]] | str:
    """Visible CUDA devices (name, driver version) via the driver API, or why none."""
    lib = _libcuda()
    if lib is None:
        return "no CUDA driver (libcuda.so.1 cannot be loaded)"
    rc = lib.cuInit(0)
    if rc != 0:
        return f"cuInit failed with CUresult {rc} (no GPU, or CUDA_VISIBLE_DEVICES hides it)"
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return "the CUDA driver sees no GPU"
    version = ctypes.c_int(0)
    lib.cuDriverGetVersion(ctypes.byref(version))
    out = []
    for i in range(count.value):
        dev = ctypes.c_int(0)
        lib.cuDeviceGet(ctypes.byref(dev), i)
        buf = ctypes.create_string_buffer(256)
        lib.cuDeviceGetName(buf, 256, dev)
        out.append({"index": i, "name": buf.value.decode(errors="replace"),
                    "driver": f"CUDA driver {version.value // 1000}.{version.value % 1000 // 10}"})
    return out


def trt_cache_dir(target: Target | None = None) -> str:
    """Where TensorRT engines are cached (created if missing)."""
    opt = target.option("engine_cache_dir") if target is not None else None
    path = Path(str(opt or os.environ.get("COLLAGE_TRT_CACHE")
                    or Path.home() / ".cache" / "collage-farm" / "trt")).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


_CUDA_TYPES = frozenset({"float16"})
ORT_CUDA_KERNELS = {
    k: (v | _CUDA_TYPES if v is not None and "float" in v else v)
    for k, v in ORT_CPU_KERNELS.items()
}


class OrtCudaToolchain(OrtCpuToolchain):
    """ONNX Runtime, CUDA execution provider, IOBinding on the device."""

    name = "ort-cuda"
    device_kind = "cuda"
    providers: tuple[str, ...] = ("CUDAExecutionProvider",)
    device_id = 0  # the worker's CUDA_VISIBLE_DEVICES maps the runner's GPU to 0

    def capabilities(self) -> Capabilities:
        return OnnxOpTableCapabilities(self.name, ORT_CUDA_KERNELS)

    def available(self) -> str | None:
        try:
            import onnxruntime as ort
        except ImportError as e:
            return f"onnxruntime not installed ({e}); {_INSTALL_HINT}"
        have = ort.get_available_providers()
        missing = [p for p in self.providers if p not in have]
        if missing:
            return (f"onnxruntime {ort.__version__} has no {', '.join(missing)} "
                    f"(providers: {', '.join(have)}); {_INSTALL_HINT}")
        devs = cuda_devices()
        if isinstance(devs, str):
            return devs
        return None

    def device_description(self, target: Target) -> DeviceDescription:
        devs = cuda_devices()
        if isinstance(devs, str) or not devs:
            return DeviceDescription("cuda", "unavailable", config=str(devs))
        d = devs[min(self.device_id, len(devs) - 1)]
        return DeviceDescription("cuda", d["name"], driver=d["driver"],
                                 config=f"visible={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")

    def _cuda_options(self, target: Target) -> dict[str, Any]:
        return {"device_id": self.device_id,
                "cudnn_conv_algo_search": str(target.option("cudnn_conv_algo_search",
                                                            "EXHAUSTIVE"))}

    def _provider_list(self, target: Target) -> list[Any]:
        return [("CUDAExecutionProvider", self._cuda_options(target)), "CPUExecutionProvider"]

    def _compile(self, onnx_bytes: bytes, target: Target, threads: int) -> Any:
        sess = super()._compile(onnx_bytes, target, threads)
        active = sess.get_providers()
        if self.providers[0] not in active:
            raise RuntimeError(
                f"{self.providers[0]} is not active in the session (active: {active}); "
                f"missing CUDA/cuDNN/TensorRT libraries?")
        return sess

    def _bind_device(self) -> tuple[str, int]:
        return ("cuda", self.device_id)


class OrtTensorRTToolchain(OrtCudaToolchain):
    """ONNX Runtime, TensorRT EP (engine cache on disk, optional fp16), CUDA EP fallback."""

    name = "ort-tensorrt"
    providers = ("TensorrtExecutionProvider", "CUDAExecutionProvider")

    def _provider_list(self, target: Target) -> list[Any]:
        cache = trt_cache_dir(target)
        trt = {
            "device_id": self.device_id,
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": cache,
            "trt_timing_cache_enable": True,
            "trt_timing_cache_path": cache,
            "trt_fp16_enable": option_bool(target, "fp16", False),
        }
        ws = target.option("max_workspace_bytes")
        if ws:
            trt["trt_max_workspace_size"] = int(ws)  # type: ignore[call-overload]
        return [("TensorrtExecutionProvider", trt),
                ("CUDAExecutionProvider", self._cuda_options(target)),
                "CPUExecutionProvider"]
