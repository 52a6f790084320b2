"""Does the cut-cost probe's whole-model time (the profile estimator's time base) agree with a
plan's whole model timed the way `bench.plan_error` verifies it?

One process, no Ray, no campaign: ``--repeats`` times, the probe
(`collage_farm.probes.cutcost.measure_cut_costs` with ``wholes``: every target's whole model
interleaved with the 6-chunk chains) and then each target's whole model as a one-partition plan
timed in chain (9 rotated rounds of 20 runs, medians), back to back. Printed: both whole-model
times per target (measured ms) and the probe's same-toolchain cut cost per cut (measured us),
so the spread of each over the repeats shows the machine's noise.

    PYTHONPATH=. python3 -m bench.timebase_check --model resnet18-64
"""

from __future__ import annotations

import argparse
import statistics

from bench.profile_mode import MODELS, load
from collage_farm import zoo
from collage_farm.core.graph import load_graph
from collage_farm.core.target import get_target
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.probes.cutcost import measure_cut_costs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="resnet18-64", choices=sorted(MODELS))
    ap.add_argument("--targets", default="ort-cpu,openvino-cpu,litert-cpu")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    name, kw = MODELS[args.model]
    g = load_graph(zoo.build(name, **kw))
    ts = [get_target(t) for t in args.targets.split(",")]
    b = PlanBuilder(g)
    ex = {t.id: b.executor([Part(g.all_mask, t)]) for t in ts}
    print(f"{args.model}, load before {load()}")
    for i in range(args.repeats):
        cc = measure_cut_costs(g, ts, builder=b, wholes=True)
        tot: dict[str, list[float]] = {k: [] for k in ex}
        names = list(ex)
        for r in range(9):
            for k in names[r % len(names):] + names[:r % len(names)]:
                t, _ = ex[k].measure_in_chain(20, warmup=2)
                tot[k].append(statistics.median(t))
        print(f"  repeat {i}: whole model ms (measured), probe / in-chain plan: " + ", ".join(
            f"{k} {cc.wholes_s[k] * 1e3:.3f} / {statistics.median(v) * 1e3:.3f}"
            for k, v in tot.items()) + "; probe same-toolchain cut us (measured): " +
            ", ".join(f"{k} {v * 1e6:.0f}" for k, v in cc.same_cuts.items()), flush=True)
    print(f"load after {load()}")


if __name__ == "__main__":
    main()
