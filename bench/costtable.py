"""Benchmark the Parquet cost table: write throughput, reads at 1e5-1e6 rows, lookups.

Why: a campaign appends a row per measurement and looks costs up in batches after every
search expansion; an offline search reads a whole table once. This measures what those cost
on this machine, so the flush interval, cache and compaction advice in the README rests on
numbers:

* writes: `CostTableWriter` end to end (`row_from_result` + append + flush) and the cost of one
  flush (stage, fsync, rename) by part size;
* reads of 1e5 and 1e6 rows (20 samples each) in 20 part files and compacted: `CostTable.read`
  cold and cached, ``pq.read_table(dir)``, DuckDB ``count``/filter/group-by over the glob and
  through `CostTable.query`;
* `CostTable.lookup` of 10k keys (half hits), cold and cached; and `compact`.

Results go to bench/results/costtable-<host>.md with the machine they ran on.

    python bench/costtable.py [--rows 100000 1000000] [--out bench/results]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_farm.core.target import BUILTIN_TARGETS
from collage_farm.costtable import (
    SCHEMA,
    CostTable,
    CostTableWriter,
    compact,
    write_part,
)
from runners.base import (
    DeviceDescription,
    MeasureConfig,
    MeasureResult,
    Status,
    Summary,
)

SAMPLES = 20
TARGETS = ["ort-cpu", "openvino-cpu", "ort-cuda", "ethos-u55-128"]


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f"{kb / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "host": socket.gethostname(),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "memory": mem,
        "python": platform.python_version(),
        "pyarrow": pa.__version__,
        "duckdb": duckdb.__version__,
        "os": platform.platform(),
    }


def timeit(fn: Callable[[], object], repeat: int = 3) -> float:
    """Median wall time of ``repeat`` calls, seconds."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def synthetic(n: int, seed: int = 0) -> pa.Table:
    """``n`` realistic rows: 4 targets, 5% failed, 20 samples, 3 node names each."""
    rng = np.random.default_rng(seed)
    targets = [BUILTIN_TARGETS[t] for t in TARGETS]
    ti = rng.integers(0, len(targets), n)
    ok = rng.random(n) >= 0.05
    med = rng.lognormal(-9, 1.5, n)
    samples = np.where(ok[:, None], med[:, None] * rng.normal(1, 0.02, (n, SAMPLES)), np.nan)
    counts = np.where(ok, SAMPLES, 0)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    flat = samples[ok].ravel()
    node_off = np.arange(0, 3 * n + 1, 3, dtype=np.int32)
    node_names = pa.array([f"node_{i}" for i in range(3 * n)], pa.string())
    t0 = int(datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp() * 1e6)
    dev = DeviceDescription.host_cpu().describe()
    cols = {
        "fingerprint": pa.array([f"{i * 2654435761 % 2**64:016x}" for i in range(n)]),
        "target": pa.array([targets[i].id for i in ti]),
        "target_key": pa.array([targets[i].measure_key for i in ti]),
        "toolchain": pa.array([targets[i].toolchain for i in ti]),
        "toolchain_version": pa.array(["1.31.1"] * n),
        "device": pa.array([dev] * n),
        "device_kind": pa.array([targets[i].device.kind for i in ti]),
        "measure_config": pa.array([MeasureConfig().to_json()] * n),
        "status": pa.array(np.where(ok, "ok", "build_failed").tolist()),
        "error": pa.array(np.where(ok, "", "unsupported op").tolist()),
        "kind": pa.array(["measured"] * n),
        "samples": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, pa.float64())),
        "median": pa.array(np.where(ok, med, np.nan), from_pandas=True),
        "mean": pa.array(np.where(ok, med, np.nan), from_pandas=True),
        "std": pa.array(np.where(ok, med * 0.02, np.nan), from_pandas=True),
        "p10": pa.array(np.where(ok, med * 0.98, np.nan), from_pandas=True),
        "p90": pa.array(np.where(ok, med * 1.02, np.nan), from_pandas=True),
        "min": pa.array(np.where(ok, med * 0.97, np.nan), from_pandas=True),
        "n": pa.array(counts.astype(np.int64)),
        "cv": pa.array(np.where(ok, 0.01, np.nan), from_pandas=True),
        "build_s": pa.array(rng.random(n)),
        "measure_s": pa.array(rng.random(n)),
        "campaign_id": pa.array([f"c{i % 7}" for i in range(n)]),
        "model": pa.array(["resnet50"] * n),
        "nodes": pa.ListArray.from_arrays(pa.array(node_off), node_names),
        "op_types": pa.ListArray.from_arrays(pa.array(node_off),
                                             pa.array(["Conv", "Add", "Relu"] * n)),
        "created_at": pa.array(t0 + np.arange(n) * 1000, pa.int64()).cast(
            pa.timestamp("us", tz="UTC")),
        "details": pa.array(["{}"] * n),
        "schema_version": pa.array(np.ones(n, np.int32)),
    }
    return pa.table(cols, schema=SCHEMA)


def bench_writes(root: Path, lines: list[str]) -> None:
    t = BUILTIN_TARGETS["ort-cpu"]
    dev = DeviceDescription.host_cpu()
    cfg = MeasureConfig()
    rng = np.random.default_rng(1)
    n = 20_000
    results = []
    for i in range(n):
        s = tuple(float(x) for x in rng.lognormal(-9, 0.1, SAMPLES))
        results.append(MeasureResult(f"fp{i:08d}", t, Status.OK, cfg, samples=s,
                                     summary=Summary.of(s), device=dev,
                                     toolchain_version="1.31.1"))
    lines += ["## Writes", "",
              "| what | rows | seconds | rows/s | files |", "|---|---:|---:|---:|---:|"]
    for label, kw in [("append_result, flush every 2 s (default)", {}),
                      ("append_result, max_rows=100", {"max_rows": 100}),
                      ("append_result, max_rows=100, no fsync",
                       {"max_rows": 100, "durable": False})]:
        d = root / f"w{len(lines)}"
        t0 = time.perf_counter()
        with CostTableWriter(d, campaign_id="bench", **kw) as w:
            for r in results:
                w.append_result(r, model="resnet50", nodes=("a", "b", "c"),
                                op_types=("Conv", "Add", "Relu"))
        dt = time.perf_counter() - t0
        files = len(list(d.glob("*.parquet")))
        assert CostTable(d).read().num_rows == n
        lines.append(f"| {label} | {n} | {dt:.2f} | {n / dt:,.0f} | {files} |")
    lines += ["", "One flush (stage outside the directory, write, fsync file, rename, "
              "fsync directory):", "",
              "| rows per part | ms per flush (fsync) | ms per flush (no fsync) |",
              "|---:|---:|---:|"]
    for size in (1, 10, 100, 1000, 10_000):
        part = synthetic(size, seed=size)
        d = root / f"flush{size}"
        with_sync = timeit(lambda p=part, d=d: write_part(d, p), repeat=7)
        without = timeit(lambda p=part, d=d: write_part(d, p, durable=False), repeat=7)
        lines.append(f"| {size} | {with_sync * 1e3:.1f} | {without * 1e3:.1f} |")
    lines.append("")


def bench_reads(root: Path, n: int, lines: list[str]) -> None:
    d = root / f"r{n}"
    table = synthetic(n)
    parts = 20
    step = -(-n // parts)
    t0 = time.perf_counter()
    for i in range(parts):
        write_part(d, table.slice(i * step, step), tag="bench")
    t_write = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in d.glob("*.parquet"))
    glob = f"read_parquet('{d}/*.parquet')"
    con = duckdb.connect()

    def duck(sql: str) -> Callable[[], object]:
        return lambda: con.execute(sql).fetchall()

    fps = table["fingerprint"].to_pylist()
    tks = table["target_key"].to_pylist()
    rng = np.random.default_rng(2)
    idx = rng.choice(n, 5000, replace=False)
    keys = [(fps[i], tks[i]) for i in idx] + [(f"missing{i}", tks[0]) for i in range(5000)]
    device = DeviceDescription.host_cpu().describe()
    lines += [f"## {n:,} rows ({SAMPLES} samples each), {parts} part files, "
              f"{size / 2**20:.1f} MiB", "",
              f"Writing the {parts} parts (write_part with fsync): {t_write:.2f} s.", "",
              "| operation | seconds |", "|---|---:|"]

    def row(label: str, fn: Callable[[], object], repeat: int = 3) -> None:
        lines.append(f"| {label} | {timeit(fn, repeat):.3f} |")

    for layout in ("parts", "compacted"):
        if layout == "compacted":
            t0 = time.perf_counter()
            res = compact(d)
            lines.append(f"| compact {res.files_before} files -> 1 | "
                         f"{time.perf_counter() - t0:.3f} |")
        tag = f"[{layout}]"
        row(f"{tag} CostTable(dir).read(), cold", lambda: CostTable(d).read())
        warm = CostTable(d)
        warm.read()
        row(f"{tag} CostTable.read(), cached", warm.read, repeat=5)
        row(f"{tag} pq.read_table(dir)", lambda: pq.read_table(d))
        row(f"{tag} pq.read_table(dir, columns=[fingerprint, target_key, median])",
            lambda: pq.read_table(d, columns=["fingerprint", "target_key", "median"]))
        row(f"{tag} DuckDB count(*) over the glob", duck(f"select count(*) from {glob}"))
        row(f"{tag} DuckDB filter (target, status) over the glob",
            duck(f"select count(*), avg(median) from {glob} "
                 f"where target = 'openvino-cpu' and status = 'ok'"))
        row(f"{tag} DuckDB group by target, median(median) over the glob",
            duck(f"select target, median(median) from {glob} group by 1"))
        row(f"{tag} CostTable.query group by (explicit file list)",
            lambda: CostTable(d).query("select target, median(median) from costs group by 1"))
        row(f"{tag} lookup 10k keys (5k hits), cold",
            lambda: CostTable(d).lookup(keys, device, "1.31.1"))
        row(f"{tag} lookup 10k keys (5k hits), cached table",
            lambda w=warm: w.lookup(keys, device, "1.31.1"), repeat=5)
        row(f"{tag} lookup 100 keys, cached table",
            lambda w=warm: w.lookup(keys[:50] + keys[-50:], device, "1.31.1"), repeat=5)
        hits = warm.lookup(keys, device, "1.31.1")
        assert len(hits) == 5000, len(hits)
    lines.append("")
    shutil.rmtree(d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--tmp", help="scratch directory (default: the system temp dir)")
    args = ap.parse_args(argv)
    m = machine()
    lines = [f"# Cost table benchmark on {m['host']}", "",
             f"- date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}"]
    lines += [f"- {k}: {v}" for k, v in m.items()]
    lines += ["- command: `python bench/costtable.py " + " ".join(argv or sys.argv[1:]) + "`",
              ""]
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        root = Path(tmp)
        lines.append(f"Scratch filesystem: {root} "
                     f"({os.statvfs(root).f_bsize}-byte blocks). Times are medians of 3-7 "
                     f"runs; 'cold' opens a new CostTable (parses every file).")
        lines.append("")
        bench_writes(root, lines)
        print("\n".join(lines), flush=True)
        mark = len(lines)
        for n in args.rows:
            bench_reads(root, n, lines)
            print("\n".join(lines[mark:]), flush=True)
            mark = len(lines)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"costtable-{m['host']}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
