"""LiteRT in the campaign's own process: the cut-cost probe's plan timings vs the candidate cost.

Why: the driver process times LiteRT plans through the partitioned executor (the cut-cost
probe, never-worse and refinement timings) while candidates are timed by
`LiteRTToolchain.measure` (on a Ray worker, or here); the two must agree for the same model, or
the probe's time base and the plan decisions for ``litert-cpu`` are off. On gpt2-2L they did
not: the probe's whole model ran 2.5-3x the candidate cost, because the toolchain's bounded
handle cache evicted the large interpreters and each plan run made them again.

One run, in this order, in one process (1 thread everywhere):

1. `collage_farm.probes.cutcost.measure_cut_costs` on gpt2 (``--layers``, default 2) with
   ``wholes``: every target's chunk chain, mixed chains and whole model timed interleaved
   through `PlanBuilder` executors; LiteRT interpreters made during the probe are counted;
2. `LiteRTToolchain.measure` of the whole model (the candidate path: interpreter held, inputs
   bound once, ``invoke()`` timed, the layout boundary added);
3. the probe's own whole-model LiteRT plan (its cached executor) and the candidate timer
   (`LiteRTToolchain.timer`) alternated round by round, nothing else in between: what is left
   of the difference once the probe's interleaving with the other chains is taken away.

Prints each figure (measured), and the ratios to the candidate cost (1.0 = consistent).

    python3 bench/litert_inproc.py [--targets ort-cpu,litert-cpu]
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_farm import zoo
from collage_farm.core.graph import load_graph
from collage_farm.core.target import get_target
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.probes.cutcost import measure_cut_costs
from runners.base import BuildInput, DeviceDescription, MeasureConfig, MeasureInput
from runners.measure import time_callable
from runners.registry import get_toolchain


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--targets", default="ort-cpu,openvino-cpu,litert-cpu")
    ap.add_argument("--rounds", type=int, default=3, help="probe rounds (default 3)")
    args = ap.parse_args()
    model = zoo.build("gpt2", layers=args.layers)
    graph = load_graph(model)
    targets = [get_target(t) for t in args.targets.split(",")]
    lt = get_target("litert-cpu")
    if lt not in targets:
        print("--targets must include litert-cpu")
        return 2
    tc = get_toolchain("litert")
    made: collections.Counter[int] = collections.Counter()
    make = tc._make  # counted on this instance only: how often an interpreter is made

    def counted(data: bytes, threads: int):  # type: ignore[no-untyped-def]
        made[len(data)] += 1
        return make(data, threads)

    tc._make = counted  # type: ignore[method-assign]
    t0 = time.perf_counter()
    builder = PlanBuilder(graph, threads=1)
    cc = measure_cut_costs(graph, targets, chunks=6, rounds=args.rounds, wholes=True,
                           builder=builder)
    probe_s = time.perf_counter() - t0
    made_in_probe = dict(made)
    build = tc.build(BuildInput("gpt2-whole", lt, model.SerializeToString()))
    res = tc.measure(MeasureInput(build, MeasureConfig(rounds=5, min_round_runs=3)))
    cand = res.summary.median
    plan_fn = builder.executor([Part(graph.all_mask, lt)]).timed_callable()
    timer = tc.timer(build, MeasureConfig())
    one = MeasureConfig(warmup_runs=1, rounds=1, min_round_runs=3, min_round_s=0.0)
    alt: dict[str, list[float]] = {"plan": [], "candidate": []}
    for _ in range(5):
        alt["plan"] += time_callable(plan_fn, one)[0]
        alt["candidate"] += timer(one)
    med = {k: statistics.median(v) for k, v in alt.items()}
    whole = cc.wholes_s.get(lt.id, float("nan"))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"## gpt2-{args.layers}L, LiteRT in one process "
          f"({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)\n")
    print(f"machine: {DeviceDescription.host_cpu().name}, {os.cpu_count()} cores, "
          f"load average {load}; "
          f"probe targets {args.targets}, {cc.rounds} rounds, {probe_s:.0f} s\n")
    print("| figure (measured, 1 thread) | ms |\n| --- | ---: |")
    for t, s in sorted(cc.wholes_s.items()):
        print(f"| probe: {t} whole model (one-partition plan, interleaved) | {s * 1e3:.1f} |")
    print(f"| candidate: LiteRTToolchain.measure, whole model | {cand * 1e3:.1f} |")
    print(f"| **ratio probe litert-cpu whole / candidate** | {whole / cand:.2f}x |")
    for k, v in med.items():
        print(f"| alternated: {k} (probe's whole-model plan / candidate timer) | {v * 1e3:.1f} |")
    print(f"| **ratio alternated plan / candidate** | {med['plan'] / med['candidate']:.2f}x |\n")
    sizes = ", ".join(f"{k / 1e6:.1f} MB: {v}" for k, v in sorted(made_in_probe.items()))
    print(f"LiteRT interpreters made during the probe, by flatbuffer size: {sizes}; "
          f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
