"""Summaries and SQL over a `CostTable`: ``costs show`` and ``costs query`` (DuckDB).

Both read the table's effective part files only (`CostTable.snapshot`), so, unlike a reader
that globs the directory itself, they never count a compacted file's rows twice and never
choke on a skipped file.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from collage_farm.costtable.schema import NAMES, empty_table

if TYPE_CHECKING:
    import duckdb

    from collage_farm.costtable.reader import CostTable


def _campaigns(t: pa.Table) -> list[dict[str, Any]]:
    """One entry per campaign: rows, first and last row time, models."""
    campaigns: list[dict[str, Any]] = []
    g = t.group_by("campaign_id").aggregate(
        [([], "count_all"), ("created_at", "min"), ("created_at", "max"),
         ("model", "distinct")])
    for cid, n, lo, hi, models in zip(
        g["campaign_id"].to_pylist(), g["count_all"].to_pylist(),
        g["created_at_min"].to_pylist(), g["created_at_max"].to_pylist(),
        g["model_distinct"].to_pylist()):
        campaigns.append({"campaign_id": cid, "rows": int(n),
                          "first": lo.isoformat() if lo else None,
                          "last": hi.isoformat() if hi else None,
                          "models": sorted(m for m in models if m)})
    # ties (rows written within the timestamp resolution) by id: a stable listing
    campaigns.sort(key=lambda c: (c["first"] or "", c["campaign_id"] or ""))
    return campaigns


def summarize(table: CostTable) -> dict[str, Any]:
    """Rows, files, size, per-target/status counts, campaigns (for ``costs show``)."""
    snap = table.snapshot()
    t = table.table_of(snap)
    per: dict[str, dict[str, int]] = {}
    campaigns: list[dict[str, Any]] = []
    first = last = None
    if t.num_rows:
        g = t.group_by(["target", "status"]).aggregate([([], "count_all")])
        for target, status, count in zip(g["target"].to_pylist(), g["status"].to_pylist(),
                                         g["count_all"].to_pylist()):
            per.setdefault(target, {})[status] = int(count)
        campaigns = _campaigns(t)
        first = pc.min(t["created_at"]).as_py()
        last = pc.max(t["created_at"]).as_py()
    statuses: dict[str, int] = {}
    for counts in per.values():
        for s, c in counts.items():
            statuses[s] = statuses.get(s, 0) + c
    return {
        "path": str(table.path),
        "rows": t.num_rows,
        "files": len(snap.parts),
        "files_listed": len(snap.names),
        "replaced_leftovers": len(snap.valid) - len(snap.parts),
        "skipped": [{"file": s.name, "reason": s.reason} for s in snap.skipped],
        "bytes": snap.nbytes,
        "first": first.isoformat() if first else None,
        "last": last.isoformat() if last else None,
        "statuses": dict(sorted(statuses.items())),
        "targets": {k: dict(sorted(v.items())) for k, v in sorted(per.items())},
        "campaigns": campaigns,
    }


def duckdb_view(table: CostTable, con: duckdb.DuckDBPyConnection | None = None
                ) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with view ``costs`` over the effective part files of ``table``.

    The view names the files explicitly (skipped and replaced files are left out), so a
    later compaction that removes them breaks it: call again, or use `run_query`.
    """
    import duckdb  # heavy, and only the SQL commands need it

    con = con or duckdb.connect()
    snap = table.snapshot(full=False)  # DuckDB reads the rows itself
    cols = ", ".join(f'"{n}"' for n in NAMES)
    if snap.parts:
        files = ", ".join("'" + str(table.path / n).replace("'", "''") + "'"
                          for n in snap.effective)
        con.execute(f"create or replace view costs as select {cols} from "
                    f"read_parquet([{files}], union_by_name = true)")
    else:
        con.register("_costs_empty", empty_table())
        con.execute(f"create or replace view costs as select {cols} from _costs_empty")
    return con


def run_query(table: CostTable, sql: str, *, attempts: int = 5) -> pa.Table:
    """Run DuckDB SQL with ``table`` as view ``costs``; retried when a compaction removes a
    file mid-query."""
    import duckdb  # heavy, and only the SQL commands need it

    for attempt in range(attempts):
        con = duckdb_view(table)
        try:
            rel = con.sql(sql)
            return rel.to_arrow_table() if rel is not None else pa.table({})
        except duckdb.IOException:
            if attempt == attempts - 1:
                raise
            time.sleep(0.01 * (attempt + 1))
        finally:
            con.close()
    raise AssertionError("unreachable")
