"""The Parquet cost table: every measurement the farm ever took, reusable by later campaigns.

Why a *directory* of immutable part files
=========================================
Measurements are expensive (seconds to minutes each), and a campaign can be stopped at any
moment (Ctrl-C, a preempted node, an OOM kill). So the table is append-only and every write is
all-or-nothing: a `CostTableWriter` buffers rows and, on each flush, writes one **part file**
*outside* the directory (a sibling ``<dir>.staging/`` on the same filesystem), fsyncs it and
``os.replace``-s it in under a unique name
``part-<UTC timestamp>-<campaign or pid>-<uuid>.parquet`` (then fsyncs the directory). A
reader never sees a half-written file, two writers (two campaigns, two processes, two hosts on
a shared filesystem) never overwrite each other, and a killed campaign loses at most the rows
buffered since its last flush. If the sibling staging directory cannot be created or lies on
another filesystem (the table directory is itself a mount point, where a rename would not be
atomic), files are staged inside the directory under hidden ``.staging-*.parquet.tmp`` names,
which pyarrow skips (leading ``.``) and ``*.parquet`` globs (DuckDB, Polars) do not match.

The directory is readable as is by pyarrow (``pq.read_table(dir)``), pandas
(``pd.read_parquet(dir)``), DuckDB (``read_parquet('dir/*.parquet')``) and Polars; every part
file has the same schema (below).

Flush policy
------------
A writer flushes when its buffer holds ``max_rows`` rows or its oldest buffered row is older
than ``flush_interval_s`` (default 2 s), and on `close()` / context exit (and at interpreter
exit if the owner forgot to close it). The age check runs **both** on every `append` and on a
daemon **background timer thread** (``background=True``, the default), so rows measured just
before a long silence (a 120 s timeout on the next candidate) still reach disk within about
``flush_interval_s``. With ``background=False`` only appends, `flush()` and `close()` flush.

Reading: exactly once, bad files skipped
----------------------------------------
`CostTable.read` lists ``*.parquet`` files (names starting with ``_`` or ``.`` are ignored)
and reads them one by one, so one bad file costs only its own rows: a corrupt, truncated or
foreign file (a Parquet file without the cost-table columns, or with types that do not cast)
is skipped with a `CostTableWarning` (and a log line) naming it. Parsed files are cached by
``(name, mtime, size)``: part files are immutable, so a campaign that looks costs up after
every flush re-reads only the new files.

Compaction without double counting
----------------------------------
`compact` merges the part files into one. POSIX cannot replace many files atomically, so the
merged file carries, in its Parquet key-value metadata (``collage_farm.replaces``), the names
of the files it replaces. The protocol: take an exclusive ``flock`` (one compaction at a
time), read the current files, write the merged file staged, fsync, rename it in (its name
contains ``compacted``), then unlink the files it replaces. `CostTable` applies the rule *a
file named in any present file's ``replaces`` list is ignored*, so at every instant it counts
each row exactly once: before the rename it sees only the old files; between the rename and
the unlinks it sees both and drops the old ones; after, only the merged file. A file that
vanishes between listing and opening makes the reader list again, and so does a merged file
that appears while the reader works (directory listings are not atomic snapshots). If a
compaction dies between rename and unlinks, readers still count once and the next `compact`
deletes the leftovers. Writers never take the lock: appends go on during a compaction.

Readers that glob the directory themselves (pyarrow datasets, pandas, DuckDB) do not know this
rule: for the milliseconds between the rename and the last unlink (or, after a crash in that
window, until the next `compact`) they may count the replaced rows twice. Compact while no
such reader runs, or query through `CostTable.query` / ``collage-farm costs query``, which
apply the rule.

Lookup rule
-----------
`CostTable.lookup` answers, for each ``(fingerprint, target_key)`` asked, the row that a
search should use. A row *matches* when

* ``strictness="exact"`` (default): fingerprint, ``target_key`` (`Target.measure_key`),
  ``device`` (`DeviceDescription.describe()`) and ``toolchain_version`` are all equal;
* ``strictness="device"``: as exact, but any toolchain version (reuse after an upgrade);
* ``strictness="any"``: fingerprint and ``target_key`` only (offline reuse on another machine).

``device`` / ``toolchain_version`` given as ``None`` do not constrain; either may also be a
mapping from ``target_key`` to the value for that target (one campaign mixes devices). Among
the matching rows the **newest ok row** (by ``created_at``, then file order) wins; failed rows
are kept and answer (``CostRow.seconds == inf``, i.e. `Cost.invalid()`) only when no ok row
matches, so a later success overrides an earlier crash, and a known failure is not measured
again. Keys with no matching row are absent from the result.

Two refinements. An ok row whose median is missing, NaN, infinite or negative (a hand-edited
or foreign file) is ignored with a `CostTableWarning`, so it cannot shadow a good row. And a
caller that can measure (``retry="transient"``, the farm estimator) passes over a ``timeout``
or ``crashed`` row until that candidate failed so `TRANSIENT_ATTEMPTS` times: one OOM kill
on a busy node must not make a candidate invalid for every later campaign, while a candidate
that really crashes its toolchain is not retried for ever. ``retry="all"`` (``tune
--retry-failed``) measures every failed candidate again, e.g. after fixing a toolchain.

Schema (``schema_version`` 1; one row per measurement; nothing is pickled)
---------------------------------------------------------------------------
=================  =======================  ==================================================
column             type                     meaning
=================  =======================  ==================================================
fingerprint        string                   candidate fingerprint (sub-graph structure + target)
target             string                   ``Target.id`` (name in the configuration)
target_key         string                   ``Target.measure_key`` (interchangeable targets)
toolchain          string                   toolchain id (``ort-cpu``, ``openvino``, ``vela``)
toolchain_version  string                   toolchain package version(s)
device             string                   ``DeviceDescription.describe()``
device_kind        string                   ``cpu`` / ``cuda`` / ``ethos-u``
measure_config     string (JSON)            ``MeasureConfig.to_json()``
status             string                   ``Status`` value (``ok``, ``build_failed``, ...)
error              string                   error text of a failed row, else empty
kind               string                   ``measured`` / ``simulated`` / ``analytic``
samples            list<double>             every kept sample, seconds
median             double                   the cost (seconds); null for failed rows
mean               double                   mean of samples
std                double                   standard deviation of samples
p10                double                   10th percentile
p90                double                   90th percentile
min                double                   fastest sample
n                  int64                    number of samples (0 for failed rows)
cv                 double                   coefficient of variation of round medians
build_s            double                   build (conversion/compile) wall time, seconds
measure_s          double                   measurement wall time, seconds
campaign_id        string                   the campaign that wrote the row
model              string                   the model the candidate came from
nodes              list<string>             node names the candidate covers
op_types           list<string>             op types of those nodes
created_at         timestamp[us, UTC]       when the row was made
details            string (JSON)            toolchain extras (e.g. Vela cycles per op)
schema_version     int32                    this schema's version (1)
=================  =======================  ==================================================

`schema_markdown()` renders the same table as Markdown for the README.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import math
import numbers
import os
import re
import socket
import threading
import time
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from collage_farm.core.cost import Cost

if TYPE_CHECKING:
    import duckdb

    from runners.base import MeasureConfig, MeasureResult

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
#: Parquet key-value metadata key: JSON list of the file names a compacted file replaces.
REPLACES_KEY = b"collage_farm.replaces"
SCHEMA_VERSION_KEY = b"collage_farm.schema_version"
#: Files written by `compact` carry this tag in their name (see `CostTable._snapshot`).
COMPACT_TAG = "compacted"
STRICTNESS = ("exact", "device", "any")
#: which failed rows a lookup may pass over so that the candidate is measured again
RETRY = ("none", "transient", "all")
#: failures of the machine rather than of the candidate: a runner killed or stalled (an OOM
#: kill on a busy node, a stuck driver) says little about the next attempt
TRANSIENT_STATUSES = frozenset({"timeout", "crashed"})
#: with ``retry="transient"``, a transient failure answers once it happened this many times
TRANSIENT_ATTEMPTS = 2
PART_SUFFIX = ".parquet"
#: Rows per Parquet row group: DuckDB scans row groups in parallel and prunes by their stats.
ROW_GROUP_ROWS = 128 * 1024
STAGED_SUFFIX = PART_SUFFIX + ".tmp"


def _row_mode(measure_config: str | None) -> str:
    """The measurement mode a row's ``measure_config`` JSON names (legacy rows: warm)."""
    from runners.base import LEGACY_MODE, MeasureConfig

    try:
        return MeasureConfig.from_json(measure_config or "{}").measure_mode
    except (ValueError, TypeError):
        return LEGACY_MODE


class CostTableWarning(UserWarning):
    """A part file was skipped (corrupt, truncated or not a cost-table file)."""


class CostTableError(RuntimeError):
    """A cost table cannot be used: not a directory, not writable, a write that failed.

    The message names the directory and the reason; where rows could not be written it also
    names the rescue file that holds them (`CostTableWriter.close`).
    """


def check_writable(directory: str | os.PathLike[str]) -> Path:
    """Prove that part files can be staged and renamed into ``directory``; raise
    `CostTableError` if not. A campaign calls this before it measures anything, so a
    read-only or misplaced table costs a second, not the measurements. Directories it had to
    create for the probe are removed again (the writer creates them when it has rows)."""
    d = Path(directory)
    stage = d.parent / f"{d.name}.staging"
    created = [p for p in (stage, d, *d.parents) if not p.exists()]  # removed after the probe
    try:
        d.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CostTableError(f"cost table {d}: exists and is not a directory") from None
    except OSError as e:
        raise CostTableError(f"cost table {d}: cannot create it ({e.strerror or e})") from None
    if not d.is_dir():
        raise CostTableError(f"cost table {d}: exists and is not a directory")
    tmp = _staged_path(d)
    probe = d / f".write-probe-{uuid.uuid4().hex}.tmp"  # not a part name: readers skip it
    try:
        tmp.write_bytes(b"")
        os.replace(tmp, probe)
    except OSError as e:
        raise CostTableError(f"cost table {d}: cannot write part files into it "
                             f"({e.strerror or e}); fix its permissions or choose another "
                             "--cost-table") from None
    finally:
        for f in (tmp, probe):
            with contextlib.suppress(OSError):
                f.unlink()
        for p in sorted(created, key=lambda x: len(x.parts), reverse=True):
            with contextlib.suppress(OSError):
                p.rmdir()  # a failing campaign leaves no empty directories behind
    return d


def rescue_dir() -> Path:
    """Where rows go that could not be written to their table (``$COLLAGE_FARM_RESCUE_DIR``,
    else ``<tmp>/collage-farm-rescue``)."""
    import tempfile

    return Path(os.environ.get("COLLAGE_FARM_RESCUE_DIR")
                or Path(tempfile.gettempdir()) / "collage-farm-rescue")


@dataclass(frozen=True)
class Column:
    """One column of the cost table: name, Arrow type, Markdown type label, meaning."""

    name: str
    type: pa.DataType
    label: str
    doc: str


COLUMNS: tuple[Column, ...] = (
    Column("fingerprint", pa.string(), "string",
           "candidate fingerprint (sub-graph structure + target)"),
    Column("target", pa.string(), "string", "`Target.id` (name in the configuration)"),
    Column("target_key", pa.string(), "string",
           "`Target.measure_key`: which targets' measurements are interchangeable"),
    Column("toolchain", pa.string(), "string", "toolchain id (`ort-cpu`, `openvino`, `vela`, ...)"),
    Column("toolchain_version", pa.string(), "string", "toolchain package version(s)"),
    Column("device", pa.string(), "string", "`DeviceDescription.describe()`"),
    Column("device_kind", pa.string(), "string", "`cpu` / `cuda` / `ethos-u`"),
    Column("measure_config", pa.string(), "string (JSON)", "`MeasureConfig.to_json()`"),
    Column("status", pa.string(), "string", "`Status` value: `ok`, `build_failed`, `timeout`, ..."),
    Column("error", pa.string(), "string", "error text of a failed row, else empty"),
    Column("kind", pa.string(), "string", "`measured` / `simulated` / `analytic`"),
    Column("samples", pa.list_(pa.float64()), "list<double>", "every kept sample, seconds"),
    Column("median", pa.float64(), "double", "**the cost**, seconds; null for failed rows"),
    Column("mean", pa.float64(), "double", "mean of the samples"),
    Column("std", pa.float64(), "double", "standard deviation of the samples"),
    Column("p10", pa.float64(), "double", "10th percentile"),
    Column("p90", pa.float64(), "double", "90th percentile"),
    Column("min", pa.float64(), "double", "fastest sample"),
    Column("n", pa.int64(), "int64", "number of samples (0 for failed rows)"),
    Column("cv", pa.float64(), "double", "coefficient of variation of the round medians"),
    Column("build_s", pa.float64(), "double", "build (convert/compile) wall time, seconds"),
    Column("measure_s", pa.float64(), "double", "measurement wall time, seconds"),
    Column("campaign_id", pa.string(), "string", "the campaign that wrote the row"),
    Column("model", pa.string(), "string", "the model the candidate came from"),
    Column("nodes", pa.list_(pa.string()), "list<string>", "node names the candidate covers"),
    Column("op_types", pa.list_(pa.string()), "list<string>", "op types of those nodes"),
    Column("created_at", pa.timestamp("us", tz="UTC"), "timestamp[us, UTC]",
           "when the row was made"),
    Column("details", pa.string(), "string (JSON)",
           "toolchain extras (e.g. Vela cycles per op); never pickled"),
    Column("schema_version", pa.int32(), "int32", f"schema version ({SCHEMA_VERSION})"),
)

SCHEMA: pa.Schema = pa.schema([pa.field(c.name, c.type) for c in COLUMNS])
NAMES: tuple[str, ...] = tuple(c.name for c in COLUMNS)

_STR_COLS = frozenset(c.name for c in COLUMNS if c.type == pa.string())
_FLOAT_COLS = frozenset(c.name for c in COLUMNS if c.type == pa.float64())


def schema_markdown() -> str:
    """The schema as a Markdown table (the README includes it)."""
    lines = ["| column | type | meaning |", "|---|---|---|"]
    lines += [f"| `{c.name}` | {c.label} | {c.doc} |" for c in COLUMNS]
    return "\n".join(lines) + "\n"


def empty_table() -> pa.Table:
    return SCHEMA.empty_table()


# ----------------------------------------------------------------------------------------
# rows


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _jsonable(value: Any) -> Any:
    """Plain JSON values: tuples become lists, non-finite floats strings, the rest `str`."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, str)):
        return value.value if hasattr(value, "value") and isinstance(value, str) else value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        f = float(value)
        return f if math.isfinite(f) else str(f)
    if isinstance(value, bytes):
        return {"bytes": len(value)}
    return str(value)


def to_json(value: Any) -> str:
    """Deterministic, strict JSON text for the ``details`` / ``measure_config`` columns."""
    return json.dumps(_jsonable(value), sort_keys=True, allow_nan=False)


def row_from_result(
    result: MeasureResult,
    *,
    campaign_id: str,
    model: str,
    nodes: Sequence[str],
    op_types: Sequence[str],
    created_at: datetime | None = None,
) -> dict[str, Any]:
    """One cost-table row (a plain dict in schema order) from a runner's `MeasureResult`."""
    from runners.base import Kind, Status, Summary

    status = Status(result.status)
    ok = status is Status.OK
    summary = result.summary
    if ok and summary is None:
        summary = Summary.of(result.samples)
    stats = summary if ok else None
    dev = result.device
    row: dict[str, Any] = {
        "fingerprint": result.fingerprint,
        "target": result.target.id,
        "target_key": result.target.measure_key,
        "toolchain": result.target.toolchain,
        "toolchain_version": result.toolchain_version,
        "device": dev.describe() if dev is not None else "",
        "device_kind": dev.kind if dev is not None else result.target.device.kind,
        "measure_config": result.config.to_json(),
        "status": status.value,
        "error": result.error,
        "kind": Kind(result.kind).value,
        "samples": [float(s) for s in result.samples],
    }
    for name in ("median", "mean", "std", "p10", "p90", "min"):
        row[name] = float(getattr(stats, name)) if stats is not None else None
    row["n"] = int(stats.n) if stats is not None else 0
    row["cv"] = float(stats.cv) if stats is not None else None
    row.update(
        build_s=float(result.build_s),
        measure_s=float(result.measure_s),
        campaign_id=campaign_id,
        model=model,
        nodes=[str(n) for n in nodes],
        op_types=[str(o) for o in op_types],
        created_at=created_at or _utcnow(),
        details=to_json(dict(result.details)),
        schema_version=SCHEMA_VERSION,
    )
    return row


def _default(name: str) -> Any:
    if name in ("details", "measure_config"):
        return "{}"
    if name in _STR_COLS:
        return ""
    if name in ("samples", "nodes", "op_types"):
        return []
    if name == "created_at":
        return _utcnow()
    if name == "schema_version":
        return SCHEMA_VERSION
    if name == "n":
        return 0
    return None


def normalize_row(row: Mapping[str, Any], *, campaign_id: str = "") -> dict[str, Any]:
    """Check and complete a row before it is buffered, so a bad row fails at `append`.

    Missing columns get defaults (empty strings and lists, null statistics, ``created_at`` now,
    ``campaign_id`` the writer's); unknown columns and wrong types raise `ValueError` /
    `TypeError`. ``measure_config`` and ``details`` may be given as objects: they become JSON.
    """
    unknown = set(row) - set(NAMES)
    if unknown:
        raise ValueError(f"unknown cost-table columns: {sorted(unknown)}")
    out: dict[str, Any] = {}
    for name in NAMES:
        v = row.get(name)
        if v is None:
            v = campaign_id if name == "campaign_id" and campaign_id else _default(name)
        if name in ("measure_config", "details") and not isinstance(v, str):
            v = v.to_json() if hasattr(v, "to_json") else to_json(v)
        if name in _STR_COLS:
            if isinstance(v, str) and hasattr(v, "value"):  # Status / Kind (str enums)
                v = v.value
            if not isinstance(v, str):
                raise TypeError(f"column {name!r} needs a str, got {type(v).__name__}")
        elif name in _FLOAT_COLS:
            if v is not None:
                if isinstance(v, bool) or not isinstance(v, numbers.Real):
                    raise TypeError(f"column {name!r} needs a float, got {type(v).__name__}")
                v = float(v)
        elif name in ("n", "schema_version"):
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise TypeError(f"column {name!r} needs an int, got {type(v).__name__}")
            v = int(v)
        elif name == "samples":
            v = [float(x) for x in v]
        elif name in ("nodes", "op_types"):
            if isinstance(v, str):
                raise TypeError(f"column {name!r} needs a list of str, not a str")
            v = [str(x) for x in v]
        elif name == "created_at":
            if not isinstance(v, datetime):
                raise TypeError(f"column 'created_at' needs a datetime, got {type(v).__name__}")
            v = v.replace(tzinfo=timezone.utc) if v.tzinfo is None else v
        out[name] = v
    if not out["fingerprint"] or not out["target_key"] or not out["status"]:
        raise ValueError("a cost-table row needs fingerprint, target_key and status")
    return out


def rows_to_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """Normalised rows -> an Arrow table with the cost-table schema."""
    return pa.Table.from_pylist(list(rows), schema=SCHEMA)


@dataclass(frozen=True)
class CostRow:
    """One cost-table row read back; `seconds` is what the search uses."""

    fingerprint: str
    target: str
    target_key: str
    toolchain: str
    toolchain_version: str
    device: str
    device_kind: str
    measure_config: str
    status: str
    error: str
    kind: str
    samples: tuple[float, ...]
    median: float | None
    mean: float | None
    std: float | None
    p10: float | None
    p90: float | None
    min: float | None
    n: int | None
    cv: float | None
    build_s: float | None
    measure_s: float | None
    campaign_id: str
    model: str
    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    created_at: datetime | None
    details: str
    schema_version: int | None

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> CostRow:
        kw = {name: d.get(name) for name in NAMES}
        for name in ("samples", "nodes", "op_types"):
            kw[name] = tuple(kw[name] or ())
        for name in _STR_COLS:
            kw[name] = kw[name] or ""
        return CostRow(**kw)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def seconds(self) -> float:
        """The median for an ok row; +inf (invalid) for a failed row, and for an "ok" row
        whose median is not a finite, non-negative time (a hand-edited or foreign table must
        not hand the search a negative cost, which would break Dijkstra)."""
        if (not self.ok or self.median is None or not math.isfinite(self.median)
                or self.median < 0):
            return math.inf
        return float(self.median)

    @property
    def cost(self) -> Cost:
        return Cost(self.seconds)

    @property
    def config(self) -> MeasureConfig:
        from runners.base import MeasureConfig

        return MeasureConfig.from_json(self.measure_config or "{}")

    def details_dict(self) -> dict[str, Any]:
        return json.loads(self.details) if self.details else {}

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def rows_from_table(table: pa.Table) -> list[CostRow]:
    """`CostRow`s from a cost-table Arrow table (column by column: ~3x faster than dicts)."""
    cols = []
    for name in NAMES:
        if name == "created_at":  # via int64: 5x faster than tz-aware to_pylist
            values = [None if v is None else _EPOCH + timedelta(microseconds=v)
                      for v in table.column(name).cast(pa.int64()).to_pylist()]
            cols.append(values)
            continue
        values = table.column(name).to_pylist()
        if name in ("samples", "nodes", "op_types"):
            values = [tuple(v) if v is not None else () for v in values]
        elif name in _STR_COLS:
            values = [v if v is not None else "" for v in values]
        cols.append(values)
    return [CostRow(*vals) for vals in zip(*cols)]


# ----------------------------------------------------------------------------------------
# writing part files


def _is_part(name: str) -> bool:
    return name.endswith(PART_SUFFIX) and not name.startswith(("_", "."))


def _safe_tag(text: str) -> str:
    tag = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")[:40]
    return tag or f"pid{os.getpid()}"


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def staging_dir(directory: str | os.PathLike[str]) -> Path:
    """Where part files for ``directory`` are staged: ``<dir>.staging/`` beside it.

    Falls back to ``directory`` itself (hidden ``.staging-*.parquet.tmp`` names) when the
    sibling cannot be created or lies on another filesystem, where a rename is not atomic.
    """
    d = Path(directory)
    sib = d.parent / f"{d.name}.staging"
    try:
        sib.mkdir(parents=True, exist_ok=True)
        if os.stat(sib).st_dev == os.stat(d).st_dev:
            return sib
    except OSError:
        pass
    return d


def _staged_path(directory: Path) -> Path:
    stage = staging_dir(directory)
    name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}{STAGED_SUFFIX}"
    return stage / (f".staging-{name}" if stage == directory else name)


def part_name(tag: str) -> str:
    """``part-<UTC timestamp>-<tag>-<uuid>.parquet``: sortable by time, never colliding."""
    ts = _utcnow().strftime("%Y%m%dT%H%M%S%fZ")
    return f"part-{ts}-{_safe_tag(tag)}-{uuid.uuid4().hex}{PART_SUFFIX}"


def write_part(
    directory: str | os.PathLike[str],
    table: pa.Table,
    *,
    tag: str = "",
    metadata: Mapping[bytes, bytes] | None = None,
    compression: str = "zstd",
    durable: bool = True,
) -> Path:
    """Stage ``table`` outside ``directory``, fsync it, rename it in; return the final path.

    ``durable=False`` skips the fsyncs (benchmarks, throwaway tables): the rename is still
    atomic for readers, but a power loss may lose the file.
    """
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    if table.schema != SCHEMA:
        table = table.select(list(NAMES)).cast(SCHEMA)
    meta = {SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode()}
    meta.update(metadata or {})
    table = table.replace_schema_metadata(meta)
    tmp = _staged_path(d)
    final = d / part_name(tag or f"pid{os.getpid()}")
    try:
        pq.write_table(table, tmp, compression=compression, row_group_size=ROW_GROUP_ROWS)
        if durable:
            _fsync_file(tmp)
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if durable:
        _fsync_dir(d)
    return final


class CostTableWriter:
    """Buffers rows and flushes them as part files (module docstring: "Flush policy").

    Thread-safe: `append` may be called from several threads (a farm's result callbacks).
    One writer belongs to one process; a forked child must open its own.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        campaign_id: str = "",
        flush_interval_s: float = 2.0,
        max_rows: int = 5000,
        background: bool = True,
        compression: str = "zstd",
        durable: bool = True,
    ) -> None:
        if flush_interval_s <= 0 or max_rows <= 0:
            raise ValueError("flush_interval_s and max_rows must be positive")
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.campaign_id = campaign_id
        self.flush_interval_s = float(flush_interval_s)
        self.max_rows = int(max_rows)
        self.compression = compression
        self.durable = durable
        self.rows_written = 0
        self.files_written: list[Path] = []
        self.last_error: BaseException | None = None
        self._tag = campaign_id or f"pid{os.getpid()}"
        self._pid = os.getpid()
        self._buf: list[dict[str, Any]] = []
        self._oldest: float | None = None
        self._lock = threading.Lock()  # guards the buffer
        self._flush_lock = threading.Lock()  # one flush at a time, in order
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=self._run_timer, name=f"costtable-flush-{self._tag}", daemon=True
            )
            self._thread.start()
        atexit.register(self._atexit)

    # -- public API
    @property
    def pending(self) -> int:
        """Rows buffered, not yet on disk."""
        with self._lock:
            return len(self._buf)

    def append(self, row: Mapping[str, Any]) -> None:
        """Buffer one row (checked now: `normalize_row`); flush if due."""
        self._check_open()
        norm = normalize_row(row, campaign_id=self.campaign_id)
        with self._lock:
            self._buf.append(norm)
            if self._oldest is None:
                self._oldest = time.monotonic()
            due = self._due_locked()
        if due:
            self.flush()

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.append(row)

    def append_result(
        self,
        result: MeasureResult,
        *,
        model: str = "",
        nodes: Sequence[str] = (),
        op_types: Sequence[str] = (),
    ) -> None:
        self.append(row_from_result(result, campaign_id=self.campaign_id, model=model,
                                    nodes=nodes, op_types=op_types))

    def flush(self) -> Path | None:
        """Write the buffered rows as one part file now; None when there was nothing."""
        with self._flush_lock:
            with self._lock:
                rows, oldest = self._buf, self._oldest
                self._buf, self._oldest = [], None
            if not rows:
                return None
            try:
                path = write_part(self.path, rows_to_table(rows), tag=self._tag,
                                  compression=self.compression, durable=self.durable)
            except BaseException as e:
                with self._lock:  # put the rows back, in order, to retry later
                    self._buf[:0] = rows
                    if oldest is not None and (self._oldest is None or oldest < self._oldest):
                        self._oldest = oldest
                self.last_error = e
                raise
            self.rows_written += len(rows)
            self.files_written.append(path)
            return path

    def close(self) -> None:
        """Stop the timer and flush what is left.

        If that final flush fails (a read-only or full disk, a directory removed under us), the
        rows are not dropped: they are written as a part file under `rescue_dir` and
        `CostTableError` names it (move it into the table to keep them); only if that fails
        too does the original error propagate.
        """
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        atexit.unregister(self._atexit)
        if os.getpid() != self._pid:
            return
        try:
            self.flush()
        except Exception as e:
            with self._lock:
                rows, self._buf, self._oldest = self._buf, [], None
            try:
                saved = write_part(rescue_dir(), rows_to_table(rows), tag=self._tag,
                                   compression=self.compression, durable=self.durable)
            except Exception:
                with self._lock:
                    self._buf[:0] = rows
                raise e from None
            raise CostTableError(
                f"cost table {self.path}: could not write {len(rows)} row(s) "
                f"({type(e).__name__}: {e}); they are saved in {saved}: move that file into "
                "the table directory to keep them") from e

    def __enter__(self) -> CostTableWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals
    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("append to a closed CostTableWriter")
        if os.getpid() != self._pid:
            raise RuntimeError("a CostTableWriter cannot be shared across fork; open a new one")

    def _due_locked(self) -> bool:
        if not self._buf:
            return False
        if len(self._buf) >= self.max_rows:
            return True
        return self._oldest is not None and (
            time.monotonic() - self._oldest >= self.flush_interval_s
        )

    def _run_timer(self) -> None:
        tick = min(max(self.flush_interval_s / 4, 0.01), 0.5)
        while not self._stop.wait(tick):
            with self._lock:
                due = self._due_locked()
            if due:
                try:
                    self.flush()
                except Exception as e:  # rows stay buffered; retried next tick; close raises
                    log.warning("cost table %s: background flush failed: %s", self.path, e)

    def _atexit(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


# ----------------------------------------------------------------------------------------
# reading


class _ForeignFileError(ValueError):
    pass


@dataclass(frozen=True)
class _Part:
    name: str
    table: pa.Table | None  # None: only the footer was read (schema checked, no rows)
    replaces: frozenset[str]


@dataclass(frozen=True)
class _Skipped:
    name: str
    reason: str


@dataclass(frozen=True)
class _Snapshot:
    names: tuple[str, ...]  # every listed part file
    parts: tuple[_Part, ...]  # the effective ones, in name (time) order
    valid: tuple[str, ...]  # every readable part file (effective + replaced leftovers)
    skipped: tuple[_Skipped, ...]
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


def _read_part(path: Path, full: bool = True) -> _Part:
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
    return _Part(path.name, table, replaces)


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
        self._files: dict[str, tuple[tuple[int, int], _Part | _Skipped]] = {}
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
            if not _is_part(e.name):
                continue
            try:
                if e.is_file():
                    out[e.name] = e.stat()
            except FileNotFoundError:
                return None
        return out

    def _load(self, name: str, st: os.stat_result, full: bool = True
              ) -> _Part | _Skipped | None:
        """The parsed file (cached by name, mtime, size); None when it vanished."""
        key = (st.st_mtime_ns, st.st_size)
        hit = self._files.get(name)
        if hit is not None and hit[0] == key and (
                not full or isinstance(hit[1], _Skipped) or hit[1].table is not None):
            return hit[1]
        path = self.path / name
        entry: _Part | _Skipped
        try:
            entry = _read_part(path, full)
        except FileNotFoundError:
            return None
        except Exception as e:  # corrupt, truncated, foreign: skip this file only
            reason = f"{type(e).__name__}: {e}"
            warnings.warn(f"cost table: skipping part file {path}: {reason}",
                          CostTableWarning, stacklevel=5)
            log.warning("cost table: skipping part file %s: %s", path, reason)
            entry = _Skipped(name, reason)
        if self.cache:
            self._files[name] = (key, entry)
        return entry

    def _snapshot(self, attempts: int = 50, full: bool = True) -> _Snapshot:
        """Every effective part, each row exactly once (module docstring: "Compaction").

        ``full=False`` checks each new file's footer only (its rows are not read)."""
        with self._lock:
            for attempt in range(attempts):
                listing = self._list()
                if listing is not None:
                    loaded: list[_Part | _Skipped] = []
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
                       loaded: Sequence[_Part | _Skipped]) -> _Snapshot:
        for name in list(self._files):
            if name not in listing:
                del self._files[name]
        parts = [e for e in loaded if isinstance(e, _Part)]
        replaced: set[str] = set().union(*(p.replaces for p in parts))
        return _Snapshot(
            names=tuple(sorted(listing)),
            parts=tuple(p for p in parts if p.name not in replaced),
            valid=tuple(p.name for p in parts),
            skipped=tuple(e for e in loaded if isinstance(e, _Skipped)),
            nbytes=sum(st.st_size for st in listing.values()),
        )

    def _table(self, snap: _Snapshot) -> pa.Table:
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
        return [self.path / n for n in self._snapshot().effective]

    def skipped(self) -> list[tuple[Path, str]]:
        """Part files that could not be read, and why."""
        return [(self.path / s.name, s.reason) for s in self._snapshot().skipped]

    def read(self, filters: Any = None, columns: Sequence[str] | None = None) -> pa.Table:
        """All rows (each exactly once), optionally filtered.

        ``filters``: a pyarrow ``Expression``, a ``{column: value | [values]}`` mapping, or
        pyarrow DNF tuples ``[("status", "=", "ok"), ...]``.
        """
        table = self._table(self._snapshot())
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
        device: str | Mapping[str, str] | None = None,
        toolchain_version: str | Mapping[str, str] | None = None,
        strictness: str = "exact",
        mode: str | None = None,
        retry: str = "none",
    ) -> dict[tuple[str, str], CostRow]:
        """The row each ``(fingerprint, target_key)`` should use (module docstring:
        "Lookup rule"); keys without a matching row are absent.

        ``retry`` (one of `RETRY`): failed rows to pass over, leaving the key absent so that a
        caller that can measure does so: ``"transient"`` passes over ``timeout``/``crashed``
        rows until a key has `TRANSIENT_ATTEMPTS` of them, ``"all"`` every failed row.

        ``mode`` (a `MeasureConfig` mode): an ok *measured* row answers only when it was taken
        in that mode (a row without one was taken ``warm``), so a campaign measuring in-network
        costs does not silently reuse warm ones. Simulated and analytic rows, and failures,
        answer in every mode: the cache state does not change them.
        """
        from runners.base import canonical_mode

        want_mode = canonical_mode(mode) if mode is not None else None
        if strictness not in STRICTNESS:
            raise ValueError(f"strictness must be one of {STRICTNESS}, not {strictness!r}")
        if retry not in RETRY:
            raise ValueError(f"retry must be one of {RETRY}, not {retry!r}")
        wanted = {(str(f), str(k)) for f, k in keys}
        if not wanted:
            return {}
        if strictness == "any":
            device = toolchain_version = None
        elif strictness == "device":
            toolchain_version = None
        table = self._table(self._snapshot())
        if table.num_rows == 0:
            return {}
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
        if sub.num_rows == 0:
            return {}
        fp = sub["fingerprint"].to_pylist()
        tk = sub["target_key"].to_pylist()
        st = sub["status"].to_pylist()
        ts = sub["created_at"].cast(pa.int64()).to_pylist()
        med = sub["median"].to_pylist()
        dev_map = device if isinstance(device, Mapping) else None
        ver_map = toolchain_version if isinstance(toolchain_version, Mapping) else None
        dev = sub["device"].to_pylist() if dev_map is not None else None
        ver = sub["toolchain_version"].to_pylist() if ver_map is not None else None
        cfg = sub["measure_config"].to_pylist() if want_mode is not None else None
        kinds = sub["kind"].to_pylist() if want_mode is not None else None
        modes: dict[str | None, str] = {}
        never = -(2**62)
        best: dict[tuple[str, str], tuple[tuple[bool, int, int], int]] = {}
        transient: dict[tuple[str, str], int] = {}  # timeout/crashed rows per key
        hard: dict[tuple[str, str], tuple[tuple[bool, int, int], int]] = {}  # newest other failure
        bad_median = 0
        for i in range(sub.num_rows):
            key = (fp[i], tk[i])
            if key not in wanted:
                continue
            if st[i] == "ok":
                m_i = med[i]
                if m_i is None or not math.isfinite(m_i) or m_i < 0:
                    bad_median += 1
                    continue
            elif retry == "all":
                continue
            if dev_map is not None and dev is not None:
                want = dev_map.get(tk[i])
                if want is not None and dev[i] != want:
                    continue
            if ver_map is not None and ver is not None:
                want = ver_map.get(tk[i])
                if want is not None and ver[i] != want:
                    continue
            if cfg is not None and kinds is not None and st[i] == "ok" \
                    and kinds[i] == "measured":
                m = modes.get(cfg[i])
                if m is None:
                    m = modes[cfg[i]] = _row_mode(cfg[i])
                if m != want_mode:
                    continue
            rank = (st[i] == "ok", ts[i] if ts[i] is not None else never, i)
            if st[i] in TRANSIENT_STATUSES:
                transient[key] = transient.get(key, 0) + 1
            elif st[i] != "ok":  # a failure of the candidate itself (unsupported, build, run)
                cur = hard.get(key)
                if cur is None or rank > cur[0]:
                    hard[key] = (rank, i)
            cur = best.get(key)
            if cur is None or rank > cur[0]:
                best[key] = (rank, i)
        if bad_median:
            warnings.warn(f"cost table {self.path}: {bad_median} ok row(s) with a missing, NaN, "
                          "infinite or negative median ignored", CostTableWarning, stacklevel=2)
        if retry == "transient":
            for key, (_rank, i) in list(best.items()):
                if st[i] in TRANSIENT_STATUSES and transient[key] < TRANSIENT_ATTEMPTS:
                    if key in hard:  # it also failed for a reason of its own: that answers
                        best[key] = hard[key]
                    else:  # measure it again: one stall is the machine's, not the candidate's
                        del best[key]
        if not best:
            return {}
        order = list(best)
        picked = sub.take(pa.array([best[k][1] for k in order], pa.int64()))
        return dict(zip(order, rows_from_table(picked)))

    # -- summaries and SQL
    def summary(self) -> dict[str, Any]:
        """Rows, files, size, per-target/status counts, campaigns (for ``costs show``)."""
        snap = self._snapshot()
        t = self._table(snap)
        per: dict[str, dict[str, int]] = {}
        campaigns: list[dict[str, Any]] = []
        first = last = None
        if t.num_rows:
            g = t.group_by(["target", "status"]).aggregate([([], "count_all")])
            for target, status, count in zip(g["target"].to_pylist(), g["status"].to_pylist(),
                                             g["count_all"].to_pylist()):
                per.setdefault(target, {})[status] = int(count)
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
            first = pc.min(t["created_at"]).as_py()
            last = pc.max(t["created_at"]).as_py()
        statuses: dict[str, int] = {}
        for counts in per.values():
            for s, c in counts.items():
                statuses[s] = statuses.get(s, 0) + c
        return {
            "path": str(self.path),
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

    def duckdb(self, con: duckdb.DuckDBPyConnection | None = None
               ) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with view ``costs`` over the effective part files.

        The view names the files explicitly (skipped and replaced files are left out), so a
        later compaction that removes them breaks it: call again, or use `query`.
        """
        import duckdb

        con = con or duckdb.connect()
        snap = self._snapshot(full=False)  # DuckDB reads the rows itself
        cols = ", ".join(f'"{n}"' for n in NAMES)
        if snap.parts:
            files = ", ".join("'" + str(self.path / n).replace("'", "''") + "'"
                              for n in snap.effective)
            con.execute(f"create or replace view costs as select {cols} from "
                        f"read_parquet([{files}], union_by_name = true)")
        else:
            con.register("_costs_empty", empty_table())
            con.execute(f"create or replace view costs as select {cols} from _costs_empty")
        return con

    def query(self, sql: str, *, attempts: int = 5) -> pa.Table:
        """Run DuckDB SQL with the table as view ``costs``; retried when a compaction
        removes a file mid-query."""
        import duckdb

        for attempt in range(attempts):
            con = self.duckdb()
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

    def compact(self, **kw: Any) -> CompactResult:
        return compact(self.path, **kw)


# ----------------------------------------------------------------------------------------
# compaction and export


@dataclass(frozen=True)
class CompactResult:
    """What `compact` did."""

    files_before: int  # readable part files listed
    files_after: int  # readable part files left (1, or 0 for an empty table)
    rows: int
    output: Path | None  # the merged file (None: nothing was done)
    removed: tuple[str, ...]
    skipped: tuple[str, ...]  # unreadable files (left in place unless quarantined)
    quarantined: tuple[str, ...] = ()


@contextlib.contextmanager
def _compaction_lock(directory: Path) -> Iterator[None]:
    import fcntl

    stage = staging_dir(directory)
    lock_path = stage / ("_compact.lock" if stage == directory else "compact.lock")
    with open(lock_path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _remove_stale_staging(directory: Path, max_age_s: float = 24 * 3600) -> None:
    """Staged files left by killed writers: this host's dead pids, or anything a day old."""
    stage = staging_dir(directory)
    host = socket.gethostname()
    now = time.time()
    for e in list(os.scandir(stage)):
        name = e.name
        if stage == directory:
            if not name.startswith(".staging-"):
                continue
            name = name.removeprefix(".staging-")
        m = re.fullmatch(r"(.*)-(\d+)-[0-9a-f]{32}" + re.escape(STAGED_SUFFIX), name)
        if m is None:
            continue
        dead = False
        if m.group(1) == host:
            try:
                os.kill(int(m.group(2)), 0)
            except ProcessLookupError:
                dead = True
            except OSError:
                pass
        with contextlib.suppress(OSError):
            if dead or now - e.stat().st_mtime > max_age_s:
                os.unlink(e.path)


def compact(
    path: str | os.PathLike[str],
    *,
    min_files: int = 2,
    quarantine: bool = False,
    durable: bool = True,
) -> CompactResult:
    """Merge the part files of ``path`` into one, atomically (module docstring: protocol).

    Does nothing when fewer than ``min_files`` effective files exist and no replaced leftovers
    remain. Unreadable files are never deleted: they stay in place (and keep being skipped with
    a warning), or with ``quarantine=True`` move to ``<dir>.quarantine/`` so that globbing
    readers (DuckDB, pandas) can read the directory again. Also removes staged files that
    killed writers left behind.
    """
    d = Path(path)
    if not d.is_dir():
        raise FileNotFoundError(f"cost table directory not found: {d}")
    table = CostTable(d)
    with _compaction_lock(d):
        snap = table._snapshot()
        quarantined: list[str] = []
        if quarantine and snap.skipped:
            qdir = d.parent / f"{d.name}.quarantine"
            qdir.mkdir(exist_ok=True)
            for s in snap.skipped:
                with contextlib.suppress(FileNotFoundError):
                    os.replace(d / s.name, qdir / s.name)
                    quarantined.append(s.name)
        skipped = tuple(s.name for s in snap.skipped)
        leftovers = len(snap.valid) - len(snap.parts)
        merged = table._table(snap)
        if len(snap.parts) < min_files and leftovers == 0:
            _remove_stale_staging(d)
            return CompactResult(len(snap.valid), len(snap.valid), merged.num_rows, None, (),
                                 skipped, tuple(quarantined))
        output: Path | None = None
        if merged.num_rows:  # rows stay in file (time) order: sorting 1e6 rows costs ~3 s
            meta = {REPLACES_KEY: json.dumps(sorted(snap.valid)).encode()}
            output = write_part(d, merged, tag=COMPACT_TAG, metadata=meta, durable=durable)
        for name in snap.valid:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(d / name)
        if durable:
            _fsync_dir(d)
        _remove_stale_staging(d)
        return CompactResult(
            files_before=len(snap.valid),
            files_after=1 if output else 0,
            rows=merged.num_rows,
            output=output,
            removed=tuple(snap.valid),
            skipped=skipped,
            quarantined=tuple(quarantined),
        )


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
            import pyarrow.csv as pacsv

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
