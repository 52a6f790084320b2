"""`TableStore`: the cost table as the estimators' `CostStore`.

The estimators (`estimators.measured`, `estimators.table`) know only the `CostStore` contract
of `estimators.sources`; this is its implementation over a `CostTable` (lookups, by the rule
of `collage_farm.costtable.lookup`) and a `CostTableWriter` (records). A campaign hands the
store its one writer, which it also gives to the transition and cut-cost probes; a store built
without one opens its own on the first record and closes it with the store.

A re-measurement recorded with ``confirmation=True`` carries ``{CONFIRM_DETAIL: "1"}`` in its
row's ``details``; a later lookup answers it with `StoredCost.confirmed`, so a later campaign
does not confirm it again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence

from collage_farm.costtable.reader import CostTable
from collage_farm.costtable.rows import CostRow, row_from_result, to_json
from collage_farm.costtable.writer import CostTableWriter
from estimators.sources import CostStore, LookupKey, RetryPolicy, StoredCost, Strictness
from runners.base import MeasureResult

#: details key of a row recorded with ``confirmation=True`` (an independent re-measurement)
CONFIRM_DETAIL = "confirmation"


def is_confirmation(row: CostRow) -> bool:
    """Whether ``row`` is an ok re-measurement recorded as a confirmation."""
    if not row.ok or CONFIRM_DETAIL not in (row.details or ""):
        return False
    try:
        return bool(json.loads(row.details).get(CONFIRM_DETAIL))
    except (ValueError, AttributeError):  # unreadable details: not a confirmation
        return False


def stored_cost(row: CostRow) -> StoredCost:
    """The store's answer for one looked-up row."""
    return StoredCost(cost=row.cost, status=row.status, error=row.error,
                      confirmed=is_confirmation(row), kind=row.kind)


class TableStore(CostStore):
    """A `CostStore` over a cost-table directory.

    ``table``: a `CostTable` or its directory. ``writer``: the campaign's writer on that
    directory (records go there; `close` flushes it but leaves it open for its owner); when
    None, the store opens its own writer (with ``campaign_id``) on the first record and
    closes it in `close`.
    """

    def __init__(self, table: CostTable | str | os.PathLike[str],
                 writer: CostTableWriter | None = None, *, campaign_id: str = "") -> None:
        self.table = table if isinstance(table, CostTable) else CostTable(table)
        if writer is not None and campaign_id and campaign_id != writer.campaign_id:
            raise ValueError(f"campaign_id {campaign_id!r} differs from the writer's "
                             f"{writer.campaign_id!r}")
        self.campaign_id = writer.campaign_id if writer is not None else campaign_id
        self._writer = writer
        self._owns_writer = writer is None
        self._closed = False

    @classmethod
    def existing(cls, path: CostTable | str | os.PathLike[str]) -> TableStore:
        """A store on a directory that must exist already (offline reuse); else
        `FileNotFoundError`."""
        store = cls(path)
        if not store.table.path.is_dir():
            raise FileNotFoundError(f"cost table directory not found: {store.table.path}")
        return store

    @property
    def writer(self) -> CostTableWriter:
        """The writer records go to (opened now if the store owns one and has not yet)."""
        if self._writer is None:
            if self._closed:
                raise ValueError(f"cost store {self.describe()} is closed")
            self._writer = CostTableWriter(self.table.path, campaign_id=self.campaign_id)
        return self._writer

    def lookup(self, keys: Iterable[LookupKey], *,
               device: str | Mapping[str, str] | None = None,
               toolchain_version: str | Mapping[str, str] | None = None,
               strictness: Strictness = Strictness.EXACT, mode: str | None = None,
               retry: RetryPolicy = RetryPolicy.NONE) -> dict[LookupKey, StoredCost]:
        rows = self.table.lookup(keys, device, toolchain_version, strictness, mode, retry)
        return {key: stored_cost(row) for key, row in rows.items()}

    def record(self, result: MeasureResult, *, model: str = "", nodes: Sequence[str] = (),
               op_types: Sequence[str] = (), confirmation: bool = False) -> None:
        if self._closed:
            raise ValueError(f"cost store {self.describe()} is closed")
        writer = self.writer
        row = row_from_result(result, campaign_id=writer.campaign_id, model=model,
                              nodes=nodes, op_types=op_types)
        if confirmation:  # a later campaign need not re-measure it again
            row["details"] = to_json({**dict(result.details), CONFIRM_DETAIL: "1"})
        writer.append(row)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer is None:
            return
        if self._owns_writer:
            self._writer.close()
        else:
            self._writer.flush()

    def describe(self) -> str:
        return str(self.table.path)

    def __repr__(self) -> str:
        return f"TableStore({str(self.table.path)!r})"
