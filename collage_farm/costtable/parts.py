"""Part files: how one immutable file gets into a cost-table directory, all or nothing.

Why a *directory* of immutable part files: measurements are expensive (seconds to minutes
each), and a campaign can be stopped at any moment (Ctrl-C, a preempted node, an OOM kill). So
the table is append-only and every write is all-or-nothing: `write_part` writes one **part
file** where no reader looks (the hidden ``<dir>/.staging/``, on the table's filesystem), fsyncs
it and ``os.replace``-s it into the directory under a unique name
``part-<UTC timestamp>-<campaign or pid>-<uuid>.parquet`` (then fsyncs the directory). A reader
never sees a half-written file, two writers (two campaigns, two processes, two hosts on a
shared filesystem) never overwrite each other, and a killed writer loses only what it had not
written yet. pyarrow skips ``.staging`` (a leading ``.``), and ``dir/*.parquet`` globs (DuckDB,
Polars) neither descend into it nor match its ``*.parquet.tmp`` names; nothing appears beside
the table. If ``.staging`` cannot be created or lies on another filesystem (a mount point,
where a rename would not be atomic), files are staged in the directory itself under hidden
``.staging-*.parquet.tmp`` names.

The directory is readable as is by pyarrow (``pq.read_table(dir)``), pandas
(``pd.read_parquet(dir)``), DuckDB (``read_parquet('dir/*.parquet')``) and Polars; every part
file has the same schema (`collage_farm.costtable.schema`).

Rows that could not be written to their table go to `rescue_dir` instead of being dropped.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import tempfile
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from collage_farm.costtable.errors import CostTableError
from collage_farm.costtable.schema import NAMES, SCHEMA, SCHEMA_VERSION, SCHEMA_VERSION_KEY

PART_SUFFIX = ".parquet"
STAGED_SUFFIX = PART_SUFFIX + ".tmp"
#: Files written by compaction carry this tag in their name (`CostTable.snapshot` looks for it).
COMPACT_TAG = "compacted"
#: Rows per Parquet row group: DuckDB scans row groups in parallel and prunes by their stats.
ROW_GROUP_ROWS = 128 * 1024


def is_part(name: str) -> bool:
    """Whether a directory entry is a part file (names starting ``_`` or ``.`` are not)."""
    return name.endswith(PART_SUFFIX) and not name.startswith(("_", "."))


def _safe_tag(text: str) -> str:
    tag = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")[:40]
    return tag or f"pid{os.getpid()}"


def fsync_dir(directory: Path) -> None:
    """Make renames and unlinks in ``directory`` durable (where the platform allows)."""
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


#: the hidden directory inside a table where its part files are staged
STAGING = ".staging"


def staging_dir(directory: str | os.PathLike[str]) -> Path:
    """Where part files for ``directory`` are staged: ``<dir>/.staging/`` (hidden from
    readers; see module doc), created with the table.

    Falls back to ``directory`` itself (hidden ``.staging-*.parquet.tmp`` names) when that
    cannot be created or lies on another filesystem, where a rename is not atomic.
    """
    d = Path(directory)
    stage = d / STAGING
    try:
        stage.mkdir(parents=True, exist_ok=True)
        if os.stat(stage).st_dev == os.stat(d).st_dev:
            return stage
    except OSError:
        pass
    return d


def staged_path(directory: Path) -> Path:
    """A fresh staging file for ``directory``: ``<host>-<pid>-<uuid>`` + `STAGED_SUFFIX`."""
    stage = staging_dir(directory)
    name = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}{STAGED_SUFFIX}"
    return stage / (f".staging-{name}" if stage == directory else name)


def part_name(tag: str) -> str:
    """``part-<UTC timestamp>-<tag>-<uuid>.parquet``: sortable by time, never colliding."""
    ts = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
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
    tmp = staged_path(d)
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
        fsync_dir(d)
    return final


def check_writable(directory: str | os.PathLike[str]) -> Path:
    """Prove that part files can be staged and renamed into ``directory``; raise
    `CostTableError` if not. A campaign calls this before it measures anything, so a
    read-only or misplaced table costs a second, not the measurements. Directories it had to
    create for the probe are removed again (the writer creates them when it has rows)."""
    d = Path(directory)
    stage = d / STAGING
    created = [p for p in (stage, d, *d.parents) if not p.exists()]  # removed after the probe
    try:
        d.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise CostTableError(f"cost table {d}: exists and is not a directory") from None
    except OSError as e:
        raise CostTableError(f"cost table {d}: cannot create it ({e.strerror or e})") from None
    if not d.is_dir():
        raise CostTableError(f"cost table {d}: exists and is not a directory")
    tmp = staged_path(d)
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
    return Path(os.environ.get("COLLAGE_FARM_RESCUE_DIR")
                or Path(tempfile.gettempdir()) / "collage-farm-rescue")
