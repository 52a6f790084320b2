"""The farm's records: its runners (`Runner`, in a `RunnerState`) and requests in flight (`Work`).

`collage_farm.farm.pool.Farm` keeps a `Runner` per runner actor for its whole life; each
`collage_farm.farm.dispatch.Dispatcher` moves them between states and keeps a `Work` per request
it is measuring. ``actor`` is opaque here: the `collage_farm.farm.calls.RunnerCalls`
implementation's handle to the actor (a Ray actor handle in the farm).
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Hashable
from dataclasses import dataclass, field

from collage_farm.farm.messages import RunnerInfo, RunnerSpec
from runners.base import MeasureRequest, MeasureResult

Handle = Hashable  # a call in flight (see `collage_farm.farm.calls`)


class RunnerState(enum.Enum):
    """Where a runner is in its life, as the farm sees it."""

    STARTING = "starting"  # launched; its actor has not reported yet
    ALIVE = "alive"  # takes calls
    PROBING = "probing"  # failed; pinged until it answers (ALIVE again) or is retired
    DEAD = "dead"  # retired (did not start, node gone, gone for good, farm closed)

    @property
    def in_service(self) -> bool:
        """Counted as the farm's: alive, or expected back."""
        return self in (RunnerState.ALIVE, RunnerState.PROBING)


@dataclass(eq=False)
class Work:
    """A request on its way through the farm: where it is, and the strikes against it."""

    req: MeasureRequest
    kind: str  # device kind of the runners that may take it
    crashes: int = 0
    avoid: set[str] = field(default_factory=set)  # runners it killed
    errors: list[str] = field(default_factory=list)  # what those deaths said
    runner: Runner | None = None
    timed_out: bool = False  # the watchdog killed its runner while it ran
    call: int = 0  # id of its latest actor call (ids grow per farm, so per runner too)
    cut_short: bool = False  # its `crashed` result was followed by its runner's death


@dataclass(eq=False)
class Runner:
    """The farm's record of one runner actor (``actor``: the `RunnerCalls`' handle to it)."""

    spec: RunnerSpec
    actor: object
    info: RunnerInfo | None = None
    state: RunnerState = RunnerState.STARTING
    inflight: collections.deque[Handle] = field(default_factory=collections.deque)  # in order
    head_since: float = 0.0  # when the oldest in-flight call could have started
    probe: Handle | None = None  # the outstanding ping, while probing
    probe_since: float = 0.0  # when the runner failed
    next_probe: float = 0.0  # when to ping again (a restarting actor refuses calls)
    failures: int = 0
    results: int = 0  # results this runner returned (measured here, this farm's lifetime)
    incarnation: str = ""  # the actor process the farm last heard from
    # after a failure, until the restarted actor says which call it was executing: the calls
    # it had not answered as (handle, work) (handle None: a dropped `crashed` result)
    held: list[tuple[Handle | None, Work]] = field(default_factory=list)
    fault: str = ""  # what its failure said
    # `crashed` results it returned, by the ping sent after each: kept until the ping shows
    # the same process alive (`Dispatcher.on_ping`)
    unchecked: dict[Handle, tuple[MeasureResult, Work]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def kind(self) -> str:
        return self.spec.kind

    def serves(self, toolchain: str) -> bool:
        return self.info is not None and toolchain in self.info.toolchains
