"""The Parquet cost table: every measurement the farm ever took, reusable by later campaigns.

A cost table is a directory of immutable Parquet part files with one schema, appended to by
writers, read as one table with each row exactly once, merged by compaction, and queried with
DuckDB. One module per concept:

* `schema`: the columns (`COLUMNS`, `SCHEMA`, `NAMES`), the version, `schema_markdown`;
* `rows`: a row from a runner's result (`row_from_result`), checked (`normalize_row`), read
  back (`CostRow`);
* `parts`: one part file staged, fsynced and renamed in (`write_part`), `check_writable`,
  `staging_dir`, `rescue_dir`;
* `writer`: `CostTableWriter`, the buffered writer a campaign holds (its flush policy);
* `reader`: `CostTable`, the directory read as one table (bad files skipped, each row once);
* `lookup`: which row answers for a candidate (strictness, retry of failures, newest ok row);
* `compact` and `export`: merging the part files, writing the table to one file;
* `query`: summaries and DuckDB SQL over the table;
* `store`: `TableStore`, the table as the estimators' `estimators.sources.CostStore`;
* `decisions` and `inchain`: a campaign's verified plan decision and its in-chain prices as
  rows, so that a re-run or an offline search on the table reproduces it.

The schema table (every column, its type and meaning) is in `collage_farm.costtable.schema`.
"""

from collage_farm.costtable.compact import CompactResult, compact
from collage_farm.costtable.errors import CostTableError, CostTableWarning
from collage_farm.costtable.export import EXPORT_FORMATS, export
from collage_farm.costtable.lookup import (
    RETRY,
    STRICTNESS,
    TRANSIENT_ATTEMPTS,
    TRANSIENT_STATUSES,
)
from collage_farm.costtable.parts import (
    COMPACT_TAG,
    PART_SUFFIX,
    ROW_GROUP_ROWS,
    check_writable,
    part_name,
    rescue_dir,
    staging_dir,
    write_part,
)
from collage_farm.costtable.reader import CostTable
from collage_farm.costtable.rows import (
    CostRow,
    normalize_row,
    row_from_result,
    rows_from_table,
    rows_to_table,
    to_json,
)
from collage_farm.costtable.schema import (
    COLUMNS,
    NAMES,
    REPLACES_KEY,
    SCHEMA,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    Column,
    empty_table,
    schema_markdown,
)
from collage_farm.costtable.store import CONFIRM_DETAIL, TableStore
from collage_farm.costtable.writer import CostTableWriter

__all__ = [
    "COLUMNS",
    "COMPACT_TAG",
    "CONFIRM_DETAIL",
    "EXPORT_FORMATS",
    "NAMES",
    "PART_SUFFIX",
    "REPLACES_KEY",
    "RETRY",
    "ROW_GROUP_ROWS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SCHEMA_VERSION_KEY",
    "STRICTNESS",
    "TRANSIENT_ATTEMPTS",
    "TRANSIENT_STATUSES",
    "Column",
    "CompactResult",
    "CostRow",
    "CostTable",
    "CostTableError",
    "CostTableWarning",
    "CostTableWriter",
    "TableStore",
    "check_writable",
    "compact",
    "empty_table",
    "export",
    "normalize_row",
    "part_name",
    "rescue_dir",
    "row_from_result",
    "rows_from_table",
    "rows_to_table",
    "schema_markdown",
    "staging_dir",
    "to_json",
    "write_part",
]
