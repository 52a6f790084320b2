"""Benchmark the measurement farm on this machine (embedded Ray, its LLC domains declared).

What it measures, and why each number matters:

0. **Concurrency bias**: the same candidates (``ort-cpu``, the campaign's measure mode) timed
   with one runner and with ``--bias-slots`` runners sharing one last-level-cache domain, side
   by side in one run (passes 1, k, k, 1); bias = median over candidates of cost(k) / cost(1)
   - 1. The farm times more than one candidate per LLC domain only where this is <= 2%; with
   ``--record-bias`` the figure is stored for this host and CPU (`collage_farm.farm.slots`),
   where `Farm.start` reads it.
1. **Farm overhead per measurement** (``null`` toolchain, no sleep): the same requests through
   a `LocalRunner` called directly and through the farm with one runner; the difference per
   measurement is what Ray, the actor and the dispatch loop add (goal: <= 2 ms). Also the
   throughput with one runner per core (forced: ``null`` touches no cache).
2. **Scaling**: one model's candidates measured for real (``ort-cpu``, default
   `MeasureConfig`) with 1 runner, with the farm's default slots (one per LLC domain unless a
   recorded bias allows more) and with one per core (forced, biased where the bias says so);
   efficiency = T1 / (N x TN). And the **share of time runners are busy** (actor-side time
   inside build+measure over N x wall).
3. **Cache-hit re-run**: the same campaign again on the filled cost table (nothing measured).
4. **Pruning savings**: the Dijkstra search with lazy lower-bound evaluation vs measuring
   every candidate, on fresh tables: candidates measured and campaign wall time.
5. **Multi-node loopback** (``--loopback-nodes N``): N Ray nodes on this machine, one core and
   one declared LLC domain each; the default farm places one runner per node: scale-out from 1
   node to N with the default slots (the nodes share this machine's real L3, so the bias of
   section 0 applies to their numbers).

Writes ``bench/results/farm-<hostname>.md`` with the machine description.

    python bench/farm.py [--model resnet18] [--image-size 64] [--depth 2] [--record-bias]
                         [--bias-candidates 80] [--loopback-nodes 2] [--out bench/results]
"""

from __future__ import annotations

import argparse
import datetime
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
from collage_farm.farm import BiasRecord, Farm, llc_domains, save_bias_record
from collage_farm.farm.slots import per_domain_counts
from estimators.measured import FarmEstimator
from runners.base import (
    CANDIDATE_MODE,
    BuildInput,
    DeviceDescription,
    MeasureConfig,
    MeasureRequest,
)


def machine() -> list[str]:
    import onnxruntime
    import ray

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
        farm = Farm.start(toolchains=["null"], slots=runners, progress=False)
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
        f"farm, {n_cores} runners (forced) | runner busy share (1) |",
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


def _campaign_costs(farm: Farm, todo: list[CandidatePartition], table: Path, model: str
                    ) -> tuple[list[Any], float, float]:
    """Every candidate's cost as a campaign measures it (fresh table): costs, wall, busy."""
    est = FarmEstimator(farm, TableStore(table, campaign_id=table.name), model=model,
                        close_farm=False)
    b0 = busy(farm)
    t0 = time.perf_counter()
    costs = est.estimate(todo)
    wall = time.perf_counter() - t0
    b1 = busy(farm)
    est.close()
    return costs, wall, b1 - b0


def bench_bias(model: str, image_size: int, depth: int, n: int, k: int, table_root: Path,
               lines: list[str]) -> BiasRecord | None:
    """Section 0: the same candidates with 1 runner and with k sharing one LLC domain."""
    domains = llc_domains(sorted(os.sched_getaffinity(0)))
    head = [f"## 0. Concurrency bias ({model} {image_size}x{image_size}, ort-cpu, "
            f"{CANDIDATE_MODE} mode)", ""]
    if len(domains[0]) < k:
        lines += [*head, f"not measured: the first LLC domain {domains[0]} has fewer than {k} "
                  "cores", ""]
        return None
    todo = distinct(candidates_for(model, parse_targets("ort-cpu"), depth,
                                   image_size=image_size)[1])
    todo = todo[::max(1, len(todo) // n)][:n]
    # one per domain, first runner: domain 0 alone; k per domain, first k: k in domain 0
    plan = {1: (len(domains), 1), k: (k * len(domains), k)}
    passes: list[tuple[int, dict[str, float], float]] = []
    for i, runners in enumerate((1, k, k, 1)):  # ABBA: drift of the machine cancels
        slots, cap = plan[runners]
        farm = Farm.start(toolchains=["ort-cpu"], slots=slots, max_runners=cap, progress=False)
        try:
            assert len({r.cores for r in farm.runners}) == runners
            costs, wall, _ = _campaign_costs(farm, todo, table_root / f"bias-{i}", model)
        finally:
            farm.close()
        passes.append((runners, {c.fingerprint: cost.seconds for c, cost in zip(todo, costs)
                                 if cost.is_known}, wall))
    both = set.intersection(*(set(p[1]) for p in passes))
    one = {fp: statistics.median(p[1][fp] for p in passes if p[0] == 1) for fp in both}
    many = {fp: statistics.median(p[1][fp] for p in passes if p[0] == k) for fp in both}
    ratios = sorted(many[fp] / one[fp] for fp in both)
    bias = statistics.median(ratios) - 1
    rec = BiasRecord(socket.gethostname(), DeviceDescription.host_cpu().name, bias, k,
                     len(both), f"{model}@{image_size}", CANDIDATE_MODE,
                     datetime.datetime.now().isoformat(timespec="seconds"))
    counts, why = per_domain_counts(domains, None, rec)
    lines += [
        *head,
        f"{len(both)} distinct candidates (of {len(todo)} asked), each timed in four passes in "
        f"one run: 1 runner, {k} runners on cores of one LLC domain ({domains[0]}), again {k}, "
        "again 1; a fresh cost table per pass. Per candidate, the median of its two passes per "
        "condition.",
        "",
        "| pass | runners | wall | median candidate cost |",
        "|---|---|---|---|",
        *(f"| {i + 1} | {r} | {w:.1f} s | {statistics.median(c.values()) * 1e6:.0f} us |"
          for i, (r, c, w) in enumerate(passes)),
        "",
        f"- median candidate cost: 1 runner {statistics.median(one.values()) * 1e6:.0f} us, "
        f"{k} runners {statistics.median(many.values()) * 1e6:.0f} us",
        f"- **concurrency bias (measured, {k} runners sharing an LLC domain vs 1): "
        f"{bias:+.1%}** median over candidates (p10 {ratios[len(ratios) // 10] - 1:+.1%}, "
        f"p90 {ratios[(9 * len(ratios)) // 10] - 1:+.1%})",
        f"- LLC domains here: {', '.join(str(list(d)) for d in domains)}; with this figure "
        f"recorded the farm places {sum(counts)} CPU runner(s) on this host ({why.value})",
        "",
    ]
    return rec


def bench_scaling(model: str, image_size: int, depth: int, n_cores: int, table_root: Path,
                  lines: list[str]) -> dict[str, float]:
    targets = parse_targets("ort-cpu")
    _, cands = candidates_for(model, targets, depth, image_size=image_size)
    todo = distinct(cands)
    rows: list[list[Any]] = []
    seen: dict[int, int] = {}  # runners -> row
    for label, slots in (("1 runner", 1), ("default", None),
                         ("one per core (forced)", n_cores)):
        farm = Farm.start(toolchains=["ort-cpu"], slots=slots, progress=False)
        runners, why = farm.slots()["used"], farm.slots()["why"]
        if runners in seen:  # the same runners as a row above: not measured twice
            if slots is None:
                rows[seen[runners]][0] += f" = default ({why})"
            farm.close()
            continue
        table = table_root / f"scale-{runners}"
        costs, wall, busy_s = _campaign_costs(farm, todo, table, model)
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
        med = statistics.median(c.seconds for c in costs if c.is_known)
        seen[runners] = len(rows)
        rows.append([f"default ({why})" if slots is None else label, runners, wall,
                     busy_s / (runners * wall), rerun, med])
    t1 = rows[0][2]
    lines += [
        f"## 2-3. Scaling, busy share, cache-hit re-run ({model} {image_size}x{image_size}, "
        "ort-cpu, default MeasureConfig)",
        "",
        f"{len(todo)} distinct candidates (depth <= {depth}; {len(cands)} before dedupe), all "
        "measured (no search, so every run does the same work); a fresh cost table per run.",
        "",
        "| slots | runners | campaign wall | speed-up | efficiency | runner busy share | "
        "cache-hit re-run | median candidate cost |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, runners, wall, share, rerun, med in rows:
        lines.append(f"| {name} | {runners} | {wall:.2f} s | {t1 / wall:.2f}x | "
                     f"{t1 / (runners * wall):.0%} | {share:.0%} | {rerun * 1e3:.0f} ms | "
                     f"{med * 1e6:.0f} us |")
    lines.append("")
    return {f"wall_{r[1]}": r[2] for r in rows}


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
        f"{len(cands)} candidates, {n_fp} distinct fingerprints; the default slots; fresh tables.",
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


def bench_loopback(nodes: int, model: str, image_size: int, n: int, table_root: Path,
                   lines: list[str]) -> None:
    """Section 5: a loopback cluster of ``nodes`` one-core nodes; default slots, 1 vs all."""
    from ray.cluster_utils import Cluster

    cores = sorted(os.sched_getaffinity(0))[:nodes]
    todo = distinct(candidates_for(model, parse_targets("ort-cpu"), 1,
                                   image_size=image_size)[1])
    todo = todo[::max(1, len(todo) // n)][:n]
    # each node: one core of this machine, declared as its own LLC domain (as separate hosts)
    res = [{f"cpu_slot_{c}": 1.0, f"cpu_llc_{c}": 1.0} for c in cores]
    cluster = Cluster(initialize_head=True, connect=True, head_node_args={
        "num_cpus": 1, "resources": res[0], "include_dashboard": False})
    rows = []
    try:
        for r in res[1:]:
            cluster.add_node(num_cpus=1, resources=r)
        cluster.wait_for_nodes()
        for cap in sorted({1, len(cores)}):
            farm = Farm.start(toolchains=["ort-cpu"], max_runners=cap, progress=False)
            try:
                why, nodes_used = farm.slots()["why"], len({r.node_id for r in farm.runners})
                _, wall, _ = _campaign_costs(farm, todo, table_root / f"loop-{cap}", model)
            finally:
                farm.close()
            rows.append((cap, nodes_used, why, wall))
    finally:
        farm_mod.shutdown()
        cluster.shutdown()
    t1 = rows[0][3]
    lines += [
        f"## 5. Multi-node loopback ({len(cores)} Ray nodes on this machine, {model} "
        f"{image_size}x{image_size}, ort-cpu, {len(todo)} candidates)",
        "",
        "Each node advertises one core and declares it its own LLC domain, as separate hosts "
        "would; the farm's default slots give one runner per node (`1 node` caps the farm at "
        "one runner). The nodes share this machine's real L3, so section 0's bias applies to "
        "their costs: this shows the scale-out, not unbiased numbers.",
        "",
        "| runners | nodes | slots | campaign wall | speed-up |",
        "|---|---|---|---|---|",
        *(f"| {cap} | {nn} | {why} | {wall:.2f} s | {t1 / wall:.2f}x |"
          for cap, nn, why, wall in rows),
        "",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--image-size", type=int, default=64)
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--prune-model", default="mnist")
    ap.add_argument("--prune-depth", type=int, default=3)
    ap.add_argument("--bias-candidates", type=int, default=80,
                    help="candidates (depth 1 of --model) timed for the concurrency bias")
    ap.add_argument("--bias-slots", type=int, default=2,
                    help="runners sharing one LLC domain in the bias measurement")
    ap.add_argument("--record-bias", action="store_true",
                    help="store the bias for this host and CPU where the farm reads it")
    ap.add_argument("--loopback-nodes", type=int, default=0,
                    help="also time a loopback cluster of N one-core nodes (0: skip)")
    ap.add_argument("--skip-pruning", action="store_true")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()

    n_cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)
    t_start = time.perf_counter()
    t0 = time.perf_counter()
    farm_mod.connect(toolchains=["null", "ort-cpu", "openvino"])
    ray_start = time.perf_counter() - t0
    host = socket.gethostname()
    domains = llc_domains(sorted(os.sched_getaffinity(0)))
    lines = [f"# bench/farm.py on {host}", "", *machine(),
             f"- embedded Ray: {n_cores} CPU measurement slots (`cpu_slot_<core>`) in LLC "
             f"domain(s) {', '.join(str(list(d)) for d in domains)} (`cpu_llc_*`), started in "
             f"{ray_start:.1f} s; runners pinned one core each; the coordinator shares the "
             "cores (no core is reserved for it on this machine)", ""]
    root = Path(tempfile.mkdtemp(prefix="bench-farm-"))
    try:
        rec = bench_bias(args.model, args.image_size, 1, args.bias_candidates, args.bias_slots,
                         root, lines)
        if rec is not None and args.record_bias:
            lines += [f"- recorded for `{rec.host}` ({rec.cpu}) in `{save_bias_record(rec)}`",
                      ""]
        print("\n".join(lines), flush=True)
        bench_overhead(n_cores, lines)
        bench_scaling(args.model, args.image_size, args.depth, n_cores, root, lines)
        if not args.skip_pruning:
            bench_pruning(args.prune_model,
                          28 if args.prune_model == "mnist" else args.image_size,
                          args.prune_depth, root, lines)
        farm_mod.shutdown()
        if args.loopback_nodes > 1:
            bench_loopback(args.loopback_nodes, args.model, args.image_size,
                           args.bias_candidates, root, lines)
    finally:
        farm_mod.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    lines.append(f"Total bench time {time.perf_counter() - t_start:.0f} s "
                 f"(`python bench/farm.py {' '.join(sys.argv[1:])}`).")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"farm-{host}.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
