"""The dispatch loop: a Ray-free state machine that keeps the runners busy and survives them.

`Dispatcher` owns one `Farm.measure` call's state: the queues of requests per device kind, the
calls in flight, the results ready to hand out, and what each runner death is charged to. It is
driven by events (a request submitted, a call's reply arrived, a runner failed, a ping answered,
the clock moved) and reaches the runner actors only through `RunnerCalls`, so a unit test drives
it with a scripted fake; the farm hands it `collage_farm.farm.ray_calls.RayCalls`.

* **Dispatch** keeps ``depth`` calls (default 2) queued on every runner, so a runner starts its
  next candidate the moment it finishes one (the actor-call round trip, ~0.7 ms, is hidden),
  and pulls requests from the caller's iterator only as runners free up (bounded queue).
  Results are handed out in completion order.
* **Runner death** (the actor process killed or crashed, a hung call killed by the watchdog, or
  the node lost): every call in flight on that runner is taken back. The call that was
  executing gets a strike unless the node itself died; a candidate with ``crash_limit`` (2)
  strikes is returned as a ``crashed`` result (``timeout`` if the watchdog killed it), the
  others are re-queued and the campaign goes on. A runner whose actor dies is restarted by Ray
  (``max_restarts``), pinged (`RunnerState.PROBING`) and put back to work; a runner whose node
  is gone, or that does not come back within ``probe_timeout_s``, is retired
  (`RunnerState.DEAD`). Actor calls are not retried by Ray: retries are ours, so that strikes
  can be counted and work moved to other runners.

  *Which* call was executing is not "the oldest unanswered one": a call that had finished but
  whose reply died with the process fails with the same error as the culprit. Striking the
  oldest unanswered call struck such an innocent call, twice when the culprit was re-queued
  behind it again, so it was recorded ``crashed`` and never measured (seen on a 2-core VM: a
  candidate measured 1.4 ms before the one that exited the actor). So each runner journals the
  id of the last call it finished (`collage_farm.farm.journal.CallJournal`) and its restarted
  actor reports it in its ping. Until then the dead runner's calls are *held*; then the oldest
  held call it had not finished gets the strike (`blame`) and the rest are re-queued without
  one. A runner that never comes back cannot report: its oldest unanswered call is struck.

  The other way round, a ``crashed`` *result* is not always the candidate's either: Ray kills
  an actor's child processes before the actor itself (``ray.kill``, the watchdog), so the call
  it was running sees the LocalRunner's worker die of SIGKILL and can still reply ``crashed``
  in the ~70 ms before the process exits (seen: a 0.08 s candidate answered ``crashed`` after
  27 ms). Such a result would be a ``crashed`` row, kept in the cost table for good. So a
  runner's ``crashed`` result is delivered only after a ping sent behind it is answered by the
  same actor process (`Dispatcher.on_ping`, the alive-check); if the runner died instead, the
  result is dropped and the call counts as the one the dead runner was running.
"""

from __future__ import annotations

import collections
import itertools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from collage_farm.farm.calls import Handle, Outcome, Refused, RunnerCalls, clip
from collage_farm.farm.messages import FarmError
from collage_farm.farm.progress import Progress
from collage_farm.farm.records import Runner, RunnerState, Work
from runners.base import FARM_DETAIL, NO_RUNNER, MeasureRequest, MeasureResult, Status

log = logging.getLogger(__name__)

RUNNER_DIED = "runner_died"  # FARM_DETAIL of a result given up after crash_limit deaths


@dataclass(frozen=True)
class DispatchPolicy:
    """``depth``: calls kept queued per runner; ``crash_limit``: runner deaths a candidate may
    cause before it is returned as ``crashed``; ``watchdog_slack_s``: how far past its own
    timeouts (build + measure) a call may run before its runner is killed;
    ``probe_timeout_s``: how long a failed runner may take to answer a ping again."""

    depth: int = 2
    crash_limit: int = 2
    watchdog_slack_s: float = 60.0
    probe_timeout_s: float = 120.0


@dataclass
class DispatchTally:
    """Counts over the farm's life, across `Dispatcher`s, and the call ids they hand out."""

    results: int = 0
    retried: int = 0
    crashed: int = 0
    runner_failures: int = 0
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1), repr=False)

    def next_call(self) -> int:
        """A new call id, larger than every earlier one (the call journal relies on it)."""
        return next(self._ids)


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


class Dispatcher:
    """One `Farm.measure` call's dispatch state over the farm's ``runners`` (see module doc).

    ``kinds``: toolchain -> device kind; ``tally``: the farm's counters, shared by its
    dispatchers; ``clock`` / ``sleep``: the monotonic clock and the pause of an idle loop
    (a test passes fakes).
    """

    def __init__(self, runners: Sequence[Runner], calls: RunnerCalls,
                 kinds: Mapping[str, str], *, policy: DispatchPolicy | None = None,
                 tally: DispatchTally | None = None, progress: Progress | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.runners = runners
        self.calls = calls
        self.kinds = kinds
        self.policy = policy or DispatchPolicy()
        self.tally = tally or DispatchTally()
        self.progress = progress
        self.clock = clock
        self.sleep = sleep
        self.queues: dict[str, collections.deque[Work]] = collections.defaultdict(
            collections.deque)
        self.inflight: dict[Handle, Work] = {}
        self.ready: collections.deque[MeasureResult] = collections.deque()
        self._src: Iterator[MeasureRequest] = iter(())
        self.exhausted = True
        self.max_buffer = 4 * max(1, self._in_service()) + 8

    # --- counts ------------------------------------------------------------------------
    def _in_service(self) -> int:
        return sum(1 for r in self.runners if r.state.in_service)

    def queued(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def held(self) -> int:
        """Calls waiting on a failed runner's ping, or on the alive-check after ``crashed``."""
        return sum(len(r.held) + len(r.unchecked) for r in self.runners)

    def _free_slots(self) -> int:
        return sum(self.policy.depth - len(r.inflight) for r in self.runners
                   if r.state is RunnerState.ALIVE)

    def done(self) -> bool:
        """Every request pulled, answered and handed out."""
        return (self.exhausted and not self.inflight and not self.queued() and not self.held()
                and not self.ready)

    # --- the loop ----------------------------------------------------------------------
    def measure(self, requests: Iterable[MeasureRequest]) -> Iterator[MeasureResult]:
        """Results for ``requests`` in completion order (`Farm.measure`'s contract)."""
        self._src = iter(requests)
        self.exhausted = False
        try:
            while True:
                self._feed()
                while self.ready:
                    yield self._deliver()
                    self._feed()
                if self.done():
                    break
                self.check_probes()
                if self.ready:
                    continue  # a runner retired: what it held was settled into results
                if not self.inflight:
                    self._check_stranded()
                if self._await_events():
                    self.watchdog()
                    self._show()
        finally:
            self._end()

    def _feed(self) -> None:
        self.refill()
        self.dispatch()

    def _deliver(self) -> MeasureResult:
        res = self.ready.popleft()
        self.tally.results += 1
        if self.progress is not None:
            self.progress.inflight = len(self.inflight) + self.held()
            self.progress.result(res)
        return res

    def _show(self) -> None:
        if self.progress is not None:
            self.progress.inflight = len(self.inflight) + self.held()
            self.progress.render()

    def _end(self) -> None:
        if self.progress is not None:
            self.progress.inflight = 0
        for r in self.runners:
            r.held.clear()  # a measure() left early: its calls die with it
            r.unchecked.clear()

    def _check_stranded(self) -> None:
        """Queued work but nothing running: runners are restarting, or all gone (raise)."""
        waiting = {k for k, q in self.queues.items() if q}
        stranded = [k for k in waiting if not any(
            r.kind == k and r.state.in_service for r in self.runners)]
        if stranded:
            n = sum(len(self.queues[k]) for k in stranded)
            raise FarmError(f"every {'/'.join(stranded)} runner is gone; {n} "
                            "requests were not measured (measured rows are kept)")
        if not any(r.state.in_service for r in self.runners):
            raise FarmError("no runner left")

    def _await_events(self) -> bool:
        """Wait for a reply or a ping and handle what came; False when there was none to
        wait for (then a restarting runner is asked again shortly, or unservable work fails)."""
        handles = [*self.inflight, *(r.probe for r in self.runners
                                     if r.state is RunnerState.PROBING and r.probe is not None),
                   *(h for r in self.runners for h in r.unchecked)]
        if not handles:
            if any(r.state is RunnerState.PROBING for r in self.runners):
                self.sleep(0.05)
                return False
            # alive runners exist but none could take the queued work (toolchain unserved
            # after a death): fail those requests as data
            for q in self.queues.values():
                while q:
                    self.ready.append(self._no_runner(q.popleft().req))
            return False
        pending_ping = any(r.state is RunnerState.PROBING and r.probe is None
                           for r in self.runners)
        for h in self.calls.wait(handles, 0.2 if pending_ping else 1.0):
            self.on_ready(h)
        return True

    # --- events: requests ----------------------------------------------------------------
    def submit(self, req: MeasureRequest) -> None:
        """Queue ``req`` for its device kind, or answer it at once when nothing serves it."""
        tc = req.target.toolchain
        kind = self.kinds.get(tc, req.target.device.kind)
        if not any(r.serves(tc) for r in self.runners if r.state.in_service):
            self.ready.append(self._no_runner(req))
            return
        self.queues[kind].append(Work(req, kind))

    def refill(self) -> None:
        """Pull requests while the queue is shorter than the free slots (and a bound)."""
        while (not self.exhausted and self.queued() < self.max_buffer
               and self.queued() < self._free_slots() + 1):
            try:
                req = next(self._src)
            except StopIteration:
                self.exhausted = True
                break
            self.submit(req)
            self.dispatch()

    def _pick(self, r: Runner) -> Work | None:
        q = self.queues.get(r.kind)
        if not q:
            return None
        for i, w in enumerate(q):
            if not r.serves(w.req.target.toolchain):
                continue
            if r.name in w.avoid and any(
                o is not r and o.state is RunnerState.ALIVE and o.serves(w.req.target.toolchain)
                and o.name not in w.avoid for o in self.runners
            ):
                continue  # someone else can take it
            del q[i]
            return w
        return None

    def dispatch(self) -> None:
        """Send queued work to alive runners until each has ``depth`` calls or none fits."""
        progressed = True
        while progressed:
            progressed = False
            for r in sorted((r for r in self.runners if r.state is RunnerState.ALIVE),
                            key=lambda r: len(r.inflight)):
                if len(r.inflight) >= self.policy.depth:
                    continue
                w = self._pick(r)
                if w is None:
                    continue
                w.call = self.tally.next_call()
                handle = self.calls.run(r, w.req, w.call)
                if not r.inflight:
                    r.head_since = self.clock()
                r.inflight.append(handle)
                w.runner = r
                self.inflight[handle] = w
                progressed = True

    # --- events: replies -----------------------------------------------------------------
    def on_ready(self, handle: Handle) -> None:
        """A handle `RunnerCalls.wait` reported: a run call's reply, or a ping's."""
        if handle in self.inflight:
            self.on_reply(handle)
        else:
            self.on_ping(handle)

    def on_reply(self, handle: Handle) -> None:
        """A run call ended: a result to hand out (or check first), or its runner failed."""
        w = self.inflight.pop(handle, None)
        if w is None:
            return
        r = w.runner
        assert r is not None
        reply = self.calls.run_reply(handle)
        if reply.outcome.runner_failed:
            self.inflight[handle] = w  # let the failure path see it
            self.runner_failed(r, reply.error,
                               unschedulable=reply.outcome is Outcome.UNSCHEDULABLE)
            return
        if reply.outcome is Outcome.RAISED or reply.result is None:
            res = MeasureResult.failed(w.req.build, Status.RUNTIME_ERROR,
                                       f"farm error: {clip(reply.error, 2000)}", w.req.config)
        else:
            res = reply.result
        if handle in r.inflight:
            r.inflight.remove(handle)
        r.head_since = self.clock()
        r.results += 1
        if res.status is Status.CRASHED and FARM_DETAIL not in dict(res.details):
            # its worker died: the candidate, or Ray killing the runner (alive-check first)
            check = self.calls.ping(r)
            if not isinstance(check, Refused):
                r.unchecked[check] = (res, w)
                return
        self.ready.append(res)

    def on_ping(self, handle: Handle) -> None:
        """A ping answered (or failed): a failed runner's probe, or an alive-check."""
        for r in self.runners:
            if r.probe is not None and r.probe == handle and r.state is RunnerState.PROBING:
                self._probe_answered(r)
                return
            if handle in r.unchecked:
                self._check_alive(r, handle)
                return

    def _check_alive(self, r: Runner, handle: Handle) -> None:
        """Deliver a runner's ``crashed`` result once the same actor process answered after it.

        Why: when Ray kills a runner actor (``ray.kill``, the watchdog, a restart) it kills the
        actor's child processes first, the LocalRunner's worker among them, and the actor's
        call, still running for tens of milliseconds, returns ``crashed: worker ... died from
        SIGKILL`` before the process exits; that reply can reach the farm. Taken at its word
        it is a ``crashed`` row for a candidate that did nothing. A worker the candidate
        really crashed leaves the actor alive, so the ping sent after the result is answered by
        the same incarnation. If it is not, the result is dropped and the call is counted with
        the runner's death as the one it was running (`resolve_held`): one strike, as for any
        call a killed runner was running.
        """
        item = r.unchecked.pop(handle, None)
        if item is None:
            return  # already counted with a failure of the runner
        reply = self.calls.ping_reply(handle)
        if reply.outcome is not Outcome.ANSWERED or reply.ping is None:
            error = reply.error or f"ping {reply.outcome.value}"
        elif reply.ping.incarnation != r.incarnation:
            error = f"RuntimeError: runner {r.name} restarted right after a crashed result"
        else:
            error = ""
        if not error:
            self.ready.append(item[0])
            return
        log.warning("farm: runner %s died right after returning crashed for %s; that result "
                    "is not the candidate's", r.name, item[1].req.label or item[1].req.fingerprint)
        r.unchecked[handle] = item
        if r.state is RunnerState.ALIVE:
            self.runner_failed(r, error,  # folds it in
                               unschedulable=reply.outcome is Outcome.UNSCHEDULABLE)
        else:  # a failed runner has none left (folded at its failure); never lose one anyway
            r.unchecked.pop(handle)
            item[1].runner = None
            self.queues[item[1].kind].appendleft(item[1])

    # --- events: runner failures -------------------------------------------------------------
    def runner_failed(self, r: Runner, error: str, *, unschedulable: bool = False) -> None:
        """Take back ``r``'s in-flight work and hold it until ``r`` says what it was running.

        Results that made it out before the death are kept. The rest are not struck here: the
        error every unanswered call gets is the same for the culprit and for a call that had
        finished but lost its reply (module docstring), so they wait in ``r.held`` for the
        restarted actor's ping (`resolve_held`). A runner whose node is gone
        (``unschedulable``, or the cluster no longer lists the node) is retired and its calls
        re-queued at once, without a strike: the node, not a candidate, failed.
        """
        self.tally.runner_failures += 1
        r.failures += 1
        node_gone = unschedulable or not self.calls.node_alive(r.spec.node_id)
        lost: list[tuple[Handle | None, Work]] = []
        for handle in r.inflight:
            w = self.inflight.pop(handle, None)
            if w is not None:
                lost.append((handle, w))
        r.inflight.clear()
        lost = self._collect_finished(lost)
        for _res, w in r.unchecked.values():  # its worker died with it, not by the candidate
            w.cut_short = True
            lost.append((None, w))
        r.unchecked.clear()
        log.warning("farm: runner %s failed (%s); %d request(s) %s", r.name,
                    clip(error, 160), len(lost),
                    "re-queued; its node is gone" if node_gone
                    else "held until it tells which one it was running")
        r.held.extend(lost)
        r.fault = clip(error)
        if node_gone:
            self.resolve_held(r, None, strike=False)
            r.state = RunnerState.DEAD
            self.calls.kill(r, restart=False)
            return
        r.state = RunnerState.PROBING
        r.probe = None
        r.probe_since = r.next_probe = self.clock()

    def _collect_finished(self, calls: list[tuple[Handle | None, Work]]
                          ) -> list[tuple[Handle | None, Work]]:
        """Move the results of calls that did come back to ``ready``; return the others."""
        handles = [h for h, _ in calls if h is not None]
        if not handles:
            return list(calls)
        ready = set(self.calls.wait(handles, 0))
        left: list[tuple[Handle | None, Work]] = []
        for h, w in calls:
            if h in ready:
                reply = self.calls.run_reply(h)
                if reply.outcome is Outcome.ANSWERED and reply.result is not None:
                    self.ready.append(reply.result)  # its reply made it out before the death
                    continue
            left.append((h, w))
        return left

    def resolve_held(self, r: Runner, finished: int | None, *, strike: bool = True) -> None:
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
        held = sorted(self._collect_finished(held), key=lambda h: h[1].call)
        cut = [w.call for _, w in held if w.cut_short]
        if cut and finished is not None:  # returned, but its worker was killed with the actor
            finished = min(finished, min(cut) - 1)
        culprit: Work | None = None
        if strike:
            i = blame([w.call for _, w in held], finished)
            culprit = None if i is None else held[i][1]
        back: list[Work] = []
        for _, w in held:
            w.runner = None
            w.cut_short = False
            if w is culprit:
                w.avoid.add(r.name)
                w.crashes += 1
                w.errors.append(r.fault)
                if w.crashes >= self.policy.crash_limit:
                    self.ready.append(self._crashed_result(w))
                    continue
            self.tally.retried += 1
            back.append(w)
        for w in reversed(back):
            self.queues[w.kind].appendleft(w)
        if held:
            who = "none" if culprit is None else (culprit.req.label or culprit.req.fingerprint)
            why = ("its journal is unknown" if finished is None
                   else f"the last call it finished: #{finished}")
            log.warning("farm: runner %s: struck %s (%s); %d request(s) re-queued", r.name,
                        who, why if strike else "no strike", len(back))

    # --- events: the clock ---------------------------------------------------------------
    def check_probes(self) -> None:
        """Ping runners that are restarting when due; retire those gone too long."""
        now = self.clock()
        for r in self.runners:
            if r.state is not RunnerState.PROBING:
                continue
            if now - r.probe_since > self.policy.probe_timeout_s:
                r.state = RunnerState.DEAD
                r.probe = None
                log.warning("farm: runner %s did not come back within %.0f s; retired",
                            r.name, self.policy.probe_timeout_s)
                self.calls.kill(r, restart=False)
                self.resolve_held(r, None)
            elif r.probe is None and now >= r.next_probe:
                probe = self.calls.ping(r)
                if isinstance(probe, Refused):
                    r.state = RunnerState.DEAD
                    log.warning("farm: runner %s cannot be probed: %s", r.name,
                                clip(probe.error))
                    self.resolve_held(r, None)
                else:
                    r.probe = probe

    def _probe_answered(self, r: Runner) -> None:
        handle, r.probe = r.probe, None
        assert handle is not None
        reply = self.calls.ping_reply(handle)
        if reply.outcome is Outcome.UNAVAILABLE:  # still restarting: ask again shortly
            r.next_probe = self.clock() + 0.2
            return
        if reply.outcome is not Outcome.ANSWERED or reply.ping is None:
            # died for good: restarts used up, node gone, init failing
            r.state = RunnerState.DEAD
            log.warning("farm: runner %s is gone for good: %s", r.name, clip(reply.error))
            self.resolve_held(r, None)
            return
        # the same process answering: only the connection failed, nothing died, nobody struck
        restarted = reply.ping.incarnation != r.incarnation
        r.incarnation = reply.ping.incarnation
        self.resolve_held(r, reply.ping.finished, strike=restarted)
        r.state = RunnerState.ALIVE
        r.head_since = self.clock()
        log.info("farm: runner %s is back%s", r.name,
                 " after a restart" if restarted else " (it had not restarted)")

    def watchdog(self) -> None:
        """Kill (for a restart) a runner whose oldest call ran past its timeouts and slack."""
        now = self.clock()
        for r in self.runners:
            if r.state is not RunnerState.ALIVE or not r.inflight:
                continue
            w = self.inflight.get(r.inflight[0])
            if w is None:
                continue
            limit = (r.spec.build_timeout_s + w.req.config.timeout_s
                     + self.policy.watchdog_slack_s)
            if now - r.head_since > limit:
                log.warning("farm: runner %s has run %s for %.0f s (> %.0f s); killing it",
                            r.name, w.req.label or w.req.fingerprint, now - r.head_since,
                            limit)
                w.timed_out = True
                self.calls.kill(r, restart=True)
                r.head_since = now  # one kill per limit

    # --- results the dispatcher makes ----------------------------------------------------
    def _no_runner(self, req: MeasureRequest) -> MeasureResult:
        serving = sorted({tc for r in self.runners if r.state is not RunnerState.DEAD and r.info
                          for tc in r.info.toolchains})
        return MeasureResult.failed(
            req.build, Status.UNSUPPORTED,
            f"no runner in this farm serves toolchain {req.target.toolchain!r} "
            f"(served: {', '.join(serving) or 'none'})",
            req.config, details=((FARM_DETAIL, NO_RUNNER),),
        )

    def _crashed_result(self, w: Work) -> MeasureResult:
        self.tally.crashed += 1
        status = Status.TIMEOUT if w.timed_out else Status.CRASHED
        got = self.calls.describe(w.req.target)
        device, version = got if got is not None else (None, "")
        what = "hung and was killed" if w.timed_out else "died"
        msg = (f"the runner process {what} {w.crashes} times running this candidate; "
               f"last: {w.errors[-1] if w.errors else '?'}")
        log.warning("farm: %s recorded as %s: %s", w.req.label or w.req.fingerprint,
                    status.value, msg)
        return MeasureResult.failed(w.req.build, status, msg, w.req.config, device=device,
                                    toolchain_version=version,
                                    details=((FARM_DETAIL, RUNNER_DIED),
                                             ("attempts", w.crashes)))
