"""Reliability under load: long campaigns on a local multi-node cluster, head restarts, two
coordinators on one table. Too slow for the test suite; each run appends its figures to
``bench/results/reliability-runs.md`` (and prints them).

Why these numbers: a campaign left running for hours must not grow the coordinator's memory
(buffers, result queues, the memo of costs), must not slow down as the table grows (every
lookup reads it), and must leave exactly one row per completed measurement, including when the
Ray head goes away between campaigns and when two coordinators write one table at once.

1. **load**: a `ray.cluster_utils.Cluster` with a head (2 CPU slots) and a worker node (1 CPU
   slot, 1 ``ethosu_sim`` slot); thousands of ``null`` candidates (random DAG, depth-limited
   candidates) through `FarmEstimator`; the coordinator's RSS sampled every 0.5 s and the
   throughput per tenth of the campaign; then the table is checked row by row.
2. **ethos-u**: the same for the simulated Ethos-U (int8 TFLite + Vela) on the worker node's
   ``ethosu_sim`` slot, if `runners.ethosu` is importable.
3. **head restart**: the cluster is shut down and a new one started; the same campaign on the
   same table must measure nothing.
4. **two coordinators**: two processes, each with its own embedded Ray (token auth on), run
   overlapping campaigns on one table at the same time; every row each reports is there.

    flock /tmp/bench.lock python3 bench/reliability.py [--nodes 400] [--depth 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # the local test Cluster only; see step 4

from collage_farm.core.graph import load_graph  # noqa: E402
from collage_farm.core.rules import RuleOptions, all_candidates, default_spec  # noqa: E402
from collage_farm.core.target import BUILTIN_TARGETS, CPU0, Target  # noqa: E402
from collage_farm.costtable import CostTable  # noqa: E402
from collage_farm.zoo.random_dag import random_dag  # noqa: E402
from runners.base import MeasureConfig  # noqa: E402

FAST = MeasureConfig(warmup_runs=0, rounds=2, min_round_runs=2, min_round_s=0.0, timeout_s=60)


def rss_mb(pid: int | None = None) -> float:
    with open(f"/proc/{pid or os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def machine() -> str:
    cpu = platform.processor()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    load = os.getloadavg()
    return (f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}; "
            f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; load average at start "
            f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def null_candidates(nodes: int, depth: int, seed: int = 11, sleep_s: float = 0.0) -> list:
    from runners.registry import capabilities_for

    g = load_graph(random_dag(seed, nodes), name=f"random_dag{nodes}")
    t = Target.make("null-cpu", "null", CPU0, {"sleep_s": sleep_s} if sleep_s else {})
    caps = capabilities_for("null")
    return all_candidates(g, [default_spec(t, caps.supports, caps.style,
                                           RuleOptions(max_depth=depth))])


class Sampler:
    """RSS of this process and farm progress, every ``period_s``, on a daemon thread."""

    def __init__(self, progress: Any, period_s: float = 0.5) -> None:
        self.progress, self.period_s = progress, period_s
        self.samples: list[tuple[float, float, int]] = []  # (t, rss MiB, done)
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic() - self._t0, rss_mb(), self.progress.done))
            self._stop.wait(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.monotonic() - self._t0, rss_mb(), self.progress.done))


def table_check(table: Path, expect: set[str]) -> dict[str, Any]:
    rows = CostTable(table).rows()
    counts = Counter(r.fingerprint for r in rows)
    return {"rows": len(rows), "distinct_expected": len(expect),
            "missing": len(expect - set(counts)), "extra": len(set(counts) - expect),
            "duplicated": sum(1 for v in counts.values() if v > 1),
            "statuses": dict(Counter(r.status for r in rows))}


def run_campaign(farm: Any, cands: list, table: Path, campaign: str, **kw: Any
                 ) -> dict[str, Any]:
    from collage_farm.costtable import TableStore
    from estimators.measured import FarmEstimator

    sampler = Sampler(farm.progress)
    t0 = time.perf_counter()
    est = FarmEstimator(farm, TableStore(table, campaign_id=campaign),
                        model="bench", close_farm=False,
                        measure_config=FAST, **kw)
    costs = est.estimate(cands)
    est.close()
    wall = time.perf_counter() - t0
    sampler.stop()
    st = est.stats()
    s = sampler.samples
    # throughput per tenth of the measured results
    # results per second in each tenth of the campaign's *time*, the count of results at each
    # boundary interpolated between the RSS sampler's points (a count-based split divided by
    # ~0 s whenever a tenth of the results fell between two samples)
    tenths = []
    if len(s) >= 2 and s[-1][0] > s[0][0]:
        import numpy as np

        ts = np.array([t for t, _, _ in s])
        ds = np.array([d for _, _, d in s], dtype=float)
        edges = np.linspace(ts[0], ts[-1], 11)
        done_at = np.interp(edges, ts, ds)
        width = (ts[-1] - ts[0]) / 10
        tenths = [round(float(done_at[k + 1] - done_at[k]) / width, 1) for k in range(10)]
    rss = [r for _, r, _ in s]
    warm = rss[len(rss) // 10:] or rss
    return {"campaign": campaign, "candidates": len(cands),
            "distinct": len({c.fingerprint for c in cands}), "measured": st.measured,
            "cache_hits": st.cache_hits, "failed": st.failed,
            "known_costs": sum(c.is_known for c in costs), "wall_s": round(wall, 1),
            "per_s_by_tenth": tenths, "rss_mb_start": round(rss[0], 1),
            "rss_mb_after_first_tenth": round(warm[0], 1), "rss_mb_peak": round(max(rss), 1),
            "rss_mb_end": round(rss[-1], 1), "rss_samples": len(rss)}


TWO_COORD = """
import json, sys
sys.path.insert(0, {repo!r})
sys.path.insert(0, {bench!r})
from reliability import FAST, null_candidates
from collage_farm.farm import Farm
from collage_farm.costtable import TableStore
from estimators.measured import FarmEstimator
farm = Farm.start(None, num_cpus=1, toolchains=["null"], progress=False)
cands = null_candidates({nodes}, {depth}, seed={seed})
est = FarmEstimator(farm, TableStore({table!r}, campaign_id={name!r}),
                    model="bench", measure_config=FAST)
est.estimate(cands)
est.close()
st = est.stats()
print("RESULT", json.dumps({{"measured": st.measured, "hits": st.cache_hits,
                             "fps": sorted({{c.fingerprint for c in cands}})}}))
"""


def two_coordinators(work: Path, nodes: int, depth: int) -> dict[str, Any]:
    table = work / "two" / "costs"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    procs = []
    for name, seed in (("A", 11), ("B", 11)):  # the same model: maximal overlap
        code = TWO_COORD.format(repo=str(REPO), bench=str(REPO / "bench"), nodes=nodes,
                                depth=depth, seed=seed, table=str(table), name=name)
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, cwd=work,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results = []
    for p in procs:
        out, err = p.communicate(timeout=1800)
        line = next((ln for ln in out.splitlines() if ln.startswith("RESULT ")), None)
        if p.returncode != 0 or line is None:
            raise RuntimeError(f"coordinator failed ({p.returncode}): {err[-3000:]}")
        results.append(json.loads(line[7:]))
    rows = CostTable(table).rows()
    fps = set(results[0]["fps"]) | set(results[1]["fps"])
    counts = Counter(r.fingerprint for r in rows)
    return {"measured_A": results[0]["measured"], "measured_B": results[1]["measured"],
            "hits_A": results[0]["hits"], "hits_B": results[1]["hits"],
            "rows": len(rows), "rows_expected": results[0]["measured"] + results[1]["measured"],
            "fingerprints_missing": len(fps - set(counts)),
            "measured_twice": sum(1 for v in counts.values() if v > 1),
            "campaigns": dict(Counter(r.campaign_id for r in rows))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=400, help="random DAG nodes (load campaign)")
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--ethosu-nodes", type=int, default=40)
    ap.add_argument("--two-nodes", type=int, default=120)
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "reliability-runs.md"))
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from collage_farm.farm import Farm

    report: dict[str, Any] = {"machine": machine(), "args": vars(args)}
    work = Path(tempfile.mkdtemp(prefix="reliability-"))
    table = work / "costs"

    def cluster() -> Any:
        c = Cluster(initialize_head=True, connect=True, head_node_args={
            "num_cpus": 2, "resources": {"cpu_slot_0": 1.0, "cpu_slot_1": 1.0},
            "include_dashboard": False})
        c.add_node(num_cpus=1, resources={"cpu_slot_0": 1.0, "ethosu_sim": 1.0})
        c.wait_for_nodes()
        return c

    try:
        c = cluster()
        cands = null_candidates(args.nodes, args.depth)
        farm = Farm.start(toolchains=["null"], progress=False)
        report["runners"] = len(farm.runners)
        report["nodes"] = len([n for n in ray.nodes() if n["Alive"]])
        report["load"] = run_campaign(farm, cands, table, "load")
        report["load_table"] = table_check(table, {c.fingerprint for c in cands})
        farm.close()

        try:
            import runners.ethosu  # noqa: F401
            has_ethosu = True
        except ImportError:
            has_ethosu = False
        if has_ethosu:
            from collage_farm.campaign import tensor_ranges_provider

            t = BUILTIN_TARGETS["ethos-u55-128"]
            g = load_graph(random_dag(5, args.ethosu_nodes), name="random_dag_ethosu")
            from runners.registry import capabilities_for

            caps = capabilities_for(t.toolchain)
            ecands = all_candidates(g, [default_spec(t, caps.supports, caps.style,
                                                     RuleOptions(max_depth=args.depth))])
            efarm = Farm.start(toolchains=["vela"], progress=False)
            etable = work / "costs-ethosu"
            report["ethosu"] = run_campaign(efarm, ecands, etable, "ethosu",
                                            tensor_ranges_for=tensor_ranges_provider(g, [t]))
            report["ethosu_table"] = table_check(etable, {c.fingerprint for c in ecands})
            efarm.close()

        ray.shutdown()
        c.shutdown()
        t0 = time.perf_counter()
        c = cluster()  # the head restarted: a new GCS, new actors, the same table
        farm = Farm.start(toolchains=["null"], progress=False)
        report["head_restart_s"] = round(time.perf_counter() - t0, 1)
        report["after_restart"] = run_campaign(farm, cands, table, "after-restart")
        report["after_restart_table"] = table_check(table, {c.fingerprint for c in cands})
        farm.close()
        ray.shutdown()
        c.shutdown()

        report["two_coordinators"] = two_coordinators(work, args.two_nodes, args.depth)
    finally:
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    text = json.dumps(report, indent=1)
    print(text)
    with open(args.out, "a") as f:
        f.write(f"\n## run {datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S} UTC\n\n```json\n"
                f"{text}\n```\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
