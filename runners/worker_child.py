"""The worker child: what runs inside a `runners.isolation.WorkerProcess`'s child process.

The parent spawns `child_main` (multiprocessing's spawn context) with the toolchain names, the
cores to pin to and the thread environment. The child sets that environment, pins itself,
asks each toolchain whether it is available, reports ready, then serves requests over the pipe
(``ping``, ``info``, ``build``, ``measure``, ``build_keep`` / ``measure_kept``, ``invoke``),
one at a time, until the parent sends ``stop`` or goes away. A toolchain's exception becomes a
failed result (or an ``error`` reply), never the child's death.

Imports here stay light (no numpy): the child imports this module before it sets its thread
environment, and numpy's BLAS reads that environment when it is imported.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import time
import traceback
from collections.abc import Mapping
from typing import Any

from runners import registry
from runners.base import (
    PROFILE_MODE,
    BuildInput,
    BuildResult,
    MeasureInput,
    MeasureResult,
    Status,
)
from runners.measure import pin_to_cores
from runners.profile import profile_measure

__all__ = ["THREAD_ENV_VARS", "child_main"]


#: the thread-count variables a worker's environment sets (`runners.isolation.thread_env`)
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "TF_NUM_INTRAOP_THREADS",
)


def child_main(conn: Any, toolchains: tuple[str, ...], cores: tuple[int, ...] | None,
               env: dict[str, str]) -> None:
    """The child process: set the environment, pin, load the toolchains, serve until told to
    stop or the parent goes away. Replies ``(seq, "ok", result)`` or ``(seq, "error", text)``."""
    os.environ.update(env)
    import faulthandler

    faulthandler.enable()  # a segfault prints the Python stack to stderr before dying
    try:
        pin_to_cores(cores)
    except ValueError as e:
        conn.send(("start_error", str(e)))
        return
    status: dict[str, str | None] = {}
    for name in toolchains:
        try:
            status[name] = registry.get_toolchain(name).available()
        except Exception as e:
            status[name] = f"{type(e).__name__}: {e}"
    conn.send(("ready", {"pid": os.getpid(), "toolchains": status,
                         "affinity": sorted(os.sched_getaffinity(0))}))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError, KeyboardInterrupt):
            return  # parent went away
        seq, op, blob = msg
        if op == "stop":
            return
        try:  # the payload is unpickled here so that a bad one is answered, not fatal
            reply = (seq, "ok", _handle(op, pickle.loads(blob), toolchains, status))
        except BaseException:
            reply = (seq, "error", traceback.format_exc(limit=30))
        try:
            conn.send(reply)
        except Exception as e:  # an unpicklable result must not kill the worker
            conn.send((seq, "error", f"result could not be sent back: {type(e).__name__}: {e}"))


#: the child's last build (artifact included), for ``measure_kept``; one slot is enough: the farm
#: measures a candidate right after building it
_KEPT: list[BuildResult] = []
#: the ONNX model the kept build was made from (a profile request of a toolchain whose artifact
#: is not ONNX, LiteRT's prefix profiler, cuts that model; ``build_keep_source`` builds it again)
_KEPT_SOURCE: list[bytes] = []
#: ``build_keep_source``'s answer when the child has no kept source (a fresh child): send it
NO_SOURCE = "no-kept-source"


def _handle(op: str, payload: Any, served: tuple[str, ...],
            status: dict[str, str | None]) -> Any:
    if op == "ping":
        return os.getpid()
    if op == "info":
        tcs = {}
        for name in served:
            try:
                version = registry.get_toolchain(name).version() if status[name] is None else ""
            except Exception as e:
                version = f"? ({type(e).__name__}: {e})"
            tcs[name] = {"available": status[name], "version": version}
        return {
            "pid": os.getpid(),
            "affinity": sorted(os.sched_getaffinity(0)),
            "env": {k: os.environ.get(k) for k in (*THREAD_ENV_VARS, "CUDA_VISIBLE_DEVICES")},
            "toolchains": tcs,
        }
    if op == "build":
        return _build(payload, served, status)
    if op == "measure":
        return _measure(payload, served, status)
    if op == "build_keep":  # build, keep the artifact here, send back everything else
        kept = _handle("build", payload, served, status)
        _KEPT[:] = [kept]
        _KEPT_SOURCE[:] = [payload.onnx_bytes]
        return dataclasses.replace(kept, artifact=b"")
    if op == "build_keep_source":  # `build_keep` of the kept source, not sent again
        if not _KEPT_SOURCE:
            return NO_SOURCE
        return _handle("build_keep", dataclasses.replace(payload, onnx_bytes=_KEPT_SOURCE[0]),
                       served, status)
    if op == "measure_kept":
        fingerprint, target, config = payload
        kept = _KEPT[0] if _KEPT else None
        if kept is None or kept.fingerprint != fingerprint or kept.target != target:
            return MeasureResult.failed(BuildInput(fingerprint, target, b""),
                                        Status.RUNTIME_ERROR,
                                        "no kept build for this candidate in the worker "
                                        "(was it restarted?)", config)
        return _measure(MeasureInput(kept, config), served, status,
                        source=_KEPT_SOURCE[0] if _KEPT_SOURCE else None)
    if op == "invoke":
        name, method, args, kwargs = payload
        why = _not_served(name, served, status)
        if why:
            raise RuntimeError(why)
        return getattr(registry.get_toolchain(name), method)(*args, **kwargs)
    raise ValueError(f"unknown worker request {op!r}")


def _build(inp: BuildInput, served: tuple[str, ...],
           status: Mapping[str, str | None]) -> BuildResult:
    """The toolchain's build; whatever it raises or returns wrongly becomes BUILD_FAILED."""
    name = inp.target.toolchain
    why = _not_served(name, served, status)
    if why:
        return BuildResult(inp.fingerprint, inp.target, Status.UNSUPPORTED, error=why)
    t0 = time.perf_counter()
    try:
        res = registry.get_toolchain(name).build(inp)
    except Exception:
        return BuildResult(inp.fingerprint, inp.target, Status.BUILD_FAILED,
                           error=traceback.format_exc(limit=20),
                           build_s=time.perf_counter() - t0)
    if not isinstance(res, BuildResult):
        return BuildResult(inp.fingerprint, inp.target, Status.BUILD_FAILED,
                           error=f"{name}.build returned {type(res).__name__}")
    return res


def _measure(minp: MeasureInput, served: tuple[str, ...],
             status: Mapping[str, str | None], source: bytes | None = None) -> MeasureResult:
    """The toolchain's measure (RUNTIME_ERROR for what goes wrong), device and version filled;
    a profile request (`PROFILE_MODE`) goes to `runners.profile.profile_measure` instead, with
    ``source``, the ONNX model the build was made from."""
    name = minp.target.toolchain
    why = _not_served(name, served, status)
    if why:
        return MeasureResult.failed(minp.build, Status.UNSUPPORTED, why, minp.config)
    tc = registry.get_toolchain(name)
    t0 = time.perf_counter()
    try:
        if minp.config.mode == PROFILE_MODE:
            mres = profile_measure(tc, minp, source)
        else:
            mres = tc.measure(minp)
    except Exception:
        return MeasureResult.failed(minp.build, Status.RUNTIME_ERROR,
                                    traceback.format_exc(limit=20), minp.config,
                                    measure_s=time.perf_counter() - t0)
    if not isinstance(mres, MeasureResult):
        return MeasureResult.failed(minp.build, Status.RUNTIME_ERROR,
                                    f"{name}.measure returned {type(mres).__name__}",
                                    minp.config)
    fill: dict[str, Any] = {}
    if mres.device is None:
        with contextlib.suppress(Exception):
            fill["device"] = tc.device_description(minp.target)
    if not mres.toolchain_version:
        with contextlib.suppress(Exception):
            fill["toolchain_version"] = tc.version()
    return dataclasses.replace(mres, **fill) if fill else mres


def _not_served(name: str, served: tuple[str, ...], status: Mapping[str, str | None]) -> str:
    if name not in served:
        return f"toolchain {name!r} is not served by this worker (serves {', '.join(served)})"
    if status.get(name):
        return f"toolchain {name!r} is not available on this worker: {status[name]}"
    return ""
