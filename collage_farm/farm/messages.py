"""The farm's small messages: what a runner is, what it says about itself, totals, the error.

They cross process boundaries (the coordinator, the runner actors) as Ray pickles them, so they
are frozen dataclasses of plain values. Device kinds are the project's strings (``"cpu"``,
``"cuda"``, ``"ethos-u"``: `collage_farm.core.target.Device.kind`).
"""

from __future__ import annotations

from dataclasses import dataclass


class FarmError(RuntimeError):
    """The farm cannot go on (no runner started, every runner of a kind lost)."""


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
    """A runner's answer to the farm's ping (after it failed, or behind a ``crashed`` result).

    ``finished`` is the id of the last call this runner finished, in any incarnation, read
    from its call journal (`collage_farm.farm.journal.CallJournal`; 0: none yet; None:
    unknown, the journal could not be read). A call the farm sent it with a larger id had not
    finished when the process died, so the oldest such call is the one it was executing.
    ``incarnation`` differs from the one the farm knew when Ray restarted the actor, and is the
    same when only the connection failed.
    """

    pid: int
    incarnation: str
    finished: int | None


@dataclass(frozen=True)
class RunnerStats:
    """One runner's work so far, as its actor counts it."""

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
