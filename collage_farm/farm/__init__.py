"""The measurement farm: candidate builds and measurements as Ray work on device-owning runners.

This is the only module of the project that imports ``ray``: everything else talks to the farm
through `Farm.measure`, which takes `MeasureRequest`s and yields `MeasureResult`s as they
finish, so the search, the estimators and the tests never see object refs, actors or Ray errors.

Why Ray, and how it is used
---------------------------
* **Runners are actors**, one per measurement slot, each wrapping a `runners.local.LocalRunner`
  (which runs toolchain code in its own worker process, so a segfaulting toolchain costs a row,
  not the actor). Slots come from the resources the cluster advertises (see ``cluster.yaml``):

  - ``cpu_slot_<i>`` (one per core ``i`` of a node): a CPU runner holding ``{"CPU": 1,
    "cpu_slot_<i>": 1}``, pinned to core ``i`` with ``os.sched_setaffinity`` (Ray resources are
    logical; pinning is ours) and with ``CUDA_VISIBLE_DEVICES`` emptied. If no node of the
    cluster advertises any ``cpu_slot_*`` (a plain cluster), every node's ``CPU`` count gives
    unpinned CPU runners instead, with a warning.
  - ``GPU``: a CUDA runner per GPU holding ``{"GPU": 1}`` (Ray sets ``CUDA_VISIBLE_DEVICES``).
  - ``ethosu_sim``: an Ethos-U (Vela) runner per slot. Vela's estimate is deterministic (cycles
    / clock), so these hold no CPU and need no exclusive core; on a real cluster they live on
    their own node type.

  Every runner actor is placed with a hard node affinity, so a runner is "this slot of that
  node" and its core pinning means something.
* **Builds run on the runner actors**, right before the measurement of the same candidate, in
  the same single-threaded actor on the same pinned core: a build never overlaps a measurement
  on a core. No build task runs anywhere else, because with every core of a measurement node
  owned by a pinned runner, a free-floating build task would share a core with some runner's
  timing loop. Sub-graph *extraction* (ONNX bytes of the candidate, 0.03-0.5 ms) happens in the
  coordinator, lazily, as the dispatch loop pulls requests, and travels with the request.
* **Dispatch** keeps ``depth`` calls (default 2) queued on every runner, so a runner starts its
  next candidate the moment it finishes one (the actor-call round trip, ~0.7 ms, is hidden), and
  pulls requests from the caller's iterator only as runners free up (bounded in-flight queue).
  Results are consumed with ``ray.wait`` in completion order.
* **Runner death** (the actor process killed or crashed, a hung call killed by the watchdog, or
  the node lost): every call in flight on that runner is taken back. The call that was
  executing gets a strike unless the node itself died; a candidate with ``crash_limit`` (2)
  strikes is returned as a ``crashed`` result (``timeout`` if the watchdog killed it), the
  others are re-queued and the campaign goes on. A runner whose actor dies is restarted by Ray
  (``max_restarts``), probed with ``ping`` and put back to work; a runner whose node is gone is
  retired. Actor calls use ``max_task_retries=0``: retries are ours, so that strikes can be
  counted and work moved to other runners.

  *Which* call was executing is not "the oldest unanswered one". When the actor process dies,
  Ray fails every unanswered call with the same error (``ActorUnavailableError: ... Socket
  closed``, "may or may not have been executed"), and that includes a call that had *finished*
  but whose reply was still in the dying process (the actor starts its next call the moment
  one returns, and a candidate that kills the process on arrival kills it within a millisecond,
  before the reply is sent). Striking the oldest unanswered call struck that innocent one, twice
  when the culprit was re-queued behind it again, so it was recorded ``crashed`` and never
  measured. So each runner keeps a call journal on its node (`_CallJournal`: the id of the last
  call it finished, written when the call returns), and the restarted actor reports it with the
  ``ping`` the farm probes it with. Until then the dead runner's calls are *held*; then the
  oldest call the runner had not finished gets the strike and the rest are re-queued without
  one. A runner that never comes back cannot report: its oldest unanswered call gets the strike.
  (Seen on this 2-core VM: a candidate measured 1.4 ms before the one that exited the actor
  was struck on both runners and recorded ``crashed``.)

  The other way round, a ``crashed`` *result* is not always the candidate's either: Ray kills
  an actor's child processes before the actor itself (``ray.kill``, the watchdog), so the call
  it was running sees the LocalRunner's worker die of SIGKILL and can still reply ``crashed``
  in the ~70 ms before the process exits (seen: a 0.08 s candidate answered ``crashed`` after
  27 ms, with the worker log saying "Try killing all child processes ... Quick exit"). Such a
  result would be a ``crashed`` row, kept in the cost table for good. So a runner's ``crashed``
  result is delivered only after a ``ping`` sent behind it is answered by the same actor
  process; if the runner died instead, the result is dropped and the call counts as the one
  the dead runner was running.
* **Auth**: Ray's token authentication stays on. An embedded ``ray.init()`` enables it by
  default and a cluster joined with ``--address`` needs its token (``~/.ray/auth_token`` or
  ``RAY_AUTH_TOKEN``); only tests set ``RAY_AUTH_MODE=disabled``, and the farm warns when it
  finds authentication disabled.

Progress goes to a one-line bar on a TTY (counts, cache hits, failures, ETA) and otherwise to
parseable ``logging`` lines (``farm progress done=.. total=.. hits=.. failed=.. eta_s=..``).

Test-only fault injection: a ``null``-toolchain target with option ``farm_exit_on`` (``"*"``,
or a substring of the fingerprint or of the request label, like `runners.null`'s options) makes
the runner *actor process* exit when it receives a matching request, so tests can exercise
runner death without killing processes by hand. Two more fire in a runner's first incarnation
only, and make the races described above deterministic: ``farm_exit_after`` exits right
*after* a matching request finished, before its reply leaves; ``farm_killed_on`` answers a
matching request ``crashed`` (as a call whose worker Ray killed along with the actor does)
and then exits without answering anything else. No other toolchain honours them.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import itertools
import logging
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import ray
from ray.exceptions import (
    ActorUnavailableError,
    ActorUnschedulableError,
    RayActorError,
    RayError,
    RayTaskError,
)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from collage_farm.core.target import Target
from runners.base import (
    FARM_DETAIL,
    BuildInput,  # noqa: F401 - re-exported for the farm's callers
    DeviceDescription,
    MeasureConfig,  # noqa: F401 - re-exported for the farm's callers
    MeasureRequest,
    MeasureResult,
    Status,
)

log = logging.getLogger(__name__)

CPU_SLOT_RE = re.compile(r"^cpu_slot_(\d+)$")
ETHOSU_RESOURCE = "ethosu_sim"
DEVICE_KINDS = ("cpu", "cuda", "ethos-u")
FAULT_OPTION = "farm_exit_on"
FAULT_AFTER_OPTION = "farm_exit_after"
FAULT_KILLED_OPTION = "farm_killed_on"
FAULT_EXIT_CODE = 77


class FarmError(RuntimeError):
    """The farm cannot go on (no runner started, every runner of a kind lost)."""


# ------------------------------------------------------------------------------------------
# messages


@dataclass(frozen=True)
class RunnerSpec:
    """What a runner actor is: where it runs, what it holds, what it serves."""

    name: str
    kind: str  # "cpu" | "cuda" | "ethos-u"
    node_id: str
    toolchains: tuple[str, ...]  # asked for; the actor serves those available on its node
    cores: tuple[int, ...] = ()  # cores to pin to (empty: no pinning)
    num_cpus: float = 0.0
    num_gpus: float = 0.0
    resources: tuple[tuple[str, float], ...] = ()  # custom Ray resources held
    build_timeout_s: float = 300.0


@dataclass(frozen=True)
class RunnerInfo:
    """What a started runner reports about itself."""

    name: str
    kind: str
    node_id: str
    hostname: str
    pid: int
    toolchains: tuple[str, ...]  # served
    unavailable: tuple[tuple[str, str], ...]  # (toolchain, why not)
    versions: tuple[tuple[str, str], ...]  # (toolchain, version)
    cores: tuple[int, ...]
    declared_resources: tuple[tuple[str, float], ...]  # what the LocalRunner declares
    incarnation: str = ""  # unique per actor process: tells a restart from a lost connection


@dataclass(frozen=True)
class RunnerPing:
    """A runner's answer to the farm's probe after it failed.

    ``finished`` is the id of the last call this runner finished, in any incarnation, read
    from its call journal (0: none yet; None: unknown, the journal could not be read). A call
    the farm sent it with a larger id had not finished when the process died, so the oldest
    such call is the one it was executing. ``incarnation`` differs from the one the farm knew
    when Ray restarted the actor, and is the same when only the connection failed.
    """

    pid: int
    incarnation: str
    finished: int | None


@dataclass(frozen=True)
class RunnerStats:
    name: str
    busy_s: float  # time spent inside run() (build + measure)
    calls: int
    pid: int


@dataclass(frozen=True)
class FarmStats:
    """Totals over the farm's life, for campaign summaries and the benchmark."""

    runners: int
    alive: int
    by_kind: tuple[tuple[str, int], ...]
    results: int
    retried: int  # requests re-queued after a runner died
    crashed: int  # requests given up after crash_limit runner deaths
    runner_failures: int  # runner deaths seen
    measure_wall_s: float  # time spent inside measure() loops


# ------------------------------------------------------------------------------------------
# the runner actor


def _detail(res: MeasureResult, **extra: object) -> MeasureResult:
    return dataclasses.replace(res, details=tuple(res.details) + tuple(extra.items()))


class _CallJournal:
    """The id of the last call a runner finished, in a file on its node that outlives the actor.

    Why: after a runner actor process died, the farm must tell the call it was executing (the
    culprit) from calls that had finished but whose replies died with the process (see the
    module docstring). Only the runner knew, and its memory is gone; but Ray restarts the actor
    on the same node (hard node affinity) under the same actor id, so the new incarnation finds
    this file by that id and reports it (`RunnerActor.ping`). It lives in the Ray session's temp
    directory. Cost: one ``pwrite`` of 21 bytes per call (microseconds, next to a ~0.7 ms actor
    call round trip). A process death cannot undo a write the kernel accepted; a node crash
    can, and then the node is gone and nothing is struck anyway.

    ``finished``: 0 before any call finished, None when the file could not be read (the farm
    then falls back to striking the oldest unanswered call). ``reopened``: the file was there,
    i.e. this is a restarted incarnation of the runner. Outside a Ray actor (no actor id) the
    journal is kept in memory only.
    """

    WIDTH = 20

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fd: int | None = None
        self.finished: int | None = 0
        self.reopened = False
        if path is None:
            return
        try:
            self.reopened = os.path.exists(path)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            text = os.pread(self._fd, 64, 0).decode("ascii", "replace").strip()
            self.finished = int(text) if text else 0
        except (OSError, ValueError) as e:
            log.warning("farm: runner call journal %s unreadable (%s); a death of this runner "
                        "will be charged to its oldest unanswered call", path, e)
            self.finished = None

    @classmethod
    def for_actor(cls) -> _CallJournal:
        """The journal of the calling Ray actor (in memory only outside an actor)."""
        try:
            ctx = ray.get_runtime_context()
            actor_id = ctx.get_actor_id()
            if not actor_id:
                return cls(None)
            folder = os.path.join(ctx.get_temp_dir(), ctx.get_session_name(), "collage-farm")
        except Exception:
            return cls(None)
        return cls(os.path.join(folder, f"calls-{actor_id}"))

    def mark(self, call: int) -> None:
        """Record that call ``call`` finished (ids grow: an actor runs its calls in order)."""
        if call <= 0:
            return
        self.finished = call
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.pwrite(self._fd, f"{call:0{self.WIDTH}d}\n".encode("ascii"), 0)

    def close(self, remove: bool = False) -> None:
        """Close the file; ``remove`` when the runner is shut down for good."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if remove and self.path:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


class RunnerActor:
    """The body of a runner actor: a `LocalRunner` on one slot, never raising for candidates."""

    def __init__(self, spec: RunnerSpec) -> None:
        self.spec = spec
        self.pid = os.getpid()
        self.incarnation = uuid.uuid4().hex
        self.journal = _CallJournal.for_actor()
        self._dying = False  # test-only: `farm_killed_on` fired, nothing is answered any more
        if spec.kind != "cuda":
            os.environ["CUDA_VISIBLE_DEVICES"] = ""  # CPU/NPU runners must not grab a GPU
        if spec.cores and hasattr(os, "sched_setaffinity"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, set(spec.cores))
        from runners.local import LocalRunner

        # toolchain code (and its heavy imports) lives in the LocalRunner's worker process;
        # the actor only learns there which toolchains work on this node, and their versions
        self.runner: Any = LocalRunner(
            list(spec.toolchains),
            cores=list(spec.cores) or None,
            device_kind=spec.kind,
            build_timeout_s=spec.build_timeout_s,
        )
        avail = self.runner.available()
        served: list[str] = []
        unavailable: list[tuple[str, str]] = []
        versions: dict[str, str] = {}
        for name in spec.toolchains:
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
        self.served = tuple(served)
        self.unavailable = tuple(unavailable)
        self.versions = versions
        self.busy_s = 0.0
        self.calls = 0
        self._desc: dict[str, DeviceDescription] = {}

    def ping(self) -> RunnerPing:
        """Alive; which process this is, and the last call this runner finished (its journal)."""
        if self._dying:
            os._exit(FAULT_EXIT_CODE)
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

    @staticmethod
    def _fault_matches(req: MeasureRequest, option: str) -> bool:
        """Test-only fault injection (null toolchain only): see the module docstring."""
        t = req.target
        if t.toolchain != "null":
            return False
        v = t.option(option)
        if not v:
            return False
        v = str(v)
        return v == "*" or v in req.fingerprint or bool(req.label and v in req.label)

    def _first_incarnation(self) -> bool:
        """Test faults that fire once per runner: not after Ray restarted this actor."""
        return not self.journal.reopened

    def _maybe_exit(self, req: MeasureRequest) -> None:
        if self._dying or self._fault_matches(req, FAULT_OPTION):
            os._exit(FAULT_EXIT_CODE)

    def _maybe_exit_after(self, req: MeasureRequest) -> None:
        """Die with a finished call's reply unsent, as a process killed in that window would.

        First incarnation only, so that the request is measured once its runner restarted."""
        if self._fault_matches(req, FAULT_AFTER_OPTION) and self._first_incarnation():
            os._exit(FAULT_EXIT_CODE)

    def _maybe_killed(self, req: MeasureRequest) -> MeasureResult | None:
        """Be killed the way ``ray.kill`` kills a runner in the middle of a call.

        Ray kills the actor's children first: the call sees its worker die and returns a
        ``crashed`` result, which reaches the farm; the process executes nothing after it
        and exits (the next call or ping, or 2 s later). First incarnation only."""
        if not (self._fault_matches(req, FAULT_KILLED_OPTION) and self._first_incarnation()):
            return None
        self._dying = True
        threading.Timer(2.0, os._exit, args=(FAULT_EXIT_CODE,)).start()
        return MeasureResult.failed(
            req.build, Status.CRASHED, "worker died from SIGKILL (exit code -9) (killed: "
            "possibly the OOM killer); restarted", req.config,
            toolchain_version=self.versions.get(req.target.toolchain, ""))

    def run(self, req: MeasureRequest, call: int = 0) -> MeasureResult:
        """Build then measure one candidate; every failure comes back as a result.

        ``call`` is the farm's id of this call; it goes to the call journal once the call is
        finished, so that a death right after it is not charged to it."""
        t0 = time.perf_counter()
        self._maybe_exit(req)
        try:
            res = self._maybe_killed(req) or self._run(req)
        except Exception as e:  # LocalRunner promises not to raise; a bug must not kill us
            res = MeasureResult.failed(
                req.build, Status.RUNTIME_ERROR, f"runner error ({type(e).__name__}): {e}",
                req.config, device=self._safe_device(req.target),
                toolchain_version=self.versions.get(req.target.toolchain, ""),
            )
        self.busy_s += time.perf_counter() - t0
        self.calls += 1
        self.journal.mark(call)
        self._maybe_exit_after(req)
        return _detail(res, runner=self.spec.name, node=self.spec.node_id[:12])

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


_RemoteRunner = ray.remote(RunnerActor)


# ------------------------------------------------------------------------------------------
# progress


class Progress:
    """Campaign progress: a bar on a TTY, otherwise a parseable log line every few seconds.

    The estimator reports the campaign's size and cache hits (`add`), per device kind when it
    can; the farm reports each result (`result`) and what is in flight. The ETA is the slowest
    kind's: a GPU's candidates go through one runner per GPU while a node's CPU candidates go
    through a runner per core, and on an H100 host the aggregate rate said "5 s left" while the
    CUDA queue needed over a minute. Results nobody announced (re-measurements) grow the total,
    so ``done`` never exceeds it.
    """

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None,
                 log_every_s: float = 10.0) -> None:
        self.stream = stream or sys.stderr
        tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.bar = tty if enabled is None else (enabled and tty)
        self.log_every_s = log_every_s
        self.total = 0
        self.hits = 0
        self.done = 0
        self.failed = 0
        self.inflight = 0
        self.t0 = time.monotonic()
        self.kind_total: dict[str, int] = {}  # to measure, per device kind (announced)
        self.kind_done: dict[str, int] = {}
        self._kind_start: dict[str, tuple[float, int]] = {}  # batch start: (time, done then)
        self._t_first: float | None = None
        self._last = 0.0
        self._drawn = False
        self._logged = ""

    def add(self, total: int = 0, hits: int = 0,
            kinds: Mapping[str, int] | None = None) -> None:
        """``total`` candidates, ``hits`` of them cached; ``kinds``: the rest per device kind.

        A kind with nothing outstanding starts a new batch: its rate is timed from now, so a GPU
        that first gets work after ten minutes of CPU-only campaigns is not judged by them.
        """
        self.total += total
        self.hits += hits
        now = time.monotonic()
        for kind, n in (kinds or {}).items():
            if n <= 0:
                continue
            done = self.kind_done.get(kind, 0)
            if self.kind_total.get(kind, 0) <= done:  # idle: a new batch
                self._kind_start[kind] = (now, done)
                self.kind_total[kind] = done
            self.kind_total[kind] += n
        self.render()

    def settle(self) -> None:
        """The announced work is over (what never came back never will): totals = results."""
        self.total = self.done + self.hits
        for kind in self.kind_total:
            self.kind_total[kind] = self.kind_done.get(kind, 0)
        self.render()

    def result(self, res: MeasureResult) -> None:
        if self._t_first is None:
            self._t_first = time.monotonic()
        self.done += 1
        self.total = max(self.total, self.done + self.hits)
        kind = res.target.device.kind
        self.kind_done[kind] = self.kind_done.get(kind, 0) + 1
        if kind in self.kind_total:
            self.kind_total[kind] = max(self.kind_total[kind], self.kind_done[kind])
        if not res.ok:
            self.failed += 1
        self.render()

    def eta_s(self) -> float:
        """Seconds left: the slowest device kind's at its batch's rate.

        Work announced without kinds is timed at the overall rate since the farm started.
        """
        now = time.monotonic()
        elapsed = now - self.t0
        if self.done == 0 or elapsed <= 0:
            return math.nan
        left = max(0, self.total - self.hits - self.done)
        by_kind = sum(max(0, t - self.kind_done.get(k, 0)) for k, t in self.kind_total.items())
        etas = [left * elapsed / self.done] if left > by_kind else [0.0]
        for kind, total in self.kind_total.items():
            done = self.kind_done.get(kind, 0)
            if total - done <= 0:
                continue
            t0, done0 = self._kind_start.get(kind, (self.t0, 0))
            if done - done0 <= 0 or now - t0 <= 0:
                return math.nan  # work of this kind is waiting and its rate is unknown yet
            etas.append((total - done) * (now - t0) / (done - done0))
        return max(etas)

    def line(self) -> str:
        eta = self.eta_s()
        eta_s = "-" if math.isnan(eta) else f"{eta:.0f}"
        return (f"farm progress done={self.done} total={self.total} hits={self.hits} "
                f"failed={self.failed} inflight={self.inflight} eta_s={eta_s}")

    def render(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.bar:
            if not force and now - self._last < 0.2:
                return
            self._last = now
            need = max(1, self.total)
            frac = min(1.0, (self.done + self.hits) / need)
            width = 24
            filled = int(frac * width)
            eta = self.eta_s()
            eta_txt = "--:--" if math.isnan(eta) else f"{int(eta) // 60:02d}:{int(eta) % 60:02d}"
            text = (f"\r[{'#' * filled}{'.' * (width - filled)}] "
                    f"{self.done + self.hits}/{self.total} measured {self.done} hits {self.hits} "
                    f"failed {self.failed} in-flight {self.inflight} ETA {eta_txt} ")
            self.stream.write(text)
            self.stream.flush()
            self._drawn = True
        elif force or now - self._last >= self.log_every_s:
            self._last = now
            line = self.line()
            if (self.total or self.done) and line != self._logged:
                self._logged = line
                log.info(line)

    def close(self) -> None:
        if self.bar and self._drawn:
            self.render(force=True)
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
        elif not self.bar:
            self.render(force=True)


# ------------------------------------------------------------------------------------------
# planning runners from cluster resources


def toolchain_kinds(names: Iterable[str] | None) -> dict[str, str]:
    """Device kind of each toolchain (all registered toolchains when ``names`` is None)."""
    from runners.registry import device_kind_of, toolchain_names

    if names is None:
        names = toolchain_names()
    out: dict[str, str] = {}
    for n in names:
        try:
            out[n] = device_kind_of(n)
        except Exception as e:
            log.warning("farm: toolchain %r is unknown here (%s); no runner will serve it", n, e)
    return out


def _detect_gpus() -> int:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([d for d in vis.split(",") if d.strip() and d.strip() != "-1"])
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


@dataclass(frozen=True)
class LocalResources:
    """What an embedded Ray is started with, and which cores GPU runners get."""

    num_cpus: int
    num_gpus: int
    resources: dict[str, float]
    gpu_cores: tuple[int, ...]


def local_resources(num_cpus: int | None, num_gpus: int | None, ethosu_slots: int | None,
                    kinds: Iterable[str]) -> LocalResources:
    """Detect cores/GPUs here: a ``cpu_slot_<core>`` per measurement core, a core kept per GPU.

    ``num_cpus`` is the number of CPU measurement slots (default: every core this process may
    use, less one per GPU runner, since a GPU runner drives its GPU from a core of its own).
    """
    kinds = set(kinds)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
        range(os.cpu_count() or 1))
    gpus = num_gpus if num_gpus is not None else (_detect_gpus() if "cuda" in kinds else 0)
    if num_cpus is None:
        n = len(cores) - gpus if len(cores) > gpus else len(cores)
    else:
        n = num_cpus
        if n > len(cores):
            log.warning("farm: %d CPU slots asked for but only %d cores usable; using %d",
                        n, len(cores), len(cores))
            n = len(cores)
    n = max(1, n)
    slot_cores = cores[:n]
    spare = cores[n:]
    gpu_cores = tuple(spare[i] if i < len(spare) else cores[-1] for i in range(gpus))
    ethosu = ethosu_slots if ethosu_slots is not None else (1 if "ethos-u" in kinds else 0)
    res: dict[str, float] = {f"cpu_slot_{c}": 1.0 for c in slot_cores}
    if ethosu:
        res[ETHOSU_RESOURCE] = float(ethosu)
    return LocalResources(n, gpus, res, gpu_cores)


def plan_runners(nodes: Sequence[Mapping[str, Any]], kinds_by_toolchain: Mapping[str, str],
                 *, build_timeout_s: float = 300.0,
                 gpu_cores: Mapping[str, Sequence[int]] | None = None) -> list[RunnerSpec]:
    """One `RunnerSpec` per measurement slot the alive ``nodes`` (``ray.nodes()``) advertise."""
    by_kind: dict[str, list[str]] = {}
    for tc, kind in sorted(kinds_by_toolchain.items()):
        by_kind.setdefault(kind, []).append(tc)
    alive = sorted((n for n in nodes if n.get("Alive", True)), key=lambda n: n["NodeID"])
    any_slots = any(CPU_SLOT_RE.match(k) for n in alive for k in n.get("Resources", {}))
    specs: list[RunnerSpec] = []
    gpu_cores = gpu_cores or {}
    for node in alive:
        res = node.get("Resources", {})
        nid = node["NodeID"]
        short = nid[:8]
        if "cpu" in by_kind:
            tcs = tuple(by_kind["cpu"])
            slots = sorted(int(m.group(1)) for k in res if (m := CPU_SLOT_RE.match(k)))
            for s in slots:
                specs.append(RunnerSpec(f"cpu-{short}-{s}", "cpu", nid, tcs, (s,), 1.0, 0.0,
                                        ((f"cpu_slot_{s}", 1.0),), build_timeout_s))
            if not any_slots:
                for i in range(int(res.get("CPU", 0))):
                    specs.append(RunnerSpec(f"cpu-{short}-u{i}", "cpu", nid, tcs, (), 1.0, 0.0,
                                            (), build_timeout_s))
        if "cuda" in by_kind:
            cores = list(gpu_cores.get(nid, ()))
            for i in range(int(res.get("GPU", 0))):
                pin = (cores[i],) if i < len(cores) else ()
                specs.append(RunnerSpec(f"cuda-{short}-{i}", "cuda", nid, tuple(by_kind["cuda"]),
                                        pin, 0.0, 1.0, (), build_timeout_s))
        if "ethos-u" in by_kind:
            for i in range(int(res.get(ETHOSU_RESOURCE, 0))):
                specs.append(RunnerSpec(f"ethosu-{short}-{i}", "ethos-u", nid,
                                        tuple(by_kind["ethos-u"]), (), 0.0, 0.0,
                                        ((ETHOSU_RESOURCE, 1.0),), build_timeout_s))
    if "cpu" in by_kind and not any_slots and any(s.kind == "cpu" for s in specs):
        log.warning("farm: no node advertises cpu_slot_* resources; CPU runners are not pinned "
                    "to cores (see cluster.yaml)")
    return specs


# ------------------------------------------------------------------------------------------
# connecting


_EMBEDDED: LocalResources | None = None  # what `connect` started here, if it started Ray


def connect(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    ethosu_slots: int | None = None,
    toolchains: Iterable[str] | None = None,
    namespace: str | None = None,
    runtime_env: Mapping[str, Any] | None = None,
) -> bool:
    """Connect this process to Ray; True when this call started an embedded local Ray.

    Already initialised: used as is. ``address`` (or ``RAY_ADDRESS``): join that cluster
    (``auto``, ``HOST:PORT`` or ``ray://HOST:PORT``). Otherwise start a local Ray whose
    resources are this machine's measurement slots (`local_resources`), always a new instance
    (``address="local"``), never a stray cluster named by ``/tmp/ray/ray_current_cluster``.
    Token authentication is Ray's default and is left alone.
    """
    global _EMBEDDED
    if ray.is_initialized():
        log.info("farm: using the Ray runtime already initialised in this process")
        return False
    env = dict(runtime_env) if runtime_env else None
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        _check_reachable(address)
        try:
            ray.init(address=address, namespace=namespace, runtime_env=env,
                     logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError, TimeoutError) as e:
            why = " ".join(str(e).split())[:300]
            raise FarmError(f"cannot join the Ray cluster at {address!r}: "
                            f"{type(e).__name__}: {why} (is it running? `ray status` there; "
                            "ray://HOST:10001 or HOST:6379)") from None
        started = False
    else:
        kinds = toolchain_kinds(toolchains).values()
        local = local_resources(num_cpus, num_gpus, ethosu_slots, kinds)
        ray.init(address="local", num_cpus=local.num_cpus, num_gpus=local.num_gpus,
                 resources=local.resources, include_dashboard=False, namespace=namespace,
                 runtime_env=env, logging_level=logging.WARNING)
        _EMBEDDED = local
        started = True
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled" and "pytest" not in sys.modules:
        log.warning("farm: Ray token authentication is disabled (RAY_AUTH_MODE=disabled); "
                    "anyone who can reach the cluster can run code on it")
    return started


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when nothing listens at a ``HOST:PORT`` or ``ray://HOST:PORT`` address:
    `ray.init` retries an unreachable GCS for minutes (seen hanging > 150 s on 127.0.0.1:1).
    ``auto`` and other forms are left to Ray."""
    import socket

    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        raise FarmError(f"cannot join the Ray cluster at {address!r}: nothing answers at "
                        f"{host}:{port} ({e.strerror or e}); is the head running "
                        "(`ray status` there), and is the port open to this machine?") from None


def shutdown() -> None:
    """Disconnect from Ray (and stop the embedded Ray `connect` started)."""
    global _EMBEDDED
    if ray.is_initialized():
        ray.shutdown()
    _EMBEDDED = None


# ------------------------------------------------------------------------------------------
# the farm


@dataclass(eq=False)
class _Runner:
    spec: RunnerSpec
    actor: Any
    info: RunnerInfo | None = None
    state: str = "starting"  # starting | healthy | probing | dead
    inflight: collections.deque = field(default_factory=collections.deque)  # refs, in order
    head_since: float = 0.0  # when the oldest in-flight call could have started
    probe: Any = None  # the outstanding ping, while probing
    probe_since: float = 0.0  # when the runner failed
    next_probe: float = 0.0  # when to ping again (a restarting actor refuses calls)
    failures: int = 0
    results: int = 0  # results this runner returned (measured here, this farm's lifetime)
    incarnation: str = ""  # the actor process the farm last heard from
    # after a failure, until the restarted actor says which call it was executing: the calls
    # it had not answered as (ref, work) (ref None: a dropped `crashed` result), and the error
    held: list[tuple[Any, _Work]] = field(default_factory=list)
    fault: str = ""
    # `crashed` results it returned, by the ping sent after each: kept until the ping shows
    # the same process alive (see `Farm._confirm`)
    unconfirmed: dict[Any, tuple[MeasureResult, _Work]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind

    def serves(self, toolchain: str) -> bool:
        return self.info is not None and toolchain in self.info.toolchains


@dataclass(eq=False)
class _Work:
    req: MeasureRequest
    kind: str
    crashes: int = 0
    avoid: set = field(default_factory=set)
    errors: list = field(default_factory=list)
    runner: _Runner | None = None
    timed_out: bool = False
    call: int = 0  # id of its latest actor call (ids grow per farm, so per runner too)
    cut_short: bool = False  # its `crashed` result was followed by its runner's death


def blame(calls: Sequence[int], finished: int | None) -> int | None:
    """Which of a dead runner's unanswered ``calls`` (ids, oldest first) it was executing.

    ``finished``: the last call the runner finished (its journal; None: unknown). An actor runs
    its calls in order, so every call up to ``finished`` had finished (its reply died with the
    process) and the first call after it was executing, or was next in line when the process
    died between calls. Unknown: the oldest unanswered call, the best guess without a journal.
    None when every call had finished: nobody is to blame.
    """
    for i, call in enumerate(calls):
        if finished is None or call > finished:
            return i
    return None


def _short(err: BaseException, limit: int = 300) -> str:
    text = f"{type(err).__name__}: {err}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


class Farm:
    """Runner actors on a Ray cluster, and a dispatch loop that keeps them busy.

    Build with `Farm.start`. ``depth``: calls kept queued per runner; ``crash_limit``: runner
    deaths a candidate may cause before it is returned as ``crashed``; ``watchdog_slack_s``: how
    far past its own timeouts (build + measure) a call may run before the runner is killed.
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
    ) -> None:
        self.owns_ray = owns_ray
        self.depth = max(1, depth)
        self.crash_limit = max(1, crash_limit)
        self.max_restarts = max_restarts
        self.watchdog_slack_s = watchdog_slack_s
        self.probe_timeout_s = probe_timeout_s
        self.progress = progress or Progress()
        self._runners: list[_Runner] = []
        self._desc: dict[str, tuple[DeviceDescription | None, str]] = {}
        self._kinds: dict[str, str] = {}  # toolchain -> device kind
        self._results = 0
        self._retried = 0
        self._crashed = 0
        self._runner_failures = 0
        self._wall = 0.0
        self._closed = False
        self._call_ids = itertools.count(1)

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
    ) -> Farm:
        """Start (or join) Ray and one runner actor per measurement slot.

        ``address``: ``None`` starts an embedded local Ray with detected resources (unless
        ``RAY_ADDRESS`` is set, or Ray is already initialised in this process, which is then
        used as is); ``"auto"`` or ``"ray://HOST:PORT"`` joins a cluster. ``num_cpus``: CPU
        measurement slots of an embedded Ray (default: all cores). ``toolchains``: those to
        serve (default: every registered toolchain). ``max_runners`` caps runners (benchmarks).
        """
        kinds = toolchain_kinds(toolchains)
        owns = connect(address, num_cpus=num_cpus, num_gpus=num_gpus, ethosu_slots=ethosu_slots,
                       toolchains=list(kinds), namespace=namespace, runtime_env=runtime_env)
        gpu_cores: dict[str, tuple[int, ...]] = {}
        local = _EMBEDDED
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        if local is not None:
            here = ray.get_runtime_context().get_node_id()
            gpu_cores[here] = local.gpu_cores
        specs = plan_runners(nodes, kinds, build_timeout_s=build_timeout_s, gpu_cores=gpu_cores)
        if max_runners is not None:
            specs = specs[:max_runners]
        if isinstance(progress, Progress):
            prog = progress
        else:
            prog = Progress(enabled=progress)
        farm = cls(owns_ray=owns, depth=depth, crash_limit=crash_limit, progress=prog)
        farm._kinds = dict(kinds)
        # the runners get it too: a Ray initialised earlier (or a cluster joined) ignores the
        # runtime_env handed to `connect`
        farm._runtime_env = dict(runtime_env) if runtime_env else None
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
        pending: dict[Any, _Runner] = {}
        for spec in specs:
            opts: dict[str, Any] = {
                "num_cpus": spec.num_cpus,
                "num_gpus": spec.num_gpus,
                "max_restarts": self.max_restarts,
                "max_task_retries": 0,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(spec.node_id, soft=False),
            }
            if spec.resources:
                opts["resources"] = dict(spec.resources)
            if getattr(self, "_runtime_env", None):
                opts["runtime_env"] = self._runtime_env
            actor = _RemoteRunner.options(**opts).remote(spec)
            r = _Runner(spec, actor)
            self._runners.append(r)
            pending[actor.info.remote()] = r
        ready, not_ready = ray.wait(list(pending), num_returns=len(pending), timeout=timeout_s)
        for ref in ready:
            r = pending[ref]
            try:
                r.info = ray.get(ref)
                r.incarnation = r.info.incarnation
                r.state = "healthy"
            except RayError as e:
                r.state = "dead"
                log.warning("farm: runner %s failed to start: %s", r.name, _short(e))
        for ref in not_ready:
            r = pending[ref]
            r.state = "dead"
            log.warning("farm: runner %s did not start within %.0f s (its resources may be held "
                        "by another job); dropped", r.name, timeout_s)
            with contextlib.suppress(Exception):
                ray.kill(r.actor, no_restart=True)
        healthy = [r for r in self._runners if r.state == "healthy"]
        if not healthy:
            raise FarmError("no runner started; see the warnings above")
        for r in healthy:
            assert r.info is not None
            for tc, why in r.info.unavailable:
                log.info("farm: runner %s cannot serve %s: %s", r.name, tc, why)
        counts = collections.Counter(r.kind for r in healthy)
        nodes = {r.spec.node_id for r in healthy}
        served = sorted({tc for r in healthy for tc in r.info.toolchains})  # type: ignore[union-attr]
        log.info("farm: %d runners (%s) on %d node(s), serving %s", len(healthy),
                 ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())), len(nodes),
                 ", ".join(served) or "nothing")

    # --- introspection -------------------------------------------------------------------
    @property
    def runners(self) -> list[RunnerInfo]:
        return [r.info for r in self._runners if r.info is not None and r.state != "dead"]

    def results_by_node(self) -> dict[str, int]:
        """Node id -> results its runners have returned so far (thread-safe enough: ints)."""
        out: dict[str, int] = {}
        for r in self._runners:
            out[r.spec.node_id] = out.get(r.spec.node_id, 0) + r.results
        return out

    def alive_runners(self, kind: str | None = None) -> int:
        return sum(1 for r in self._runners if r.state in ("healthy", "probing")
                   and (kind is None or r.kind == kind))

    def serves(self, toolchain: str) -> bool:
        return any(r.serves(toolchain) for r in self._runners if r.state == "healthy")

    def describe(self, target: Target) -> tuple[DeviceDescription | None, str] | None:
        """(device, toolchain version) that rows for ``target`` will carry; None if unserved."""
        key = target.measure_key
        if key in self._desc:
            return self._desc[key]
        for r in self._runners:
            if r.state == "healthy" and r.serves(target.toolchain):
                try:
                    got = ray.get(r.actor.describe.remote(target), timeout=120)
                except RayError as e:
                    log.warning("farm: runner %s could not describe %s: %s", r.name, target,
                                _short(e))
                    continue
                self._desc[key] = got
                return got
        return None

    def runner_stats(self, timeout_s: float = 30.0) -> list[RunnerStats]:
        live = [r for r in self._runners if r.state == "healthy"]
        refs = [r.actor.stats.remote() for r in live]
        out = []
        for ref in refs:
            with contextlib.suppress(RayError):
                out.append(ray.get(ref, timeout=timeout_s))
        return out

    def stats(self) -> FarmStats:
        counts = collections.Counter(r.kind for r in self._runners if r.state != "dead")
        return FarmStats(
            runners=len(self._runners),
            alive=self.alive_runners(),
            by_kind=tuple(sorted(counts.items())),
            results=self._results,
            retried=self._retried,
            crashed=self._crashed,
            runner_failures=self._runner_failures,
            measure_wall_s=self._wall,
        )

    # --- measuring -----------------------------------------------------------------------
    def measure(self, requests: Iterable[MeasureRequest]) -> Iterator[MeasureResult]:
        """Build and measure every request; yield results in completion order.

        Requests are pulled lazily, only as runners free up, so the caller may build them
        lazily (extraction happens when a runner is about to need the bytes). Never raises for
        a candidate: failures are results. Raises `FarmError` only when no runner is left for
        requests still waiting.
        """
        t0 = time.perf_counter()
        src = iter(requests)
        exhausted = False
        queues: dict[str, collections.deque[_Work]] = collections.defaultdict(
            collections.deque)
        inflight: dict[Any, _Work] = {}
        ready_out: collections.deque[MeasureResult] = collections.deque()
        n_runners = max(1, self.alive_runners())
        max_buffer = 4 * n_runners + 8
        prog = self.progress

        def queued() -> int:
            return sum(len(q) for q in queues.values())

        def held() -> int:
            return sum(len(r.held) + len(r.unconfirmed) for r in self._runners)

        def free_slots() -> int:
            return sum(self.depth - len(r.inflight) for r in self._runners
                       if r.state == "healthy")

        def route(req: MeasureRequest) -> None:
            tc = req.target.toolchain
            kind = self._kinds.get(tc, req.target.device.kind)
            if not any(r.serves(tc) for r in self._runners if r.state in ("healthy", "probing")):
                ready_out.append(self._no_runner(req))
                return
            queues[kind].append(_Work(req, kind))

        def pick(r: _Runner) -> _Work | None:
            q = queues.get(r.kind)
            if not q:
                return None
            for i, w in enumerate(q):
                if not r.serves(w.req.target.toolchain):
                    continue
                if r.name in w.avoid and any(
                    o is not r and o.state == "healthy" and o.serves(w.req.target.toolchain)
                    and o.name not in w.avoid for o in self._runners
                ):
                    continue  # someone else can take it
                del q[i]
                return w
            return None

        def dispatch() -> None:
            progressed = True
            while progressed:
                progressed = False
                for r in sorted((r for r in self._runners if r.state == "healthy"),
                                key=lambda r: len(r.inflight)):
                    if len(r.inflight) >= self.depth:
                        continue
                    w = pick(r)
                    if w is None:
                        continue
                    w.call = next(self._call_ids)
                    ref = r.actor.run.remote(w.req, w.call)
                    if not r.inflight:
                        r.head_since = time.monotonic()
                    r.inflight.append(ref)
                    w.runner = r
                    inflight[ref] = w
                    progressed = True

        def refill() -> None:
            nonlocal exhausted
            while not exhausted and queued() < max_buffer and queued() < free_slots() + 1:
                try:
                    req = next(src)
                except StopIteration:
                    exhausted = True
                    break
                route(req)
                dispatch()

        def on_result(ref: Any) -> None:
            w = inflight.pop(ref, None)
            if w is None:
                return
            r = w.runner
            assert r is not None
            try:
                res = ray.get(ref)
            except (RayActorError, ActorUnschedulableError) as e:
                inflight[ref] = w  # let the failure path see it
                self._runner_failed(r, e, inflight, queues, ready_out)
                return
            except RayTaskError as e:  # the actor's own code raised: a farm bug, recorded
                res = MeasureResult.failed(w.req.build, Status.RUNTIME_ERROR,
                                           f"farm error: {_short(e, 2000)}", w.req.config)
            except RayError as e:  # lost object, owner died, ...: treat as a runner failure
                inflight[ref] = w
                self._runner_failed(r, e, inflight, queues, ready_out)
                return
            if ref in r.inflight:
                r.inflight.remove(ref)
            r.head_since = time.monotonic()
            r.results += 1
            if res.status is Status.CRASHED and FARM_DETAIL not in dict(res.details):
                try:  # its worker died: the candidate, or Ray killing the runner (_confirm)
                    r.unconfirmed[r.actor.ping.remote()] = (res, w)
                    return
                except Exception:
                    pass
            ready_out.append(res)

        def watchdog() -> None:
            now = time.monotonic()
            for r in self._runners:
                if r.state != "healthy" or not r.inflight:
                    continue
                w = inflight.get(r.inflight[0])
                if w is None:
                    continue
                limit = r.spec.build_timeout_s + w.req.config.timeout_s + self.watchdog_slack_s
                if now - r.head_since > limit:
                    log.warning("farm: runner %s has run %s for %.0f s (> %.0f s); killing it",
                                r.name, w.req.label or w.req.fingerprint, now - r.head_since,
                                limit)
                    w.timed_out = True
                    with contextlib.suppress(Exception):
                        ray.kill(r.actor, no_restart=False)
                    r.head_since = now  # one kill per limit

        try:
            while True:
                refill()
                dispatch()
                while ready_out:
                    res = ready_out.popleft()
                    self._results += 1
                    prog.inflight = len(inflight) + held()
                    prog.result(res)
                    yield res
                    refill()
                    dispatch()
                if exhausted and not inflight and not queued() and not held():
                    break
                self._probe_tick(queues, ready_out)
                if ready_out:
                    continue  # a runner retired: what it held was settled into results
                if not inflight:
                    # queued work but nothing running: runners are restarting, or all gone
                    waiting = {k for k, q in queues.items() if q}
                    stranded = [k for k in waiting if not any(
                        r.kind == k and r.state in ("healthy", "probing")
                        for r in self._runners)]
                    if stranded:
                        n = sum(len(queues[k]) for k in stranded)
                        raise FarmError(f"every {'/'.join(stranded)} runner is gone; {n} "
                                        "requests were not measured (measured rows are kept)")
                    if not any(r.state in ("healthy", "probing") for r in self._runners):
                        raise FarmError("no runner left")
                probes = {r.probe: r for r in self._runners
                          if r.state == "probing" and r.probe is not None}
                confirms = {ref: r for r in self._runners for ref in r.unconfirmed}
                refs = list(inflight) + list(probes) + list(confirms)
                if not refs:
                    if any(r.state == "probing" for r in self._runners):
                        time.sleep(0.05)  # a restarting runner is asked again shortly
                        continue
                    # healthy runners exist but none could take the queued work (toolchain
                    # unserved after a death): fail those requests as data
                    for k in list(queues):
                        while queues[k]:
                            ready_out.append(self._no_runner(queues[k].popleft().req))
                    continue
                pending_ping = any(r.state == "probing" and r.probe is None
                                   for r in self._runners)
                done, _ = ray.wait(refs, num_returns=1, timeout=0.2 if pending_ping else 1.0)
                if done:
                    more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
                    done = list(dict.fromkeys(list(done) + list(more)))
                for ref in done:
                    if ref in probes:
                        self._probe_done(probes[ref], queues, ready_out)
                    elif ref in confirms:
                        self._confirm(confirms[ref], ref, inflight, queues, ready_out)
                    elif ref in inflight:
                        on_result(ref)
                watchdog()
                prog.inflight = len(inflight) + held()
                prog.render()
        finally:
            self._wall += time.perf_counter() - t0
            prog.inflight = 0
            for r in self._runners:
                r.held.clear()  # a measure() left early: its calls die with it
                r.unconfirmed.clear()

    def _no_runner(self, req: MeasureRequest) -> MeasureResult:
        serving = sorted({tc for r in self._runners if r.state != "dead" and r.info
                          for tc in r.info.toolchains})
        return MeasureResult.failed(
            req.build, Status.UNSUPPORTED,
            f"no runner in this farm serves toolchain {req.target.toolchain!r} "
            f"(served: {', '.join(serving) or 'none'})",
            req.config, details=((FARM_DETAIL, "no_runner"),),
        )

    def _node_alive(self, node_id: str) -> bool:
        try:
            for n in ray.nodes():
                if n["NodeID"] == node_id:
                    return bool(n.get("Alive"))
        except Exception:
            return True
        return False

    def _runner_failed(self, r: _Runner, err: BaseException, inflight: dict[Any, _Work],
                       queues: dict[str, collections.deque[_Work]],
                       ready_out: collections.deque[MeasureResult]) -> None:
        """Take back ``r``'s in-flight work and hold it until ``r`` says what it was running.

        Results that made it out before the death are kept. The rest are not struck here: the
        error every unanswered call gets is the same for the culprit and for a call that had
        finished but lost its reply (module docstring), so they wait in ``r.held`` for the
        restarted actor's ping (`_settle`). A runner whose node is gone is retired and its
        calls re-queued at once, without a strike: the node, not a candidate, failed.
        """
        self._runner_failures += 1
        r.failures += 1
        node_gone = isinstance(err, ActorUnschedulableError) or not self._node_alive(
            r.spec.node_id)
        refs = list(r.inflight)
        r.inflight.clear()
        lost: list[tuple[Any, _Work]] = []
        for ref in refs:
            w = inflight.pop(ref, None)
            if w is not None:
                lost.append((ref, w))
        lost = self._collect_finished(lost, ready_out)
        for _res, w in r.unconfirmed.values():  # its worker died with it, not by the candidate
            w.cut_short = True
            lost.append((None, w))
        r.unconfirmed.clear()
        log.warning("farm: runner %s failed (%s); %d request(s) %s", r.name,
                    _short(err, 160), len(lost),
                    "re-queued; its node is gone" if node_gone
                    else "held until it tells which one it was running")
        r.held.extend(lost)
        r.fault = _short(err)
        if node_gone:
            self._settle(r, None, queues, ready_out, strike=False)
            r.state = "dead"
            with contextlib.suppress(Exception):
                ray.kill(r.actor, no_restart=True)
            return
        r.state = "probing"
        r.probe = None
        r.probe_since = r.next_probe = time.monotonic()

    @staticmethod
    def _collect_finished(calls: list[tuple[Any, _Work]],
                          ready_out: collections.deque[MeasureResult],
                          ) -> list[tuple[Any, _Work]]:
        """Move the results of calls that did come back to ``ready_out``; return the others."""
        refs = [ref for ref, _ in calls if ref is not None]
        if not refs:
            return list(calls)
        got, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready = set(got)
        left: list[tuple[Any, _Work]] = []
        for ref, w in calls:
            if ref in ready:
                try:
                    ready_out.append(ray.get(ref))  # its reply made it out before the death
                    continue
                except RayError:
                    pass
            left.append((ref, w))
        return left

    def _settle(self, r: _Runner, finished: int | None,
                queues: dict[str, collections.deque[_Work]],
                ready_out: collections.deque[MeasureResult], *, strike: bool = True) -> None:
        """Strike the call ``r`` was executing when it died and re-queue the rest of its calls.

        ``finished``: the last call ``r`` finished (its journal, `RunnerPing`); calls run in
        order, so the oldest held call after it is the one that was executing, or the next in
        line if the process died between two calls (conservative: a candidate that kills the
        actor while its request is being received must not be retried forever either). None:
        unknown (the runner never came back), the oldest held call. ``strike=False``: nobody
        (node lost, or the actor did not restart and only its connection failed).
        """
        held, r.held = r.held, []
        # a last look: a reply that was already on its way when the failure was seen
        held = sorted(self._collect_finished(held, ready_out), key=lambda h: h[1].call)
        cut = [w.call for _, w in held if w.cut_short]
        if cut and finished is not None:  # returned, but its worker was killed with the actor
            finished = min(finished, min(cut) - 1)
        culprit: _Work | None = None
        if strike:
            i = blame([w.call for _, w in held], finished)
            culprit = None if i is None else held[i][1]
        back: list[_Work] = []
        for _, w in held:
            w.runner = None
            w.cut_short = False
            if w is culprit:
                w.avoid.add(r.name)
                w.crashes += 1
                w.errors.append(r.fault)
                if w.crashes >= self.crash_limit:
                    ready_out.append(self._crashed_result(w))
                    continue
            self._retried += 1
            back.append(w)
        for w in reversed(back):
            queues[w.kind].appendleft(w)
        if held:
            who = "none" if culprit is None else (culprit.req.label or culprit.req.fingerprint)
            why = ("its journal is unknown" if finished is None
                   else f"the last call it finished: #{finished}")
            log.warning("farm: runner %s: struck %s (%s); %d request(s) re-queued", r.name,
                        who, why if strike else "no strike", len(back))

    def _confirm(self, r: _Runner, ref: Any, inflight: dict[Any, _Work],
                 queues: dict[str, collections.deque[_Work]],
                 ready_out: collections.deque[MeasureResult]) -> None:
        """Deliver a runner's ``crashed`` result once the same actor process answered after it.

        Why: when Ray kills a runner actor (``ray.kill``, the watchdog, a restart) it kills the
        actor's child processes first, the LocalRunner's worker among them, and the actor's
        call, still running for tens of milliseconds, returns ``crashed: worker ... died from
        SIGKILL`` before the process exits; that reply can reach the farm. Taken at its word
        it is a ``crashed`` row for a candidate that did nothing, written to the cost table
        for good. A worker the candidate really crashed leaves the actor alive, so the ping
        sent after the result is answered by the same incarnation. If it is not, the result
        is dropped and the call is counted with the runner's death as the one it was running
        (`_settle`): one strike, as for any call a killed runner was running.
        """
        item = r.unconfirmed.pop(ref, None)
        if item is None:
            return  # already counted with a failure of the runner
        err: BaseException | None = None
        try:
            pong = ray.get(ref)
            if pong.incarnation != r.incarnation:
                err = RuntimeError(f"runner {r.name} restarted right after a crashed result")
        except RayError as e:
            err = e
        if err is None:
            ready_out.append(item[0])
            return
        log.warning("farm: runner %s died right after returning crashed for %s; that result "
                    "is not the candidate's", r.name, item[1].req.label or item[1].req.fingerprint)
        r.unconfirmed[ref] = item
        if r.state == "healthy":
            self._runner_failed(r, err, inflight, queues, ready_out)  # folds it in
        else:  # a failed runner has none left (folded at its failure); never lose one anyway
            r.unconfirmed.pop(ref)
            item[1].runner = None
            queues[item[1].kind].appendleft(item[1])

    def _probe_tick(self, queues: dict[str, collections.deque[_Work]],
                    ready_out: collections.deque[MeasureResult]) -> None:
        """Ping runners that are restarting when due; retire those gone too long."""
        now = time.monotonic()
        for r in self._runners:
            if r.state != "probing":
                continue
            if now - r.probe_since > self.probe_timeout_s:
                r.state = "dead"
                r.probe = None
                log.warning("farm: runner %s did not come back within %.0f s; retired",
                            r.name, self.probe_timeout_s)
                with contextlib.suppress(Exception):
                    ray.kill(r.actor, no_restart=True)
                self._settle(r, None, queues, ready_out)
            elif r.probe is None and now >= r.next_probe:
                try:
                    r.probe = r.actor.ping.remote()
                except Exception as e:
                    r.state = "dead"
                    log.warning("farm: runner %s cannot be probed: %s", r.name, _short(e))
                    self._settle(r, None, queues, ready_out)

    def _probe_done(self, r: _Runner, queues: dict[str, collections.deque[_Work]],
                    ready_out: collections.deque[MeasureResult]) -> None:
        ref, r.probe = r.probe, None
        try:
            pong = ray.get(ref)
        except ActorUnavailableError:  # still restarting: ask again shortly
            r.next_probe = time.monotonic() + 0.2
            return
        except RayError as e:  # died for good: restarts used up, node gone, init failing
            r.state = "dead"
            log.warning("farm: runner %s is gone for good: %s", r.name, _short(e))
            self._settle(r, None, queues, ready_out)
            return
        # the same process answering: only the connection failed, nothing died, nobody struck
        restarted = pong.incarnation != r.incarnation
        r.incarnation = pong.incarnation
        self._settle(r, pong.finished, queues, ready_out, strike=restarted)
        r.state = "healthy"
        r.head_since = time.monotonic()
        log.info("farm: runner %s is back%s", r.name,
                 " after a restart" if restarted else " (it had not restarted)")

    def _crashed_result(self, w: _Work) -> MeasureResult:
        self._crashed += 1
        status = Status.TIMEOUT if w.timed_out else Status.CRASHED
        device, version = None, ""
        with contextlib.suppress(Exception):
            got = self.describe(w.req.target)
            if got is not None:
                device, version = got
        what = "hung and was killed" if w.timed_out else "died"
        msg = (f"the runner process {what} {w.crashes} times running this candidate; "
               f"last: {w.errors[-1] if w.errors else '?'}")
        log.warning("farm: %s recorded as %s: %s", w.req.label or w.req.fingerprint,
                    status.value, msg)
        return MeasureResult.failed(w.req.build, status, msg, w.req.config, device=device,
                                    toolchain_version=version,
                                    details=((FARM_DETAIL, "runner_died"),
                                             ("attempts", w.crashes)))

    # --- shutdown ------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the runner actors (and the embedded Ray this farm started)."""
        if self._closed:
            return
        self._closed = True
        self.progress.close()
        if ray.is_initialized():
            live = [r for r in self._runners if r.state in ("healthy", "probing")]
            refs = []
            for r in live:
                with contextlib.suppress(Exception):
                    refs.append(r.actor.close.remote())
            if refs:
                with contextlib.suppress(Exception):
                    ray.wait(refs, num_returns=len(refs), timeout=10)
            for r in self._runners:
                with contextlib.suppress(Exception):
                    ray.kill(r.actor, no_restart=True)
                r.state = "dead"
            if self.owns_ray:
                shutdown()

    def __enter__(self) -> Farm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
