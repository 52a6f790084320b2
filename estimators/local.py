"""A `MeasurementService` without Ray: the toolchains' own runners, in this process's reach.

Why: simulated and analytic toolchains (Vela for an Ethos-U NPU, the Cortex-M host's cycle
model) give deterministic figures that no timing slot has to protect, so a campaign or a
comparison on an Ethos-U board needs no cluster: one `runners.local.LocalRunner` per device
kind (each with its isolated worker process, so a Vela segfault is still a ``crashed`` row, not
a dead coordinator) builds and measures every request in turn. Measured toolchains work too, on
an unpinned runner; for their timings the Ray farm (`collage_farm.farm`) is the right service.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from collage_farm.core.target import Target
from estimators.sources import MeasurementService
from runners.base import DeviceDescription, MeasureRequest, MeasureResult, Status
from runners.local import LocalRunner
from runners.registry import device_kind_of

__all__ = ["LocalService"]


class LocalService(MeasurementService):
    """One `LocalRunner` per device kind of ``toolchains``; requests run one at a time."""

    def __init__(self, toolchains: Sequence[str], *, build_timeout_s: float = 300.0) -> None:
        by_kind: dict[str, list[str]] = {}
        for tc in dict.fromkeys(toolchains):
            by_kind.setdefault(device_kind_of(tc), []).append(tc)
        self._runners = {kind: LocalRunner(tcs, device_kind=kind,
                                           build_timeout_s=build_timeout_s)
                         for kind, tcs in by_kind.items()}
        self._by_toolchain = {tc: r for r in self._runners.values() for tc in r.toolchains()}
        self._versions: dict[str, str] = {}

    def measure(self, requests: Iterable[MeasureRequest]) -> Iterator[MeasureResult]:
        for req in requests:
            runner = self._by_toolchain.get(req.target.toolchain)
            if runner is None:
                yield MeasureResult.failed(req.build, Status.UNSUPPORTED,
                                           f"no local runner serves {req.target.toolchain!r}",
                                           req.config)
                continue
            yield runner.run(req.build, req.config)[1]

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
        for r in self._runners.values():
            r.close()
        self._runners.clear()
        self._by_toolchain.clear()
