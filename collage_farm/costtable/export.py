"""Export: the whole table, each row once, to one CSV, Parquet or JSON file."""

from __future__ import annotations

import contextlib
import json
import math
import os
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from collage_farm.costtable.errors import CostTableError
from collage_farm.costtable.reader import CostTable

EXPORT_FORMATS = ("csv", "parquet", "json")


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def export(
    path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    fmt: str = "csv",
    *,
    filters: Any = None,
) -> int:
    """Write the table (each row once) to one file; returns the row count.

    ``csv``: list columns (``samples``, ``nodes``, ``op_types``) as JSON text; ``parquet``: one
    file with the cost-table schema; ``json``: an array of objects (timestamps ISO 8601,
    non-finite numbers null). The file is written beside ``out_path`` and renamed into place.
    """
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"format must be one of {EXPORT_FORMATS}, not {fmt!r}")
    d = Path(path)
    if not d.is_dir():
        raise FileNotFoundError(f"cost table directory not found: {d}")
    out = Path(out_path)
    if out.resolve().parent == d.resolve():  # it would be read back as a part: every row twice
        raise CostTableError(f"export to {out}: that is inside the table directory {d}, where "
                             "a .parquet file counts as a part file; write it elsewhere")
    table = CostTable(d).read(filters)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex}.tmp")
    try:
        if fmt == "parquet":
            pq.write_table(table, tmp, compression="zstd")
        elif fmt == "csv":
            cols = []
            for name in table.column_names:
                col = table[name]
                if pa.types.is_list(col.type):
                    col = pa.array([None if v is None else json.dumps(_plain(v))
                                    for v in col.to_pylist()], pa.string())
                cols.append(col)
            pacsv.write_csv(pa.table(cols, names=table.column_names), tmp)
        else:
            with open(tmp, "w") as f:
                f.write("[")
                for i, rec in enumerate(table.to_pylist()):
                    f.write(",\n" if i else "\n")
                    f.write(json.dumps({k: _plain(v) for k, v in rec.items()}, allow_nan=False))
                f.write("\n]\n")
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return table.num_rows
