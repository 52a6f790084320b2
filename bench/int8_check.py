"""How far an Ethos-U plan's int8 outputs are from the fp32 model, in int8 steps, two ways.

Why: ``collage-farm run`` holds a plan with int8 partitions (Ethos-U NPU, Cortex-M host) to
`collage_farm.execute.numerics.INT8_STEPS` steps of each output's calibrated range. This
measures, side by side in one run on the same feeds, the error of each plan (1) as ``run``
builds it now, every int8 partition quantised with the whole model's ranges
(`runners.calibration`), and (2) as it was built before: each partition calibrated on its own
first inputs. Plans: Vela's own NPU / host split of each model (`collage_farm.postsearch.
vela_whole`) and the model's nodes cut into ``--chunks`` runs alternating NPU and host.

    python bench/int8_check.py [--out bench/results] [--chunks 3] [--seeds 0,5]
                               [--models mnist,resnet18,mobilenet_v2,gpt2]

Results go to bench/results/int8-check-<host>.md with the machine and load average.
"""

from __future__ import annotations

import argparse
import itertools
import os
import socket
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_farm import zoo
from collage_farm.config import load_config
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.core.plan import make_plan, write_plan
from collage_farm.core.search import PlannedPartition, SearchResult
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import Target
from collage_farm.execute import INT8_STEPS, PlanExecutor, make_runtime
from collage_farm.execute.numerics import reference_outputs
from collage_farm.postsearch.vela_whole import ethos_u_board, vela_whole_parts
from runners.base import DeviceDescription
from runners.ethosu import VelaCapabilities

MODELS: dict[str, dict[str, object]] = {
    "mnist": {}, "resnet18": {"image_size": 32}, "mobilenet_v2": {"image_size": 32},
    "gpt2": {"layers": 1},
}


def chunked(graph: DataflowGraph, k: int, npu: Target, host: Target
            ) -> list[tuple[int, Target]]:
    """``k`` runs of the node order alternating NPU and host (a node Vela refuses: host)."""
    n, caps = len(graph.nodes), VelaCapabilities()
    bounds = [round(i * n / k) for i in range(k + 1)]
    parts: list[list] = []
    for i, (a, b) in enumerate(itertools.pairwise(bounds)):
        for j in range(a, b):
            t = npu if i % 2 == 0 and caps.why_not(graph.nodes[j], graph) is None else host
            if parts and parts[-1][1] is t:
                parts[-1][0] |= 1 << j
            else:
                parts.append([1 << j, t])
    return [(m, t) for m, t in parts]


def write(graph: DataflowGraph, parts: list[tuple[int, Target]], targets: list[Target],
          out: Path, source: Path) -> Path:
    planned = tuple(PlannedPartition(CandidatePartition(SubGraph(graph, m), t), Cost(1e-5), 0.0)
                    for m, t in parts)
    result = SearchResult(planned, 1e-5 * len(parts), 0, 0, 0, 0, 0.0)
    plan = make_plan(graph, result, targets, estimator="bench")
    plan.extra["source"] = str(source)
    write_plan(plan, graph, result, out)
    return out


def errors_in_steps(plan_dir: Path, seeds: list[int]) -> tuple[int, list[float], list[float]]:
    """(partitions, steps with whole-model ranges, steps with per-partition ranges) per seed,
    the largest over the outputs."""
    ex = PlanExecutor(plan_dir)
    own = PlanExecutor.from_runtimes(
        [make_runtime(rt.id, rt.target, rt.toolchain, ex.files[rt.id].read_bytes(), rt.inputs,
                      rt.outputs, rt.estimated_s) for rt in ex.partitions],
        ex.plan.graph_inputs, ex.plan.graph_outputs, ex.reference())
    steps = ex.int8_steps
    new, old = [], []
    for seed in seeds:
        feeds = ex.random_feeds(seed)
        ref = reference_outputs(ex.reference(), ex.plan.graph_outputs, feeds)
        for runner, acc in ((ex, new), (own, old)):
            got = runner.run(feeds)
            acc.append(max(float(np.abs(got[o] - r).max()) / steps[o] for o, r in ref.items()))
    return len(ex.partitions), new, old


def machine() -> list[str]:
    dev = DeviceDescription.host_cpu()
    return [f"- date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}",
            f"- host: {socket.gethostname()}, {dev.name}, {dev.cores} cores",
            "- load average at start (1/5/15 min): "
            + " / ".join(f"{x:.2f}" for x in os.getloadavg())]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--seeds", default="0,5")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--system", default="ethos-u55-128")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    targets = list(load_config(builtin_system=args.system).selected_targets)
    board = ethos_u_board(targets)
    assert board is not None
    lines = [f"# int8 plan outputs vs the fp32 model, in int8 steps ({args.system})", "",
             *machine(), "",
             f"Seeds {seeds}; `run` tolerates {INT8_STEPS:g} steps. 'whole' = every int8 "
             "partition quantised with the whole model's ranges (run now); 'own' = each "
             "partition calibrated on its own first inputs (run before).", "",
             "| model | plan | partitions | whole (steps) | own (steps) | own / whole |",
             "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            model = zoo.build(name, **MODELS[name])
            path = Path(tmp) / f"{name}.onnx"
            onnx.save(model, path)
            g = load_graph(path)
            cuts = {"vela whole": [(p.mask, p.target) for p in vela_whole_parts(g, board)],
                    f"{args.chunks} chunks": chunked(g, args.chunks, board.npu, board.host)}
            for label, parts in cuts.items():
                d = write(g, parts, targets, Path(tmp) / f"{name}-{label.replace(' ', '_')}",
                          path)
                n, new, old = errors_in_steps(d, seeds)
                row = (f"| {name} | {label} | {n} | {', '.join(f'{x:.1f}' for x in new)} | "
                       f"{', '.join(f'{x:.1f}' for x in old)} | "
                       f"{max(old) / max(max(new), 1e-9):.1f}x |")
                print(row, flush=True)
                lines.append(row)
    out = Path(args.out) / f"int8-check-{socket.gethostname()}.md"
    out.write_text("\n".join(lines) + "\n")
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
