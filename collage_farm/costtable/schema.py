"""The cost-table schema: one row per measurement, the same columns in every part file.

Schema (``schema_version`` 2; one row per measurement; nothing is pickled)
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
kind               string                   ``measured`` / ``simulated`` / ``analytic`` /
                                            ``profiled``
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
schema_version     int32                    the schema version the row was written with
=================  =======================  ==================================================

Versions: 1, the first; 2 adds rows of kind ``profiled`` (a toolchain's in-network operator
profile of a whole model, `runners.profile`: fingerprint ``profile:...``, the unprofiled
whole-model samples as samples, the profile as JSON in ``details``). The columns are the same,
so version-1 tables read (and DuckDB queries them) unchanged, and a table may hold rows of
both versions; readers that want candidate costs skip ``profiled`` rows by their fingerprint.

`schema_markdown()` renders the same table as Markdown for the README. Every part file also
carries, in its Parquet key-value metadata, the schema version (`SCHEMA_VERSION_KEY`) and, for a
file written by compaction, the names of the files it replaces (`REPLACES_KEY`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = 2
#: Parquet key-value metadata key: JSON list of the file names a compacted file replaces.
REPLACES_KEY = b"collage_farm.replaces"
SCHEMA_VERSION_KEY = b"collage_farm.schema_version"


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
    Column("kind", pa.string(), "string",
           "`measured` / `simulated` / `analytic` / `profiled` (schema 2)"),
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
#: the string, float and list columns (how rows are checked and read back)
STR_COLUMNS = frozenset(c.name for c in COLUMNS if c.type == pa.string())
FLOAT_COLUMNS = frozenset(c.name for c in COLUMNS if c.type == pa.float64())
LIST_COLUMNS = ("samples", "nodes", "op_types")


def schema_markdown() -> str:
    """The schema as a Markdown table (the README includes it)."""
    lines = ["| column | type | meaning |", "|---|---|---|"]
    lines += [f"| `{c.name}` | {c.label} | {c.doc} |" for c in COLUMNS]
    return "\n".join(lines) + "\n"


def empty_table() -> pa.Table:
    """A table with the cost-table schema and no rows."""
    return SCHEMA.empty_table()
