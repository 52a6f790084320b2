"""Benchmark the measurement farm on this machine (embedded Ray, one runner per core).

What it measures, and why each number matters:

1. **Farm overhead per measurement** (``null`` toolchain, no sleep): the same requests through
   a `LocalRunner` called directly and through the farm with one runner; the difference per
   measurement is what Ray, the actor and the dispatch loop add (goal: <= 2 ms). Also the
   throughput with every runner.
2. **Scaling**: one model's candidates measured for real (``ort-cpu``, default
   `MeasureConfig`) with 1 runner and with all runners; efficiency = T1 / (N x TN). And the
   **share of time runners are busy** (actor-side time inside build+measure over N x wall).
3. **Cache-hit re-run**: the same campaign again on the filled cost table (nothing measured).
4. **Pruning savings**: the Dijkstra search with lazy lower-bound evaluation vs measuring
   every candidate, on fresh tables: candidates measured and campaign wall time.

Writes ``bench/results/farm-<hostname>.md`` with the machine description.

    python bench/farm.py [--model resnet18] [--image-size 64] [--depth 2] [--out bench/results]
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_farm import farm as farm_mod
from collage_farm import zoo
from collage_farm.campaign import build_specs
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import load_graph
from collage_farm.core.rules import RuleOptions, all_candidates
from collage_farm.core.target import CPU0, Target, parse_targets
from collage_farm.costtable import TableStore
from collage_farm.farm import Farm
from estimators.measured import FarmEstimator
from runners.base import BuildInput, MeasureConfig, MeasureRequest


def machine() -> list[str]:
    import onnxruntime
    import ray

    from runners.base import DeviceDescription

    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        f"- host: `{socket.gethostname()}`; CPU: {DeviceDescription.host_cpu().name}, "
        f"{cores} usable cores{mem}",
        f"- {platform.platform()}; Python {platform.python_version()}; Ray {ray.__version__}; "
        f"onnxruntime {onnxruntime.__version__}",
    ]


def candidates_for(model: str, targets: list[Target], depth: int, segments: bool = True,
                   **kw: Any) -> tuple[Any, list[CandidatePartition]]:
    g = load_graph(zoo.build(model, **kw), name=model)
    specs = build_specs(targets, RuleOptions(max_depth=depth, segments=segments))
    return g, all_candidates(g, specs)


def distinct(cands: list[CandidatePartition]) -> list[CandidatePartition]:
    seen: dict[str, CandidatePartition] = {}
    for c in cands:
        seen.setdefault(c.fingerprint, c)
    return list(seen.values())


def requests(cands: list[CandidatePartition], config: MeasureConfig) -> list[MeasureRequest]:
    return [MeasureRequest(BuildInput(c.fingerprint, c.target,
                                      c.sub_graph.extract().SerializeToString(), label=c.label()),
                           config) for c in distinct(cands)]


def busy(farm: Farm) -> float:
    return sum(s.busy_s for s in farm.runner_stats())


# ------------------------------------------------------------------------------------------


def _overhead_case(reqs: list[MeasureRequest], n_cores: int) -> dict[str, float]:
    """Per-measurement wall: LocalRunner.run directly (the actor's own call) vs the farm."""
    from runners.local import LocalRunner

    n = len(reqs)
    out: dict[str, float] = {"n": n, "mb": sum(len(q.build.onnx_bytes) for q in reqs) / n / 1e6}
    with LocalRunner(["null"], cores=[0]) as lr:
        lr.available()
        for q in reqs[:20]:  # warm
            lr.run(q.build, q.config)
        t0 = time.perf_counter()
        tool_s = 0.0
        for q in reqs:
            b, m = lr.run(q.build, q.config)
            tool_s += b.build_s + m.measure_s
        out["direct"] = (time.perf_counter() - t0) / n
        out["tool"] = tool_s / n
    for runners in sorted({1, n_cores}):
        farm = Farm.start(toolchains=["null"], max_runners=runners, progress=False)
        list(farm.measure(reqs[:20]))  # warm
        b0 = busy(farm)
        t0 = time.perf_counter()
        res = list(farm.measure(reqs))
        wall = time.perf_counter() - t0
        b1 = busy(farm)
        farm.close()
        assert all(r.ok for r in res), [r.error for r in res if not r.ok][:3]
        out[f"wall_{runners}"] = wall
        out[f"busy_{runners}"] = b1 - b0
        out[f"per_{runners}"] = wall / n
    return out


def bench_overhead(n_cores: int, lines: list[str]) -> dict[str, float]:
    cfg = MeasureConfig(warmup_runs=0, rounds=1, min_round_runs=1, min_round_s=0.0)
    cases: dict[str, dict[str, float]] = {}
    for label, segments in (("nodes and windows (depth <= 3)", False),
                            ("with whole-run segments (weights of many layers)", True)):
        cands: list[CandidatePartition] = []
        for speed in (1.0, 1.01, 1.02, 1.03):  # four null targets: four times the fingerprints
            t = Target.make(f"null-{speed}", "null", CPU0, {"speed": speed})
            cands += candidates_for("resnet18", [t], 3, segments=segments, image_size=32)[1]
        if segments:  # only the segments themselves (the small ones are the first case), and
            # at most 48 of them: each carries up to 44 MB of weights, all held in memory here
            cands = sorted((c for c in distinct(cands) if len(c.node_names) > 8),
                           key=lambda c: len(c.node_names))[:48]
        reqs = requests(cands, cfg)
        cases[label] = _overhead_case(reqs, n_cores)
    lines += [
        "## 1. Farm overhead per measurement (null toolchain)",
        "",
        "Distinct requests of resnet18 at 32x32 for four null targets; one sample per "
        "measurement, so the toolchain itself costs ~nothing. *Direct* is `LocalRunner.run` "
        "called in a loop (what the runner actor does per request, without Ray); *overhead* is "
        "the farm with one runner minus direct. Requests carry the sub-model with its weights, "
        "so the second row shows the cost of payload size.",
        "",
        "| requests | n | payload MB | direct | farm, 1 runner | farm overhead | "
        f"farm, {n_cores} runners | runner busy share (1) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, o in cases.items():
        lines.append(
            f"| {label} | {o['n']:.0f} | {o['mb']:.2f} | {o['direct'] * 1e3:.2f} ms | "
            f"{o['per_1'] * 1e3:.2f} ms | **{(o['per_1'] - o['direct']) * 1e3:.2f} ms** | "
            f"{o.get(f'per_{n_cores}', o['per_1']) * 1e3:.2f} ms | "
            f"{o['busy_1'] / o['wall_1']:.0%} |")
    small = next(iter(cases.values()))
    lines += [
        "",
        f"- toolchain time inside the worker (build_s + measure_s): {small['tool'] * 1e3:.3f} ms "
        "per small request; goal for the farm overhead: <= 2 ms per measurement",
        "",
    ]
    return small


def bench_scaling(model: str, image_size: int, depth: int, n_cores: int, table_root: Path,
                  lines: list[str]) -> dict[str, float]:
    targets = parse_targets("ort-cpu")
    _, cands = candidates_for(model, targets, depth, image_size=image_size)
    todo = distinct(cands)
    out: dict[str, float] = {}
    rows = []
    for runners in sorted({1, n_cores}):
        table = table_root / f"scale-{runners}"
        farm = Farm.start(toolchains=["ort-cpu"], max_runners=runners, progress=False)
        est = FarmEstimator(farm, TableStore(table, campaign_id=f"scale{runners}"), model=model,
                            close_farm=False)
        b0 = busy(farm)
        t0 = time.perf_counter()
        costs = est.estimate(todo)
        wall = time.perf_counter() - t0
        b1 = busy(farm)
        est.close()
        # cache-hit re-run on the filled table
        est2 = FarmEstimator(farm, TableStore(table, campaign_id=f"rerun{runners}"), model=model,
                             close_farm=False)
        t1 = time.perf_counter()
        est2.estimate(todo)
        rerun = time.perf_counter() - t1
        st2 = est2.stats()
        est2.close()
        farm.close()
        assert st2.measured == 0 and st2.cache_hits == len(todo)
        share = (b1 - b0) / (runners * wall)
        out[f"wall_{runners}"] = wall
        out[f"share_{runners}"] = share
        out[f"rerun_{runners}"] = rerun
        med = statistics.median(c.seconds for c in costs if c.is_known)
        rows.append((runners, wall, share, rerun, med))
    t1 = out["wall_1"]
    lines += [
        f"## 2-3. Scaling, busy share, cache-hit re-run ({model} {image_size}x{image_size}, "
        "ort-cpu, default MeasureConfig)",
        "",
        f"{len(todo)} distinct candidates (depth <= {depth}; {len(cands)} before dedupe), all "
        "measured (no search, so both runs do the same work); a fresh cost table per run.",
        "",
        "| runners | campaign wall | speed-up | efficiency | runner busy share | "
        "cache-hit re-run | median candidate cost |",
        "|---|---|---|---|---|---|---|",
    ]
    for runners, wall, share, rerun, med in rows:
        lines.append(f"| {runners} | {wall:.2f} s | {t1 / wall:.2f}x | "
                     f"{t1 / (runners * wall):.0%} | {share:.0%} | {rerun * 1e3:.0f} ms | "
                     f"{med * 1e6:.0f} us |")
    lines.append("")
    return out


def bench_pruning(model: str, image_size: int, depth: int, table_root: Path,
                  lines: list[str]) -> None:
    try:
        from collage_farm.core.search import search
    except ImportError:
        lines += ["## 4. Pruning savings", "", "skipped: collage_farm.core.search is not available",
                  ""]
        return
    targets = parse_targets("ort-cpu,openvino-cpu")
    g, cands = candidates_for(model, targets, depth, image_size=image_size)
    farm = Farm.start(toolchains=["ort-cpu", "openvino"], progress=False)
    rows = []
    for prune in (False, True):
        table = table_root / f"prune-{prune}"
        est = FarmEstimator(farm, TableStore(table, campaign_id=f"prune{prune}"), model=model,
                            close_farm=False, prune=prune)
        t0 = time.perf_counter()
        r = search(g, cands, est, lazy=prune)
        wall = time.perf_counter() - t0
        est.close()
        st = est.stats()
        rows.append((prune, st.measured, st.pruned, wall, r.total_s, len(r.partitions)))
    farm.close()
    n_fp = len({c.fingerprint for c in cands})
    lines += [
        f"## 4. Pruning savings ({model} {image_size}x{image_size}, ort-cpu + openvino-cpu, "
        f"depth <= {depth})",
        "",
        f"{len(cands)} candidates, {n_fp} distinct fingerprints; all runners; fresh tables.",
        "",
        "| lazy lower bounds | measured | bound asked, never measured | campaign wall | "
        "plan estimate | partitions |",
        "|---|---|---|---|---|---|",
    ]
    for prune, measured, pruned, wall, total, parts in rows:
        lines.append(f"| {'yes' if prune else 'no'} | {measured} | "
                     f"{pruned} | {wall:.2f} s | "
                     f"{total * 1e3:.3f} ms | {parts} |")
    full, lazy = rows[0], rows[1]
    lines += [
        "",
        f"Lazy evaluation measured {lazy[1]} of {full[1]} candidates "
        f"({1 - lazy[1] / max(1, full[1]):.0%} fewer) and the campaign took "
        f"{lazy[3] / full[3]:.0%} of the time. The two plans may differ by measurement "
        "noise: each run measures afresh.",
        "",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--prune-model", default="mnist")
    ap.add_argument("--prune-depth", type=int, default=3)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()

    n_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    t_start = time.perf_counter()
    t0 = time.perf_counter()
    farm_mod.connect(toolchains=["null", "ort-cpu", "openvino"])
    ray_start = time.perf_counter() - t0
    host = socket.gethostname()
    lines = [f"# bench/farm.py on {host}", "", *machine(),
             f"- embedded Ray: {n_cores} CPU measurement slots (`cpu_slot_<core>`), started in "
             f"{ray_start:.1f} s; runners pinned one per core; the coordinator shares the "
             "cores (no core is reserved for it on this machine)", ""]
    root = Path(tempfile.mkdtemp(prefix="bench-farm-"))
    try:
        bench_overhead(n_cores, lines)
        print("\n".join(lines), flush=True)
        bench_scaling(args.model, args.image_size, args.depth, n_cores, root, lines)
        bench_pruning(args.prune_model, 28 if args.prune_model == "mnist" else args.image_size,
                      args.prune_depth, root, lines)
    finally:
        farm_mod.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    lines.append(f"Total bench time {time.perf_counter() - t_start:.0f} s "
                 f"(`python bench/farm.py`).")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"farm-{host}.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
