"""`Farm`: the runner actors on a Ray cluster, as a `MeasurementService`.

`Farm.start` joins or starts Ray (`collage_farm.farm.connect`), plans the runners the nodes'
resources allow (`collage_farm.farm.resources`: CPU runners per host as `collage_farm.farm.slots`
decides, by default one per last-level-cache domain) and launches them
(`collage_farm.farm.actor.RunnerActor`, one actor per slot, hard node affinity, restarted by Ray
up to ``max_restarts`` times, no Ray task retries). `Farm.measure` hands each call to a fresh
`collage_farm.farm.dispatch.Dispatcher` over the farm's runners; the runners' records, the
counters and the call ids outlive it.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from collage_farm.core.target import Target
from collage_farm.farm.actor import RunnerActor
from collage_farm.farm.calls import clip, one_line
from collage_farm.farm.connect import alive_nodes, connect, gpu_cores_here, shutdown
from collage_farm.farm.dispatch import Dispatcher, DispatchPolicy, DispatchTally
from collage_farm.farm.messages import FarmError, FarmStats, RunnerInfo, RunnerSpec, RunnerStats
from collage_farm.farm.progress import Progress
from collage_farm.farm.ray_calls import RayCalls
from collage_farm.farm.records import Runner, RunnerState
from collage_farm.farm.resources import (
    ETHOSU_RESOURCE,
    plan_runners,
    plan_slots,
    toolchain_kinds,
)
from collage_farm.farm.slots import SlotPlan, load_bias_records, node_host, records_for_nodes
from estimators.sources import MeasurementService
from runners.base import DeviceDescription, MeasureRequest, MeasureResult

log = logging.getLogger(__name__)


def _cpu_model() -> str:
    return DeviceDescription.host_cpu().name


def _node_cpu(node: Mapping[str, Any], timeout_s: float = 60.0) -> str | None:
    """The CPU model of a ``ray.nodes()`` node: read here for this host, else by a zero-CPU
    task on that node (None when it does not answer)."""
    import ray
    from ray.exceptions import RayError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    if node_host(node) == socket.gethostname():
        return _cpu_model()
    task = ray.remote(num_cpus=0)(_cpu_model).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
    try:
        return str(ray.get(task.remote(), timeout=timeout_s))
    except RayError as e:
        log.warning("farm: could not read the CPU model of node %s: %s", node["NodeID"][:12],
                    clip(one_line(e)))
        return None


@functools.cache
def _remote_class(actor: type[RunnerActor]) -> Any:
    """``ray.remote(actor)``, made once per class (Ray exports it to each new session)."""
    import ray

    return ray.remote(actor)


class Farm(MeasurementService):
    """Runner actors on a Ray cluster, and a dispatch loop that keeps them busy.

    Build with `Farm.start`. ``depth``: calls kept queued per runner; ``crash_limit``: runner
    deaths a candidate may cause before it is returned as ``crashed``; ``watchdog_slack_s``: how
    far past its own timeouts (build + measure) a call may run before the runner is killed;
    ``actor``: the actor body (`RunnerActor`, or a subclass that adds behaviour, as the tests'
    fault drills do).
    """

    def __init__(
        self,
        *,
        owns_ray: bool = False,
        depth: int = 2,
        crash_limit: int = 2,
        max_restarts: int = 4,
        watchdog_slack_s: float = 60.0,
        probe_timeout_s: float = 120.0,
        progress: Progress | None = None,
        actor: type[RunnerActor] = RunnerActor,
    ) -> None:
        self.owns_ray = owns_ray
        self.policy = DispatchPolicy(depth=max(1, depth), crash_limit=max(1, crash_limit),
                                     watchdog_slack_s=watchdog_slack_s,
                                     probe_timeout_s=probe_timeout_s)
        self.max_restarts = max_restarts
        self.actor = actor
        self.progress = progress or Progress()
        self._runners: list[Runner] = []
        self._desc: dict[str, tuple[DeviceDescription | None, str]] = {}
        self._kinds: dict[str, str] = {}  # toolchain -> device kind
        self._runtime_env: dict[str, Any] | None = None
        self._tally = DispatchTally()
        self._calls = RayCalls(self.describe)
        self._wall = 0.0
        self._closed = False
        self.slot_plan = SlotPlan(())  # the CPU runners per host `start` placed, and why
        self._cpu_started = 0

    # --- construction ------------------------------------------------------------------
    @classmethod
    def start(
        cls,
        address: str | None = None,
        *,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        ethosu_slots: int | None = None,
        toolchains: Iterable[str] | None = None,
        build_timeout_s: float = 300.0,
        depth: int = 2,
        crash_limit: int = 2,
        namespace: str | None = None,
        runtime_env: Mapping[str, Any] | None = None,
        progress: bool | Progress | None = None,
        startup_timeout_s: float = 180.0,
        max_runners: int | None = None,
        actor: type[RunnerActor] = RunnerActor,
        slots: int | None = None,
    ) -> Farm:
        """Start (or join) Ray and the runner actors its nodes can hold.

        ``address``: ``None`` starts an embedded local Ray with detected resources (unless
        ``RAY_ADDRESS`` is set, or Ray is already initialised in this process, which is then
        used as is); ``"auto"`` or ``"ray://HOST:PORT"`` joins a cluster. ``num_cpus``: cores
        an embedded Ray advertises for CPU measurement (default: all). ``toolchains``: those to
        serve (default: every registered toolchain). ``max_runners`` caps runners (benchmarks).
        ``actor``: the runner actors' body (a `RunnerActor` subclass may add behaviour).
        ``slots``: CPU runners per host, forced (``tune --slots``); by default one per
        last-level-cache domain, more where a concurrency bias <= 2% was measured
        (`collage_farm.farm.slots`).
        """
        if slots is not None and slots < 1:
            raise ValueError(f"slots must be at least 1, not {slots}")
        kinds = toolchain_kinds(toolchains)
        owns = connect(address, num_cpus=num_cpus, num_gpus=num_gpus, ethosu_slots=ethosu_slots,
                       toolchains=list(kinds), namespace=namespace, runtime_env=runtime_env)
        nodes = alive_nodes()
        slot_plan = (plan_slots(nodes, forced=slots, records=records_for_nodes(
            nodes, load_bias_records(), _node_cpu)) if "cpu" in kinds.values() else SlotPlan(()))
        specs = plan_runners(nodes, kinds, build_timeout_s=build_timeout_s,
                             gpu_cores=gpu_cores_here(), slots=slot_plan)
        if max_runners is not None:
            specs = specs[:max_runners]
        prog = progress if isinstance(progress, Progress) else Progress(enabled=progress)
        farm = cls(owns_ray=owns, depth=depth, crash_limit=crash_limit, progress=prog,
                   actor=actor)
        farm._kinds = dict(kinds)
        farm.slot_plan = slot_plan
        # the runners get it too: a Ray initialised earlier (or a cluster joined) ignores the
        # runtime_env handed to `connect`
        farm._runtime_env = dict(runtime_env) if runtime_env else None
        slot_plan.log()
        try:
            farm._launch(specs, startup_timeout_s)
        except BaseException:
            farm.close()
            raise
        return farm

    def _launch(self, specs: Sequence[RunnerSpec], timeout_s: float) -> None:
        if not specs:
            raise FarmError(
                "the Ray cluster advertises no measurement slot for the requested toolchains "
                f"({', '.join(sorted(self._kinds)) or 'none'}): need cpu_slot_<i>, GPU or "
                f"{ETHOSU_RESOURCE} resources (see cluster.yaml)")
        pending = {r.actor.info.remote(): r  # type: ignore[attr-defined]
                   for r in (self._spawn(spec) for spec in specs)}
        self._await_started(pending, timeout_s)
        alive = [r for r in self._runners if r.state is RunnerState.ALIVE]
        if not alive:
            raise FarmError("no runner started; see the warnings above")
        for r in alive:
            assert r.info is not None
            for tc, why in r.info.unavailable:
                log.info("farm: runner %s cannot serve %s: %s", r.name, tc, why)
        counts = collections.Counter(r.kind for r in alive)
        self._cpu_started = counts.get("cpu", 0)
        nodes = {r.spec.node_id for r in alive}
        served = sorted({tc for r in alive if r.info for tc in r.info.toolchains})
        log.info("farm: %d runners (%s) on %d node(s), serving %s", len(alive),
                 ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())), len(nodes),
                 ", ".join(served) or "nothing")

    def _spawn(self, spec: RunnerSpec) -> Runner:
        """Launch the actor of ``spec`` on its node; its record, `RunnerState.STARTING`."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        opts: dict[str, Any] = {
            "num_cpus": spec.num_cpus,
            "num_gpus": spec.num_gpus,
            "max_restarts": self.max_restarts,
            "max_task_retries": 0,
            "scheduling_strategy": NodeAffinitySchedulingStrategy(spec.node_id, soft=False),
        }
        if spec.resources:
            opts["resources"] = dict(spec.resources)
        if self._runtime_env:
            opts["runtime_env"] = self._runtime_env
        r = Runner(spec, _remote_class(self.actor).options(**opts).remote(spec))
        self._runners.append(r)
        return r

    def _await_started(self, pending: dict[Any, Runner], timeout_s: float) -> None:
        """Each runner reports its `RunnerInfo` (ALIVE) or is dropped (DEAD) within the time."""
        import ray
        from ray.exceptions import RayError

        ready, not_ready = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
        for ref in ready:
            r = pending[ref]
            try:
                r.info = ray.get(ref)
                r.incarnation = r.info.incarnation
                r.state = RunnerState.ALIVE
            except RayError as e:
                r.state = RunnerState.DEAD
                log.warning("farm: runner %s failed to start: %s", r.name, clip(one_line(e)))
        for ref in not_ready:
            r = pending[ref]
            r.state = RunnerState.DEAD
            log.warning("farm: runner %s did not start within %.0f s (its resources may be held "
                        "by another job); dropped", r.name, timeout_s)
            self._calls.kill(r, restart=False)

    # --- introspection -------------------------------------------------------------------
    @property
    def runners(self) -> list[RunnerInfo]:
        return [r.info for r in self._runners
                if r.info is not None and r.state is not RunnerState.DEAD]

    def slots(self) -> dict[str, Any]:
        """The campaign summary's ``slots``: CPU runners that started (``used``), ``why``
        (``llc-domains``, ``measured-bias <= 2%`` or ``forced``) and the decision per host."""
        return self.slot_plan.to_json(used=self._cpu_started)

    def results_by_node(self) -> dict[str, int]:
        """Node id -> results its runners have returned so far (thread-safe enough: ints)."""
        out: dict[str, int] = {}
        for r in self._runners:
            out[r.spec.node_id] = out.get(r.spec.node_id, 0) + r.results
        return out

    def alive_runners(self, kind: str | None = None) -> int:
        """Runners alive or expected back (restarting), of ``kind`` if given."""
        return sum(1 for r in self._runners if r.state.in_service
                   and (kind is None or r.kind == kind))

    def serves(self, toolchain: str) -> bool:
        return any(r.serves(toolchain) for r in self._runners if r.state is RunnerState.ALIVE)

    def describe(self, target: Target) -> tuple[DeviceDescription | None, str] | None:
        """(device, toolchain version) that rows for ``target`` will carry; None if unserved."""
        import ray
        from ray.exceptions import RayError

        key = target.measure_key
        if key in self._desc:
            return self._desc[key]
        for r in self._runners:
            if r.state is RunnerState.ALIVE and r.serves(target.toolchain):
                try:
                    got = ray.get(r.actor.describe.remote(target),  # type: ignore[attr-defined]
                                  timeout=120)
                except RayError as e:
                    log.warning("farm: runner %s could not describe %s: %s", r.name, target,
                                clip(one_line(e)))
                    continue
                self._desc[key] = got
                return got  # type: ignore[no-any-return]
        return None

    def runner_stats(self, timeout_s: float = 30.0) -> list[RunnerStats]:
        """What each alive runner's actor counts (busy time, calls)."""
        import ray
        from ray.exceptions import RayError

        live = [r for r in self._runners if r.state is RunnerState.ALIVE]
        refs = [r.actor.stats.remote() for r in live]  # type: ignore[attr-defined]
        out = []
        for ref in refs:
            with contextlib.suppress(RayError):
                out.append(ray.get(ref, timeout=timeout_s))
        return out

    def stats(self) -> FarmStats:
        counts = collections.Counter(r.kind for r in self._runners
                                     if r.state is not RunnerState.DEAD)
        return FarmStats(
            runners=len(self._runners),
            alive=self.alive_runners(),
            by_kind=tuple(sorted(counts.items())),
            results=self._tally.results,
            retried=self._tally.retried,
            crashed=self._tally.crashed,
            runner_failures=self._tally.runner_failures,
            measure_wall_s=self._wall,
        )

    # --- MeasurementService ------------------------------------------------------------
    def measure(self, requests: Iterable[MeasureRequest]) -> Iterator[MeasureResult]:
        """Build and measure every request; yield results in completion order.

        Requests are pulled lazily, only as runners free up, so the caller may build them
        lazily (extraction happens when a runner is about to need the bytes). Never raises for
        a candidate: failures are results. Raises `FarmError` only when no runner is left for
        requests still waiting.
        """
        t0 = time.perf_counter()
        try:
            dispatcher = Dispatcher(self._runners, self._calls, self._kinds, policy=self.policy,
                                    tally=self._tally, progress=self.progress)
            yield from dispatcher.measure(requests)
        finally:
            self._wall += time.perf_counter() - t0

    def expect(self, total: int, hits: int = 0,
               kinds: Mapping[str, int] | None = None) -> None:
        """Progress: ``total`` asked, ``hits`` answered from the store, ``kinds`` to measure."""
        self.progress.add(total=total, hits=hits, kinds=kinds)

    def settle(self) -> None:
        """Progress: forget expected results that will not come."""
        self.progress.settle()

    def finish(self) -> None:
        """Progress: one caller's work is over; draw the final state (the farm goes on)."""
        self.progress.close()

    def close(self) -> None:
        """Stop the runner actors (and the embedded Ray this farm started); idempotent."""
        if not self._closed:
            self._closed = True
            self.progress.close()
            self._stop()

    def _stop(self) -> None:
        import ray

        if not ray.is_initialized():
            return
        refs = []
        for r in self._runners:
            if r.state.in_service:
                with contextlib.suppress(Exception):
                    refs.append(r.actor.close.remote())  # type: ignore[attr-defined]
        if refs:
            with contextlib.suppress(Exception):
                ray.wait(refs, num_returns=len(refs), timeout=10)
        for r in self._runners:
            self._calls.kill(r, restart=False)
            r.state = RunnerState.DEAD
        self._calls.release()
        if self.owns_ray:
            shutdown()

    def __enter__(self) -> Farm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
