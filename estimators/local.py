"""A `MeasurementService` without Ray: the toolchains' own runners, in this process's reach.

Why: simulated and analytic toolchains (Vela for an Ethos-U NPU, the Cortex-M host's cycle
model) give deterministic figures that no timing slot has to protect, so a campaign or a
comparison on an Ethos-U board needs no cluster: one `runners.local.LocalRunner` per device
kind (each with its isolated worker process, so a Vela segfault is still a ``crashed`` row, not
a dead coordinator) builds and measures every request in turn. Measured toolchains work too, on
an unpinned runner; for their timings the Ray farm (`collage_farm.farm`) is the right service.

Deterministic toolchains (`runners.runtime.SIMULATED_TOOLCHAINS`: Vela and the Cortex-M cycle
model) get ``parallel`` worker processes per device kind (by default one per usable core, at
most 4) and a batch of their requests is built concurrently, one request per worker at a time:
their figures do not depend on what else runs (no timing), so this only shortens a campaign.
Measured toolchains keep one worker and run one request at a time.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait

from collage_farm.core.target import Target
from estimators.sources import MeasurementService
from runners.base import DeviceDescription, MeasureRequest, MeasureResult, Status
from runners.local import LocalRunner
from runners.registry import device_kind_of
from runners.runtime import SIMULATED_TOOLCHAINS

__all__ = ["LocalService"]


def default_parallel() -> int:
    """Worker processes per device kind for deterministic toolchains: usable cores, 1..4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


class LocalService(MeasurementService):
    """One `LocalRunner` per device kind of ``toolchains`` (``parallel`` of them for a kind
    whose toolchains are all deterministic, see the module docstring)."""

    def __init__(self, toolchains: Sequence[str], *, build_timeout_s: float = 300.0,
                 parallel: int | None = None) -> None:
        by_kind: dict[str, list[str]] = {}
        for tc in dict.fromkeys(toolchains):
            by_kind.setdefault(device_kind_of(tc), []).append(tc)
        n = default_parallel() if parallel is None else max(1, int(parallel))
        self._runners = {kind: LocalRunner(tcs, device_kind=kind,
                                           build_timeout_s=build_timeout_s)
                         for kind, tcs in by_kind.items()}
        self._by_toolchain = {tc: r for r in self._runners.values() for tc in r.toolchains()}
        # extra workers of deterministic kinds: each serves one request at a time
        self._pools: dict[str, queue.SimpleQueue[LocalRunner]] = {}
        for kind, tcs in by_kind.items():
            if n > 1 and set(tcs) <= set(SIMULATED_TOOLCHAINS):
                pool: queue.SimpleQueue[LocalRunner] = queue.SimpleQueue()
                pool.put(self._runners[kind])
                for _ in range(n - 1):
                    pool.put(LocalRunner(tcs, device_kind=kind, build_timeout_s=build_timeout_s))
                self._pools.update(dict.fromkeys(tcs, pool))
        self._pooled = [r for p in {id(p): p for p in self._pools.values()}.values()
                       for r in _drain(p)]
        self._versions: dict[str, str] = {}

    def measure(self, requests: Iterable[MeasureRequest]) -> Iterator[MeasureResult]:
        """Results as they finish; pooled requests are submitted as they are read, at most
        two per pooled worker in flight (a request holds its sub-model's bytes)."""
        workers = max(1, len(self._pooled))
        with ThreadPoolExecutor(max_workers=workers) as ex:
            running: set[Future[MeasureResult]] = set()
            for req in requests:
                runner = self._by_toolchain.get(req.target.toolchain)
                if runner is None:
                    yield MeasureResult.failed(req.build, Status.UNSUPPORTED,
                                               f"no local runner serves "
                                               f"{req.target.toolchain!r}", req.config)
                elif req.target.toolchain in self._pools:
                    running.add(ex.submit(self._pooled_run, req))
                    while len(running) >= 2 * workers:
                        done, running = wait(running, return_when=FIRST_COMPLETED)
                        yield from (f.result() for f in done)
                else:
                    yield runner.run(req.build, req.config)[1]
            for f in as_completed(running):
                yield f.result()

    def _pooled_run(self, req: MeasureRequest) -> MeasureResult:
        pool = self._pools[req.target.toolchain]
        runner = pool.get()
        try:
            return runner.run(req.build, req.config)[1]
        finally:
            pool.put(runner)

    def describe(self, target: Target) -> tuple[DeviceDescription | None, str] | None:
        runner = self._by_toolchain.get(target.toolchain)
        if runner is None:
            return None
        tc = target.toolchain
        if tc not in self._versions:
            try:
                self._versions[tc] = str(runner.invoke(tc, "version"))
            except Exception:  # an unavailable toolchain: its rows will say why
                self._versions[tc] = ""
        return runner.device_description(target), self._versions[tc]

    def close(self) -> None:
        for r in {id(r): r for r in (*self._runners.values(), *self._pooled)}.values():
            r.close()
        self._runners.clear()
        self._pooled.clear()
        self._pools.clear()
        self._by_toolchain.clear()


def _drain(pool: queue.SimpleQueue[LocalRunner]) -> list[LocalRunner]:
    """The runners of ``pool`` (taken out and put back)."""
    out = []
    while not pool.empty():
        out.append(pool.get())
    for r in out:
        pool.put(r)
    return out
