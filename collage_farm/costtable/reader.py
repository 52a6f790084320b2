"""`CostTable`: a cost-table directory read as one table, each row exactly once.

Reading: exactly once, bad files skipped
----------------------------------------
`CostTable.read` lists ``*.parquet`` files (names starting with ``_`` or ``.`` are ignored)
and reads them one by one, so one bad file costs only its own rows: a corrupt, truncated or
foreign file (a Parquet file without the cost-table columns, or with types that do not cast)
is skipped with a `CostTableWarning` (and a log line) naming it. Parsed files are cached by
``(name, mtime, size)``: part files are immutable, so a campaign that looks costs up after
every flush re-reads only the new files.

A compacted file names, in its metadata, the files it replaces
(`collage_farm.costtable.compact`); the reader applies the rule *a file named in any present
file's ``replaces`` list is ignored*, so at every instant it counts each row exactly once. A
file that vanishes between listing and opening makes the reader list again, and so does a
merged file that appears while the reader works (directory listings are not atomic snapshots).

Lookups follow `collage_farm.costtable.lookup`; summaries and SQL are
`collage_farm.costtable.query`.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collage_farm.costtable.errors import CostTableError, CostTableWarning
from collage_farm.costtable.lookup import Constraint, LookupRule
from collage_farm.costtable.parts import COMPACT_TAG, is_part
from collage_farm.costtable.query import duckdb_view, run_query, summarize
from collage_farm.costtable.rows import CostRow, rows_from_table
from collage_farm.costtable.schema import COLUMNS, NAMES, REPLACES_KEY, SCHEMA, empty_table
from collage_farm.costtable.writer import CostTableWriter
from estimators.sources import RetryPolicy, Strictness

if TYPE_CHECKING:
    import duckdb

log = logging.getLogger(__name__)


class _ForeignFileError(ValueError):
    pass


@dataclass(frozen=True)
class Part:
    """One readable part file: its rows (None: only the footer was read) and what it
    replaces (a compacted file's metadata)."""

    name: str
    table: pa.Table | None
    replaces: frozenset[str]


@dataclass(frozen=True)
class Skipped:
    """A part file that could not be read, and why."""

    name: str
    reason: str


@dataclass(frozen=True)
class Snapshot:
    """The directory at one instant, each row counted once."""

    names: tuple[str, ...]  # every listed part file
    parts: tuple[Part, ...]  # the effective ones, in name (time) order
    valid: tuple[str, ...]  # every readable part file (effective + replaced leftovers)
    skipped: tuple[Skipped, ...]
    nbytes: int  # on-disk size of the listed files

    @property
    def effective(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts)


_CAST_ERRORS = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)


def _same_kind(t: pa.DataType, want: pa.DataType) -> bool:
    """Whether a column of type ``t`` holds what ``want`` means (a width or encoding apart)."""
    pt = pa.types
    for test in (pt.is_integer, pt.is_floating, pt.is_timestamp):
        if test(want):
            return bool(test(t))
    if pt.is_string(want) or pt.is_large_string(want):
        return bool(pt.is_string(t) or pt.is_large_string(t))
    if pt.is_list(want) and (pt.is_list(t) or pt.is_large_list(t)):
        return t.value_type == want.value_type or _same_kind(t.value_type, want.value_type)
    return False


def read_part(path: Path, full: bool = True) -> Part:
    """Parse and check one part file; ``full=False`` reads only its footer (for DuckDB)."""
    # Open first: once open, the file stays readable even if a compaction unlinks it.
    table: pa.Table | None = None
    with open(path, "rb") as f:
        pf = pq.ParquetFile(f)
        schema = pf.schema_arrow
        missing = [n for n in NAMES if n not in schema.names]
        if missing:
            raise _ForeignFileError(f"not a cost-table file: missing columns {missing}")
        if full:
            table = pf.read(columns=list(NAMES))
    try:
        if table is not None:
            table = table.select(list(NAMES)).cast(SCHEMA)
        else:  # footer only: the types must be the same kind (an empty array casts from
            # string to double happily, and DuckDB then unions every column as VARCHAR)
            for c in COLUMNS:
                t = schema.field(c.name).type
                if t != c.type and not _same_kind(t, c.type):
                    raise _ForeignFileError(f"not a cost-table file: column {c.name!r} is {t}, "
                                            f"not {c.type}")
    except _CAST_ERRORS as e:
        raise _ForeignFileError(f"not a cost-table file: column types do not match ({e})") from e
    meta = schema.metadata or {}
    replaces: frozenset[str] = frozenset()
    if REPLACES_KEY in meta:
        replaces = frozenset(json.loads(meta[REPLACES_KEY]))
    return Part(path.name, table, replaces)


def _to_expression(filters: Any) -> pc.Expression | None:
    """Filters as a pyarrow expression, a ``{column: value or [values]}`` mapping, or
    pyarrow's DNF tuples (``[("status", "=", "ok")]``)."""
    if filters is None:
        return None
    if isinstance(filters, pc.Expression):
        return filters
    if isinstance(filters, Mapping):
        expr: pc.Expression | None = None
        for col, val in filters.items():
            if col not in NAMES:
                raise ValueError(f"unknown column {col!r}")
            if isinstance(val, (list, tuple, set, frozenset)):
                e = pc.field(col).isin(list(val))
            else:
                e = pc.field(col) == val
            expr = e if expr is None else expr & e
        return expr
    return pq.filters_to_expression(filters)


class CostTable:
    """A cost-table directory, read as one table (module docstring: the rules).

    A missing directory reads as an empty table (nothing measured yet).
    """

    def __init__(self, path: str | os.PathLike[str], *, cache: bool = True) -> None:
        self.path = Path(path)
        self.cache = cache
        self._files: dict[str, tuple[tuple[int, int], Part | Skipped]] = {}
        self._concat: tuple[tuple[tuple[str, int], ...], pa.Table] | None = None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"CostTable({str(self.path)!r})"

    def writer(self, **kw: Any) -> CostTableWriter:
        """A `CostTableWriter` on this directory."""
        return CostTableWriter(self.path, **kw)

    # -- listing and snapshots
    def _list(self) -> dict[str, os.stat_result] | None:
        """Part files and their stats; None when one vanished while listing."""
        try:
            entries = list(os.scandir(self.path))
        except FileNotFoundError:
            return {}
        except OSError as e:  # unreadable, or not a directory
            raise CostTableError(f"cost table {self.path}: cannot list it "
                                 f"({e.strerror or e})") from None
        out: dict[str, os.stat_result] = {}
        for e in entries:
            if not is_part(e.name):
                continue
            try:
                if e.is_file():
                    out[e.name] = e.stat()
            except FileNotFoundError:
                return None
        return out

    def _load(self, name: str, st: os.stat_result, full: bool = True
              ) -> Part | Skipped | None:
        """The parsed file (cached by name, mtime, size); None when it vanished."""
        key = (st.st_mtime_ns, st.st_size)
        hit = self._files.get(name)
        if hit is not None and hit[0] == key and (
                not full or isinstance(hit[1], Skipped) or hit[1].table is not None):
            return hit[1]
        path = self.path / name
        entry: Part | Skipped
        try:
            entry = read_part(path, full)
        except FileNotFoundError:
            return None
        except Exception as e:  # corrupt, truncated, foreign: skip this file only
            reason = f"{type(e).__name__}: {e}"
            warnings.warn(f"cost table: skipping part file {path}: {reason}",
                          CostTableWarning, stacklevel=5)
            log.warning("cost table: skipping part file %s: %s", path, reason)
            entry = Skipped(name, reason)
        if self.cache:
            self._files[name] = (key, entry)
        return entry

    def snapshot(self, attempts: int = 50, full: bool = True) -> Snapshot:
        """Every effective part, each row exactly once (module docstring).

        ``full=False`` checks each new file's footer only (its rows are not read)."""
        with self._lock:
            for attempt in range(attempts):
                listing = self._list()
                if listing is not None:
                    loaded: list[Part | Skipped] = []
                    for name in sorted(listing):
                        entry = self._load(name, listing[name], full)
                        if entry is None:
                            break
                        loaded.append(entry)
                    else:
                        again = self._list()
                        if again is not None and not any(
                            COMPACT_TAG in n for n in set(again) - set(listing)
                        ):
                            return self._make_snapshot(listing, loaded)
                time.sleep(min(0.001 * 2**attempt, 0.05))
            raise RuntimeError(f"cost table {self.path}: the directory kept changing while "
                               f"being read ({attempts} attempts)")

    def _make_snapshot(self, listing: Mapping[str, os.stat_result],
                       loaded: Sequence[Part | Skipped]) -> Snapshot:
        for name in list(self._files):
            if name not in listing:
                del self._files[name]
        parts = [e for e in loaded if isinstance(e, Part)]
        replaced: set[str] = set().union(*(p.replaces for p in parts))
        return Snapshot(
            names=tuple(sorted(listing)),
            parts=tuple(p for p in parts if p.name not in replaced),
            valid=tuple(p.name for p in parts),
            skipped=tuple(e for e in loaded if isinstance(e, Skipped)),
            nbytes=sum(st.st_size for st in listing.values()),
        )

    def table_of(self, snap: Snapshot) -> pa.Table:
        """The rows of a full snapshot as one Arrow table (cached while it is current)."""
        tables = [p.table for p in snap.parts if p.table is not None]
        assert len(tables) == len(snap.parts), "a full snapshot is needed"
        key = tuple((p.name, id(p.table)) for p in snap.parts)
        with self._lock:
            if self._concat is not None and self._concat[0] == key:
                return self._concat[1]
            table = pa.concat_tables(tables) if tables else empty_table()
            if self.cache:
                self._concat = (key, table)
            return table

    # -- reading
    def files(self) -> list[Path]:
        """The effective part files (what `read` reads), in name (time) order."""
        return [self.path / n for n in self.snapshot().effective]

    def skipped(self) -> list[tuple[Path, str]]:
        """Part files that could not be read, and why."""
        return [(self.path / s.name, s.reason) for s in self.snapshot().skipped]

    def read(self, filters: Any = None, columns: Sequence[str] | None = None) -> pa.Table:
        """All rows (each exactly once), optionally filtered.

        ``filters``: a pyarrow ``Expression``, a ``{column: value | [values]}`` mapping, or
        pyarrow DNF tuples ``[("status", "=", "ok"), ...]``.
        """
        table = self.table_of(self.snapshot())
        expr = _to_expression(filters)
        if expr is not None:
            table = table.filter(expr)
        if columns is not None:
            table = table.select(list(columns))
        return table

    def rows(self, filters: Any = None) -> list[CostRow]:
        return rows_from_table(self.read(filters))

    def lookup(
        self,
        keys: Iterable[tuple[str, str]],
        device: Constraint = None,
        toolchain_version: Constraint = None,
        strictness: Strictness | str = Strictness.EXACT,
        mode: str | None = None,
        retry: RetryPolicy | str = RetryPolicy.NONE,
    ) -> dict[tuple[str, str], CostRow]:
        """The row each ``(fingerprint, target_key)`` should use (the rule of
        `collage_farm.costtable.lookup`); keys without a matching row are absent.

        ``retry`` (a `RetryPolicy` or its spelling): failed rows to pass over, leaving the key
        absent so that a caller that can measure does so. ``mode`` (a `MeasureConfig` mode):
        an ok *measured* row answers only when it was taken in that mode.
        """
        rule = LookupRule(strictness=Strictness.parse(strictness),
                          retry=RetryPolicy.parse(retry), mode=mode, device=device,
                          toolchain_version=toolchain_version)
        return rule.answer(self.table_of(self.snapshot()), keys, where=str(self.path))

    # -- summaries and SQL (collage_farm.costtable.query)
    def summary(self) -> dict[str, Any]:
        """Rows, files, size, per-target/status counts, campaigns (for ``costs show``)."""
        return summarize(self)

    def duckdb(self, con: duckdb.DuckDBPyConnection | None = None
               ) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with view ``costs`` over the effective part files."""
        return duckdb_view(self, con)

    def query(self, sql: str, *, attempts: int = 5) -> pa.Table:
        """Run DuckDB SQL with the table as view ``costs``; retried when a compaction
        removes a file mid-query."""
        return run_query(self, sql, attempts=attempts)
