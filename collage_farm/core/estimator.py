"""The CostEstimator interface: how the search gets costs (phase 3 asks, estimators answer).

The RFC's estimator answers one candidate at a time. Here the search asks in **batches**: every
candidate that a Dijkstra expansion needs is requested together, so a farm-backed estimator can
dedupe them by fingerprint and measure the missing ones in parallel. Estimators compose: a cost
table answers what it knows, the farm measures the rest, an analytic bound answers when offline.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost


@dataclass(frozen=True)
class EstimatorStats:
    """What an estimator did, for campaign summaries."""

    requested: int = 0  # candidate costs asked for
    distinct: int = 0  # distinct fingerprints among them
    cache_hits: int = 0  # answered from a table or memo
    measured: int = 0  # sent to runners
    pruned: int = 0  # skipped by a lower bound
    analytic: int = 0  # answered by a formula
    failed: int = 0  # answered invalid by a failure


class EstimatorKind(enum.Enum):
    """Where an estimator's costs come from; callers choose behaviour by it, never by `label`.

    ``MOCK``: deterministic fake costs. ``ANALYTIC``: a formula (roofline). ``TABLE``: a cost
    table measured earlier, possibly on another machine (offline). ``FARM``: measured on this
    machine's runners now (the cost table first). ``OTHER``: anything else (a caller's own
    estimator), treated like mock costs: not measurements, no table behind them.
    """

    MOCK = "mock"
    ANALYTIC = "analytic"
    TABLE = "table"
    FARM = "farm"
    OTHER = "other"

    @property
    def measures(self) -> bool:
        """Its costs are measurements on this machine, and it can measure more."""
        return self is EstimatorKind.FARM

    @property
    def reads_table(self) -> bool:
        """Its costs come from a cost table (whose other rows, e.g. cut costs, apply too)."""
        return self in (EstimatorKind.TABLE, EstimatorKind.FARM)


class CostEstimator(abc.ABC):
    """Gives a `Cost` for each candidate partition.

    Contract:
    * `estimate` returns one `Cost` per candidate, in order; equal fingerprints get equal costs.
    * A candidate that cannot be built or run costs `Cost.invalid()`; a cost nobody knows is
      `Cost.unknown()` (the search treats unknown as unusable and reports it).
    * Implementations may memoise by fingerprint; calling twice with the same candidates must
      not measure twice.
    * `label` says where costs come from ("mock", "table", "farm", "analytic"); every output
      that shows costs names it, so mock costs are never mistaken for measurements. It is for
      display only: `kind` (an `EstimatorKind`) is what callers branch on.
    """

    label: str = "estimator"
    kind: EstimatorKind = EstimatorKind.OTHER
    #: True when `lower_bound` is informative, so the search may evaluate edges lazily
    has_lower_bound: bool = False

    @property
    def measure_mode(self) -> str | None:
        """The `runners.base.MeasureConfig` mode this estimator measures candidates in, as
        configured (``"network"``, ``"warm"``...); None for estimators that do not measure."""
        return None

    @abc.abstractmethod
    def estimate(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        """Costs for a batch of candidates."""

    def lower_bound(self, candidate: CandidatePartition) -> Cost:
        """A cost no measurement of this candidate can beat; 0 when nothing better is known."""
        return Cost.zero()

    def remeasure(self, candidates: Sequence[CandidatePartition]) -> list[Cost] | None:
        """Fresh, independent measurements of candidates this estimator already answered.

        Contract: one `Cost` per candidate, in order, measured now whatever a memo or table
        holds; later `estimate` calls answer the fresh cost. A fresh failure of a candidate
        that had measured fine keeps the earlier cost (a transient fault is not a property of
        the candidate). None when this estimator cannot measure (tables, formulas, mock): the
        caller then keeps its costs. Why: the search picks the cheapest path among thousands
        of noisy costs, so the costs on the path it picks are biased low (the winner's curse);
        an independent measurement of just those is not (the campaign's confirmation step).
        """
        return None

    def is_confirmed(self, candidate: CandidatePartition) -> bool:
        """Whether the candidate's cost is already a re-measurement (`remeasure`, here or in an
        earlier campaign whose table row says so), so confirming it again adds nothing."""
        return False

    def stored_confirmations(self, candidates: Sequence[CandidatePartition]) -> set[str]:
        """The fingerprints among ``candidates`` whose stored cost (a cost table row) is a
        confirmation (`remeasure`, in this or an earlier campaign), found without measuring
        anything; empty for estimators with no store, or that ignore confirmations."""
        return set()

    def why_invalid(self, candidate: CandidatePartition) -> str | None:
        """Why the candidate's cost is invalid (``"crashed: worker ... SIGSEGV"``), when this
        estimator knows (a failed measurement or table row); None otherwise. Used to say why
        no plan covers a node, instead of guessing."""
        return None

    def stats(self) -> EstimatorStats:
        return EstimatorStats()

    def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release resources."""
