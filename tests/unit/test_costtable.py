"""Cost-table tests: the table is the farm's memory, so every promise it makes is tested here.

Round trips through pyarrow, pandas and DuckDB; the lookup rule; failed rows as invalid
costs; bad part files skipped with a warning naming them; a writer killed mid-write loses
nothing already flushed; two writer processes keep every row; compaction keeps every row
exactly once (also while writers and readers run); a property test over random sequences of
appends, flushes and compactions. Results are built directly from `runners.base` messages.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings
from datetime import datetime, timedelta, timezone
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import collage_farm.costtable as ct
import collage_farm.costtable.reader as ct_reader
import collage_farm.costtable.schema as ct_schema
import collage_farm.costtable.writer as ct_writer
from collage_farm.cli import costs as cli_costs
from collage_farm.core.target import BUILTIN_TARGETS
from collage_farm.costtable import (
    NAMES,
    SCHEMA,
    SCHEMA_VERSION,
    CostRow,
    CostTable,
    CostTableWarning,
    CostTableWriter,
    compact,
    export,
    row_from_result,
    schema_markdown,
)
from runners.base import DeviceDescription, Kind, MeasureConfig, MeasureResult, Status, Summary

REPO = Path(__file__).resolve().parents[2]
T_ORT = BUILTIN_TARGETS["ort-cpu"]
T_OV = BUILTIN_TARGETS["openvino-cpu"]
T_U55 = BUILTIN_TARGETS["ethos-u55-128"]
DEV_A = DeviceDescription("cpu", "Test CPU A", 2)
DEV_B = DeviceDescription("cpu", "Test CPU B", 8)
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def ok_result(fp: str, median: float = 1e-3, *, target=T_ORT, device=DEV_A,
              version: str = "1.0", kind: Kind = Kind.MEASURED) -> MeasureResult:
    samples = (median * 0.9, median, median * 1.1)
    return MeasureResult(fp, target, Status.OK, MeasureConfig(rounds=3), samples=samples,
                         summary=Summary.of(samples), kind=kind, device=device,
                         toolchain_version=version, build_s=0.5, measure_s=0.25,
                         details=(("cycles", (10, 20)), ("peak", float("inf"))))


def failed_result(fp: str, *, target=T_ORT, device=DEV_A, version: str = "1.0",
                  status: Status = Status.BUILD_FAILED) -> MeasureResult:
    return MeasureResult(fp, target, status, MeasureConfig(), error=f"{status.value}: boom",
                         device=device, toolchain_version=version)


def row(result: MeasureResult, at: int = 0, campaign: str = "c") -> dict:
    return row_from_result(result, campaign_id=campaign, model="m.onnx", nodes=["n1", "n2"],
                           op_types=["Conv", "Relu"], created_at=T0 + timedelta(seconds=at))


def write_rows(directory: Path, rows: list[dict], per_file: int = 0) -> None:
    with CostTableWriter(directory, background=False, max_rows=per_file or 10**6) as w:
        w.extend(rows)


def simple_rows(n: int, prefix: str = "fp", start: int = 0) -> list[dict]:
    return [row(ok_result(f"{prefix}{i}", 1e-4 * (i + 1)), at=i) for i in range(start, start + n)]


def duck_count(d: Path) -> int:
    """Rows DuckDB sees when it globs the directory itself."""
    con = duckdb.connect()
    return con.execute(f"select count(*) from read_parquet('{d}/*.parquet')").fetchone()[0]


def fingerprints(table: pa.Table) -> list[str]:
    return sorted(table["fingerprint"].to_pylist())


# ----------------------------------------------------------------------------------------
# schema and rows


def test_schema_is_documented_everywhere() -> None:
    md = schema_markdown()
    doc = ct_schema.__doc__ or ""
    assert md.startswith("| column | type | meaning |")
    for name in NAMES:
        assert f"`{name}`" in md
        assert f"\n{name} " in doc, f"{name} missing from the schema module docstring's table"
    assert tuple(f.name for f in __import__("dataclasses").fields(CostRow)) == NAMES
    assert SCHEMA.field("created_at").type == pa.timestamp("us", tz="UTC")
    assert SCHEMA.field("samples").type == pa.list_(pa.float64())
    assert SCHEMA.field("nodes").type == pa.list_(pa.string())


def test_row_from_result_ok_and_failed() -> None:
    r = row(ok_result("a", 2e-3, target=T_U55, kind=Kind.SIMULATED))
    assert list(r) == list(NAMES)
    assert r["target"] == "ethos-u55-128" and r["target_key"] == T_U55.measure_key
    assert r["toolchain"] == "vela" and r["kind"] == "simulated" and r["status"] == "ok"
    assert r["device"] == DEV_A.describe() and r["device_kind"] == "cpu"
    assert r["median"] == pytest.approx(2e-3) and r["n"] == 3 and len(r["samples"]) == 3
    assert MeasureConfig.from_json(r["measure_config"]) == MeasureConfig(rounds=3)
    assert json.loads(r["details"]) == {"cycles": [10, 20], "peak": "inf"}  # strict JSON
    f = row(failed_result("b", status=Status.TIMEOUT))
    assert f["status"] == "timeout" and "boom" in f["error"]
    assert f["median"] is None and f["n"] == 0 and f["samples"] == []
    assert CostRow.from_dict(f).seconds == float("inf")
    assert CostRow.from_dict(r).seconds == pytest.approx(2e-3)
    assert CostRow.from_dict(r).config == MeasureConfig(rounds=3)


def test_append_rejects_bad_rows(tmp_path: Path) -> None:
    with CostTableWriter(tmp_path / "t", background=False) as w:
        with pytest.raises(ValueError, match="unknown cost-table columns"):
            w.append({**row(ok_result("a")), "bogus": 1})
        with pytest.raises(TypeError, match="median"):
            w.append({**row(ok_result("a")), "median": "fast"})
        with pytest.raises(ValueError, match="fingerprint"):
            w.append({"target_key": "k", "status": "ok"})
        w.append({"fingerprint": "x", "target_key": "k", "status": Status.OK})  # defaults
    (only,) = CostTable(tmp_path / "t").rows()
    assert only.status == "ok" and only.seconds == float("inf")  # ok without a median
    assert only.schema_version == SCHEMA_VERSION == 2 and only.details == "{}"


# ----------------------------------------------------------------------------------------
# writing, reading, round trips


def test_round_trip_pyarrow_pandas_duckdb(tmp_path: Path) -> None:
    d = tmp_path / "costs"
    rows = [*simple_rows(30), row(failed_result("bad"), at=99)]
    write_rows(d, rows, per_file=7)
    # a crashed writer's leftover in the staging dir must not bother anyone
    stage = ct.staging_dir(d)
    assert stage == d / ".staging"  # hidden inside the table: nothing beside it
    assert sorted(p.name for p in d.parent.iterdir()) == ["costs"]
    (stage / "host-1-0123456789abcdef0123456789abcdef.parquet.tmp").write_bytes(b"PAR1garbage")
    assert len(list(d.glob("*.parquet"))) == 5

    def check_all_readers() -> None:
        want = sorted(r["fingerprint"] for r in rows)
        mine = CostTable(d).read()
        assert fingerprints(mine) == want
        assert mine.schema == SCHEMA
        assert fingerprints(pq.read_table(d)) == want
        df = pd.read_parquet(d)
        assert sorted(df["fingerprint"]) == want
        assert df.loc[df.fingerprint == "fp3", "median"].iloc[0] == pytest.approx(4e-4)
        con = duckdb.connect()
        # epoch_us: fetching TIMESTAMPTZ values into Python needs pytz, not a dependency
        got = con.sql(f"select fingerprint, median, samples, epoch_us(created_at) from "
                      f"read_parquet('{d}/*.parquet') order by fingerprint").fetchall()
        assert sorted(g[0] for g in got) == want
        by_fp = {g[0]: g for g in got}
        assert by_fp["fp0"][1] == pytest.approx(1e-4) and len(by_fp["fp0"][2]) == 3
        assert by_fp["bad"][1] is None
        assert by_fp["fp5"][3] == int((T0 + timedelta(seconds=5)).timestamp() * 1e6)
        agg = con.sql(f"select target, count(*) from read_parquet('{d}/*.parquet') "
                      f"group by 1").fetchall()
        assert agg == [("ort-cpu", 31)]

    check_all_readers()
    res = compact(d)
    assert res.files_before == 5 and res.files_after == 1 and res.rows == 31
    assert [p.name for p in d.glob("*.parquet")] == [res.output.name]
    check_all_readers()
    # round trip of values: CostRow equals what was written
    back = {r.fingerprint: r for r in CostTable(d).rows()}
    for r in rows:
        assert back[r["fingerprint"]] == CostRow.from_dict(r)


def test_missing_directory_reads_empty(tmp_path: Path) -> None:
    t = CostTable(tmp_path / "nothing")
    assert t.read().num_rows == 0 and t.read().schema == SCHEMA
    assert t.lookup([("a", "b")]) == {}
    assert t.summary()["rows"] == 0


def test_read_filters(tmp_path: Path) -> None:
    d = tmp_path / "t"
    write_rows(d, [row(ok_result("a")), row(ok_result("b", target=T_OV)),
                   row(failed_result("c"))])
    t = CostTable(d)
    assert fingerprints(t.read({"status": "ok"})) == ["a", "b"]
    assert fingerprints(t.read({"target": ["openvino-cpu", "nope"]})) == ["b"]
    assert fingerprints(t.read([("status", "!=", "ok")])) == ["c"]
    assert fingerprints(t.read(pa.compute.field("fingerprint") == "a")) == ["a"]
    assert t.read(columns=["target", "median"]).column_names == ["target", "median"]


def test_writer_flush_policy(tmp_path: Path) -> None:
    d = tmp_path / "t"
    # max_rows flushes on append
    w = CostTableWriter(d, background=False, max_rows=3, flush_interval_s=3600)
    w.extend(simple_rows(7))
    assert w.rows_written == 6 and w.pending == 1 and len(w.files_written) == 2
    w.close()
    assert CostTable(d).read().num_rows == 7
    with pytest.raises(ValueError, match="closed"):
        w.append(row(ok_result("late")))
    # the age check on append (no timer thread)
    d2 = tmp_path / "t2"
    w = CostTableWriter(d2, background=False, max_rows=1000, flush_interval_s=0.05)
    w.append(row(ok_result("x")))
    assert w.pending == 1
    time.sleep(0.08)
    w.append(row(ok_result("y")))
    assert w.pending == 0 and w.rows_written == 2
    w.close()
    # the background timer flushes without further appends
    d3 = tmp_path / "t3"
    with CostTableWriter(d3, max_rows=1000, flush_interval_s=0.05) as w:
        w.append(row(ok_result("z")))
        deadline = time.monotonic() + 5
        while w.rows_written == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert w.rows_written == 1 and w.pending == 0
        assert fingerprints(CostTable(d3).read()) == ["z"]


def test_failed_flush_keeps_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "t"
    real = ct_writer.write_part
    calls = {"n": 0}

    def flaky(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError("disk full")
        return real(*a, **kw)

    monkeypatch.setattr(ct_writer, "write_part", flaky)
    w = CostTableWriter(d, background=False)
    w.extend(simple_rows(3))
    with pytest.raises(OSError, match="disk full"):
        w.flush()
    assert w.pending == 3 and w.rows_written == 0
    w.append(row(ok_result("fp3")))
    w.close()
    assert fingerprints(CostTable(d).read()) == ["fp0", "fp1", "fp2", "fp3"]
    assert not list(ct.staging_dir(d).iterdir())  # the failed attempt left nothing staged


def test_in_directory_staging_fallback(tmp_path: Path) -> None:
    d = tmp_path / "t"
    d.mkdir()
    (d / ".staging").write_text("a file where the staging dir would go")
    write_rows(d, simple_rows(4), per_file=2)
    assert ct.staging_dir(d) == d
    assert len(list(d.glob("*.parquet"))) == 2 and not list(d.glob(".staging-*"))
    assert duck_count(d) == 4
    assert compact(d).rows == 4
    assert (d / "_compact.lock").exists()  # ignored by pyarrow (leading _), not *.parquet
    assert pq.read_table(d).num_rows == duck_count(d) == CostTable(d).read().num_rows == 4


# ----------------------------------------------------------------------------------------
# lookup


def test_lookup_strictness(tmp_path: Path) -> None:
    d = tmp_path / "t"
    k = T_ORT.measure_key
    write_rows(d, [
        row(ok_result("f", 1.0, device=DEV_A, version="1.0"), at=1),
        row(ok_result("f", 2.0, device=DEV_A, version="2.0"), at=2),
        row(ok_result("f", 3.0, device=DEV_B, version="2.0"), at=3),
        row(ok_result("f", 9.0, target=T_OV, device=DEV_A, version="1.0"), at=4),
        row(ok_result("g", 5.0, device=DEV_B, version="1.0"), at=5),
    ])
    t = CostTable(d)
    a, b = DEV_A.describe(), DEV_B.describe()
    keys = [("f", k), ("g", k), ("missing", k)]

    exact = t.lookup(keys, a, "1.0")
    assert set(exact) == {("f", k)} and exact["f", k].seconds == 1.0
    assert t.lookup(keys, a, "3.0") == {}
    assert t.lookup(keys, b, "1.0", "exact")["g", k].seconds == 5.0

    dev = t.lookup(keys, a, "3.0", strictness="device")  # any version on device A
    assert dev["f", k].seconds == 2.0 and ("g", k) not in dev

    anyr = t.lookup(keys, a, "3.0", strictness="any")  # newest ok anywhere
    assert anyr["f", k].seconds == 3.0 and anyr["g", k].seconds == 5.0
    assert ("missing", k) not in anyr

    # openvino's row never answers for ort's key
    assert t.lookup([("f", T_OV.measure_key)], None, None, "any")[
        "f", T_OV.measure_key].seconds == 9.0
    # None does not constrain; mappings give one value per target_key
    assert t.lookup([("f", k)], None, "1.0")["f", k].seconds == 1.0
    assert t.lookup([("f", k)], {k: b}, {k: "2.0"})["f", k].seconds == 3.0
    assert t.lookup([("f", k)], {"other": b}, None)["f", k].seconds == 3.0
    with pytest.raises(ValueError, match="strictness"):
        t.lookup(keys, a, "1.0", strictness="fuzzy")


def test_lookup_failed_rows_answer_invalid_only_without_ok(tmp_path: Path) -> None:
    d = tmp_path / "t"
    k = T_ORT.measure_key
    write_rows(d, [
        row(ok_result("recovered", 2e-3), at=1),
        row(failed_result("recovered", status=Status.CRASHED), at=2),  # newer, but failed
        row(failed_result("broken"), at=1),
        row(failed_result("broken", status=Status.TIMEOUT), at=3),
        row(ok_result("twice", 5e-3), at=1),
        row(ok_result("twice", 4e-3), at=7),
        row(ok_result("twice", 6e-3), at=3),
    ])
    got = CostTable(d).lookup([("recovered", k), ("broken", k), ("twice", k)],
                              DEV_A.describe(), "1.0")
    assert got["recovered", k].seconds == pytest.approx(2e-3) and got["recovered", k].ok
    assert got["broken", k].seconds == float("inf") and got["broken", k].status == "timeout"
    assert got["broken", k].cost.is_invalid
    assert got["twice", k].seconds == pytest.approx(4e-3)  # the newest ok row


def test_lookup_by_measure_mode(tmp_path: Path) -> None:
    """A network-mode campaign does not reuse warm timings (the cache state differs), but
    simulated rows and known failures answer in every mode."""
    import dataclasses

    d = tmp_path / "t"
    k, ku = T_ORT.measure_key, T_U55.measure_key

    def in_mode(res: MeasureResult, mode: str) -> MeasureResult:
        return dataclasses.replace(res, config=MeasureConfig(mode=mode))

    legacy = row(ok_result("legacy", 1e-3), at=1)
    cfg = json.loads(legacy["measure_config"])
    del cfg["mode"]  # written before modes existed: warm
    legacy["measure_config"] = json.dumps(cfg, sort_keys=True)
    write_rows(d, [
        row(in_mode(ok_result("both", 1e-3), "warm"), at=1),
        row(in_mode(ok_result("both", 3e-3), "network"), at=2),
        row(in_mode(ok_result("warm_only", 1e-3), "isolated"), at=1),  # old spelling of warm
        legacy,
        row(in_mode(ok_result("sim", 2e-3, target=T_U55, kind=Kind.SIMULATED), "warm"), at=1),
        row(failed_result("broken"), at=1),
    ])
    keys = [("both", k), ("warm_only", k), ("legacy", k), ("sim", ku), ("broken", k)]
    table = CostTable(d)
    net = table.lookup(keys, strictness="any", mode="network")
    assert net["both", k].seconds == pytest.approx(3e-3)
    assert ("warm_only", k) not in net and ("legacy", k) not in net
    assert net["sim", ku].seconds == pytest.approx(2e-3)  # Vela's estimate has no cache state
    assert net["broken", k].cost.is_invalid  # a build failure is one in every mode
    warm = table.lookup(keys, strictness="any", mode="warm")
    assert warm["both", k].seconds == pytest.approx(1e-3)  # older, but the right mode
    assert warm["warm_only", k].ok and warm["legacy", k].ok
    anymode = table.lookup(keys, strictness="any")
    assert anymode["both", k].seconds == pytest.approx(3e-3)  # no mode given: newest ok row
    with pytest.raises(ValueError, match="unknown measure mode"):
        table.lookup(keys, mode="lukewarm")


# ----------------------------------------------------------------------------------------
# bad files, caching


def _truncated(good: Path) -> bytes:
    data = good.read_bytes()
    return data[: len(data) // 2]


@pytest.mark.parametrize("kind", ["corrupt", "truncated", "foreign", "wrong_types", "empty"])
def test_bad_part_files_are_skipped_with_a_warning(tmp_path: Path, kind: str) -> None:
    d = tmp_path / "t"
    write_rows(d, simple_rows(5))
    (good,) = d.glob("*.parquet")
    bad = d / f"part-zz-{kind}.parquet"
    if kind == "corrupt":
        bad.write_bytes(b"PAR1 this is not parquet at all PAR1")
    elif kind == "truncated":
        bad.write_bytes(_truncated(good))
    elif kind == "foreign":
        pq.write_table(pa.table({"x": [1, 2, 3], "fingerprint": ["a", "b", "c"]}), bad)
    elif kind == "wrong_types":  # every column, but samples are text
        t = pq.read_table(good)
        i = t.column_names.index("samples")
        pq.write_table(t.set_column(i, "samples", pa.array(["?"] * t.num_rows)), bad)
    else:
        bad.write_bytes(b"")
    # ignored names: never read, never warned about
    (d / "_SUCCESS.parquet").write_bytes(b"junk")
    (d / ".hidden.parquet").write_bytes(b"junk")
    (d / "notes.txt").write_text("not a part")

    table = CostTable(d)
    with pytest.warns(CostTableWarning, match=bad.name) as rec:
        got = table.read()
    assert fingerprints(got) == [f"fp{i}" for i in range(5)]
    assert not any("_SUCCESS" in str(w.message) or ".hidden" in str(w.message) for w in rec)
    assert [p.name for p, _ in table.skipped()] == [bad.name]
    with warnings.catch_warnings():  # cached: no warning the second time
        warnings.simplefilter("error")
        assert table.read().num_rows == 5
    assert table.summary()["skipped"][0]["file"] == bad.name


def test_bad_files_survive_compaction_or_go_to_quarantine(tmp_path: Path) -> None:
    d = tmp_path / "t"
    write_rows(d, simple_rows(6), per_file=2)
    (d / "part-zz-bad.parquet").write_bytes(b"garbage")
    with pytest.warns(CostTableWarning, match="part-zz-bad"):
        res = compact(d)
    assert res.rows == 6 and res.skipped == ("part-zz-bad.parquet",)
    assert (d / "part-zz-bad.parquet").exists()
    with pytest.warns(CostTableWarning, match="part-zz-bad"):
        res = compact(d, quarantine=True)
    assert res.quarantined == ("part-zz-bad.parquet",)
    assert (tmp_path / "t.quarantine" / "part-zz-bad.parquet").exists()
    assert duck_count(d) == 6


def test_parsed_files_are_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "t"
    write_rows(d, simple_rows(4), per_file=2)
    reads: list[str] = []
    real = ct_reader.read_part
    monkeypatch.setattr(ct_reader, "read_part", lambda p, *a: reads.append(p.name) or real(p, *a))
    t = CostTable(d)
    assert t.read().num_rows == 4 and len(reads) == 2
    t.lookup([("fp0", T_ORT.measure_key)])
    assert t.read().num_rows == 4 and len(reads) == 2
    write_rows(d, simple_rows(1, start=4))
    assert t.read().num_rows == 5 and len(reads) == 3


# ----------------------------------------------------------------------------------------
# crashes and concurrency

_CHILD_PRELUDE = """
import os, sys, time
sys.path.insert(0, {repo!r})
from datetime import datetime, timezone
from collage_farm.costtable import CostTableWriter
def row(fp):
    return {{"fingerprint": fp, "target_key": "k", "target": "t", "status": "ok",
             "median": 1.0, "samples": [1.0] * 50, "nodes": ["n"] * 20}}
w = CostTableWriter({d!r}, campaign_id="victim", background=False, max_rows=10**9)
for i in range(100):
    w.append(row(f"early{{i}}"))
w.flush()
"""


def _run_child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _assert_only_complete_files(d: Path) -> pa.Table:
    for p in d.iterdir():
        if p.name == ".staging" and p.is_dir():  # staged files, hidden from readers
            continue
        assert p.name.startswith("part-") and p.suffix == ".parquet", p
        pq.read_table(p)  # every file in the directory is whole
    n = duck_count(d)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        table = CostTable(d).read()
    assert table.num_rows == n
    return table


def test_exit_in_the_middle_of_a_write_loses_nothing_flushed(tmp_path: Path) -> None:
    d = tmp_path / "t"
    code = textwrap.dedent(_CHILD_PRELUDE.format(repo=str(REPO), d=str(d))) + textwrap.dedent("""
        import pyarrow.parquet as pq
        real = pq.write_table
        def dying_write(table, where, **kw):
            real(table, where, **kw)
            with open(where, "r+b") as f:          # half a file on disk, then die
                f.truncate(os.path.getsize(where) // 2)
            os._exit(9)
        pq.write_table = dying_write
        for i in range(50):
            w.append(row(f"late{i}"))
        w.flush()
        print("unreachable")
    """)
    proc = _run_child(code)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 9, err
    table = _assert_only_complete_files(d)
    assert fingerprints(table) == sorted(f"early{i}" for i in range(100))
    stage = ct.staging_dir(d)
    assert len(list(stage.glob("*.tmp"))) == 1  # the half file stayed outside
    compact(d, min_files=1)  # cleans staged files of dead writers
    assert not list(stage.glob("*.tmp"))
    assert CostTable(d).read().num_rows == 100


def test_sigkill_during_later_writes_loses_nothing_flushed(tmp_path: Path) -> None:
    d = tmp_path / "t"
    code = textwrap.dedent(_CHILD_PRELUDE.format(repo=str(REPO), d=str(d))) + textwrap.dedent("""
        print("ready", flush=True)
        n = 0
        while True:                       # big flushes, back to back, until killed
            for i in range(5000):
                w.append(row(f"late{n}"))
                n += 1
            w.flush()
    """)
    proc = _run_child(code)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.6)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    table = _assert_only_complete_files(d)
    fps = set(table["fingerprint"].to_pylist())
    assert {f"early{i}" for i in range(100)} <= fps
    assert (len(fps) - 100) % 5000 == 0  # later flushes: whole files or nothing
    assert table.num_rows == len(fps)


def _campaign(directory: str, name: str, n: int, ready: multiprocessing.synchronize.Event,
              start: multiprocessing.synchronize.Event) -> None:
    ready.set()
    start.wait(30)
    with CostTableWriter(directory, campaign_id=name, max_rows=25,
                         flush_interval_s=0.01) as w:
        for i in range(n):
            w.append({"fingerprint": f"{name}-{i}", "target_key": "k", "status": "ok",
                      "median": float(i), "samples": [float(i)]})
            time.sleep(0.002)  # a campaign of ~1 s, so compactions overlap it


def _compactor(directory: str, ready: multiprocessing.synchronize.Event,
               start: multiprocessing.synchronize.Event,
               stop: multiprocessing.synchronize.Event, count: multiprocessing.Value) -> None:
    ready.set()
    start.wait(30)
    while not stop.is_set():
        if compact(directory).output is not None:
            with count.get_lock():
                count.value += 1
        time.sleep(0.005)


def test_two_campaign_processes_keep_every_row_while_compacting(tmp_path: Path) -> None:
    """Two writer processes and a compactor process; the reader here never double counts."""
    d = tmp_path / "t"
    d.mkdir()
    n = 400
    mp = multiprocessing.get_context("spawn")
    start, stop, count = mp.Event(), mp.Event(), mp.Value("i", 0)
    ready = [mp.Event() for _ in range(3)]
    writers = [mp.Process(target=_campaign, args=(str(d), name, n, r, start))
               for name, r in zip("AB", ready)]
    compactor = mp.Process(target=_compactor, args=(str(d), ready[2], start, stop, count))
    for p in [*writers, compactor]:
        p.start()
    for r in ready:  # all three imported and waiting: start together
        assert r.wait(60)
    start.set()
    reader = CostTable(d)
    seen = reads = 0
    try:
        while any(p.is_alive() for p in writers):
            fps = reader.read()["fingerprint"].to_pylist()
            assert len(fps) == len(set(fps)), "a row was counted twice"
            assert len(fps) >= seen, "a row disappeared"
            seen, reads = len(fps), reads + 1
            time.sleep(0.002)
    finally:
        stop.set()
        for p in [*writers, compactor]:
            p.join(30)
    assert [p.exitcode for p in [*writers, compactor]] == [0, 0, 0]
    want = sorted(f"{c}-{i}" for c in "AB" for i in range(n))
    assert fingerprints(CostTable(d).read()) == want
    assert fingerprints(pq.read_table(d)) == want
    compact(d)
    assert fingerprints(CostTable(d).read()) == want
    assert len(list(d.glob("*.parquet"))) == 1
    assert count.value >= 2 and reads >= 10, (count.value, reads)


# ----------------------------------------------------------------------------------------
# compaction


def test_compact_preserves_every_row_and_is_idempotent(tmp_path: Path) -> None:
    d = tmp_path / "t"
    rows = [*simple_rows(20), row(failed_result("bad"))]
    write_rows(d, rows, per_file=3)
    before = CostTable(d).read().sort_by("fingerprint")
    res = compact(d)
    assert (res.files_before, res.files_after, res.rows) == (7, 1, 21)
    after = CostTable(d).read().sort_by("fingerprint")
    assert after.equals(before)
    meta = pq.read_schema(res.output).metadata
    assert sorted(json.loads(meta[ct.REPLACES_KEY])) == sorted(res.removed)
    again = compact(d)
    assert again.output is None and again.removed == ()
    write_rows(d, simple_rows(2, start=20))
    res = compact(d)
    assert res.rows == 23 and len(list(d.glob("*.parquet"))) == 1


def test_compaction_crash_before_unlink_never_double_counts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "t"
    write_rows(d, simple_rows(9), per_file=3)

    def no_unlink(path):
        raise KeyboardInterrupt("killed between rename and unlink")

    monkeypatch.setattr(os, "unlink", no_unlink)
    with pytest.raises(KeyboardInterrupt):
        compact(d)
    monkeypatch.undo()
    assert len(list(d.glob("*.parquet"))) == 4  # merged file + the three it replaces
    t = CostTable(d)
    assert fingerprints(t.read()) == sorted(f"fp{i}" for i in range(9))
    s = t.summary()
    assert s["rows"] == 9 and s["files"] == 1 and s["replaced_leftovers"] == 3
    assert t.query("select count(*) as n from costs").to_pylist() == [{"n": 9}]
    res = compact(d)
    assert res.rows == 9 and len(list(d.glob("*.parquet"))) == 1


def test_a_listing_that_misses_a_new_compacted_file_is_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """readdir is not a snapshot: during a compaction it may return neither the new merged
    file (added during the scan) nor an old part (removed during the scan). The reader lists
    again, sees a merged file it did not know, and starts over."""
    d = tmp_path / "t"
    write_rows(d, simple_rows(9), per_file=3)
    old = sorted(p.name for p in d.glob("*.parquet"))
    monkeypatch.setattr(os, "unlink", lambda p: None)  # freeze "renamed, not unlinked"
    compact(d)
    monkeypatch.undo()
    real = CostTable._list
    calls = {"n": 0}

    def torn_listing(self: CostTable) -> dict | None:
        calls["n"] += 1
        listing = real(self)
        if calls["n"] == 1 and listing is not None:
            listing = {n: listing[n] for n in old[1:]}  # neither the merged file nor p1
        return listing

    monkeypatch.setattr(CostTable, "_list", torn_listing)
    got = CostTable(d).read()
    assert calls["n"] >= 3
    assert fingerprints(got) == sorted(f"fp{i}" for i in range(9))


# ----------------------------------------------------------------------------------------
# export and CLI


def test_export_formats(tmp_path: Path) -> None:
    d = tmp_path / "t"
    rows = [*simple_rows(5), row(failed_result("bad"))]
    write_rows(d, rows, per_file=2)
    assert export(d, tmp_path / "o.parquet", "parquet") == 6
    assert pq.read_table(tmp_path / "o.parquet").sort_by("fingerprint").equals(
        CostTable(d).read().sort_by("fingerprint"))
    assert export(d, tmp_path / "o.csv", "csv") == 6
    df = pd.read_csv(tmp_path / "o.csv")
    assert len(df) == 6 and json.loads(df.loc[df.fingerprint == "fp0", "samples"].iloc[0])
    assert export(d, tmp_path / "o.json", "json") == 6
    recs = json.loads((tmp_path / "o.json").read_text())
    assert {r["fingerprint"] for r in recs} == {r["fingerprint"] for r in rows}
    assert next(r for r in recs if r["fingerprint"] == "bad")["median"] is None
    assert export(d, tmp_path / "ok.csv", "csv", filters={"status": "ok"}) == 5
    with pytest.raises(ValueError, match="format"):
        export(d, tmp_path / "o.xml", "xml")
    assert not list(tmp_path.glob(".*tmp"))


def test_cli_show_query_compact_export(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    d = tmp_path / "t"
    write_rows(d, [row(ok_result("a"), campaign="c1"), row(ok_result("b", target=T_OV),
                                                           campaign="c2"),
                   row(failed_result("c"), campaign="c2")], per_file=1)
    assert cli_costs.main(["show", str(d)]) == 0
    out = capsys.readouterr().out
    assert "rows 3, files 3" in out and "openvino-cpu" in out and "build_failed" in out
    assert "c1" in out and "c2" in out
    assert cli_costs.main(["show", str(d), "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["rows"] == 3 and s["targets"]["ort-cpu"] == {"build_failed": 1, "ok": 1}
    assert [c["campaign_id"] for c in s["campaigns"]] == ["c1", "c2"]

    sql = "select target, median(median) as m, count(*) as n from costs group by 1 order by 1"
    assert cli_costs.main(["query", str(d), sql]) == 0
    out = capsys.readouterr().out
    assert "openvino-cpu" in out and "(2 rows)" in out
    assert cli_costs.main(["query", str(d), sql, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0] == {"target": "openvino-cpu", "m": 1e-3,
                                                       "n": 1}
    assert cli_costs.main(["query", str(d), "select * from nope"]) == 2
    assert "error" in capsys.readouterr().err

    assert cli_costs.main(["compact", str(d)]) == 0
    assert "3 file(s) -> 1, 3 rows" in capsys.readouterr().out
    assert cli_costs.main(["export", str(d), "-o", str(tmp_path / "x.json")]) == 0
    assert "3 rows" in capsys.readouterr().out
    assert len(json.loads((tmp_path / "x.json").read_text())) == 3

    for cmd in (["show"], ["query", "-", "select 1"], ["compact"], ["export", "-o", "x"]):
        argv = [cmd[0], str(tmp_path / "missing"), *cmd[1:]]
        if cmd[0] == "query":
            argv = ["query", str(tmp_path / "missing"), "select 1"]
        assert cli_costs.main(argv) == 2
        err = capsys.readouterr().err
        assert "cost table directory not found" in err and "missing" in err


def test_cli_plugs_into_the_main_parser(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cli = pytest.importorskip("collage_farm.cli")
    d = tmp_path / "t"
    write_rows(d, simple_rows(2))
    assert cli.main(["costs", "show", str(d), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 2


# ----------------------------------------------------------------------------------------
# property: any sequence of appends, flushes and compactions keeps exactly the rows written

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 12)),
        st.tuples(st.just("flush"), st.just(0)),
        st.tuples(st.just("compact"), st.integers(1, 3)),
    ),
    max_size=14,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops, max_rows=st.integers(1, 25))
def test_property_appends_flushes_compacts_keep_exactly_the_rows(
        ops: list[tuple[str, int]], max_rows: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "t"
        reader = CostTable(d)  # long-lived: exercises the cache across compactions
        written: list[str] = []
        w = CostTableWriter(d, background=False, max_rows=max_rows, flush_interval_s=3600)
        for op, arg in ops:
            if op == "append":
                for _ in range(arg):
                    fp = f"r{len(written)}"
                    written.append(fp)
                    w.append({"fingerprint": fp, "target_key": "k", "status": "ok",
                              "median": float(len(written))})
            elif op == "flush":
                w.flush()
            else:
                compact(d, min_files=arg)
            on_disk = sorted(written[: w.rows_written])
            assert w.rows_written + w.pending == len(written)
            assert fingerprints(reader.read()) == on_disk
            assert fingerprints(CostTable(d).read()) == on_disk
        w.close()
        assert fingerprints(reader.read()) == sorted(written)
        if written:
            con = duckdb.connect()
            got = con.sql(f"select fingerprint from read_parquet('{d}/*.parquet')").fetchall()
            assert sorted(g[0] for g in got) == sorted(written)


def test_compare_spread_from_a_table_of_another_model_says_so(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture
                                                              ) -> None:
    """`compare MODEL --cost-table T --no-whole` where T holds nothing of MODEL: a clear line,
    exit 0, and no empty chart (it used to write one, with a matplotlib warning)."""
    from collage_farm.cli import main

    table = tmp_path / "costs"
    write_rows(table, [row(ok_result("fp-a", target=T_ORT)), row(ok_result("fp-a", target=T_OV))])
    png = tmp_path / "spread.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels" is a failure
        rc = main(["compare", "zoo:mnist", "--targets", "ort-cpu,openvino-cpu",
                   "--cost-table", str(table), "--no-whole", "--plot", str(png)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "sub-graphs measured on 2+ targets: 0" in out and "no sub-graph plot" in out
    assert not png.exists()


def test_lookup_retries_a_transient_failure_once_and_failed_rows_on_request(
        tmp_path: Path) -> None:
    """A candidate that timed out or crashed once (a busy node's OOM kill) is measured again
    by a campaign that can measure; twice, it is the candidate's fault and answers invalid.
    A build failure answers as before, unless the user asks to retry everything."""
    d = tmp_path / "t"
    k = T_ORT.measure_key
    write_rows(d, [
        row(failed_result("once", status=Status.CRASHED), at=1),
        row(failed_result("twice", status=Status.TIMEOUT), at=1),
        row(failed_result("twice", status=Status.CRASHED), at=2),
        row(failed_result("hard"), at=1),  # build_failed
        row(failed_result("hard-then-crash"), at=1),
        row(failed_result("hard-then-crash", status=Status.CRASHED), at=2),
        row(ok_result("ok-then-crash", 2e-3), at=1),
        row(failed_result("ok-then-crash", status=Status.CRASHED), at=2),
    ])
    keys = [(f, k) for f in ("once", "twice", "hard", "hard-then-crash", "ok-then-crash")]
    t = CostTable(d)
    none = t.lookup(keys, DEV_A.describe(), "1.0")
    assert set(none) == {f for f in keys} and none["once", k].status == "crashed"  # offline
    tr = t.lookup(keys, DEV_A.describe(), "1.0", retry="transient")
    assert ("once", k) not in tr  # measured again
    assert tr["twice", k].status == "crashed" and tr["twice", k].cost.is_invalid
    assert tr["hard", k].status == "build_failed"
    assert tr["hard-then-crash", k].status == "build_failed"
    assert tr["ok-then-crash", k].ok
    every = t.lookup(keys, DEV_A.describe(), "1.0", retry="all")
    assert set(every) == {("ok-then-crash", k)}
    with pytest.raises(ValueError, match="retry"):
        t.lookup(keys, retry="sometimes")


def test_lookup_ignores_ok_rows_with_an_impossible_median(tmp_path: Path) -> None:
    """A hand-edited or foreign row (status ok, median NaN/inf/negative/null) must not shadow
    the good row under it; it is ignored with a warning."""
    d = tmp_path / "t"
    k = T_ORT.measure_key
    bad = []
    for n, m in enumerate((float("nan"), float("inf"), -1e-3, None)):
        r = row(ok_result(f"fp{n}", 1e-3), at=5)
        r["median"] = m
        bad.append(r)
    good = [row(ok_result(f"fp{n}", 2e-3), at=1) for n in range(4)]
    write_rows(d, good + bad)
    with pytest.warns(CostTableWarning, match="4 ok row"):
        got = CostTable(d).lookup([(f"fp{n}", k) for n in range(4)], DEV_A.describe(), "1.0")
    assert all(got[f"fp{n}", k].seconds == pytest.approx(2e-3) for n in range(4))


def test_an_unusable_table_is_refused_before_any_measurement(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A measured campaign whose --cost-table cannot take part files stops at once with one
    line (it used to measure everything, then die in a traceback losing the rows)."""
    from collage_farm.cli import main
    from collage_farm.costtable import CostTableError, check_writable

    a_file = tmp_path / "costs"
    a_file.write_text("not a table")
    with pytest.raises(CostTableError, match="not a directory"):
        check_writable(a_file)
    with pytest.raises(CostTableError, match="cannot create"):
        check_writable(a_file / "sub")
    check_writable(tmp_path / "new" / "costs")
    assert not (tmp_path / "new").exists()  # the probe leaves nothing behind
    (tmp_path / "old").mkdir()
    check_writable(tmp_path / "old")
    assert (tmp_path / "old").is_dir() and not any((tmp_path / "old").iterdir())
    from collage_farm.farm import Farm

    def no_farm(*a: object, **k: object) -> None:
        raise AssertionError("the farm started: the table was checked too late")

    monkeypatch.setattr(Farm, "start", staticmethod(no_farm))
    rc = main(["tune", "zoo:mnist", "--targets", "ort-cpu", "--out", str(tmp_path / "o"),
               "--cost-table", str(a_file)])
    assert rc == 2  # refused before Ray starts: nothing measured
    err = capsys.readouterr().err
    assert "cost table" in err and "not a directory" in err and "Traceback" not in err


def test_rows_that_cannot_be_written_are_rescued_not_lost(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    from collage_farm.costtable import CostTableError

    monkeypatch.setenv("COLLAGE_FARM_RESCUE_DIR", str(tmp_path / "rescue"))
    d = tmp_path / "t"
    w = CostTableWriter(d, background=False)
    w.extend(simple_rows(3))
    d.rmdir()
    d.write_text("the table directory was replaced by a file")  # every flush now fails
    with pytest.raises(CostTableError, match="could not write 3 row") as got:
        w.close()
    saved = Path(str(got.value).split("saved in ")[1].split(":")[0])
    assert saved.parent == tmp_path / "rescue" and saved.exists()
    d.unlink()
    d.mkdir()
    saved.rename(d / saved.name)  # what the message tells the user to do
    assert fingerprints(CostTable(d).read()) == ["fp0", "fp1", "fp2"]


def test_sql_skips_a_file_whose_numbers_are_text(tmp_path: Path) -> None:
    """`costs query` reads part files through DuckDB from their footers: a file with the right
    column names but text where numbers belong used to be read (2x the rows, every numeric
    column unioned as VARCHAR) while every other reader skipped it."""
    d = tmp_path / "t"
    write_rows(d, simple_rows(5))
    (good,) = d.glob("*.parquet")
    t = pq.read_table(good)
    for col in ("median", "mean", "n"):
        i = t.column_names.index(col)
        t = t.set_column(i, col, pc.cast(t[col], pa.string()))
    pq.write_table(t, d / "part-zz-textnumbers.parquet")
    with pytest.warns(CostTableWarning, match="textnumbers"):
        got = CostTable(d).query("select count(*) as n, median(median) as m from costs")
    assert got["n"].to_pylist() == [5]
    assert pa.types.is_floating(got.schema.field("m").type)


def test_export_into_the_table_directory_is_refused(tmp_path: Path) -> None:
    """A backup written into the table would be read back as a part: every row twice, made
    permanent by the next compaction."""
    from collage_farm.costtable import CostTableError

    d = tmp_path / "t"
    write_rows(d, simple_rows(3))
    with pytest.raises(CostTableError, match="inside the table directory"):
        export(d, d / "backup.parquet", "parquet")
    assert CostTable(d).read().num_rows == 3
    assert export(d, tmp_path / "backup.parquet", "parquet") == 3
