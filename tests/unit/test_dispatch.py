"""The farm's dispatch state machine, driven without Ray through a scripted `RunnerCalls`.

Why: what the farm does when runners die (which call is struck, what is retried, what is held
until a restarted runner reports its call journal, which ``crashed`` result is believed) is the
part of the farm that is hardest to hit on real actors, where it depends on races. Here every
reply, ping and death is scripted, so each rule is checked deterministically: completion-order
delivery within the depth bound, a candidate that kills its runner retried elsewhere and then
recorded ``crashed``, the strike of a runner that died mid-call going to the call its journal
says it was running, the alive-check behind a ``crashed`` result, a lost node, the watchdog,
and requests no runner serves. ``tests/ray/test_farm.py`` runs the same rules on real actors.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest

from collage_farm.core.target import BUILTIN_TARGETS, CPU0, Target
from collage_farm.farm import FarmError, RunnerInfo, RunnerPing, RunnerSpec, RunnerState
from collage_farm.farm.calls import Outcome, PingReply, Refused, RunnerCalls, RunReply
from collage_farm.farm.dispatch import RUNNER_DIED, Dispatcher, DispatchPolicy, DispatchTally
from collage_farm.farm.records import Handle, Runner, Work
from runners.base import (
    FARM_DETAIL,
    NO_RUNNER,
    BuildInput,
    BuildResult,
    DeviceDescription,
    MeasureRequest,
    MeasureResult,
    Status,
)

SOCKET_CLOSED = ("ActorUnavailableError: The actor is temporarily unavailable: RpcError: RPC "
                 "error: Socket closed rpc_code: 14")
NULL = Target.make("null-cpu", "null", CPU0, {})


def request(name: str, target: Target = NULL) -> MeasureRequest:
    return MeasureRequest(BuildInput(f"fp-{name}", target, b"", label=name))


def runner(name: str, node: str = "node-a", toolchains: tuple[str, ...] = ("null",)) -> Runner:
    spec = RunnerSpec(name, "cpu", node, toolchains, build_timeout_s=10.0)
    info = RunnerInfo(name, "cpu", node, "host", 1, toolchains, (), (), (), (), "inc-0")
    return Runner(spec, actor=name, info=info, state=RunnerState.ALIVE, incarnation="inc-0")


def ok(req: MeasureRequest) -> MeasureResult:
    return MeasureResult(req.fingerprint, req.target, Status.OK, req.config, samples=(1e-3,))


def crashed(req: MeasureRequest) -> MeasureResult:
    return MeasureResult.failed(BuildResult(req.fingerprint, req.target, Status.OK),
                                Status.CRASHED, "worker died from SIGKILL", req.config)


@dataclass
class Clock:
    """The dispatcher's monotonic clock; its idle pauses advance it."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


class ScriptedCalls(RunnerCalls):
    """Runner actors as a script.

    A test answers calls itself (`answer`, `answer_ping`), or lets `wait` run them: each
    `wait` with a timeout runs the oldest unanswered call of every runner (`step`), where a
    request labelled in ``kills`` kills the runner's process (every call it had not answered
    fails with ``Socket closed``; Ray restarts it as a new incarnation whose journal says the
    last call it finished), and answers every ping.
    """

    def __init__(self, kills: Sequence[str] = ()) -> None:
        self.kills = set(kills)
        self.calls: dict[Handle, tuple[Runner, MeasureRequest, int]] = {}
        self.pings: dict[Handle, Runner] = {}
        self.replies: dict[Handle, RunReply | PingReply] = {}
        self.sent: list[tuple[str, str, int]] = []  # (runner, label, call id)
        self.answered: list[str] = []  # fingerprints, in the order their results were made
        self.killed: list[tuple[str, bool]] = []  # (runner, restart)
        self.nodes_gone: set[str] = set()
        self.journal: dict[str, int] = collections.defaultdict(int)
        self.incarnation: dict[str, str] = collections.defaultdict(lambda: "inc-0")
        self.refuse_pings = False
        self._ids = itertools.count(1)

    # --- RunnerCalls -------------------------------------------------------------------
    def run(self, runner: Runner, req: MeasureRequest, call: int) -> Handle:
        handle = f"run-{call}"
        self.calls[handle] = (runner, req, call)
        self.sent.append((runner.name, req.label, call))
        unanswered = [h for h, (r, _, _) in self.calls.items()
                      if r is runner and h not in self.replies]
        assert len(unanswered) <= 2, "more calls queued on a runner than the depth"
        return handle

    def ping(self, runner: Runner) -> Handle | Refused:
        if self.refuse_pings:
            return Refused("RuntimeError: actor handle unusable")
        handle = f"ping-{next(self._ids)}"
        self.pings[handle] = runner
        return handle

    def kill(self, runner: Runner, *, restart: bool) -> None:
        self.killed.append((runner.name, restart))

    def node_alive(self, node_id: str) -> bool:
        return node_id not in self.nodes_gone

    def wait(self, handles: Sequence[Handle], timeout_s: float) -> list[Handle]:
        if timeout_s > 0:
            self.step()
        return [h for h in handles if h in self.replies]

    def run_reply(self, handle: Handle) -> RunReply:
        reply = self.replies[handle]
        assert isinstance(reply, RunReply)
        return reply

    def ping_reply(self, handle: Handle) -> PingReply:
        reply = self.replies[handle]
        assert isinstance(reply, PingReply)
        return reply

    def describe(self, target: Target) -> tuple[DeviceDescription | None, str] | None:
        return None, "null test"

    # --- the script ----------------------------------------------------------------------
    def pending(self, runner: Runner) -> list[Handle]:
        """``runner``'s unanswered run calls, oldest first."""
        return [h for h, (r, _, _) in self.calls.items() if r is runner and h not in self.replies]

    def answer(self, handle: Handle, result: MeasureResult | None = None) -> None:
        r, req, call = self.calls[handle]
        res = result or ok(req)
        self.replies[handle] = RunReply(Outcome.ANSWERED, res)
        self.journal[r.name] = call
        self.answered.append(res.fingerprint)

    def die(self, runner: Runner, outcome: Outcome = Outcome.UNAVAILABLE) -> None:
        """``runner``'s process dies: its unanswered calls fail; Ray restarts it."""
        for h in self.pending(runner):
            self.replies[h] = RunReply(outcome, error=SOCKET_CLOSED)
        self.incarnation[runner.name] += "+"

    def answer_ping(self, handle: Handle, outcome: Outcome = Outcome.ANSWERED) -> None:
        r = self.pings[handle]
        ping = RunnerPing(1, self.incarnation[r.name], self.journal[r.name])
        self.replies[handle] = (PingReply(outcome, ping) if outcome is Outcome.ANSWERED
                                else PingReply(outcome, error=SOCKET_CLOSED))

    def step(self) -> None:
        runners = {id(r): r for r, _, _ in self.calls.values()}.values()
        for r in runners:
            pending = self.pending(r)
            if not pending:
                continue
            if self.calls[pending[0]][1].label in self.kills:
                self.die(r)
            else:
                self.answer(pending[0])
        for h in self.pings:
            if h not in self.replies:
                self.answer_ping(h)


def dispatcher(runners: list[Runner], calls: ScriptedCalls, clock: Clock | None = None,
               **policy: float) -> Dispatcher:
    clock = clock or Clock()
    return Dispatcher(runners, calls, {"null": "cpu"}, policy=DispatchPolicy(**policy),
                      tally=DispatchTally(), clock=clock, sleep=clock.sleep)


def started(*labels: str, clock: Clock | None = None, **policy: float
            ) -> tuple[ScriptedCalls, Runner, Dispatcher, list[Handle]]:
    """One runner with a request per label sent to it: (calls, runner, dispatcher, handles)."""
    calls = ScriptedCalls()
    r = runner("cpu-0")
    d = dispatcher([r], calls, clock, **policy)
    for label in labels:
        d.submit(request(label))
    d.dispatch()
    return calls, r, d, calls.pending(r)


def test_results_come_in_completion_order_and_requests_are_pulled_as_runners_free_up(
        ) -> None:
    calls = ScriptedCalls()
    d = dispatcher([runner("cpu-0"), runner("cpu-1")], calls)
    reqs = [request(f"r{i}") for i in range(12)]
    pulled: list[int] = []

    def lazily() -> Iterator[MeasureRequest]:
        for i, q in enumerate(reqs):
            pulled.append(i)
            yield q

    results = []
    for res in d.measure(lazily()):
        if not results:
            # 2 runners x depth 2 in flight and one queued beyond; the first step answered
            # one call per runner, whose slots were refilled before the first result left
            assert len(pulled) == 2 * 2 + 1 + 2
        results.append(res)
    assert [r.fingerprint for r in results] == calls.answered  # completion order
    assert sorted(r.fingerprint for r in results) == sorted(q.fingerprint for q in reqs)
    assert {name for name, _, _ in calls.sent} == {"cpu-0", "cpu-1"}
    assert [c for _, _, c in calls.sent] == list(range(1, 13))  # call ids grow
    assert d.tally.results == 12 and d.tally.retried == 0 and d.done()


def test_a_candidate_that_kills_its_runner_is_retried_elsewhere_then_recorded_crashed(
        ) -> None:
    calls = ScriptedCalls(kills=["bad"])
    r0, r1 = runner("cpu-0"), runner("cpu-1")
    d = dispatcher([r0, r1], calls)
    reqs = [request("bad")] + [request(f"r{i}") for i in range(5)]
    results = {res.fingerprint: res for res in d.measure(reqs)}
    assert set(results) == {q.fingerprint for q in reqs}
    bad = results["fp-bad"]
    assert bad.status is Status.CRASHED and "died 2 times" in bad.error
    assert "Socket closed" in bad.error
    assert dict(bad.details)[FARM_DETAIL] == RUNNER_DIED and dict(bad.details)["attempts"] == 2
    assert all(res.ok for fp, res in results.items() if fp != "fp-bad")
    # the second attempt went to the runner it had not killed yet
    assert [name for name, label, _ in calls.sent if label == "bad"] == ["cpu-0", "cpu-1"]
    assert d.tally.crashed == 1 and d.tally.runner_failures == 2
    assert r0.state is RunnerState.ALIVE and r1.state is RunnerState.ALIVE  # restarted
    assert r0.incarnation == "inc-0+" and not r0.held and not r0.inflight


def test_a_runner_that_died_mid_call_is_charged_with_the_call_its_journal_says_it_ran(
        ) -> None:
    """``a`` finished (journaled) but its reply died with the process ``b`` killed."""
    calls, r, d, (h_a, h_b) = started("a", "b")
    calls.journal["cpu-0"] = 1  # a finished ...
    calls.die(r)  # ... and both replies fail alike
    d.on_ready(h_a)
    assert r.state is RunnerState.PROBING and len(r.held) == 2 and not d.inflight
    assert d.tally.runner_failures == 1
    d.check_probes()
    assert r.probe is not None
    calls.answer_ping(r.probe)
    d.on_ready(r.probe)
    assert r.state is RunnerState.ALIVE and r.incarnation == "inc-0+"
    wa, wb = d.queues["cpu"]
    assert (wa.req.label, wb.req.label) == ("a", "b")  # both back, in order, at the front
    assert (wa.crashes, wb.crashes) == (0, 1) and wb.avoid == {"cpu-0"}
    assert wb.errors == [SOCKET_CLOSED] and d.tally.retried == 2 and not d.ready
    d.on_ready(h_b)  # a stale handle of the dead incarnation changes nothing
    assert len(d.queues["cpu"]) == 2


def test_only_the_connection_failed_nobody_is_struck() -> None:
    calls, r, d, (h,) = started("a")
    calls.replies[h] = RunReply(Outcome.UNAVAILABLE, error=SOCKET_CLOSED)  # same process
    d.on_ready(h)
    d.check_probes()
    calls.answer_ping(r.probe)
    d.on_ready(r.probe)
    (w,) = d.queues["cpu"]
    assert w.crashes == 0 and r.state is RunnerState.ALIVE


def test_a_crashed_result_is_delivered_only_once_the_same_process_answered_behind_it(
        ) -> None:
    calls, r, d, (h_x, h_y) = started("x", "y")
    x, y = request("x"), request("y")
    # x's worker really crashed: the actor answers the ping behind it, as the same process
    calls.answer(h_x, crashed(x))
    d.on_ready(h_x)
    assert not d.ready and len(r.unchecked) == 1
    (check,) = r.unchecked
    calls.answer_ping(check)
    d.on_ready(check)
    assert [res.status for res in d.ready] == [Status.CRASHED]
    # y's `crashed` came from Ray killing the runner: the ping behind it never comes back
    d.ready.clear()
    calls.answer(h_y, crashed(y))
    d.on_ready(h_y)
    (check,) = r.unchecked
    calls.die(r)
    calls.answer_ping(check, Outcome.UNAVAILABLE)
    d.on_ready(check)
    assert not d.ready  # no crashed row for y
    assert r.state is RunnerState.PROBING and [w.req for _, w in r.held] == [y]
    d.check_probes()
    calls.answer_ping(r.probe)  # the journal says y finished; it was running when killed
    d.on_ready(r.probe)
    (w,) = d.queues["cpu"]
    assert w.req == y and w.crashes == 1 and not w.cut_short


def test_a_lost_node_retires_its_runner_without_a_strike() -> None:
    calls = ScriptedCalls()
    r0, r1 = runner("cpu-0", node="node-a"), runner("cpu-1", node="node-b")
    d = dispatcher([r0, r1], calls)
    for i in range(4):
        d.submit(request(f"r{i}"))
    d.dispatch()
    (h, _) = calls.pending(r1)
    calls.nodes_gone.add("node-b")
    calls.die(r1)
    d.on_ready(h)
    assert r1.state is RunnerState.DEAD and calls.killed == [("cpu-1", False)]
    assert all(w.crashes == 0 for w in d.queues["cpu"]) and len(d.queues["cpu"]) == 2
    assert r0.state is RunnerState.ALIVE
    # an unschedulable actor says so itself, without asking the cluster
    calls2, r2 = ScriptedCalls(), runner("cpu-2")
    d2 = dispatcher([r2], calls2)
    d2.submit(request("z"))
    d2.dispatch()
    (h,) = calls2.pending(r2)
    calls2.die(r2, Outcome.UNSCHEDULABLE)
    d2.on_ready(h)
    assert r2.state is RunnerState.DEAD and d2.queues["cpu"][0].crashes == 0
    with pytest.raises(FarmError, match="every cpu runner is gone; 1 requests"):
        list(d2.measure([]))


def test_the_watchdog_kills_a_hung_call_and_it_is_recorded_as_a_timeout() -> None:
    clock = Clock()
    calls, r, d, (h,) = started("hung", clock=clock, crash_limit=1, watchdog_slack_s=5.0)
    hung = request("hung")
    clock.now += 10.0 + hung.config.timeout_s + 4.0
    d.watchdog()
    assert calls.killed == []  # within build + measure timeouts + slack
    clock.now += 2.0
    d.watchdog()
    assert calls.killed == [("cpu-0", True)]
    calls.die(r)
    d.on_ready(h)
    d.check_probes()
    calls.answer_ping(r.probe)
    d.on_ready(r.probe)
    (res,) = d.ready
    assert res.status is Status.TIMEOUT and "hung and was killed 1 times" in res.error
    assert res.toolchain_version == "null test"


def test_a_runner_that_never_comes_back_is_retired_and_its_oldest_call_struck() -> None:
    clock = Clock()
    calls = ScriptedCalls()
    r0, r1 = runner("cpu-0"), runner("cpu-1")
    d = dispatcher([r0, r1], calls, clock, probe_timeout_s=30.0)
    a, b = request("a"), request("b")
    d.submit(a)
    d.submit(b)
    d.dispatch()
    (h,) = calls.pending(r0)
    calls.die(r0)
    d.on_ready(h)
    clock.now += 31.0
    d.check_probes()
    assert r0.state is RunnerState.DEAD and ("cpu-0", False) in calls.killed
    (w,) = d.queues["cpu"]
    assert w.crashes == 1 and w.avoid == {"cpu-0"}
    # and one that cannot even be pinged is retired at once
    calls.refuse_pings = True
    (h,) = calls.pending(r1)
    calls.die(r1)
    d.on_ready(h)
    d.check_probes()
    assert r1.state is RunnerState.DEAD


def test_requests_no_runner_serves_are_answered_by_the_farm() -> None:
    calls = ScriptedCalls()
    d = dispatcher([runner("cpu-0")], calls)
    ort = request("o", BUILTIN_TARGETS["ort-cpu"])
    results = list(d.measure([ort, request("n")]))
    by_fp = {r.fingerprint: r for r in results}
    assert by_fp["fp-n"].ok
    res = by_fp["fp-o"]
    assert res.status is Status.UNSUPPORTED and dict(res.details)[FARM_DETAIL] == NO_RUNNER
    assert "no runner in this farm serves toolchain 'ort-cpu' (served: null)" in res.error
    assert [label for _, label, _ in calls.sent] == ["n"]  # nothing sent for it


def test_work_left_when_its_runners_stop_serving_it_fails_as_data() -> None:
    """Alive runners, none serving the queued work any more: answered, not waited for."""
    calls = ScriptedCalls()
    r = runner("cpu-0")
    d = dispatcher([r], calls)
    d.queues["cpu"].append(Work(request("x", BUILTIN_TARGETS["ort-cpu"]), "cpu"))
    d.exhausted = True
    (res,) = list(d.measure([]))
    assert dict(res.details)[FARM_DETAIL] == NO_RUNNER
