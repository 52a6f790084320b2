"""``collage-farm costs``: look at, query, compact and export a cost-table directory.

The cost table is the farm's memory, so the commands that inspect it must be safe to run
while a campaign is writing: they read through `CostTable` (each row exactly once, corrupt or
foreign files skipped with a warning on stderr) and never modify part files, except
``compact``, which follows the table's atomic replace protocol.

    collage-farm costs show DIR [--json]
    collage-farm costs query DIR "select target, median(median) from costs group by 1" [--json]
    collage-farm costs compact DIR [--quarantine]
    collage-farm costs export DIR -o FILE [--format csv|parquet|json]

A missing directory is a user error: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from collage_farm.costtable import PART_SUFFIX, CostTable, compact, export

EXIT_USAGE = 2
_MAX_CELL = 60


def add_costs_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``costs show|query|compact|export DIR`` on the main CLI's subparsers."""
    p = subparsers.add_parser("costs", help="inspect, query, compact and export cost tables",
                              description=__doc__.split("\n\n")[1] if __doc__ else None)
    cs = p.add_subparsers(dest="costs_cmd", required=True)

    s = cs.add_parser("show", help="summary: rows, files, size, per target/status, campaigns")
    s.add_argument("dir", help="cost table directory")
    s.add_argument("--json", action="store_true", help="print the summary as JSON")

    q = cs.add_parser("query", help="run DuckDB SQL; the table is the view `costs`")
    q.add_argument("dir", help="cost table directory")
    q.add_argument("sql", help='e.g. "select target, median(median) from costs group by 1"')
    q.add_argument("--json", action="store_true", help="print rows as JSON records")

    c = cs.add_parser("compact", help="merge the part files into one (atomic, exactly once)")
    c.add_argument("dir", help="cost table directory")
    c.add_argument("--quarantine", action="store_true",
                   help="move unreadable part files to DIR.quarantine/")
    c.add_argument("--json", action="store_true", help="print the result as JSON")

    e = cs.add_parser("export", help="write the whole table to one CSV, Parquet or JSON file")
    e.add_argument("dir", help="cost table directory")
    e.add_argument("-o", "--output", required=True, help="output file")
    e.add_argument("--format", choices=["csv", "parquet", "json"],
                   help="output format (default: from the output suffix, else csv)")
    p.set_defaults(func=run_costs)
    return p


def run_costs(args: argparse.Namespace) -> int:
    """Run one ``costs`` subcommand; returns the exit status."""
    directory = Path(args.dir)
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "not found"
        print(f"collage-farm costs {args.costs_cmd}: error: cost table directory {what}: "
              f"{directory}", file=sys.stderr)
        return EXIT_USAGE
    if (directory / "plan.json").is_file() and not any(directory.glob(f"*{PART_SUFFIX}")):
        hint = directory / "costs"
        print(f"collage-farm costs {args.costs_cmd}: error: {directory} is a plan directory, "
              f"not a cost table" + (f": did you mean {hint}?" if hint.is_dir() else ""),
              file=sys.stderr)
        return EXIT_USAGE
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            status = _dispatch(args, directory)
        finally:
            for w in caught:  # skipped files: say so on stderr, not in the output
                print(f"warning: {w.message}", file=sys.stderr)
    return status


def _dispatch(args: argparse.Namespace, directory: Path) -> int:
    cmd = args.costs_cmd
    if cmd == "show":
        summary = CostTable(directory).summary()
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            print(format_summary(summary))
        return 0
    if cmd == "query":
        import duckdb  # heavy (~0.2 s): only this subcommand needs it

        try:
            result = CostTable(directory).query(args.sql)
        except duckdb.Error as e:
            print(f"collage-farm costs query: error: {e}", file=sys.stderr)
            return EXIT_USAGE
        records = result.to_pylist()
        if args.json:
            print(json.dumps([{k: _jsonable(v) for k, v in r.items()} for r in records],
                             indent=2))
        else:
            print(format_table(result.column_names,
                               [[r[c] for c in result.column_names] for r in records]))
        return 0
    if cmd == "compact":
        res = compact(directory, quarantine=args.quarantine)
        if args.json:
            print(json.dumps({"files_before": res.files_before, "files_after": res.files_after,
                              "rows": res.rows, "output": str(res.output) if res.output else None,
                              "removed": list(res.removed), "skipped": list(res.skipped),
                              "quarantined": list(res.quarantined)}, indent=2))
        elif res.output is None and not res.removed:
            print(f"{directory}: nothing to compact ({res.files_before} file(s), "
                  f"{res.rows} rows)")
        else:
            print(f"{directory}: {res.files_before} file(s) -> {res.files_after}, "
                  f"{res.rows} rows" + (f"; wrote {res.output.name}" if res.output else ""))
        if res.skipped:
            verb = "moved to quarantine" if res.quarantined else "left in place"
            print(f"{len(res.skipped)} unreadable file(s) {verb}: {', '.join(res.skipped)}",
                  file=sys.stderr)
        return 0
    if cmd == "export":
        out = Path(args.output)
        fmt = args.format or {".parquet": "parquet", ".json": "json"}.get(out.suffix, "csv")
        n = export(directory, out, fmt)
        print(f"wrote {n} rows to {out} ({fmt})")
        return 0
    raise AssertionError(f"unknown costs command {cmd!r}")


# ----------------------------------------------------------------------------------------
# text output


def _jsonable(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    return str(v)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, datetime):
        return v.isoformat(sep=" ", timespec="seconds")
    text = str(v)
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 3] + "..."


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain aligned text table (numbers right-aligned)."""
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))
    numeric = [all(isinstance(r[i], (int, float)) or r[i] is None for r in rows) and bool(rows)
               for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [line(list(headers)), line(["-" * w for w in widths])]
    out += [line(r) for r in cells]
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def format_summary(s: dict[str, Any]) -> str:
    """The ``costs show`` text: totals, per-target status counts, campaigns."""
    lines = [f"cost table {s['path']}",
             f"  rows {s['rows']}, files {s['files']}, size {_size(s['bytes'])}"]
    if s["first"]:
        lines.append(f"  created {s['first']} .. {s['last']}")
    if s["replaced_leftovers"]:
        lines.append(f"  {s['replaced_leftovers']} file(s) already replaced by a compacted "
                     f"file (run `collage-farm costs compact`)")
    for sk in s["skipped"]:
        lines.append(f"  skipped {sk['file']}: {sk['reason']}")
    if s["targets"]:
        statuses = sorted(s["statuses"], key=lambda x: (x != "ok", x))
        rows = [[t, *(counts.get(st, 0) for st in statuses), sum(counts.values())]
                for t, counts in s["targets"].items()]
        rows.append(["(all)", *(s["statuses"][st] for st in statuses), s["rows"]])
        lines += ["", format_table(["target", *statuses, "total"], rows)]
    if s["campaigns"]:
        rows = [[c["campaign_id"] or "(none)", c["rows"], c["first"], c["last"],
                 ",".join(c["models"])] for c in s["campaigns"]]
        lines += ["", format_table(["campaign", "rows", "first", "last", "models"], rows)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Standalone entry point: ``python -m collage_farm.cli.costs show DIR``."""
    parser = argparse.ArgumentParser(prog="collage-farm")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add_costs_parser(sub)
    args = parser.parse_args(["costs", *(sys.argv[1:] if argv is None else argv)])
    return run_costs(args)


if __name__ == "__main__":
    sys.exit(main())
