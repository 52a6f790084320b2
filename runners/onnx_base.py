"""The shared skeleton of toolchains that compile ONNX bytes in process, and its helpers.

`OnnxToolchainBase` is the build/measure skeleton of ONNX Runtime (`runners.ort`, and the GPU
execution providers in `runners.cuda`) and OpenVINO (`runners.openvino_cpu`): build creates the
session / compiled model (that is the "compile" the cost table's build time means) and returns
the ONNX bytes as the artifact: sessions cannot cross processes, and the farm may measure on
another node than the one that built. Each toolchain keeps its last compiled handle keyed by
fingerprint, artifact digest and thread count, so a build followed by a measure in the same
worker compiles once.

Inputs are seeded from the fingerprint (`collage_farm.core.graph.random_inputs` over the model's
input value infos), so every toolchain, and every re-measurement, sees the same data.

The helpers (`classify_build_error`, `seed_of`, `artifact_digest`, `error_text`, `option_int`,
`option_bool`, `Prepared`) are shared with the other toolchains (`runners.litert`).
"""

from __future__ import annotations

import hashlib
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import onnx

from collage_farm.core.graph import random_inputs
from runners.base import (
    BuildInput,
    BuildResult,
    DeviceDescription,
    Kind,
    MeasureConfig,
    MeasureInput,
    MeasureResult,
    Status,
    Toolchain,
)
from runners.measure import summarize, time_callable

if TYPE_CHECKING:
    import numpy as np

    from collage_farm.core.target import Target

__all__ = [
    "UNSUPPORTED_PATTERNS",
    "OnnxToolchainBase",
    "Prepared",
    "artifact_digest",
    "classify_build_error",
    "error_text",
    "feeds_for",
    "option_bool",
    "option_int",
    "seed_of",
]

UNSUPPORTED_PATTERNS = (
    "not a registered function/op",
    "could not find an implementation",
    "no conversion rule found",
    "not_implemented",
    "is not supported",
    "unsupported",
)


def classify_build_error(message: str) -> Status:
    """UNSUPPORTED when the toolchain says it has no implementation, else BUILD_FAILED."""
    low = message.lower()
    if any(p in low for p in UNSUPPORTED_PATTERNS):
        return Status.UNSUPPORTED
    return Status.BUILD_FAILED


def seed_of(fingerprint: str) -> int:
    """A 32-bit seed from a fingerprint (hex or not)."""
    try:
        return int(fingerprint[:8], 16)
    except ValueError:
        return zlib.crc32(fingerprint.encode())


def artifact_digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()


class DigestMemo:
    """`artifact_digest` remembered per bytes object: a toolchain keys its compiled handles by
    the artifact's digest on every measure call, and hashing a transformer's few hundred MB
    takes ~0.8 s a time. Each entry holds its bytes alive (so its ``id`` is not reused); the
    memo forgets everything once it holds more than ``limit`` entries or ``max_bytes``."""

    def __init__(self, limit: int = 256, max_bytes: int = 1 << 30) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self._memo: dict[int, tuple[bytes, str]] = {}
        self._bytes = 0

    def __call__(self, data: bytes) -> str:
        hit = self._memo.get(id(data))
        if hit is not None and hit[0] is data:
            return hit[1]
        d = artifact_digest(data)
        if len(self._memo) >= self.limit or self._bytes + len(data) > self.max_bytes:
            self.clear()
        if len(data) <= self.max_bytes:
            self._memo[id(data)] = (data, d)
            self._bytes += len(data)
        return d

    def __len__(self) -> int:
        return len(self._memo)

    def knows(self, data: bytes) -> bool:
        """Whether ``data`` (this very object) was digested and is still remembered."""
        hit = self._memo.get(id(data))
        return hit is not None and hit[0] is data

    def clear(self) -> None:
        self._memo.clear()
        self._bytes = 0


def feeds_for(onnx_bytes: bytes, seed: int) -> dict[str, np.ndarray]:
    """Seeded feeds for a model's runtime inputs from its input value infos."""
    return random_inputs(onnx.load_from_string(onnx_bytes), seed)


def error_text(e: BaseException, limit: int = 4000) -> str:
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def option_int(target: Target, key: str, default: int) -> int:
    try:
        return int(target.option(key, default))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return default


def option_bool(target: Target, key: str, default: bool) -> bool:
    v = target.option(key, default)
    if isinstance(v, str):
        return v.strip().lower() not in ("0", "false", "no", "off", "")
    return bool(v)


@dataclass
class Prepared:
    """A ready-to-time artifact: ``fn`` runs it once on bound inputs, ``sync`` waits for it.

    ``outputs`` returns the latest outputs by name (as numpy, copied), ``keep`` holds whatever
    must stay alive while ``fn`` is in use (bound buffers).
    """

    fn: Callable[[], Any]
    sync: Callable[[], None] | None = None
    outputs: Callable[[], dict[str, np.ndarray]] | None = None
    details: tuple[tuple[str, object], ...] = ()
    keep: list[object] = field(default_factory=list)
    #: host arrays bound as inputs (shared with the toolchain): re-read in ``network`` mode
    inputs: list[object] = field(default_factory=list)
    #: the device's own between-runs action in ``flush``/``network`` modes (a GPU evicts its L2,
    #: not the host's caches); None: the host's (`runners.measure.flush_for`)
    flush: Callable[[], None] | None = None


class OnnxToolchainBase(Toolchain):
    """Build/measure skeleton for toolchains that compile ONNX bytes in process.

    Subclasses give `_compile` (bytes -> handle), `_prepare` (handle + feeds -> `Prepared`) and
    `_run` (handle + feeds -> outputs). Failures become results: compile errors give
    UNSUPPORTED / BUILD_FAILED (by the toolchain's message), run errors RUNTIME_ERROR.
    """

    kind = Kind.MEASURED
    artifact_kind = "onnx"

    def __init__(self) -> None:
        self._cached: tuple[tuple, Any] | None = None
        self._digest = DigestMemo()

    # --- hooks ---------------------------------------------------------------------------
    def _compile(self, onnx_bytes: bytes, target: Target, threads: int) -> Any:
        raise NotImplementedError

    def _prepare(self, handle: Any, feeds: dict[str, np.ndarray], target: Target | None
                 ) -> Prepared:
        raise NotImplementedError

    def _run(self, handle: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _build_details(self, handle: Any) -> tuple[tuple[str, object], ...]:
        return ()

    # --- handles -------------------------------------------------------------------------
    def _key(self, fingerprint: str, data: bytes, target: Target, threads: int) -> tuple:
        return (fingerprint, self._digest(data), target.measure_key, threads)

    def handle_for(self, fingerprint: str, data: bytes, target: Target, threads: int
                   ) -> tuple[Any, bool]:
        """The compiled handle (reused when the last one matches); (handle, reused)."""
        key = self._key(fingerprint, data, target, threads)
        if self._cached is not None and self._cached[0] == key:
            return self._cached[1], True
        self._cached = None  # drop the old one before compiling the next (memory)
        handle = self._compile(data, target, threads)
        self._cached = (key, handle)
        return handle, False

    def clear_cache(self) -> None:
        self._cached = None
        self._digest.clear()

    # --- Toolchain -----------------------------------------------------------------------
    def device_description(self, target: Target) -> DeviceDescription:
        return DeviceDescription.host_cpu()

    def build(self, inp: BuildInput) -> BuildResult:
        t0 = time.perf_counter()
        if not inp.onnx_bytes:
            return BuildResult(inp.fingerprint, inp.target, Status.BUILD_FAILED,
                               error="empty ONNX model")
        threads = option_int(inp.target, "threads", 1)
        try:
            handle, _ = self.handle_for(inp.fingerprint, inp.onnx_bytes, inp.target, threads)
        except Exception as e:
            msg = error_text(e)
            return BuildResult(inp.fingerprint, inp.target, classify_build_error(msg), error=msg,
                               build_s=time.perf_counter() - t0)
        return BuildResult(
            inp.fingerprint, inp.target, Status.OK, artifact=inp.onnx_bytes,
            artifact_kind=self.artifact_kind, build_s=time.perf_counter() - t0,
            details=self._build_details(handle),
        )

    def prepare(self, build: BuildResult, config: MeasureConfig,
                feeds: dict[str, np.ndarray] | None = None,
                _handle: tuple[Any, bool] | None = None) -> Prepared:
        """Compile (or reuse) and bind inputs; raises on failure. Used by measure and benches."""
        import numpy as np

        handle, reused = _handle or self.handle_for(build.fingerprint, build.artifact,
                                                    build.target, max(1, int(config.threads)))
        if feeds is None:
            feeds = feeds_for(build.artifact, seed_of(build.fingerprint))
        feeds = {k: np.asarray(v, order="C") for k, v in feeds.items()}
        prepared = self._prepare(handle, feeds, build.target)
        prepared.details = (*prepared.details, ("handle_reused", reused))
        if not prepared.inputs:
            prepared.inputs = list(feeds.values())
        return prepared

    def timer(self, build: BuildResult, config: MeasureConfig
              ) -> Callable[[MeasureConfig], list[float]]:
        """`Toolchain.timer`: compiled and bound once (`prepare`); each call times the
        prepared run, as `measure` does, and the function holds the session alive whatever
        this toolchain's one-session cache compiles next."""
        prepared = self.prepare(build, config)

        def timed(cfg: MeasureConfig) -> list[float]:
            flush = prepared.flush if cfg.measure_mode != "warm" else None
            samples, _ = time_callable(prepared.fn, cfg, sync=prepared.sync,
                                       inputs=prepared.inputs, flush=flush)
            return samples
        return timed

    def measure(self, inp: MeasureInput) -> MeasureResult:
        t0 = time.perf_counter()
        build, config = inp.build, inp.config
        common: dict[str, Any] = dict(
            device=self.device_description(build.target), toolchain_version=self.version(),
            build_s=build.build_s, kind=self.kind,
        )
        if not build.ok:
            return MeasureResult.failed(build, build.status, build.error or "build failed",
                                        config, **common)
        try:  # the artifact may have been built on another node: compile here
            handle = self.handle_for(build.fingerprint, build.artifact, build.target,
                                     max(1, int(config.threads)))
        except Exception as e:
            msg = error_text(e)
            return MeasureResult.failed(build, classify_build_error(msg), msg, config,
                                        measure_s=time.perf_counter() - t0, **common)
        try:
            prepared = self.prepare(build, config, _handle=handle)
        except Exception as e:
            return MeasureResult.failed(build, Status.RUNTIME_ERROR, error_text(e), config,
                                        measure_s=time.perf_counter() - t0, **common)
        try:
            device_flush = prepared.flush if config.measure_mode != "warm" else None
            samples, medians = time_callable(prepared.fn, config, sync=prepared.sync,
                                             inputs=prepared.inputs, flush=device_flush)
        except Exception as e:
            return MeasureResult.failed(build, Status.RUNTIME_ERROR, error_text(e), config,
                                        measure_s=time.perf_counter() - t0, **common)
        return MeasureResult(
            fingerprint=build.fingerprint, target=build.target, status=Status.OK, config=config,
            samples=tuple(samples), summary=summarize(samples, medians),
            measure_s=time.perf_counter() - t0, details=prepared.details, **common,
        )

    def run_outputs(self, build: BuildResult, feeds: Mapping[str, np.ndarray],
                    threads: int = 1) -> dict[str, np.ndarray]:
        """Run a built artifact once on ``feeds``; outputs by ONNX output name (raises)."""
        handle, _ = self.handle_for(build.fingerprint, build.artifact, build.target, threads)
        return self._run(handle, feeds)
