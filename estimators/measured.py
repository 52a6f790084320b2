"""FarmEstimator: costs measured on the farm, cost table first, every result written at once.

Why this shape: measurements are the expensive part of a campaign (seconds each, thousands of
candidates), so the estimator does as little of them as it can and loses none of them:

1. **Dedupe** a batch by fingerprint: repeated layers share one measurement.
2. **Store first**: ask the `CostStore` (the cost table) for every fingerprint not yet known,
   keyed by the device and toolchain version the service's runners report (so a table measured
   on another machine or toolchain version is not silently reused, unless ``strictness`` says
   so). Hits are cache hits; a known failure is not measured again.
3. **Measure the rest** through the `MeasurementService` (the farm), building each request
   lazily: the sub-graph is extracted only when a runner is about to need it.
4. **Record every result as it arrives** (`CostStore.record`; the cost table's writer flushes
   within ~2 s), so a campaign killed with ``kill -9`` loses at most its last seconds of
   measurements and a re-run measures nothing already measured.

The estimator knows only the two contracts of `estimators.sources`: the farm
(``collage_farm.farm.Farm``) and the cost table (``collage_farm.costtable.TableStore``)
implement them, and a test may hand it any other implementation.

A failed measurement (any status but ok) answers `Cost.invalid()`. Results the farm itself
produced because no runner serves a toolchain (``details`` ``farm=no_runner``) answer invalid
for this campaign but are **not** written: they say nothing about the candidate.

Lower bounds come from `AnalyticEstimator` (roofline) so the search can evaluate lazily and
never measure candidates that cannot win; ``prune=False`` turns that off.

Statistics (`stats`, a `FarmEstimatorStats`): ``requested`` candidate costs asked for,
``distinct`` fingerprints among them (over the estimator's life), ``cache_hits`` fingerprints
answered by the table, ``measured`` fingerprints sent to runners, ``failed`` fingerprints
answered invalid because of a failure (cached or fresh) with ``failed_by_status``, and
``pruned`` fingerprints whose lower bound was asked but whose cost never was.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from estimators.analytic import AnalyticEstimator
from estimators.base import CostEstimator, EstimatorKind, EstimatorStats
from estimators.sources import CostStore, MeasurementService, RetryPolicy, Strictness
from runners.base import (
    CANDIDATE_MODE,
    FARM_DETAIL,
    BuildInput,
    MeasureConfig,
    MeasureRequest,
    MeasureResult,
    Status,
)

log = logging.getLogger(__name__)

TensorRanges = tuple[tuple[str, float, float], ...]
RangesFor = Callable[[CandidatePartition], "TensorRanges | Mapping[str, tuple[float, float]]"]
MeansFor = Callable[[CandidatePartition], tuple[tuple[str, tuple[float, ...]], ...]]


@dataclass(frozen=True)
class FarmEstimatorStats(EstimatorStats):
    """`EstimatorStats` plus failures by status (``dict(stats.failed_by_status)``)."""

    failed_by_status: tuple[tuple[str, int], ...] = ()


def candidate_config(config: MeasureConfig, candidate: CandidatePartition) -> MeasureConfig:
    """``config`` for one candidate: in ``network`` mode with no size given, the eviction is
    what the rest of *this* model touches between two runs of the candidate
    (`SubGraph.rest_of_network_bytes`), so every candidate is timed in its own network."""
    if config.measure_mode != "network" or config.network_bytes or config.flush_bytes:
        return config
    # at least 1 byte: 0 would mean "size unknown" (2 x L2); the whole model has no rest
    return dataclasses.replace(
        config, network_bytes=max(1, candidate.sub_graph.rest_of_network_bytes()))


def _ranges(value: Any) -> TensorRanges:
    if not value:
        return ()
    if isinstance(value, Mapping):
        return tuple((str(k), float(v[0]), float(v[1])) for k, v in sorted(value.items()))
    return tuple((str(k), float(lo), float(hi)) for k, lo, hi in value)


class FarmEstimator(CostEstimator):
    """Cost store first, the measurement service for the rest, results recorded as they arrive.

    ``farm``: the `MeasurementService` that measures. ``store``: the `CostStore` looked up
    first and recorded into; `close` closes it (a store on the campaign's shared writer only
    flushes it). ``close_farm``: `close` also closes the service (the estimator then owns it,
    as `collage_farm.campaign` does). ``retry``: which failed rows are measured again instead
    of answering (`RetryPolicy` or its spelling; by default `RetryPolicy.TRANSIENT`: a timeout
    or crash seen fewer than the store's transient-attempt limit). ``tensor_ranges_for`` /
    ``channel_means_for``: a candidate's calibrated ranges / per-channel means for its build
    request (`BuildInput`; `estimators.int8_ranges`).
    """

    label = "farm"
    kind = EstimatorKind.FARM

    def __init__(
        self,
        farm: MeasurementService,
        store: CostStore,
        *,
        model: str = "",
        tensor_ranges_for: RangesFor | None = None,
        channel_means_for: MeansFor | None = None,
        measure_config: MeasureConfig | None = None,
        prune: bool = True,
        strictness: Strictness | str = Strictness.EXACT,
        bound: CostEstimator | None = None,
        close_farm: bool = True,
        retry: RetryPolicy | str = RetryPolicy.TRANSIENT,
        reconfirm: bool = False,
    ) -> None:
        self.retry = RetryPolicy.parse(retry)
        self.reconfirm = reconfirm
        self.strictness = Strictness.parse(strictness)
        self.farm = farm
        self.store = store
        self.model = model
        self.tensor_ranges_for = tensor_ranges_for
        self.channel_means_for = channel_means_for
        # candidates are timed inside their network unless told otherwise (runners.measure)
        self.config = measure_config or MeasureConfig(mode=CANDIDATE_MODE)
        self.close_farm = close_farm
        self.bound = bound or AnalyticEstimator(threads=self.config.threads)
        self.has_lower_bound = bool(prune)
        self._memo: dict[str, Cost] = {}
        self._requested = 0
        self._cache_hits = 0
        self._measured = 0
        self._failed: dict[str, int] = {}
        self._lb_asked: set[str] = set()
        self._confirmed: set[str] = set()  # fingerprints whose cost is a re-measurement
        self._why: dict[str, str] = {}  # fingerprint -> "status: error" of a failure
        self._closed = False

    # --- CostEstimator -------------------------------------------------------------------
    @property
    def measure_mode(self) -> str | None:
        return self.config.mode

    def lower_bound(self, candidate: CandidatePartition) -> Cost:
        self._lb_asked.add(candidate.fingerprint)
        return self.bound.lower_bound(candidate)

    def estimate(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        self._requested += len(candidates)
        first: dict[str, CandidatePartition] = {}
        for c in candidates:
            first.setdefault(c.fingerprint, c)
        new = [fp for fp in first if fp not in self._memo]
        if new:
            self._resolve({fp: first[fp] for fp in new})
        return [self._memo[c.fingerprint] for c in candidates]

    def remeasure(self, candidates: Sequence[CandidatePartition]) -> list[Cost] | None:
        """Measure ``candidates`` again on the farm (see `CostEstimator.remeasure`).

        The fresh rows are written to the table too (lookups prefer the newest ok row, so a
        later campaign reuses them), ok ones marked as confirmations: a candidate confirmed
        once stays confirmed for later campaigns (so a re-run of a finished campaign measures
        nothing and searches the same costs), unless the estimator was made with
        ``reconfirm``, which ignores the table's confirmations. The row keeps the
        re-measurement's round-median cv, so a noisy one can be found with a query. Counted in
        ``measured``, not ``requested``.
        """
        first: dict[str, CandidatePartition] = {}
        for c in candidates:
            first.setdefault(c.fingerprint, c)
        old = {fp: self._memo.get(fp) for fp in first}
        self._measure(first, confirmation=True)
        for fp, before in old.items():
            now = self._memo.get(fp)
            if before is not None and before.is_known and (now is None or not now.is_known):
                log.info("farm estimator: re-measuring %s failed; its earlier cost stands",
                         first[fp].label())
                self._memo[fp] = before
            elif now is None:
                self._memo[fp] = Cost.invalid()
        return [self._memo[c.fingerprint] for c in candidates]

    def stats(self) -> FarmEstimatorStats:
        return FarmEstimatorStats(
            requested=self._requested,
            distinct=len(self._memo),
            cache_hits=self._cache_hits,
            measured=self._measured,
            pruned=len(self._lb_asked - set(self._memo)),
            failed=sum(self._failed.values()),
            failed_by_status=tuple(sorted(self._failed.items())),
        )

    def flush(self) -> None:
        self.store.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.store.close()
        finally:
            self.farm.finish()
            if self.close_farm:
                self.farm.close()

    # --- the work ------------------------------------------------------------------------
    def _lookup_keys(self, cands: Mapping[str, CandidatePartition]
                     ) -> tuple[dict[str, str], dict[str, str]]:
        devices: dict[str, str] = {}
        versions: dict[str, str] = {}
        seen: set[str] = set()
        for c in cands.values():
            key = c.target.measure_key
            if key in seen:
                continue
            seen.add(key)
            got = self.farm.describe(c.target)
            if got is None:
                log.info("farm estimator: no runner serves %s; any table row for it is used",
                         c.target)
                continue
            device, version = got
            if device is not None:
                devices[key] = device.describe()
            if version:
                versions[key] = version
        return devices, versions

    def _resolve(self, cands: dict[str, CandidatePartition]) -> None:
        devices, versions = self._lookup_keys(cands)
        keys = [(fp, c.target.measure_key) for fp, c in cands.items()]
        hits = self.store.lookup(keys, device=devices, toolchain_version=versions,
                                 strictness=self.strictness, mode=self.config.measure_mode,
                                 retry=self.retry)
        for (fp, _key), row in hits.items():
            self._memo[fp] = row.cost
            self._cache_hits += 1
            if row.confirmed and not self.reconfirm:
                self._confirmed.add(fp)
            if not row.ok:
                self._failed[row.status] = self._failed.get(row.status, 0) + 1
                self._why[fp] = f"{row.status}: {row.error}"
        missing = {fp: c for fp, c in cands.items() if fp not in self._memo}
        kinds: dict[str, int] = {}
        for c in missing.values():
            kinds[c.target.device.kind] = kinds.get(c.target.device.kind, 0) + 1
        self.farm.expect(len(cands), hits=len(cands) - len(missing), kinds=kinds)
        if not missing:
            return
        log.debug("farm estimator: %d distinct, %d from the table, %d to measure",
                  len(cands), len(cands) - len(missing), len(missing))
        try:
            self._measure(missing)
        finally:  # requests that could not be built never come back: not left for the ETA
            self.farm.settle()
        for fp in missing:  # requests the generator could not build (extraction failed)
            self._memo.setdefault(fp, Cost.invalid())

    def _measure(self, cands: Mapping[str, CandidatePartition], *,
                 confirmation: bool = False) -> None:
        """Measure ``cands`` on the farm, recording each result as it arrives; with
        ``confirmation``, ok results are marked as re-measurements (`remeasure`)."""
        for res in self.farm.measure(self._requests(cands)):
            c = cands.get(res.fingerprint)
            if c is None:  # not ours (cannot happen unless a runner mislabels a result)
                log.warning("farm estimator: unexpected result for %s", res.fingerprint)
                continue
            confirmed = confirmation and res.status is Status.OK
            self._record(c, res, confirmation=confirmed)
            if confirmed:
                self._confirmed.add(c.fingerprint)

    def _requests(self, missing: Mapping[str, CandidatePartition]) -> Iterator[MeasureRequest]:
        for fp, c in missing.items():
            try:
                onnx_bytes = c.sub_graph.extract(f"{self.model or 'model'}_{fp[:12]}"
                                                 ).SerializeToString()
                ranges = _ranges(self.tensor_ranges_for(c)) if self.tensor_ranges_for else ()
                means = self.channel_means_for(c) if self.channel_means_for else ()
            except Exception as e:  # a bug in extraction, not a property of the candidate
                log.warning("farm estimator: cannot extract %s: %s: %s; answered invalid, "
                            "not written", c.label(), type(e).__name__, e)
                self._memo[fp] = Cost.invalid()
                self._failed["extract_failed"] = self._failed.get("extract_failed", 0) + 1
                self._why[fp] = f"extract_failed: {type(e).__name__}: {e}"
                continue
            label = f"{self.model}:{c.label()}" if self.model else c.label()
            yield MeasureRequest(BuildInput(fp, c.target, onnx_bytes, ranges, label, means),
                                 candidate_config(self.config, c))

    def is_confirmed(self, candidate: CandidatePartition) -> bool:
        return candidate.fingerprint in self._confirmed

    def stored_confirmations(self, candidates: Sequence[CandidatePartition]) -> set[str]:
        """Fingerprints whose store row (the row `estimate` would answer) is a confirmation;
        none with ``reconfirm``. Looks up, measures nothing."""
        first = {c.fingerprint: c for c in candidates}
        if self.reconfirm or not first:
            return set()
        devices, versions = self._lookup_keys(first)
        hits = self.store.lookup([(fp, c.target.measure_key) for fp, c in first.items()],
                                 device=devices, toolchain_version=versions,
                                 strictness=self.strictness, mode=self.config.measure_mode,
                                 retry=self.retry)
        return {fp for (fp, _k), row in hits.items() if row.ok and row.confirmed}

    def why_invalid(self, candidate: CandidatePartition) -> str | None:
        return self._why.get(candidate.fingerprint)

    def _record(self, c: CandidatePartition, res: MeasureResult, *,
                confirmation: bool = False) -> None:
        fp = c.fingerprint
        farm_made = dict(res.details).get(FARM_DETAIL) == "no_runner"
        if not farm_made:  # a later campaign need not re-measure a confirmation again
            self.store.record(res, model=self.model, nodes=c.node_names, op_types=c.op_types,
                              confirmation=confirmation)
            self._measured += 1
        if res.status is Status.OK:
            self._memo[fp] = Cost(res.seconds)
        else:
            self._memo[fp] = Cost.invalid()
            key = res.status.value if not farm_made else "no_runner"
            self._failed[key] = self._failed.get(key, 0) + 1
            self._why[fp] = f"{key}: {res.error}"
