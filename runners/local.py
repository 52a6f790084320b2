"""LocalRunner: one device, some toolchains, one isolated worker process.

Why: the Ray farm wraps a runner in an actor per device (a CPU core slot, a GPU, an Ethos-U
simulator slot); everything device-specific and everything that can crash lives below this
class, so the actor stays a thin shell and the same runner works without Ray (tests, the CLI's
local mode, benchmarks). The runner:

* validates that its toolchains run on its device kind (known from the registry without
  importing them), and advertises the Ray resources its actor must hold: CPU workers take one
  ``CPU`` per core plus a ``cpu_slot_<core>`` custom resource per pinned core (Ray resources are
  logical; the slot resources keep two timing actors off one core), CUDA workers one ``GPU``,
  Ethos-U simulator workers one ``ethosu_sim``;
* runs every build and measure in a `WorkerProcess` and turns every failure into a result,
  so `build` and `measure` never raise for anything a candidate does;
* reports the device as stored in rows (asked of the toolchain, inside the worker, once).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from collage_farm.core.target import Target
from runners.base import (
    BuildInput,
    BuildResult,
    DeviceDescription,
    MeasureConfig,
    MeasureInput,
    MeasureResult,
    Runner,
    Status,
)
from runners.isolation import WorkerError, WorkerProcess
from runners.registry import TOOLCHAINS, UnknownToolchainError, device_kind_of

__all__ = ["LocalRunner"]

DEVICE_KINDS = ("cpu", "cuda", "ethos-u")


class LocalRunner(Runner):
    """Serves ``toolchains`` on one device through an isolated worker process."""

    def __init__(
        self,
        toolchains: Sequence[str],
        *,
        cores: Sequence[int] | None = None,
        device_kind: str = "cpu",
        build_timeout_s: float = 300,
        threads: int | None = None,
        device_id: int = 0,
        start: bool = True,
    ) -> None:
        if device_kind not in DEVICE_KINDS:
            raise ValueError(f"unknown device kind {device_kind!r} ({', '.join(DEVICE_KINDS)})")
        if not toolchains:
            raise ValueError("a runner needs at least one toolchain")
        for name in toolchains:
            if name not in TOOLCHAINS:
                raise UnknownToolchainError(
                    f"unknown toolchain {name!r}; known: {', '.join(TOOLCHAINS)}")
            kind = device_kind_of(name)
            if kind != device_kind:
                raise ValueError(f"toolchain {name!r} runs on {kind}, not on {device_kind}")
        self._toolchains = tuple(toolchains)
        self.cores = tuple(int(c) for c in cores) if cores else None
        self.device_kind = device_kind
        self.device_id = int(device_id)
        self.build_timeout_s = float(build_timeout_s)
        env: dict[str, str] = {}
        if device_kind == "cuda":
            env["CUDA_VISIBLE_DEVICES"] = str(self.device_id)
        self.worker = WorkerProcess(
            self._toolchains, cores=self.cores, threads=threads,
            cpu_only=device_kind != "cuda", env=env,
            name=f"collage-{device_kind}{self.device_id}-worker",
        )
        self._devices: dict[str, DeviceDescription] = {}
        self._lock = threading.Lock()
        if start:
            self.worker.start()

    # --- Runner --------------------------------------------------------------------------
    def toolchains(self) -> Sequence[str]:
        return self._toolchains

    def resources(self) -> Mapping[str, float]:
        if self.device_kind == "cuda":
            return {"GPU": 1}
        if self.device_kind == "ethos-u":
            return {"ethosu_sim": 1}
        if self.cores:
            res: dict[str, float] = {"CPU": float(len(self.cores))}
            for c in self.cores:
                res[f"cpu_slot_{c}"] = 1
            return res
        return {"CPU": 1}

    def device_description(self, target: Target) -> DeviceDescription:
        key = target.toolchain
        with self._lock:
            if key in self._devices:
                return self._devices[key]
        try:
            desc = self.worker.invoke(key, "device_description", target, timeout_s=60)
        except WorkerError:
            desc = None
        if not isinstance(desc, DeviceDescription):
            return (DeviceDescription.host_cpu() if self.device_kind == "cpu"
                    else DeviceDescription(self.device_kind, "unknown"))
        with self._lock:
            self._devices[key] = desc
        return desc

    def _not_served(self, toolchain: str) -> str:
        if toolchain in self._toolchains:
            return ""
        return (f"toolchain {toolchain!r} is not served by this runner "
                f"(serves {', '.join(self._toolchains)})")

    def build(self, inp: BuildInput) -> BuildResult:
        why = self._not_served(inp.target.toolchain)
        if why:
            return BuildResult(inp.fingerprint, inp.target, Status.UNSUPPORTED, error=why)
        try:
            return self.worker.build(inp, self.build_timeout_s)
        except Exception as e:  # defensive: the worker API does not raise
            return BuildResult(inp.fingerprint, inp.target, Status.BUILD_FAILED,
                               error=f"runner error: {type(e).__name__}: {e}")

    def measure(self, inp: MeasureInput) -> MeasureResult:
        build = inp.build
        why = self._not_served(build.target.toolchain)
        if why:
            return MeasureResult.failed(build, Status.UNSUPPORTED, why, inp.config)
        if not build.ok:
            return MeasureResult.failed(build, build.status, build.error or "build failed",
                                        inp.config, build_s=build.build_s)
        try:
            return self.worker.measure(inp)
        except Exception as e:  # defensive: the worker API does not raise
            return MeasureResult.failed(build, Status.RUNTIME_ERROR,
                                        f"runner error: {type(e).__name__}: {e}", inp.config)

    def run(self, inp: BuildInput, config: MeasureConfig) -> tuple[BuildResult, MeasureResult]:
        """Build then measure in the worker, one round trip; the artifact stays in the worker.

        What the farm calls. Same results as `build` followed by `measure`, except that the
        returned `BuildResult` carries no artifact.
        """
        why = self._not_served(inp.target.toolchain)
        if why:
            b = BuildResult(inp.fingerprint, inp.target, Status.UNSUPPORTED, error=why)
            return b, MeasureResult.failed(b, Status.UNSUPPORTED, why, config)
        try:
            return self.worker.run(inp, config, self.build_timeout_s)
        except Exception as e:  # defensive: the worker API does not raise
            b = BuildResult(inp.fingerprint, inp.target, Status.BUILD_FAILED,
                            error=f"runner error: {type(e).__name__}: {e}")
            return b, MeasureResult.failed(b, b.status, b.error, config)

    def close(self) -> None:
        self.worker.close()

    # --- extras --------------------------------------------------------------------------
    def available(self, timeout_s: float = 120.0) -> dict[str, str | None]:
        """Toolchain -> None when usable in the worker, else why not."""
        try:
            info = self.worker.wait_ready(timeout_s)
        except WorkerError as e:
            return dict.fromkeys(self._toolchains, f"worker failed: {e}")
        return dict(info.get("toolchains", {}))

    def invoke(self, toolchain: str, method: str, *args: Any, timeout_s: float = 120.0,
               **kwargs: Any) -> Any:
        """Call a toolchain method inside the worker (e.g. ``run_outputs`` for the executor)."""
        why = self._not_served(toolchain)
        if why:
            raise WorkerError(Status.UNSUPPORTED, why)
        return self.worker.invoke(toolchain, method, *args, timeout_s=timeout_s, **kwargs)

    def stats(self) -> dict[str, int]:
        w = self.worker
        return {"requests": w.requests, "restarts": w.restarts, "crashes": w.crashes,
                "timeouts": w.timeouts}

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        cores = f", cores={list(self.cores)}" if self.cores else ""
        return f"LocalRunner({list(self._toolchains)}, {self.device_kind}{cores})"
