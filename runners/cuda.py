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
across campaigns. Target option ``fp16`` sets ``trt_fp16_enable``. Target option ``tf32``
(default true, ORT's own default) sets the CUDA EP's ``use_tf32``: on Ampere and later, fp32
convolutions and matrix products then multiply with a 10-bit mantissa, which is faster and is
what users of the EP get; ``tf32: false`` measures strict fp32. `precision` says which, and
the plan check (`collage_farm.execute.PRECISIONS`) tolerates it. A session in which the
requested EP is not active (libraries missing: ORT then silently falls back) is a build failure,
not a CUDA or CPU measurement filed under the wrong toolchain.

Libraries: onnxruntime-gpu 1.31 is built for CUDA 13 and cuDNN 9, and its TensorRT EP for
TensorRT 10 (``libnvinfer.so.10``; TensorRT 11 does not load). pip's ``nvidia-*`` wheels are not
on the loader's path, so before the first session each process calls
``onnxruntime.preload_dlls()`` once (it loads CUDA and cuDNN from the ``nvidia`` site packages
beside onnxruntime, else from the default paths) and, for TensorRT, loads the ``libnvinfer``
soname that the installed EP names from the ``tensorrt_libs`` package when it is there. Without
this, ORT silently falls back to the CPU EP and every "CUDA" cost would be a CPU cost.

Cache modes: a CUDA candidate's data lives in device memory, so ``flush`` and ``network``
modes evict the *GPU's* L2 between runs (a ``cudaMemset`` over a device buffer of the evicted
size, at most 2 x L2, then ``cudaDeviceSynchronize``; `DeviceL2Flusher`), not the host's
caches. Evicting the host's caches before every run measured the wrong cache and, on an H100,
timed 25-50 us candidates about 2.3-2.8x slower than warm runs: such a candidate is mostly host-side
launch work (ORT's run path, kernel launches), which is hot in a running network
(bench/results/gpu-candidates-h100.md). ``network`` with the rest of the network's size
unknown (``network_bytes`` 0) evicts all of L2, as ``flush`` does. Unlike the host's ``network``
mode, the candidate's inputs are not read back into L2 after the eviction (their producer
would have left them there): for inputs that are a small share of L2 this overstates the
cost slightly.

`available()` says why not when the installed onnxruntime lacks the EP, no GPU is visible (the
driver is asked through ``libcuda`` with ctypes), or, for TensorRT, the ``libnvinfer`` the EP
was built against cannot be loaded (named with its version, since TensorRT 11 is what a plain
``pip install tensorrt`` gets). Capabilities
approximate the CUDA EP by ORT's CPU kernel table (ORT places nodes the GPU EPs lack on the
CPU EP, so such sub-graphs still build) with fp16 accepted; the runner's worker pins one GPU
with ``CUDA_VISIBLE_DEVICES``, so inside it the device id is 0.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from collage_farm.core.target import CUDA0, VirtualDevice
from runners.base import (
    BuildResult,
    Capabilities,
    DeviceDescription,
    MeasureConfig,
    RuntimeUnavailable,
)
from runners.kernels import ORT_CPU_KERNELS, OnnxOpTableCapabilities
from runners.onnx_base import Prepared, option_bool
from runners.ort import OrtCpuToolchain, ort_runtime, ort_session
from runners.runtime import PartitionRuntime, RuntimeInput

if TYPE_CHECKING:
    import numpy as np

    from collage_farm.core.target import Target

__all__ = ["DeviceL2Flusher", "OrtCudaToolchain", "OrtTensorRTToolchain", "cuda_devices",
           "load_tensorrt", "multi_ep_runtime", "preload_cuda", "provider_needs",
           "trt_cache_dir"]

_INSTALL_HINT = "pip uninstall -y onnxruntime && pip install -e .[cuda]"
_preloaded: dict[str, str | None] = {}


def preload_cuda() -> str | None:
    """Load CUDA and cuDNN for the CUDA EP once per process; what it printed on failure, or None.

    ``onnxruntime.preload_dlls`` prints (it does not raise) what it could not load, so its output
    is captured and kept as the explanation for a session whose CUDA EP is then not active.
    """
    with _LOCK:
        return _preload_cuda_locked()


def _preload_cuda_locked() -> str | None:
    if "cuda" not in _preloaded:
        import io

        import onnxruntime as ort

        # onnxruntime 1.31 warns "No registered plugin EP device found for
        # 'CUDAExecutionProvider'" at every session it then builds with the CUDA EP all the same:
        # one line per candidate in a campaign's log. Errors still show.
        ort.set_default_logger_severity(3)
        out = io.StringIO()
        fn = getattr(ort, "preload_dlls", None)
        try:
            if fn is not None:
                with contextlib.redirect_stdout(out):
                    fn()
        except Exception as e:  # a bad directory is reported, not fatal
            out.write(f"preload_dlls failed: {type(e).__name__}: {e}")
        text = out.getvalue().strip()
        # ORT prints "Failed to load X" for each library it could not load from its default
        # paths and then "Please follow ..."; a version mismatch prints a WARNING
        _preloaded["cuda"] = text if ("Please follow" in text or "WARNING" in text
                                      or "preload_dlls failed" in text) else None
    return _preloaded["cuda"]


def provider_needs(library: str | Path, stem: str) -> list[str]:
    """Sonames starting with ``stem`` that a shared library names (its dynamic string table).

    A byte scan, not an ELF parser: sonames are plain NUL-terminated strings in ``.dynstr``, and
    this only has to tell ``libnvinfer.so.10`` from ``libnvinfer.so.11``.
    """
    try:
        data = Path(library).read_bytes()
    except OSError:
        return []
    pat = re.escape(stem.encode()) + rb"\.so\.[0-9]+"
    return sorted({m.decode() for m in re.findall(pat, data)})


def _ort_capi_dir() -> Path | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    return Path(ort.__file__).parent / "capi"


def load_tensorrt() -> str | None:
    """Load the ``libnvinfer`` (and ONNX parser) the installed TensorRT EP needs; why not, or None.

    Looks in the ``tensorrt_libs`` package (pip's ``tensorrt-cu13-libs``) first, then the default
    loader path (``LD_LIBRARY_PATH``, ldconfig). Loaded ``RTLD_GLOBAL`` so the EP's own
    ``dlopen`` finds them.
    """
    with _LOCK:
        return _load_tensorrt_locked()


def _load_tensorrt_locked() -> str | None:
    if "trt" in _preloaded:
        return _preloaded["trt"]
    capi = _ort_capi_dir()
    ep = capi / "libonnxruntime_providers_tensorrt.so" if capi is not None else None
    needed = (provider_needs(ep, "libnvinfer") + provider_needs(ep, "libnvonnxparser")
              if ep is not None and ep.exists() else [])
    if not needed:
        needed = ["libnvinfer.so.10", "libnvonnxparser.so.10"]
    dirs: list[Path] = []
    try:
        import tensorrt_libs  # type: ignore[import-not-found]

        dirs.append(Path(tensorrt_libs.__file__).parent)
    except ImportError:
        pass
    why: list[str] = []
    for name in needed:
        errors = []
        for cand in [*(str(d / name) for d in dirs), name]:
            try:
                ctypes.CDLL(cand, mode=ctypes.RTLD_GLOBAL)
                break
            except OSError as e:
                errors.append(str(e))
        else:
            why.append(f"{name}: {errors[-1]}")
    major = needed[0].rsplit(".", 1)[-1]
    _preloaded["trt"] = (
        f"the installed TensorRT EP needs {', '.join(needed)} (TensorRT {major}.x for CUDA 13) "
        f"and cannot load it ({'; '.join(why)}); pip install tensorrt-cu13-libs=={major}.* "
        f"or put TensorRT {major} on LD_LIBRARY_PATH" if why else None)
    return _preloaded["trt"]


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


CUDA_DEV_ATTR_L2_CACHE_SIZE = 38  # cudaDevAttrL2CacheSize (driver_types.h)
MIN_PLAUSIBLE_L2 = 256 << 10  # every CUDA GPU since Kepler has at least this much L2
_LOCK = threading.Lock()


class _DeviceBuffer:
    """A device allocation that frees itself when the last flusher using it is gone."""

    def __init__(self, rt: Any, size: int) -> None:
        self.rt, self.size, self.ptr = rt, size, ctypes.c_void_p()
        _check(rt, rt.cudaMalloc(ctypes.byref(self.ptr), ctypes.c_size_t(size)), "cudaMalloc")

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.rt.cudaFree(self.ptr)


class DeviceL2Flusher:
    """Evicts the current GPU's L2: writes ``nbytes`` of a device buffer, then synchronises.

    Uses the CUDA runtime that ORT's CUDA EP loaded (the ``libcudart`` soname its provider
    library names), so it runs in the same primary context as the sessions. ``nbytes`` is
    clamped to 2 x L2 (more evicts nothing more). Flushers share the process's largest buffer;
    each keeps its own alive, so a newer, larger one never frees memory an older one writes.
    Raises OSError/RuntimeError when the runtime or the device is unusable, or when the L2 size
    it reads is implausible (below 256 KiB: the attribute read the wrong thing).
    """

    _buffer: _DeviceBuffer | None = None
    _l2: dict[int, int] = {}  # device ordinal -> L2 bytes

    def __init__(self, nbytes: int) -> None:
        rt = _cudart()
        dev = ctypes.c_int(0)
        _check(rt, rt.cudaGetDevice(ctypes.byref(dev)), "cudaGetDevice")
        with _LOCK:
            if dev.value not in DeviceL2Flusher._l2:
                l2 = ctypes.c_int(0)
                _check(rt, rt.cudaDeviceGetAttribute(ctypes.byref(l2),
                                                     CUDA_DEV_ATTR_L2_CACHE_SIZE, dev.value),
                       "L2 size")
                if l2.value < MIN_PLAUSIBLE_L2:
                    raise RuntimeError(f"implausible L2 size {l2.value} B on device {dev.value}")
                DeviceL2Flusher._l2[dev.value] = int(l2.value)
            self.l2_bytes = DeviceL2Flusher._l2[dev.value]
            self.nbytes = max(0, min(int(nbytes), 2 * self.l2_bytes))
            buf = DeviceL2Flusher._buffer
            if buf is None or buf.size < self.nbytes:
                buf = DeviceL2Flusher._buffer = _DeviceBuffer(rt, max(1, self.nbytes))
        self._rt, self._buf = rt, buf
        self._value = 0

    def __call__(self) -> None:
        if self.nbytes:
            self._value = (self._value + 1) & 0xFF  # new bytes each time: nothing to skip
            _check(self._rt, self._rt.cudaMemset(self._buf.ptr, self._value,
                                                 ctypes.c_size_t(self.nbytes)), "cudaMemset")
        _check(self._rt, self._rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def _check(rt: Any, rc: int, what: str) -> None:
    if rc != 0:
        rt.cudaGetErrorString.restype = ctypes.c_char_p
        raise RuntimeError(f"{what}: CUDA error {rc} ({rt.cudaGetErrorString(rc).decode()})")


@functools.cache
def _cudart() -> Any:
    """The CUDA runtime ORT's CUDA EP links (found once per process: the scan reads the EP)."""
    capi = _ort_capi_dir()
    names = (provider_needs(capi / "libonnxruntime_providers_cuda.so", "libcudart")
             if capi is not None else [])
    errors = []
    for name in [*names, "libcudart.so.13", "libcudart.so.12", "libcudart.so"]:
        try:
            return ctypes.CDLL(name)
        except OSError as e:
            errors.append(str(e))
    raise OSError(f"no CUDA runtime library: {'; '.join(errors)}")


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
    """ONNX Runtime, CUDA execution provider, IOBinding on the device.

    Its per-operator profiler is ONNX Runtime's session trace with this EP
    (`runners.profilers.OrtTraceProfiler`, inherited): a Node event times the kernel's launch
    on the host, so a profile whose sum is far from the whole model falls back to isolated
    measurement in the campaign."""

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
        return self._libraries()

    def _libraries(self) -> str | None:
        """Load the EP's libraries; why not, or None (CUDA's own failures show at build)."""
        preload_cuda()
        return None

    def device_description(self, target: Target) -> DeviceDescription:
        devs = cuda_devices()
        if isinstance(devs, str) or not devs:
            return DeviceDescription("cuda", "unavailable", config=str(devs))
        d = devs[min(self.device_id, len(devs) - 1)]
        return DeviceDescription("cuda", d["name"], driver=d["driver"],
                                 config=f"visible={os.environ.get('CUDA_VISIBLE_DEVICES', '')}")

    def version(self) -> str:
        # rows timed while the host's caches were evicted between runs (2.3-2.8x slow) must not
        # be reused as if taken now: the eviction protocol is part of what the row measured
        # (v2: v1 read the wrong device attribute for the L2 size and evicted 2 bytes)
        return f"{super().version()}; evicts gpu l2 v2"

    def precision(self, target: Target) -> str:
        """The arithmetic this target runs fp32 graphs with (the plan check's tolerance)."""
        return "tf32" if option_bool(target, "tf32", True) else "fp32"

    def runtime_device(self) -> VirtualDevice:
        return CUDA0

    def runtime(self, inp: RuntimeInput) -> PartitionRuntime:
        """As the CPU EP's (same session builder), once `available` says the EP can run here;
        a session in which the EP is not active is an error (`_compile`), not a CPU run."""
        why = self.available()
        if why:
            raise RuntimeUnavailable(f"toolchain {self.name} cannot run here: {why}")
        return super().runtime(inp)

    def _cuda_options(self, target: Target) -> dict[str, Any]:
        return {"device_id": self.device_id,
                "cudnn_conv_algo_search": str(target.option("cudnn_conv_algo_search",
                                                            "EXHAUSTIVE")),
                "use_tf32": int(option_bool(target, "tf32", True))}

    def _provider_list(self, target: Target) -> list[Any]:
        return [("CUDAExecutionProvider", self._cuda_options(target)), "CPUExecutionProvider"]

    def _compile(self, onnx_bytes: bytes, target: Target, threads: int) -> Any:
        why = self._libraries()
        if why:
            raise RuntimeError(why)
        sess = super()._compile(onnx_bytes, target, threads)
        active = sess.get_providers()
        if self.providers[0] not in active:
            hint = preload_cuda() or "missing CUDA 13 / cuDNN 9 libraries?"
            raise RuntimeError(
                f"{self.providers[0]} is not active in the session (active: {active}); {hint}")
        return sess

    def _bind_device(self) -> tuple[str, int]:
        return ("cuda", self.device_id)

    def prepare(self, build: BuildResult, config: MeasureConfig,
                feeds: dict[str, np.ndarray] | None = None,
                _handle: tuple[Any, bool] | None = None) -> Prepared:
        """As the CPU toolchain's, plus the GPU's own eviction for ``flush``/``network`` modes."""
        prepared = super().prepare(build, config, feeds, _handle)
        mode = config.measure_mode
        if mode == "warm":
            return prepared
        if config.flush_bytes > 0:
            nbytes = int(config.flush_bytes)
        elif mode == "network" and config.network_bytes > 0:
            nbytes = int(config.network_bytes)
        else:
            nbytes = 1 << 40  # flush, or network with the rest unknown: all of L2 (clamped)
        try:
            flusher = DeviceL2Flusher(nbytes)
        except (OSError, RuntimeError, AttributeError) as e:
            # timing warm and filing it under this mode would be a wrong row: fail instead
            raise RuntimeError(f"cannot evict the GPU's L2 for {mode} mode ({e}); "
                               "measure in warm mode instead") from e
        prepared.flush = flusher
        prepared.details = (*prepared.details,
                            ("evicts", f"gpu l2 {flusher.nbytes} of {flusher.l2_bytes} B"))
        return prepared


class OrtTensorRTToolchain(OrtCudaToolchain):
    """ONNX Runtime, TensorRT EP (engine cache on disk, optional fp16), CUDA EP fallback."""

    name = "ort-tensorrt"
    providers = ("TensorrtExecutionProvider", "CUDAExecutionProvider")

    def _libraries(self) -> str | None:
        preload_cuda()
        return load_tensorrt()

    def precision(self, target: Target) -> str:
        # TensorRT builds fp32 layers with TF32 allowed (its builder default); fp16 when asked
        return "fp16" if option_bool(target, "fp16", False) else "tf32"

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


def multi_ep_runtime(data: bytes, inputs: tuple[str, ...], outputs: tuple[str, ...],
                     threads: int = 1) -> tuple[PartitionRuntime | None, str]:
    """A whole model in ONNX Runtime's own assignment over [TensorRT, CUDA, CPU]:
    (runtime, the session's active providers) or (None, why it does not apply here)."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        return None, f"onnxruntime missing ({e})"
    have = ort.get_available_providers()
    if "CUDAExecutionProvider" not in have:
        return None, ("does not apply: this onnxruntime has only "
                      f"{', '.join(have)}; ORT's multi-EP assignment needs the CUDA/TensorRT EPs")
    devs = cuda_devices()
    if isinstance(devs, str):
        return None, f"does not apply: {devs}"
    preload_cuda()
    # TensorRT only where its libraries load: else ORT prints an EP error and retries without it
    providers = [p for p in ("TensorrtExecutionProvider", "CUDAExecutionProvider") if p in have
                 and (p != "TensorrtExecutionProvider" or load_tensorrt() is None)]
    sess = ort_session(data, [*providers, "CPUExecutionProvider"], threads)
    inp = RuntimeInput("ort-multi-ep", "ort-multi-ep", data, inputs, outputs, threads=threads)
    rt = ort_runtime(sess, inp, "ort-multi-ep", "ort " + ",".join(providers),
                     precision="tf32",  # ORT's CUDA EP default (use_tf32=1)
                     sync_outputs=True)
    return rt, f"providers {sess.get_providers()}"

