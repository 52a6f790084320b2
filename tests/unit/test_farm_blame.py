"""Which call a dead runner is charged with: the call journal and the strike rule, no cluster.

Why: when a runner actor process dies, Ray fails every call it had not answered with the same
error (``ActorUnavailableError ... Socket closed``), the call that killed it and a call that
had *finished* but whose reply died with the process alike. The farm used to strike the oldest
unanswered call, so a candidate measured right before a crashing one was struck, twice once the
culprit was re-queued behind it again, and recorded ``crashed`` (the flaky
``test_candidate_crashing_its_runner_twice_is_recorded_crashed``). Now the runner journals the
last call it finished (`CallJournal`, read back by its restarted incarnation) and
`Dispatcher.resolve_held` strikes the oldest call after it. The other race: a call whose worker
Ray killed along with the actor replies ``crashed``; the dispatcher's alive-check drops that
result and `Dispatcher.resolve_held` counts the call as the one the runner was running. These
tests replay both step by step, deterministically (``tests/unit/test_dispatch.py`` drives the
whole dispatcher through the same scripted runners); ``tests/ray/test_farm.py`` runs them on
real actors.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from collage_farm.core.target import CPU0, Target
from collage_farm.farm import RunnerActor, RunnerSpec, RunnerState, blame
from collage_farm.farm.dispatch import Dispatcher
from collage_farm.farm.journal import CallJournal
from collage_farm.farm.records import Runner, Work
from runners.base import BuildInput, MeasureRequest, Status
from tests.unit.test_dispatch import SOCKET_CLOSED, ScriptedCalls, dispatcher, request, runner


def _work(name: str) -> Work:
    return Work(request(name), "cpu")


def _dispatcher() -> Dispatcher:
    # no reply comes back late: the scripted runners answer nothing by themselves here
    return dispatcher([], ScriptedCalls(), crash_limit=2)


def _runner(name: str) -> Runner:
    r = runner(name)
    r.state = RunnerState.PROBING
    return r


def _die(d: Dispatcher, r: Runner, calls: list[tuple[Work, int]], finished: int | None, *,
         strike: bool = True) -> None:
    """``r`` died with ``calls`` unanswered; its restarted actor reports ``finished``."""
    for w, call in calls:
        if w in d.queues[w.kind]:
            d.queues[w.kind].remove(w)  # it was dispatched again
        w.call = call
    r.held = [(object(), w) for w, _ in calls]
    r.fault = SOCKET_CLOSED
    d.resolve_held(r, finished, strike=strike)


def test_blame_is_the_first_call_the_runner_had_not_finished() -> None:
    assert blame([5, 6], 5) == 1  # 5 finished (its reply died with the process); 6 ran
    assert blame([5, 6], 4) == 0  # 5 was running
    assert blame([5, 6], 6) is None  # both finished: died between calls, nothing pending
    assert blame([5, 6], 0) == 0  # no call finished yet
    assert blame([5, 6], None) == 0  # no journal: the oldest, as before
    assert blame([], 3) is None


def test_a_finished_call_whose_reply_died_is_never_struck() -> None:
    """The flaky run, replayed: innocent ``i`` finished right before culprit ``c`` killed the
    runner, on one runner and then on the other. Only ``c`` is struck, ``crashed`` at 2."""
    d = _dispatcher()
    i, c = _work("i"), _work("c")
    r0, r1 = _runner("cpu-0"), _runner("cpu-1")

    _die(d, r0, [(i, 1), (c, 2)], 1)
    assert (i.crashes, c.crashes) == (0, 1)
    assert list(d.queues["cpu"]) == [i, c]  # both back, in order, at the front
    assert c.avoid == {"cpu-0"} and not i.avoid
    assert c.errors == [SOCKET_CLOSED]

    _die(d, r1, [(i, 3), (c, 4)], 3)
    assert i.crashes == 0
    assert list(d.queues["cpu"]) == [i]  # the innocent one is measured next
    assert len(d.ready) == 1
    res = d.ready[0]
    assert res.fingerprint == "fp-c" and res.status is Status.CRASHED
    assert "died 2 times" in res.error and "Socket closed" in res.error
    assert d.tally.crashed == 1 and d.tally.retried == 3
    assert not r0.held and not r1.held


def test_no_restart_no_journal_and_a_lost_node() -> None:
    d = _dispatcher()
    a, b = _work("a"), _work("b")
    r = _runner("cpu-0")
    # the same actor process answered the probe: only the connection failed, nobody is struck
    _die(d, r, [(a, 1), (b, 2)], 0, strike=False)
    assert (a.crashes, b.crashes) == (0, 0) and list(d.queues["cpu"]) == [a, b]
    # the runner never came back (no journal to read): the oldest unanswered call, as before
    _die(d, r, [(a, 3), (b, 4)], None)
    assert (a.crashes, b.crashes) == (1, 0) and a.avoid == {"cpu-0"}
    # both had finished and nothing was sent after them: nobody is to blame
    _die(d, r, [(a, 5), (b, 6)], 6)
    assert (a.crashes, b.crashes) == (1, 0) and not d.ready


def test_a_crashed_result_followed_by_the_runners_death_counts_as_the_running_call() -> None:
    """``ray.kill``: Ray killed the worker first, the call replied ``crashed`` (dropped by the
    dispatcher's alive-check), then the actor died. The journal says the call finished; it was
    running."""
    d = _dispatcher()
    cut, nxt = _work("cut"), _work("next")
    cut.call, nxt.call, cut.cut_short = 6, 7, True
    r = _runner("cpu-0")
    r.held = [(object(), nxt), (None, cut)]  # folded in after the in-flight ones
    r.fault = SOCKET_CLOSED
    d.resolve_held(r, 6)
    assert (cut.crashes, nxt.crashes) == (1, 0)
    assert list(d.queues["cpu"]) == [cut, nxt] and not cut.cut_short and not d.ready


def test_call_journal_outlives_its_writer(tmp_path: Path) -> None:
    path = tmp_path / "session" / "collage-farm" / "calls-actor"
    j = CallJournal(str(path))
    assert j.finished == 0 and not j.reopened  # a new runner: nothing finished
    j.mark(3)
    j.mark(0)  # a call without an id (not from the farm) is not journaled
    j.mark(12)
    # no flush, no close: what a killed process leaves (a pwrite is in the kernel already)
    again = CallJournal(str(path))  # what the restarted actor reads
    assert again.finished == 12 and again.reopened
    j.mark(9)  # narrower number: the fixed width leaves no digits of the old one behind
    assert CallJournal(str(path)).finished == 9
    j.close(remove=True)
    assert not path.exists()

    path.write_text("garbage")
    assert CallJournal(str(path)).finished is None  # unknown: the farm falls back

    mem = CallJournal(None)  # outside a Ray actor: in memory only
    mem.mark(4)
    assert mem.finished == 4


def test_runner_actor_ping_reports_its_journal(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    """`RunnerActor.run` journals the call after it finished, and `ping` reports it."""
    path = tmp_path / "calls"
    monkeypatch.setattr(CallJournal, "for_actor", classmethod(lambda cls: cls(str(path))))
    actor = RunnerActor(RunnerSpec("cpu-0", "cpu", "node", ("null",)))
    try:
        target = Target.make("null-cpu", "null", CPU0, {})
        onnx_bytes = _identity_model()
        res = actor.run(MeasureRequest(BuildInput("fp", target, onnx_bytes, label="x")), 7)
        assert res.status is Status.OK, res.error
        pong = actor.ping()
        assert pong.finished == 7 and pong.pid > 0 and pong.incarnation
        assert actor.info().incarnation == pong.incarnation
        # a new incarnation (Ray's restart) reads what the dead one journaled
        again = CallJournal(str(path))
        assert again.finished == 7
    finally:
        actor.close()
    assert not path.exists()  # a runner shut down for good leaves no journal


def _identity_model() -> bytes:
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="relu")], "g", [x], [y])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
