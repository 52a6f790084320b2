"""The cut-cost probe's points and fit by bytes, beside one cut at a time at the same places.

For a model (a zoo model of `bench.profile_mode.MODELS`, or a source such as ``pkg:ppocr-rec``)
and targets ``ort-cpu,openvino-cpu,litert-cpu``, one thread a session:

1. the campaign's cut-cost probe (`collage_farm.probes.cutcost.measure_cut_costs`, ``wholes``
   as profile mode runs it): per target, each chunk's entering bytes, its *mixed* extra per
   partner (the chunk in the chain alternating with the partner less the same chunk in the
   all-target chain), the constant it charged before (median), and the fitted line by bytes;
2. then, at every chunk boundary of the probe, the model cut once on each target (a
   two-partition plan: the chunks before, the chunks after) beside the whole model in the same
   rotated rounds: the *same-toolchain* cost of that one cut (median over rounds of the
   two-partition plan less the whole model), against the probe's same-toolchain figure
   ((all-target chain - whole) / cuts, one figure per target).

Every figure measured; what it says about the charge goes in bench/results/cut-size-vm.md.

    PYTHONPATH=. python3 -m bench.cut_fit --model pkg:ppocr-rec
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from bench.profile_mode import MODELS
from collage_farm import zoo
from collage_farm.core.cutcharge import fit_cut_charge
from collage_farm.core.graph import load_graph
from collage_farm.core.target import get_target
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.probes.cutcost import chunk_masks, measure_cut_costs
from collage_farm.zoo.source import load_source


def rotated_medians(chains: dict[Any, Any], rounds: int, runs: int) -> dict[Any, list[float]]:
    """Per chain (a `PlanExecutor`), its median end-to-end seconds in each of ``rounds``
    rounds of ``runs`` runs (2 warm-up runs each), the chains in rotated order each round."""
    names = list(chains)
    got: dict[Any, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            totals, _ = chains[k].measure_in_chain(runs, warmup=2)
            got[k].append(statistics.median(totals))
    return got


def one_cut_costs(builder: PlanBuilder, masks: list[int], targets: list, rounds: int,
                  runs: int) -> dict[str, list[float]]:
    """Per target, the cost of one cut at each chunk boundary: median over rounds of
    (two-partition plan - whole model), interleaved in rotated rounds."""
    full = sum(masks)
    plans = {}
    for t in targets:
        plans[(t.id, 0)] = builder.executor([Part(full, t)])
        for j in range(1, len(masks)):
            head = sum(masks[:j])
            plans[(t.id, j)] = builder.executor([Part(head, t), Part(full ^ head, t)])
    got = rotated_medians(plans, rounds, runs)
    return {t.id: [statistics.median(a - b for a, b in zip(got[(t.id, j)], got[(t.id, 0)]))
                   for j in range(1, len(masks))] for t in targets}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mobilenet_v2-96")
    ap.add_argument("--targets", default="ort-cpu,openvino-cpu,litert-cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    if args.model in MODELS:
        name, kw = MODELS[args.model]
        g = load_graph(zoo.build(name, **kw), name=args.model)
    else:
        g = load_source(args.model)
    targets = [get_target(t) for t in args.targets.split(",")]
    builder = PlanBuilder(g, threads=1)
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    cc = measure_cut_costs(g, targets, builder=builder, wholes=True)
    probe_s = time.perf_counter() - t0
    masks = chunk_masks(g, cc.chunks)
    one = one_cut_costs(builder, masks, targets, args.rounds, args.runs)
    print(f"{args.model}: {len(g.nodes)} nodes, {cc.chunks} chunks; probe {probe_s:.1f} s "
          f"({cc.rounds} rounds); one-cut plans {args.rounds} rounds x {args.runs} runs; load "
          f"{load0:.2f} -> {os.getloadavg()[0]:.2f}; whole models ms (probe): "
          + ", ".join(f"{k} {v * 1e3:.3f}" for k, v in cc.wholes_s.items()))
    print("| target | boundary | entering KiB | mixed extra us per partner (probe) | "
          "same-toolchain one cut us (two-partition plan - whole) |")
    print("|---|---|---|---|---|")
    for t in targets:
        for j in range(1, cc.chunks):
            # chunk j runs on t in the chain starting on the partner (j odd) or on t (j even)
            labels = [(p, f"{p.id}/{t.id}" if j % 2 else f"{t.id}/{p.id}")
                      for p in targets if p.id != t.id]
            mixed = [f"{p.id.split('-')[0]} "
                     f"{(cc.chunk_s[lab][j] - cc.chunk_s[t.id][j]) * 1e6:+.0f}"
                     for p, lab in labels if lab in cc.chunk_s and t.id in cc.chunk_s]
            print(f"| {t.id} | {j} | {cc.chunk_bytes[j] / 1024:.0f} | {', '.join(mixed)} | "
                  f"{one[t.id][j - 1] * 1e6:+.0f} |")
    for t in targets:
        c = cc.charges.get(t.id)
        same_fit = fit_cut_charge(list(zip(cc.chunk_bytes[1:], one[t.id])))
        print(f"  {t.id}: mixed extra, probe constant {cc.cuts.get(t.id, 0) * 1e6:.0f} us, "
              f"fit {c.fixed_s * 1e6:+.0f} us + {c.per_byte_s * 1024e6:.3f} us/KiB; "
              f"same-toolchain cut, probe figure {cc.same_cuts.get(t.id, 0) * 1e6:.0f} us, "
              f"one cut at a time fit {same_fit.fixed_s * 1e6:+.0f} us + "
              f"{same_fit.per_byte_s * 1024e6:.3f} us/KiB" if c else f"  {t.id}: no fit")


if __name__ == "__main__":
    main()
