"""What the dispatch state machine asks of the runners: the `RunnerCalls` interface.

`collage_farm.farm.dispatch.Dispatcher` decides what runs where, what a runner's death is charged
to and what is retried; everything it needs from the runner actors goes through `RunnerCalls`,
whose answers are data (`RunReply`, `PingReply`, `Refused`), never Ray objects or Ray errors.
The farm supplies the Ray implementation (`collage_farm.farm.ray_calls.RayCalls`); a unit test
supplies a scripted one and drives the dispatcher without a cluster.

A call in flight is a `Handle`: an opaque, hashable token (a Ray object ref in the farm) that
`RunnerCalls.wait` reports ready and `RunnerCalls.run_reply` / `RunnerCalls.ping_reply` read.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from collage_farm.core.target import Target
from collage_farm.farm.messages import RunnerPing
from collage_farm.farm.records import Handle, Runner
from runners.base import DeviceDescription, MeasureRequest, MeasureResult


class Outcome(enum.Enum):
    """How a call to a runner actor ended."""

    ANSWERED = "answered"  # it returned a value
    RAISED = "raised"  # the actor's own code raised: a farm bug, not the runner's death
    UNAVAILABLE = "unavailable"  # the actor is unreachable for now (restarting, or the link)
    LOST = "lost"  # the actor process died, or the reply was lost
    UNSCHEDULABLE = "unschedulable"  # the actor cannot be placed any more: its node is gone

    @property
    def runner_failed(self) -> bool:
        """The runner, not the call, failed: every call it had not answered is in doubt."""
        return self in (Outcome.UNAVAILABLE, Outcome.LOST, Outcome.UNSCHEDULABLE)


@dataclass(frozen=True)
class RunReply:
    """A finished ``run`` call: the result when `Outcome.ANSWERED`, else why not (one line)."""

    outcome: Outcome
    result: MeasureResult | None = None
    error: str = ""


@dataclass(frozen=True)
class PingReply:
    """A finished ``ping``: the runner's answer when `Outcome.ANSWERED`, else why not."""

    outcome: Outcome
    ping: RunnerPing | None = None
    error: str = ""


@dataclass(frozen=True)
class Refused:
    """A call that could not even be sent (the actor handle is unusable), and why."""

    error: str


class RunnerCalls(abc.ABC):
    """The runner actors, as the dispatcher sees them.

    Contract: `run`, `ping` and `kill` never block on the runner (they send); `wait` blocks
    at most ``timeout_s``; `run_reply` / `ping_reply` are asked only for handles `wait`
    reported ready and never raise for anything a runner did: a runner's death is an
    `Outcome`. ``runner`` is the dispatcher's record of the runner (its ``actor`` field is
    this implementation's handle to the actor).
    """

    @abc.abstractmethod
    def run(self, runner: Runner, req: MeasureRequest, call: int) -> Handle:
        """Send ``req`` to ``runner`` as call number ``call`` (ids grow)."""

    @abc.abstractmethod
    def ping(self, runner: Runner) -> Handle | Refused:
        """Send a ping to ``runner``; `Refused` when it cannot be called at all."""

    @abc.abstractmethod
    def kill(self, runner: Runner, *, restart: bool) -> None:
        """Kill ``runner``'s actor process; ``restart``: let it come back. Never raises."""

    @abc.abstractmethod
    def node_alive(self, node_id: str) -> bool:
        """Whether the node is still in the cluster (True when that cannot be told)."""

    @abc.abstractmethod
    def wait(self, handles: Sequence[Handle], timeout_s: float) -> list[Handle]:
        """Every handle of ``handles`` that is ready, waiting up to ``timeout_s`` for the
        first (0: do not wait); the first ready one first, then in ``handles`` order."""

    @abc.abstractmethod
    def run_reply(self, handle: Handle) -> RunReply:
        """How the ``run`` call ``handle`` ended."""

    @abc.abstractmethod
    def ping_reply(self, handle: Handle) -> PingReply:
        """How the ``ping`` ``handle`` ended."""

    @abc.abstractmethod
    def describe(self, target: Target) -> tuple[DeviceDescription | None, str] | None:
        """(device, toolchain version) a runner serving ``target`` stamps on its rows, or
        None; used to stamp the results the dispatcher makes itself. Never raises."""


def one_line(err: BaseException) -> str:
    """An exception as one line: its type and message."""
    return f"{type(err).__name__}: {err}".replace("\n", " ")


def clip(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters (with an ellipsis when cut)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."
