"""`RunnerCalls` on Ray: the dispatcher's calls as actor method calls, Ray errors as outcomes.

Actor calls are sent with Ray's task retries off (``max_task_retries=0``, set where the actors
are launched): the dispatcher retries, counting strikes. A Ray error becomes an `Outcome`:

* ``ActorUnschedulableError``: `Outcome.UNSCHEDULABLE` (the actor's node is gone);
* ``ActorUnavailableError``: `Outcome.UNAVAILABLE` (restarting, or the connection failed);
* any other ``RayActorError`` (the actor process died): `Outcome.LOST`;
* ``RayTaskError`` (the actor's own code raised): `Outcome.RAISED`;
* any other ``RayError`` (an object lost, its owner dead, ...): `Outcome.LOST`.

A request whose model is at least `SHARED_MODEL_BYTES` sends it through the object store once
for every request that holds the same bytes object (`RunnerActor.run_shared`, which fetches
it once and hands its worker process the same object, sent to it once): a campaign's profile
requests, one per target, carry the same whole model (365 MB for gpt2-2L, whose every
``remote`` call serialised and stored a copy of it in ~2 s of the driver's time).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from collage_farm.core.target import Target
from collage_farm.farm.calls import (
    Outcome,
    PingReply,
    Refused,
    RunnerCalls,
    RunReply,
    one_line,
)
from collage_farm.farm.connect import node_alive
from collage_farm.farm.records import Handle, Runner
from runners.base import DeviceDescription, MeasureRequest


def _outcome(err: BaseException) -> Outcome:
    from ray.exceptions import (
        ActorUnavailableError,
        ActorUnschedulableError,
        RayActorError,
        RayTaskError,
    )

    if isinstance(err, ActorUnschedulableError):
        return Outcome.UNSCHEDULABLE
    if isinstance(err, ActorUnavailableError):
        return Outcome.UNAVAILABLE
    if isinstance(err, RayActorError):
        return Outcome.LOST
    if isinstance(err, RayTaskError):
        return Outcome.RAISED
    return Outcome.LOST


def _get(handle: Handle) -> tuple[Outcome, Any, str]:
    import ray
    from ray.exceptions import RayError

    try:
        return Outcome.ANSWERED, ray.get(handle), ""
    except RayError as e:
        return _outcome(e), None, one_line(e)


#: model bytes from which a request's model goes to the object store on its own, shared
SHARED_MODEL_BYTES = 1 << 20


class RayCalls(RunnerCalls):
    """The runner actors of a farm; ``describe`` is the farm's (cached) `Farm.describe`.

    ``shared``: the last large model put in the object store, (the bytes object, its ref);
    requests holding that very object send the ref (module docstring)."""

    def __init__(self, describe: Callable[[Target], tuple[DeviceDescription | None, str] | None]
                 ) -> None:
        self._describe = describe
        self.shared: tuple[bytes, Any] | None = None
        self.puts = 0  # models put in the object store on their own

    def run(self, runner: Runner, req: MeasureRequest, call: int) -> Handle:
        data = req.build.onnx_bytes
        if len(data) < SHARED_MODEL_BYTES:
            return runner.actor.run.remote(req, call)  # type: ignore[attr-defined]
        bare = dataclasses.replace(req, build=dataclasses.replace(req.build, onnx_bytes=b""))
        return runner.actor.run_shared.remote(  # type: ignore[attr-defined]
            bare, [self._model_ref(data)], call)

    def _model_ref(self, data: bytes) -> Any:
        """The object-store ref of ``data``: the last one's when it is the same object (held
        in `shared`, so its id cannot be reused), else put now (the last one let go)."""
        import ray

        if self.shared is None or self.shared[0] is not data:
            self.shared = None
            self.shared = (data, ray.put(data))
            self.puts += 1
        return self.shared[1]

    def release(self) -> None:
        """Let go of the shared model (before Ray shuts down)."""
        self.shared = None

    def ping(self, runner: Runner) -> Handle | Refused:
        try:
            return runner.actor.ping.remote()  # type: ignore[attr-defined, no-any-return]
        except Exception as e:
            return Refused(one_line(e))

    def kill(self, runner: Runner, *, restart: bool) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.kill(runner.actor, no_restart=not restart)

    def node_alive(self, node_id: str) -> bool:
        return node_alive(node_id)

    def wait(self, handles: Sequence[Handle], timeout_s: float) -> list[Handle]:
        import ray

        refs = list(handles)
        if not refs:
            return []
        done, _ = ray.wait(refs, num_returns=1, timeout=timeout_s)
        if not done:
            return []
        more, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return list(dict.fromkeys([*done, *more]))

    def run_reply(self, handle: Handle) -> RunReply:
        outcome, value, error = _get(handle)
        return RunReply(outcome, value, error)

    def ping_reply(self, handle: Handle) -> PingReply:
        outcome, value, error = _get(handle)
        return PingReply(outcome, value, error)

    def describe(self, target: Target) -> tuple[DeviceDescription | None, str] | None:
        try:
            return self._describe(target)
        except Exception:
            return None
