"""Where an int8 plan's error arises: every partition boundary of Vela's own split, and every
node alone, against the fp32 model, in int8 steps of each tensor's calibrated range.

Why: `collage-farm run` holds a plan's outputs to `collage_farm.execute.numerics.INT8_STEPS`
steps; when a model fails it, the output alone does not say which layer lost the precision.
Two views, on the feeds `run` checks (seeded random, seed 0) and the whole model's ranges:

* ``boundaries``: Vela whole's split of the model (`collage_farm.postsearch.vela_whole`), each
  partition's outputs as the plan computes them (int8 partitions in LiteRT's reference kernels,
  as `run` does) against ONNX Runtime's fp32 values of the same tensors: the accumulated error;
* ``local``: every node as its own partition (NPU where Vela takes it, else the host), fed the
  fp32 values of its inputs: the error that node adds by itself, largest first.

    python bench/int8_layers.py pkg:ppocr-det [--system ethos-u65-256] [--view local]
                                [--top 30]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parent))

from int8_check import machine, write

from collage_farm.config import load_config
from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.execute import PlanExecutor
from collage_farm.execute.numerics import int8_step, reference_outputs
from collage_farm.postsearch.vela_whole import Board, ethos_u_board, vela_whole_parts
from collage_farm.zoo import packaged


def fp32_values(model: onnx.ModelProto, names: list[str], feeds: dict) -> dict[str, np.ndarray]:
    """ONNX Runtime CPU values of ``names``, every one exposed as a graph output."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    have = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names if t not in have)
    return reference_outputs(probe, names, feeds)


def parts_of(g: DataflowGraph, board: Board, view: str) -> list[tuple[int, object]]:
    whole = [(p.mask, p.target) for p in vela_whole_parts(g, board)]
    if view == "boundaries":
        return whole
    npu = 0
    for mask, target in whole:
        if target == board.npu:
            npu |= mask
    return [(1 << i, board.npu if npu >> i & 1 else board.host) for i in range(len(g.nodes))]


def rows(spec: str, system: str, view: str, tmp: Path) -> list[tuple]:
    name = spec.removeprefix(packaged.PREFIX)
    model = packaged.reference_model(name)
    src = tmp / "model.onnx"
    onnx.save(model, src)
    g = load_graph(src, packaged.input_shapes(name))
    targets = list(load_config(builtin_system=system).selected_targets)
    board = ethos_u_board(targets)
    assert board is not None
    ex = PlanExecutor(write(g, parts_of(g, board, view), targets, tmp / "plan", spec),
                      model=str(src))
    feeds = ex.random_feeds(0)
    ref = {**fp32_values(model, [o for n in g.nodes for o in n.outputs if o], feeds), **feeds}
    if view == "boundaries":
        ex.run(feeds)
        got = ex._discovered
    producer = {o: n for n in g.nodes for o in n.outputs}
    out = []
    for rt in ex.partitions:
        vals = rt.plain({k: ref[k] for k in rt.inputs}) if view == "local" else got
        for o in rt.outputs:
            lo, hi = ex.tensor_ranges.get(o, (0.0, 0.0))
            err = float(np.abs(np.asarray(vals[o], np.float64) - ref[o]).max())
            out.append((err / int8_step(lo, hi), rt.id, rt.target, producer[o].op_type, o,
                        lo, hi, err))
    return sorted(out, reverse=True) if view == "local" else out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a packaged model, pkg:NAME")
    ap.add_argument("--system", default="ethos-u65-256")
    ap.add_argument("--view", choices=["boundaries", "local"], default="boundaries")
    ap.add_argument("--top", type=int, default=0, help="print only the first N rows")
    args = ap.parse_args()
    print("\n".join(machine()))
    print(f"\n{args.model} on {args.system}, {args.view}: error in int8 steps of each tensor's "
          "calibrated range (seed-0 feeds, whole-model ranges)\n")
    print("| steps | partition | target | op | tensor | range | max abs error |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        found = rows(args.model, args.system, args.view, Path(tmp))
    for steps, pid, target, op, t, lo, hi, err in found[:args.top or None]:
        print(f"| {steps:.1f} | {pid} | {target} | {op} | {t} | [{lo:.3f}, {hi:.3f}] | "
              f"{err:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
