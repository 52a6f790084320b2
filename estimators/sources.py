"""Where measured costs come from: a store of earlier measurements and a service that measures.

The estimators that answer with measurements (`estimators.measured`, `estimators.table`) need two
things the layers above them provide: a **cost store** (the Parquet cost table:
`collage_farm.costtable` implements `CostStore`) and a **measurement service** (the Ray farm:
`collage_farm.farm` implements `MeasurementService`). Both are interfaces here so that the
estimators depend only on the core and the runners' messages, and so that a test can hand an
estimator an in-memory store or a scripted service that obeys the same contract.

The lookup policy is chosen by enums, never by free strings: `Strictness` (which rows may answer
for this machine) and `RetryPolicy` (which failed rows are measured again instead of answering).
Both are ``str`` enums whose values are the command-line spellings (``--strictness exact``).
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from collage_farm.core.cost import Cost
from collage_farm.core.target import Target
from runners.base import DeviceDescription, MeasureRequest, MeasureResult


class Strictness(str, enum.Enum):
    """Which stored rows may answer a lookup.

    ``EXACT``: fingerprint, target measure key, toolchain version and device description all
    match (the default: a table measured elsewhere is not silently reused). ``DEVICE``: the
    toolchain version may differ. ``ANY``: fingerprint and target measure key only (offline reuse
    on another machine).
    """

    EXACT = "exact"
    DEVICE = "device"
    ANY = "any"

    @classmethod
    def parse(cls, value: Strictness | str) -> Strictness:
        """The member spelled ``value``; ValueError names the spellings."""
        return _parse(cls, "strictness", value)


class RetryPolicy(str, enum.Enum):
    """Which failed rows a lookup passes over, so that a caller that can measure does so.

    ``NONE``: every failed row answers (invalid). ``TRANSIENT``: a ``timeout`` or ``crashed`` row
    seen fewer than the store's transient-attempt limit is passed over (one stall is the
    machine's fault, not the candidate's); other failures answer. ``ALL``: every failed row is
    passed over (``tune --retry-failed``, after fixing a toolchain).
    """

    NONE = "none"
    TRANSIENT = "transient"
    ALL = "all"

    @classmethod
    def parse(cls, value: RetryPolicy | str) -> RetryPolicy:
        """The member spelled ``value``; ValueError names the spellings."""
        return _parse(cls, "retry", value)


_E = TypeVar("_E", Strictness, RetryPolicy)


def _parse(cls: type[_E], what: str, value: _E | str) -> _E:
    try:
        return cls(value)
    except ValueError:
        spellings = tuple(m.value for m in cls)
        raise ValueError(f"{what} must be one of {spellings}, not {value!r}") from None


@dataclass(frozen=True)
class StoredCost:
    """A store's answer for one ``(fingerprint, target_key)``: the cost and what it rests on.

    ``cost`` is `Cost.invalid()` for a failed row. ``status`` is the `runners.base.Status` value
    (``"ok"``, ``"timeout"``, ...), ``error`` the failure's text (empty when ok). ``confirmed``:
    the row is an independent re-measurement (the campaign's confirmation step), so confirming it
    again adds nothing. ``kind``: ``measured`` | ``simulated`` | ``analytic``.
    """

    cost: Cost
    status: str = "ok"
    error: str = ""
    confirmed: bool = False
    kind: str = "measured"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


LookupKey = tuple[str, str]  # (fingerprint, Target.measure_key)


class CostStore(abc.ABC):
    """Earlier measurements, looked up by fingerprint and target key; new ones recorded.

    Contract:
    * `lookup` returns, for each key it can answer, the row the store's lookup rule picks (the
      newest ok row that matches under ``strictness`` and ``mode``; a failed row only when no ok
      row matches and ``retry`` does not pass it over); keys it cannot answer are absent.
      ``device`` / ``toolchain_version`` are one string for every key or a mapping from target
      key (a key the mapping lacks is not constrained). ``mode`` (a `MeasureConfig` mode) limits
      *measured* ok rows to that cache mode; ``None`` accepts any mode.
    * `record` keeps one measurement result; after `flush` returns, a new `lookup` (by this or
      another process) sees it. Recording never raises for a result that a runner produced.
    * `close` flushes and releases; a closed store refuses `record`.
    * `describe` names the store for messages (a directory path).
    """

    @abc.abstractmethod
    def lookup(self, keys: Iterable[LookupKey], *,
               device: str | Mapping[str, str] | None = None,
               toolchain_version: str | Mapping[str, str] | None = None,
               strictness: Strictness = Strictness.EXACT, mode: str | None = None,
               retry: RetryPolicy = RetryPolicy.NONE) -> dict[LookupKey, StoredCost]:
        """The stored answer for each key the store holds one for."""

    @abc.abstractmethod
    def record(self, result: MeasureResult, *, model: str = "", nodes: Sequence[str] = (),
               op_types: Sequence[str] = (), confirmation: bool = False) -> None:
        """Keep ``result`` (with the model and node names it came from, for explanations);
        ``confirmation`` marks it as an independent re-measurement."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Make everything recorded so far visible to lookups."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and release; idempotent."""

    @abc.abstractmethod
    def describe(self) -> str:
        """A short name of the store for messages (its directory)."""


class MeasurementService(abc.ABC):
    """Builds and times candidates on devices it owns; reports progress as it goes.

    Contract:
    * `measure` yields exactly one `MeasureResult` per request, in completion order (not request
      order), and never raises for a failure of one candidate: a build error, a crash, a timeout
      or a missing runner is a failed result (`runners.base.Status`). Results the service made
      itself because nothing serves the toolchain carry ``details`` ``FARM_DETAIL: NO_RUNNER``
      and say nothing about the candidate. Requests are pulled from the iterable lazily, so a
      caller may build them (extract sub-models) on demand.
    * `describe` gives the device description and toolchain version a runner serving the target
      would stamp on its rows (the store's lookup key on this service), or None when nothing
      serves the target.
    * `expect` / `settle` / `finish` feed the progress display: ``total`` candidates asked,
      ``hits`` answered without measuring, ``kinds`` the device kinds of the rest; `settle`
      drops what was expected but will not come (requests that could not be built); `finish`
      ends one caller's share (the display shows its final state).
    * `close` releases runners; idempotent.
    """

    @abc.abstractmethod
    def measure(self, requests: Iterable[MeasureRequest]) -> Iterator[MeasureResult]:
        """One result per request."""

    @abc.abstractmethod
    def describe(self, target: Target) -> tuple[DeviceDescription | None, str] | None:
        """(device, toolchain version) of the runner serving ``target``, or None."""

    def expect(self, total: int, hits: int = 0,  # noqa: B027 - optional progress hook
               kinds: Mapping[str, int] | None = None) -> None:
        """Progress: ``total`` asked, ``hits`` answered from the store, ``kinds`` to measure."""

    def settle(self) -> None:  # noqa: B027 - optional progress hook
        """Progress: forget expected results that will not come."""

    def finish(self) -> None:  # noqa: B027 - optional progress hook
        """Progress: this caller's work is over; show the final state (the service may go on
        serving other callers)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the runners; idempotent."""
