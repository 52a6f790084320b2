"""The lookup rule: which stored row answers for a ``(fingerprint, target_key)``.

A row *matches* when

* `Strictness.EXACT` (``"exact"``, the default): fingerprint, ``target_key``
  (`Target.measure_key`), ``device`` (`DeviceDescription.describe()`) and ``toolchain_version``
  are all equal;
* `Strictness.DEVICE` (``"device"``): as exact, but any toolchain version (reuse after an
  upgrade);
* `Strictness.ANY` (``"any"``): fingerprint and ``target_key`` only (offline reuse on another
  machine).

``device`` / ``toolchain_version`` given as ``None`` do not constrain; either may also be a
mapping from ``target_key`` to the value for that target (one campaign mixes devices). A
``mode`` (a `MeasureConfig` mode) limits ok *measured* rows to those taken in that mode (a row
without one was taken ``warm``); simulated and analytic rows, and failures, answer in every
mode: the cache state does not change them.

Among the matching rows the **newest ok row** (by ``created_at``, then file order) wins; failed
rows are kept and answer (``CostRow.seconds == inf``, i.e. `Cost.invalid()`) only when no ok
row matches, so a later success overrides an earlier crash, and a known failure is not
measured again. Keys with no matching row are absent from the result.

Two refinements. An ok row whose median is missing, NaN, infinite or negative (a hand-edited
or foreign file) is ignored with a `CostTableWarning`, so it cannot shadow a good row. And a
caller that can measure (`RetryPolicy.TRANSIENT`, the farm estimator) passes over a
``timeout`` or ``crashed`` row until that candidate failed so `TRANSIENT_ATTEMPTS` times: one
OOM kill on a busy node must not make a candidate invalid for every later campaign, while a
candidate that really crashes its toolchain is not retried for ever. `RetryPolicy.ALL`
(``tune --retry-failed``) measures every failed candidate again, e.g. after fixing a
toolchain.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from collage_farm.costtable.errors import CostTableWarning
from collage_farm.costtable.rows import CostRow, rows_from_table
from estimators.sources import LookupKey, RetryPolicy, Strictness
from runners.base import LEGACY_MODE, MeasureConfig, canonical_mode

#: the ``--strictness`` spellings, `Strictness` values
STRICTNESS = tuple(s.value for s in Strictness)
#: which failed rows a lookup may pass over so that the candidate is measured again
RETRY = tuple(r.value for r in RetryPolicy)
#: failures of the machine rather than of the candidate: a runner killed or stalled (an OOM
#: kill on a busy node, a stuck driver) says little about the next attempt
TRANSIENT_STATUSES = frozenset({"timeout", "crashed"})
#: with `RetryPolicy.TRANSIENT`, a transient failure answers once it happened this many times
TRANSIENT_ATTEMPTS = 2

Constraint = str | Mapping[str, str] | None  # one value, or one per target key
_Rank = tuple[bool, int, int]  # (ok, created_at, row index): the greatest answers
_NEVER = -(2**62)


def row_mode(measure_config: str | None) -> str:
    """The measurement mode a row's ``measure_config`` JSON names (legacy rows: warm)."""
    try:
        return MeasureConfig.from_json(measure_config or "{}").measure_mode
    except (ValueError, TypeError):
        return LEGACY_MODE


def _candidate_rows(table: pa.Table, wanted: set[LookupKey], device: Constraint,
                    toolchain_version: Constraint) -> pa.Table:
    """The rows of the wanted fingerprints, narrowed by a single device / version value."""
    if table.num_rows == 0:
        return table
    fps = pa.array(sorted({f for f, _ in wanted}), pa.string())
    sub = table.filter(pc.is_in(table["fingerprint"], value_set=fps))  # hash probe first
    expr = None
    if isinstance(device, str):
        expr = pc.field("device") == device
    if isinstance(toolchain_version, str):
        e = pc.field("toolchain_version") == toolchain_version
        expr = e if expr is None else expr & e
    if expr is not None and sub.num_rows:
        sub = sub.filter(expr)
    return sub


class _Columns:
    """The candidate rows' columns as Python lists, and the per-row match test."""

    def __init__(self, sub: pa.Table, device: Constraint, toolchain_version: Constraint,
                 want_mode: str | None) -> None:
        self.n = sub.num_rows
        self.fp = sub["fingerprint"].to_pylist()
        self.tk = sub["target_key"].to_pylist()
        self.st = sub["status"].to_pylist()
        self.ts = sub["created_at"].cast(pa.int64()).to_pylist()
        self.med = sub["median"].to_pylist()
        self.dev_map = device if isinstance(device, Mapping) else None
        self.ver_map = toolchain_version if isinstance(toolchain_version, Mapping) else None
        self.dev = sub["device"].to_pylist() if self.dev_map is not None else None
        self.ver = sub["toolchain_version"].to_pylist() if self.ver_map is not None else None
        self.want_mode = want_mode
        self.cfg = sub["measure_config"].to_pylist() if want_mode is not None else None
        self.kinds = sub["kind"].to_pylist() if want_mode is not None else None
        self._modes: dict[str | None, str] = {}  # measure_config JSON -> its mode

    def bad_median(self, i: int) -> bool:
        """An ok row whose median is missing, NaN, infinite or negative."""
        m = self.med[i]
        return self.st[i] == "ok" and (m is None or not math.isfinite(m) or m < 0)

    def matches(self, i: int) -> bool:
        """Row ``i`` passes the per-target device / version constraints and the mode."""
        if self.dev_map is not None and self.dev is not None:
            want = self.dev_map.get(self.tk[i])
            if want is not None and self.dev[i] != want:
                return False
        if self.ver_map is not None and self.ver is not None:
            want = self.ver_map.get(self.tk[i])
            if want is not None and self.ver[i] != want:
                return False
        if self.cfg is not None and self.kinds is not None and self.st[i] == "ok" \
                and self.kinds[i] == "measured":
            m = self._modes.get(self.cfg[i])
            if m is None:
                m = self._modes[self.cfg[i]] = row_mode(self.cfg[i])
            if m != self.want_mode:
                return False
        return True

    def rank(self, i: int) -> _Rank:
        return (self.st[i] == "ok", self.ts[i] if self.ts[i] is not None else _NEVER, i)


def _pick(cols: _Columns, wanted: set[LookupKey], retry: RetryPolicy
          ) -> tuple[dict[LookupKey, int], int]:
    """The answering row index per key (the rule above), and how many bad medians were seen."""
    best: dict[LookupKey, tuple[_Rank, int]] = {}
    transient: dict[LookupKey, int] = {}  # timeout/crashed rows per key
    hard: dict[LookupKey, tuple[_Rank, int]] = {}  # newest other failure per key
    bad_median = 0
    for i in range(cols.n):
        key = (cols.fp[i], cols.tk[i])
        if key not in wanted:
            continue
        if cols.bad_median(i):
            bad_median += 1
            continue
        if cols.st[i] != "ok" and retry is RetryPolicy.ALL:
            continue
        if not cols.matches(i):
            continue
        rank = cols.rank(i)
        if cols.st[i] in TRANSIENT_STATUSES:
            transient[key] = transient.get(key, 0) + 1
        elif cols.st[i] != "ok" and (key not in hard or rank > hard[key][0]):
            hard[key] = (rank, i)  # a failure of the candidate itself (unsupported, build, run)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, i)
    if retry is RetryPolicy.TRANSIENT:
        for key, (_rank, i) in list(best.items()):
            if cols.st[i] in TRANSIENT_STATUSES and transient[key] < TRANSIENT_ATTEMPTS:
                if key in hard:  # it also failed for a reason of its own: that answers
                    best[key] = hard[key]
                else:  # measure it again: one stall is the machine's, not the candidate's
                    del best[key]
    return {k: i for k, (_rank, i) in best.items()}, bad_median


@dataclass(frozen=True)
class LookupRule:
    """Which stored rows may answer a lookup (module docstring), as one value.

    ``mode`` is any `MeasureConfig` mode name (None: any mode; kept canonical); an unknown
    mode, strictness or retry raises ValueError. What ``strictness`` does not constrain is
    dropped: ``ANY`` ignores ``device`` and ``toolchain_version``, ``DEVICE`` ignores
    ``toolchain_version``.
    """

    strictness: Strictness = Strictness.EXACT
    retry: RetryPolicy = RetryPolicy.NONE
    mode: str | None = None  # canonical after construction
    # one value for every target key, or one per target key; None: not constrained
    device: Constraint = None
    toolchain_version: Constraint = None

    def __post_init__(self) -> None:
        if self.mode is not None:
            object.__setattr__(self, "mode", canonical_mode(self.mode))
        strict = Strictness.parse(self.strictness)
        object.__setattr__(self, "strictness", strict)
        object.__setattr__(self, "retry", RetryPolicy.parse(self.retry))
        if strict is Strictness.ANY:
            object.__setattr__(self, "device", None)
        if strict is not Strictness.EXACT:
            object.__setattr__(self, "toolchain_version", None)

    def answer(self, table: pa.Table, keys: Iterable[tuple[str, str]], *, where: str = ""
               ) -> dict[LookupKey, CostRow]:
        """The row each ``(fingerprint, target_key)`` of ``table`` should use; keys without a
        matching row are absent. ``where`` names the table in warnings."""
        wanted = {(str(f), str(k)) for f, k in keys}
        if not wanted:
            return {}
        sub = _candidate_rows(table, wanted, self.device, self.toolchain_version)
        if sub.num_rows == 0:
            return {}
        cols = _Columns(sub, self.device, self.toolchain_version, self.mode)
        best, bad_median = _pick(cols, wanted, self.retry)
        if bad_median:
            warnings.warn(f"cost table {where}: {bad_median} ok row(s) with a missing, NaN, "
                          "infinite or negative median ignored", CostTableWarning, stacklevel=3)
        if not best:
            return {}
        order = list(best)
        picked = sub.take(pa.array([best[k] for k in order], pa.int64()))
        return dict(zip(order, rows_from_table(picked)))
