"""Does a partition run slower when the partition it feeds runs on another toolchain?

For each kept campaign directory of `bench.plan_error` (``--keep``: ``DIR/<model>-<i>`` holding
the model and ``out/plan.json``, a two-partition plan), builds over the plan's own cut, in one
process, interleaved (9 rotated rounds of 20 chain runs, medians):

* ``plan``: the plan as written (producer on A, consumer on B);
* ``same:A`` and ``same:B``: both partitions on A, both on B (the same cut, no mix);
* ``whole:A`` and ``whole:B``: each toolchain's whole model.

Printed: each chain's end-to-end median and each partition's median call inside it (measured
ms). The producer's call in ``plan`` against the same call in ``same:A`` is what the mix costs
on the producer's side of the cut; the cut-cost probe (`collage_farm.probes.cutcost`) charges a
transition to the consumer's side only.

    PYTHONPATH=. python3 -m bench.producer_mix DIR/resnet18-64-0
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import onnx

from bench.profile_mode import load
from collage_farm.core.graph import load_graph
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import get_target
from collage_farm.execute import PlanExecutor
from collage_farm.execute.builder import Part, PlanBuilder


def chains_of(d: Path) -> tuple[list[str], dict[str, PlanExecutor]]:
    """The plan's partitions ('target nodes') and the five chains over its cut."""
    g = load_graph(onnx.load(str(next(d.glob("*.onnx")))))
    plan = json.loads((d / "out" / "plan.json").read_text())
    idx = {n.name: i for i, n in enumerate(g.nodes)}
    masks = [SubGraph.of(g, [idx[n] for n in p["nodes"]]).mask for p in plan["partitions"]]
    tg = [get_target(p["target"]) for p in plan["partitions"]]
    if len(tg) != 2 or tg[0].id == tg[1].id:
        raise SystemExit(f"{d}: not a plan of two partitions on two targets")
    b = PlanBuilder(g)
    chains = {"plan": b.executor([Part(m, t) for m, t in zip(masks, tg)])}
    for t in tg:
        chains[f"same:{t.id}"] = b.executor([Part(m, t) for m in masks])
    for t in tg:
        chains[f"whole:{t.id}"] = b.executor([Part(g.all_mask, t)])
    return [f"{p['target']} {len(p['nodes'])}" for p in plan["partitions"]], chains


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    print(f"load before {load()}")
    for d in args.dirs:
        parts, chains = chains_of(d)
        names = list(chains)
        tot: dict[str, list[float]] = {k: [] for k in names}
        per: dict[str, dict[int, list[float]]] = {k: {} for k in names}
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                t, calls = chains[k].measure_in_chain(args.runs, warmup=2)
                tot[k].append(statistics.median(t))
                for i, xs in enumerate(calls.values()):
                    per[k].setdefault(i, []).append(statistics.median(xs))
        print(f"{d.name}: plan {' + '.join(parts)}")
        for k in names:
            print(f"  {k}: e2e {statistics.median(tot[k]) * 1e3:.3f} ms (measured); in chain "
                  + ", ".join(f"p{i} {statistics.median(v) * 1e3:.3f}"
                              for i, v in per[k].items()), flush=True)
    print(f"load after {load()}")


if __name__ == "__main__":
    main()
