"""TableEstimator: offline costs from a cost table alone (no Ray, no runner, no device).

Why: the second use of the project (DESIGN.md) is re-running the search on a laptop from a
table measured earlier on the farm. That must never quietly invent numbers: a cost the table
does not hold is either

* an error (default): all the missing costs of the batch the search asked for are collected
  and raised as one `MissingCostsError` that lists them (target, fingerprint, model nodes) and
  says how to get them (measure with the farm, or allow analytic answers); or, with
  ``on_missing="collect"``, answered `Cost.unknown()` (the search treats it as unusable) and
  kept in `missing` so the caller can report them all at the end (`check` raises then);
* or, with ``allow_analytic=True``, answered by `AnalyticEstimator` and counted as analytic:
  `stats().analytic`, `source(candidate) == "analytic"` and the label ``table+analytic``
  make sure such costs are never shown as measurements.

The costs come from a `CostStore` (`estimators.sources`; the Parquet cost table implements it
as ``collage_farm.costtable.TableStore``), whose lookup rule answers (newest ok row; a known
failure answers invalid). ``device`` / ``toolchain_version`` (a string, or a mapping from
``Target.measure_key``) constrain the rows under `Strictness` ``EXACT`` / ``DEVICE``; unset,
any device's rows serve (the usual offline case: this machine is not the one that measured).

Lower bounds come from the analytic roofline, so the lazy search asks the table only for
candidates that can still win: fewer lookups, and fewer "missing" costs that would not have
mattered.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from estimators.analytic import AnalyticEstimator
from estimators.base import CostEstimator, EstimatorKind, EstimatorStats
from estimators.sources import CostStore, Strictness


@dataclass(frozen=True)
class MissingCost:
    """A cost the table does not hold."""

    fingerprint: str
    target: str
    target_key: str
    label: str  # target and node span, as `CandidatePartition.label`
    nodes: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.label} [{self.fingerprint[:12]}]"


class MissingCostsError(LookupError):
    """Costs the cost table does not hold; ``missing`` lists them."""

    def __init__(self, missing: Sequence[MissingCost], table: str = "",
                 strictness: Strictness | str = Strictness.EXACT, show: int = 20) -> None:
        self.missing = list(missing)
        self.table = table
        if isinstance(strictness, Strictness):
            strictness = strictness.value
        self.strictness = strictness
        lines = [f"{len(self.missing)} candidate cost(s) are not in the cost table "
                 f"{table or '?'} (strictness={strictness}):"]
        lines += [f"  {m}" for m in self.missing[:show]]
        if len(self.missing) > show:
            lines.append(f"  ... and {len(self.missing) - show} more")
        lines.append("measure them on the farm (collage-farm tune MODEL --cost-table DIR "
                     "[--address auto]), relax --strictness, or pass --allow-analytic to "
                     "answer them with the analytic lower bound (labelled analytic)")
        super().__init__("\n".join(lines))

    def __str__(self) -> str:
        return str(self.args[0])


class TableEstimator(CostEstimator):
    """Costs from a cost store; missing costs raise, collect, or go to the analytic bound.

    ``store``: where the costs are (`CostStore.describe` names it in errors); the estimator
    only looks up, never records, and leaves closing the store to its owner.
    """

    kind = EstimatorKind.TABLE

    def __init__(
        self,
        store: CostStore,
        *,
        allow_analytic: bool = False,
        strictness: Strictness | str = Strictness.EXACT,
        device: str | Mapping[str, str] | None = None,
        toolchain_version: str | Mapping[str, str] | None = None,
        on_missing: str = "raise",
        analytic: AnalyticEstimator | None = None,
        prune: bool = True,
        mode: str | None = None,
    ) -> None:
        if on_missing not in ("raise", "collect"):
            raise ValueError("on_missing must be 'raise' or 'collect'")
        self.strictness = Strictness.parse(strictness)
        self.store = store
        self.allow_analytic = allow_analytic
        self.device = device
        self.toolchain_version = toolchain_version
        self.on_missing = on_missing
        self.mode = mode  # None: rows of any measurement mode (`CostStore.lookup`)
        self.analytic = analytic or AnalyticEstimator()
        self.has_lower_bound = bool(prune)
        self.label = "table+analytic" if allow_analytic else "table"
        self._memo: dict[str, Cost] = {}
        self._source: dict[str, str] = {}  # fingerprint -> "table" | "analytic" | "missing"
        self._missing: dict[str, MissingCost] = {}
        self._requested = 0
        self._failed = 0
        self._why: dict[str, str] = {}  # fingerprint -> "status: error" of a failed row
        self._lb_asked: set[str] = set()

    @property
    def missing(self) -> list[MissingCost]:
        """Costs found missing so far (``on_missing="collect"``)."""
        return list(self._missing.values())

    def check(self) -> None:
        """Raise `MissingCostsError` if any cost was found missing."""
        if self._missing:
            raise MissingCostsError(self.missing, self.store.describe(), self.strictness)

    def source(self, candidate: CandidatePartition) -> str | None:
        """Where the candidate's cost came from: "table", "analytic", "missing" or None."""
        return self._source.get(candidate.fingerprint)

    def lower_bound(self, candidate: CandidatePartition) -> Cost:
        self._lb_asked.add(candidate.fingerprint)
        return self.analytic.lower_bound(candidate)

    def estimate(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        self._requested += len(candidates)
        first: dict[str, CandidatePartition] = {}
        for c in candidates:
            if c.fingerprint not in self._memo:
                first.setdefault(c.fingerprint, c)
        if first:
            keys = [(fp, c.target.measure_key) for fp, c in first.items()]
            hits = self.store.lookup(keys, device=self.device,
                                     toolchain_version=self.toolchain_version,
                                     strictness=self.strictness, mode=self.mode)
            missing: list[CandidatePartition] = []
            for fp, c in first.items():
                row = hits.get((fp, c.target.measure_key))
                if row is None:
                    missing.append(c)
                    continue
                self._memo[fp] = row.cost
                self._source[fp] = "table"
                if not row.ok:
                    self._failed += 1
                    self._why[fp] = f"{row.status}: {row.error}"
            if missing:
                if self.allow_analytic:
                    for c, cost in zip(missing, self.analytic.estimate(missing)):
                        self._memo[c.fingerprint] = cost
                        self._source[c.fingerprint] = "analytic"
                else:
                    found = [MissingCost(c.fingerprint, c.target.id, c.target.measure_key,
                                         c.label(), tuple(c.node_names)) for c in missing]
                    if self.on_missing == "raise":
                        raise MissingCostsError(found, self.store.describe(), self.strictness)
                    for m, c in zip(found, missing):
                        self._missing[m.fingerprint] = m
                        self._memo[c.fingerprint] = Cost.unknown()
                        self._source[c.fingerprint] = "missing"
        return [self._memo[c.fingerprint] for c in candidates]

    def why_invalid(self, candidate: CandidatePartition) -> str | None:
        return self._why.get(candidate.fingerprint)

    def stored_confirmations(self, candidates: Sequence[CandidatePartition]) -> set[str]:
        """Fingerprints whose table row (the row `estimate` would answer) is a confirmation."""
        first = {c.fingerprint: c for c in candidates}
        if not first:
            return set()
        hits = self.store.lookup([(fp, c.target.measure_key) for fp, c in first.items()],
                                 device=self.device, toolchain_version=self.toolchain_version,
                                 strictness=self.strictness, mode=self.mode)
        return {fp for (fp, _k), row in hits.items() if row.ok and row.confirmed}

    def stats(self) -> EstimatorStats:
        n_an = sum(1 for s in self._source.values() if s == "analytic")
        n_tab = sum(1 for s in self._source.values() if s == "table")
        return EstimatorStats(
            requested=self._requested,
            distinct=len(self._memo),
            cache_hits=n_tab,
            analytic=n_an,
            failed=self._failed,
            pruned=len(self._lb_asked - set(self._memo)),
        )
