"""Faults that need no Ray: a full disk under the cost-table writer, a leaking toolchain.

Why: the table is the campaign's only durable output, and a disk (or quota) filling up is the
most ordinary way for a long campaign to end. The writer must fail *cleanly*: the flush that
did not fit raises, leaves nothing half-written in the table or staged, keeps its rows
buffered, and every earlier row stays readable; once space is back the same writer flushes
them. A full disk is simulated for real with ``RLIMIT_FSIZE`` in a child process (the kernel
then fails ``write`` with EFBIG, as it fails with ENOSPC on a full disk); SIGXFSZ is ignored so
the write fails instead of killing the process. SIGKILL in the middle of a flush is covered by
test_costtable.py (``test_sigkill_during_later_writes_loses_nothing_flushed``) and, with a real
campaign, by tests/ray/test_farm.py (``test_kill9_then_resume_measures_nothing_twice``).

A toolchain that leaks memory on one candidate must cost that candidate's row (``crashed``,
"exceeded the memory limit") and a worker restart, not the machine: `runners.isolation`
caps the worker's RSS.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from collage_farm.core.target import CPU0, Target
from collage_farm.costtable import CostTable, staging_dir
from runners.base import BuildInput, Status
from runners.local import LocalRunner
from tests.unit.test_isolation import MODEL

REPO = Path(__file__).resolve().parents[2]

DISK_FULL_CHILD = textwrap.dedent("""
    import json, resource, signal, sys
    sys.path.insert(0, {repo!r})
    from collage_farm.costtable import CostTableWriter
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # EFBIG from write(), not death
    def row(fp):
        return {{"fingerprint": fp, "target_key": "k", "target": "t", "status": "ok",
                 "median": 1.0, "samples": [float(i) for i in range(40)],
                 "nodes": [fp * 4] * 30}}
    w = CostTableWriter({d!r}, campaign_id="full", background=False, max_rows=10**9,
                        compression="none")
    for i in range(50):
        w.append(row(f"early{{i:04d}}"))
    w.flush()                                          # fits
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))   # the disk is now full
    for i in range(3000):
        w.append(row(f"late{{i:04d}}"))
    errors = []
    for attempt in range(2):                           # fails, and fails again on retry
        try:
            w.flush()
        except OSError as e:
            errors.append(f"{{type(e).__name__}}: {{e}}")
    report = {{"errors": errors, "pending": w.pending, "written": w.rows_written}}
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))        # space is back
    w.close()
    report["written_after"] = w.rows_written
    print(json.dumps(report))
""")


def test_disk_full_while_writing_a_part_file(tmp_path: Path) -> None:
    d = tmp_path / "costs"
    code = DISK_FULL_CHILD.format(repo=str(REPO), d=str(d))
    # the child reports what its flushes did while the disk was full; the table is read here
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(report["errors"]) == 2, report
    assert all("File too large" in e or "No space" in e or "Errno 27" in e
               for e in report["errors"]), report
    assert report["pending"] == 3000 and report["written"] == 50  # rows kept, none lost
    assert report["written_after"] == 3050
    rows = CostTable(d).read()["fingerprint"].to_pylist()
    assert sorted(rows) == sorted([f"early{i:04d}" for i in range(50)]
                                  + [f"late{i:04d}" for i in range(3000)])
    assert len(rows) == len(set(rows))
    assert len(list(d.glob("*.parquet"))) == 2  # the failed attempts added no file
    assert not list(staging_dir(d).glob("*.tmp"))  # and left nothing staged


def test_disk_full_table_keeps_earlier_rows_while_full(tmp_path: Path) -> None:
    """The same, stopped while the disk is still full: the table holds exactly the earlier
    flush, every file in it is whole, and the process exits with its rows unflushed."""
    d = tmp_path / "costs"
    code = DISK_FULL_CHILD.format(repo=str(REPO), d=str(d)).replace(
        "resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))        # space is back",
        "import os; print(json.dumps(report)); sys.stdout.flush(); os._exit(3)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 3, p.stderr[-3000:]
    table = CostTable(d)
    rows = table.read()["fingerprint"].to_pylist()
    assert sorted(rows) == [f"early{i:04d}" for i in range(50)]
    assert not table.skipped()


@pytest.fixture
def leak_runner(monkeypatch: pytest.MonkeyPatch):
    import os

    monkeypatch.setenv("COLLAGE_WORKER_MAX_RSS_MB", "300")
    r = LocalRunner(["null"], cores=[min(os.sched_getaffinity(0))], build_timeout_s=30.0)
    yield r
    r.close()


def test_leaking_candidate_is_a_crashed_row_and_the_worker_restarts(leak_runner: LocalRunner
                                                                   ) -> None:
    t = Target.make("null-leaky", "null", CPU0, {"leak_on": "leak"})
    assert leak_runner.worker.max_rss_mb == 300
    pid = leak_runner.worker.pid
    t0 = time.monotonic()
    b = leak_runner.build(BuildInput("leak0001", t, MODEL))
    took = time.monotonic() - t0
    assert b.status is Status.CRASHED, b.error
    assert "exceeded the memory limit" in b.error and "> 300 MiB" in b.error
    assert took < 20  # the cap, not the 30 s build timeout, stopped it
    ok = leak_runner.build(BuildInput("fine0001", t, MODEL))  # a fresh worker serves on
    assert ok.status is Status.OK, ok.error
    assert leak_runner.worker.pid != pid and leak_runner.worker.memory_kills == 1


def test_rss_cap_setting() -> None:
    import os

    from runners.isolation import WorkerProcess, default_max_rss_mb

    total_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    assert default_max_rss_mb() in (None, pytest.approx(total_mb / 2)) or os.environ.get(
        "COLLAGE_WORKER_MAX_RSS_MB")
    assert WorkerProcess(["null"], max_rss_mb=None).max_rss_mb is None
    assert WorkerProcess(["null"], max_rss_mb=0).max_rss_mb is None
    assert WorkerProcess(["null"], max_rss_mb=512).max_rss_mb == 512
