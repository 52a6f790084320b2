"""The body of a runner actor: a `runners.local.LocalRunner` on one measurement slot.

A plain class: `collage_farm.farm.pool.Farm` wraps it with ``ray.remote`` where it launches the
actors (one per slot, hard node affinity), and a test can call it directly. Toolchain code (and
its heavy imports) runs in the LocalRunner's worker process, so a segfaulting toolchain costs a
row, not the actor; the actor only learns there which toolchains work on its node, and their
versions. Builds run here, right before the measurement of the same candidate, in the same
single-threaded actor on the same pinned core: a build never overlaps a measurement on a core.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import time
import uuid
from typing import Any

from collage_farm.core.target import Target
from collage_farm.farm.journal import CallJournal
from collage_farm.farm.messages import RunnerInfo, RunnerPing, RunnerSpec, RunnerStats
from runners.base import DeviceDescription, MeasureRequest, MeasureResult, Status
from runners.local import LocalRunner


def _detail(res: MeasureResult, **extra: object) -> MeasureResult:
    return dataclasses.replace(res, details=tuple(res.details) + tuple(extra.items()))


class RunnerActor:
    """A `LocalRunner` on one slot, never raising for candidates; journals each call it ends."""

    def __init__(self, spec: RunnerSpec) -> None:
        self.spec = spec
        self.pid = os.getpid()
        self.incarnation = uuid.uuid4().hex
        self.journal = CallJournal.for_actor()
        if spec.kind != "cuda":
            os.environ["CUDA_VISIBLE_DEVICES"] = ""  # CPU/NPU runners must not grab a GPU
        if spec.cores and hasattr(os, "sched_setaffinity"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, set(spec.cores))
        self.runner: Any = LocalRunner(
            list(spec.toolchains),
            cores=list(spec.cores) or None,
            device_kind=spec.kind,
            build_timeout_s=spec.build_timeout_s,
        )
        self.served, self.unavailable, self.versions = self._survey(spec.toolchains)
        self.busy_s = 0.0
        self.calls = 0
        self._desc: dict[str, DeviceDescription] = {}
        self._model: tuple[str, bytes] | None = None  # `run_shared`'s last (ref, model)

    def _survey(self, toolchains: tuple[str, ...]
                ) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...], dict[str, str]]:
        """Which of ``toolchains`` work on this node (served, (name, why not), versions)."""
        avail = self.runner.available()
        served: list[str] = []
        unavailable: list[tuple[str, str]] = []
        versions: dict[str, str] = {}
        for name in toolchains:
            why = avail.get(name, "not reported by the runner's worker")
            if why is None:
                try:
                    versions[name] = str(self.runner.invoke(name, "version", timeout_s=60))
                except Exception as e:
                    why = f"version() failed: {type(e).__name__}: {e}"
            if why is None:
                served.append(name)
            else:
                unavailable.append((name, str(why)))
        return tuple(served), tuple(unavailable), versions

    def ping(self) -> RunnerPing:
        """Alive; which process this is, and the last call this runner finished (its journal)."""
        return RunnerPing(self.pid, self.incarnation, self.journal.finished)

    def info(self) -> RunnerInfo:
        declared: tuple[tuple[str, float], ...] = ()
        if self.runner is not None:
            with contextlib.suppress(Exception):
                declared = tuple(sorted((str(k), float(v))
                                        for k, v in self.runner.resources().items()))
        return RunnerInfo(
            name=self.spec.name,
            kind=self.spec.kind,
            node_id=self.spec.node_id,
            hostname=socket.gethostname(),
            pid=self.pid,
            toolchains=self.served,
            unavailable=self.unavailable,
            versions=tuple(sorted(self.versions.items())),
            cores=tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity")
            else (),
            declared_resources=declared,
            incarnation=self.incarnation,
        )

    def describe(self, target: Target) -> tuple[DeviceDescription | None, str]:
        """The device rows of ``target`` will name, and the toolchain version."""
        return self._device(target), self.versions.get(target.toolchain, "")

    def _device(self, target: Target) -> DeviceDescription | None:
        key = target.measure_key
        if key not in self._desc:
            d = None
            if self.runner is not None and target.toolchain in self.served:
                try:
                    d = self.runner.device_description(target)
                except Exception:
                    d = None
            if d is None:
                return None
            self._desc[key] = d
        return self._desc[key]

    def stats(self) -> RunnerStats:
        return RunnerStats(self.spec.name, self.busy_s, self.calls, self.pid)

    def close(self) -> None:
        if self.runner is not None:
            with contextlib.suppress(Exception):
                self.runner.close()
            self.runner = None
        self.journal.close(remove=True)

    def run(self, req: MeasureRequest, call: int = 0) -> MeasureResult:
        """Build then measure one candidate; every failure comes back as a result.

        ``call`` is the farm's id of this call; it goes to the call journal once the call is
        finished, so that a death right after it is not charged to it."""
        t0 = time.perf_counter()
        try:
            res = self._run(req)
        except Exception as e:  # LocalRunner promises not to raise; a bug must not kill us
            res = MeasureResult.failed(
                req.build, Status.RUNTIME_ERROR, f"runner error ({type(e).__name__}): {e}",
                req.config, device=self._safe_device(req.target),
                toolchain_version=self.versions.get(req.target.toolchain, ""),
            )
        self.busy_s += time.perf_counter() - t0
        self.calls += 1
        self.journal.mark(call)
        return _detail(res, runner=self.spec.name, node=self.spec.node_id[:12])

    def run_shared(self, req: MeasureRequest, model: list[Any], call: int = 0
                   ) -> MeasureResult:
        """`run` of a request sent without its model: ``model`` holds the object-store ref
        of it (in a list, so Ray hands the ref over unresolved). The last model fetched is
        kept with its ref, so requests sharing one ref get the very same bytes object and
        the worker process is not sent the model again (`runners.isolation`)."""
        ref = model[0]
        key = ref.hex()
        if self._model is None or self._model[0] != key:
            import ray

            self._model = None  # the old one let go before the next is fetched
            try:
                self._model = (key, ray.get(ref))
            except Exception as e:  # the object is gone: this request's row says so
                return MeasureResult.failed(
                    req.build, Status.RUNTIME_ERROR, f"the model could not be fetched from "
                    f"the object store: {type(e).__name__}: {e}", req.config)
        build = dataclasses.replace(req.build, onnx_bytes=self._model[1])
        return self.run(dataclasses.replace(req, build=build), call)

    def _safe_device(self, target: Target) -> DeviceDescription | None:
        try:
            return self._device(target)
        except Exception:
            return None

    def _run(self, req: MeasureRequest) -> MeasureResult:
        target = req.target
        version = self.versions.get(target.toolchain, "")
        if self.runner is None or target.toolchain not in self.served:
            why = dict(self.unavailable).get(target.toolchain, "not served by this runner")
            return MeasureResult.failed(
                req.build, Status.UNSUPPORTED,
                f"toolchain {target.toolchain!r} unavailable on runner {self.spec.name}: {why}",
                req.config, toolchain_version=version,
            )
        device = self._device(target)
        b, m = self.runner.run(req.build, req.config)  # one round trip to the worker
        if not b.ok:
            return MeasureResult.failed(b, b.status, b.error, req.config, device=device,
                                        toolchain_version=version, build_s=b.build_s)
        fill: dict[str, object] = {}
        if not m.build_s:
            fill["build_s"] = b.build_s
        if m.device is None and device is not None:
            fill["device"] = device
        if not m.toolchain_version and version:
            fill["toolchain_version"] = version
        return dataclasses.replace(m, **fill) if fill else m
