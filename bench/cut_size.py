"""Does a cut's cost grow with the tensor crossing it? One cut at a time, per toolchain.

For a zoo model and a toolchain, every ``--stride``-th topological position whose cut is
crossed by one tensor becomes a two-partition plan (prefix, rest) on that toolchain; each is
timed end to end beside the whole model as one partition, interleaved (rotated order, medians
of ``--rounds`` rounds of ``--runs`` runs, `PlanExecutor.measure_in_chain`). The cut's cost is
the two-partition plan's time less the whole model's in the same round (median over rounds),
printed with the bytes of the tensor crossing it. A per-toolchain constant (what the campaign's
cut-cost probe charges) fits if the costs do not grow with the bytes.

    PYTHONPATH=. python3 -m bench.cut_size --model mobilenet_v2-96 --target openvino-cpu
"""

from __future__ import annotations

import argparse
import os
import statistics

from collage_farm import zoo
from collage_farm.core.graph import load_graph
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import get_target
from collage_farm.execute.builder import Part, PlanBuilder

MODELS = {"resnet18-64": ("resnet18", {"image_size": 64}),
          "mobilenet_v2-96": ("mobilenet_v2", {"image_size": 96})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mobilenet_v2-96", choices=sorted(MODELS))
    ap.add_argument("--target", default="openvino-cpu")
    ap.add_argument("--stride", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    name, kw = MODELS[args.model]
    g = load_graph(zoo.build(name, **kw), name=args.model)
    n, t = len(g.nodes), get_target(args.target)
    builder = PlanBuilder(g, threads=1)
    whole = builder.executor([Part(SubGraph.of(g, range(n)).mask, t)])
    plans = {}
    for p in range(1, n, args.stride):
        head = SubGraph.of(g, range(p))
        crossing = set(head.output_tensors) - set(g.graph_outputs)
        if len(crossing) != 1 or not head.is_convex or not SubGraph.of(g, range(p, n)).is_convex:
            continue
        (x,) = crossing
        nbytes = g.tensors[x].nbytes
        plans[(p, nbytes)] = builder.executor(
            [Part(head.mask, t), Part(SubGraph.of(g, range(p, n)).mask, t)])
    names = [("whole", whole), *plans.items()]
    got: dict[object, list[float]] = {k: [] for k, _ in names}
    load0 = os.getloadavg()[0]
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k, ex in order:
            totals, _ = ex.measure_in_chain(args.runs, warmup=2)
            got[k].append(statistics.median(totals))
    print(f"{args.model} on {args.target}: {n} nodes, {args.rounds} rounds x {args.runs} runs, "
          f"load {load0:.2f} -> {os.getloadavg()[0]:.2f}; whole "
          f"{statistics.median(got['whole']) * 1e3:.3f} ms")
    print("| cut at node | tensor KiB | cut cost us (median over rounds, vs whole) |")
    print("|---|---|---|")
    for (p, nbytes) in plans:
        d = [a - b for a, b in zip(got[(p, nbytes)], got["whole"])]
        print(f"| {p} | {nbytes / 1024:.0f} | {statistics.median(d) * 1e6:+.0f} |")


if __name__ == "__main__":
    main()
