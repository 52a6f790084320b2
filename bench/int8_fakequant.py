"""Which quantisation scheme could pass `run`'s int8 check: fake quantisation in ONNX Runtime.

Why: `collage-farm run` holds an Ethos-U plan's outputs to `collage_farm.execute.numerics.
INT8_STEPS` steps of each output's calibrated range (or of its pinned int8 scale). When a model
fails it, the question is whether any scheme the NPU could run would pass: per-tensor int8
activations (what the converter writes today), 16-bit activations with 8-bit weights (TFLite's
"16x8"), bias correction of the weights, per-channel activations (not expressible in TFLite, a
bound). Each scheme is emulated in the fp32 model itself, no converter or kernel involved:

* activations: a round to the scheme's grid after every tensor the converter quantises (graph
  inputs and node outputs, less the ones a fold absorbs, `runners.tflite.fuse.plan_fusions`,
  and the outputs of `TIED_OPS`, which carry their input's grid),
  with the whole model's calibrated ranges (`runners.calibration.calibrate`, the campaign's
  seeded random samples); int8 asymmetric per tensor (Sigmoid / Softmax outputs pinned to
  1/256, `runners.tflite.PINNED_SCALES`), int8 per channel (rank-4 tensors, channel axis), or
  int16 symmetric per tensor (pins 1/32768);
* weights: Conv / ConvTranspose / MatMul constant weights per output channel, symmetric int8
  (max-abs scale), as the converter writes them; elementwise constants stay fp32;
* bias correction (``+bc``): each Conv / MatMul bias minus the mean shift its quantised weights
  cause, ``sum_c (Wq - W)[o, c] * mean(x_c)``, with the per-channel means of its input over the
  calibration samples (the analytic correction of Nagel et al., "Data-Free Quantization", 2019,
  with measured means).

Errors: max abs error of each graph output against the fp32 model on the seeded feeds `run`
checks (seed 0) and others, in the check's steps (`int8_step`, with the pinned scale of a
Softmax / Sigmoid output, also through an Identity after it: `pinned_outputs`); ``argmax`` is
the fraction of last-axis argmaxes that agree on the first seed.

    python bench/int8_fakequant.py pkg:ppocr-rec [--seeds 0,11,12] [--schemes a8w8,w8,...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parent))

from int8_check import machine

from collage_farm.core.graph import DataflowGraph, load_graph, random_inputs
from collage_farm.execute.numerics import (
    INT8_STEPS,
    TIED_OPS,
    int8_step,
    pinned_outputs,
    reference_outputs,
)
from collage_farm.zoo import packaged
from runners.calibration import calibrate
from runners.tflite import PINNED_SCALES
from runners.tflite.fuse import plan_fusions

_WEIGHT_OPS = {"Conv": 0, "ConvTranspose": 1, "MatMul": -1}  # op -> output-channel axis
_PIN16 = 1.0 / 32768.0


@dataclass(frozen=True)
class Scheme:
    """One emulated quantisation: activation grid ("" fp32, "int8", "int8-channel",
    "int16"), int8 weights or not, bias correction or not."""

    label: str
    acts: str
    weights: bool
    bias_correction: bool = False


SCHEMES = {s.label: s for s in (
    Scheme("a8w8", "int8", True),
    Scheme("w8", "", True),
    Scheme("w8+bc", "", True, True),
    Scheme("a8", "int8", False),
    Scheme("a8ch", "int8-channel", False),
    Scheme("a8w8+bc", "int8", True, True),
    Scheme("a16w8", "int16", True),
    Scheme("a16w8+bc", "int16", True, True),
)}


def quantised_tensors(g: DataflowGraph) -> list[str]:
    """The tensors the converter rounds: graph inputs and node outputs no fold absorbs (an
    Identity / Reshape output holds its input's rounded values: not rounded again)."""
    absorbed = plan_fusions(g, "int8").absorbed
    readers: dict[str, list[int]] = {}
    for i, n in enumerate(g.nodes):
        for t in n.inputs:
            if t:
                readers.setdefault(t, []).append(i)
    outs = set(g.graph_outputs)
    names = list(g.graph_inputs)
    for n in g.nodes:
        if n.op_type in TIED_OPS:
            continue
        for o in n.outputs:
            rs = readers.get(o, [])
            if o and not (rs and o not in outs and all(r in absorbed for r in rs)):
                names.append(o)
    return [t for t in names if t in g.tensors and g.tensors[t].elem_type == 1]


def with_outputs(model: onnx.ModelProto, names: list[str]) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    m.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names if t not in have)
    return m


def channel_stats(g: DataflowGraph, names: list[str], samples: list[dict]
                  ) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per tensor (per-channel min, max, mean) over ``samples``: channel axis 1 for rank 4,
    the last axis otherwise."""
    probe = with_outputs(g.model, names)
    acc: dict[str, list[np.ndarray]] = {}
    for feeds in samples:
        for t, v in reference_outputs(probe, names, feeds).items():
            a = np.asarray(v, np.float64)
            a = np.moveaxis(a, 1, -1) if a.ndim == 4 else a
            a = a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1)
            cur = (a.min(0), a.max(0), a.mean(0) / len(samples))
            acc[t] = [np.minimum(acc[t][0], cur[0]), np.maximum(acc[t][1], cur[1]),
                      acc[t][2] + cur[2]] if t in acc else list(cur)
    return {t: (v[0], v[1], v[2]) for t, v in acc.items()}


def quantise_weights(g: DataflowGraph, model: onnx.ModelProto,
                     means: Mapping[str, np.ndarray] | None) -> None:
    """Weights to symmetric per-output-channel int8 in place; with ``means`` (per-channel
    input means) each node's bias absorbs the mean shift (module docstring)."""
    inits = {i.name: i for i in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    for n in g.nodes:
        axis = _WEIGHT_OPS.get(n.op_type)
        if axis is None or len(n.inputs) < 2 or n.inputs[1] not in inits:
            continue
        w = numpy_helper.to_array(inits[n.inputs[1]]).astype(np.float64)
        axis %= w.ndim
        other = tuple(d for d in range(w.ndim) if d != axis)
        scale = np.maximum(np.abs(w).max(axis=other, keepdims=True), 1e-12) / 127.0
        q = np.clip(np.round(w / scale), -127, 127) * scale
        inits[n.inputs[1]].CopyFrom(numpy_helper.from_array(q.astype(np.float32), n.inputs[1]))
        if means is None or n.inputs[0] not in means or n.op_type == "ConvTranspose":
            continue
        shift = _mean_shift(n.op_type, q - w, means[n.inputs[0]])
        if shift is not None:
            _subtract_bias(model, nodes[n.name], inits, shift)


def _mean_shift(op: str, dw: np.ndarray, mean: np.ndarray) -> np.ndarray | None:
    """Per output channel, the mean of (Wq - W) x for inputs of per-channel ``mean``."""
    if op == "MatMul":
        return mean @ dw if dw.ndim == 2 else None
    cout, cin_g = dw.shape[:2]
    groups = mean.size // cin_g
    per = dw.sum(axis=(2, 3)).reshape(groups, cout // groups, cin_g)
    return np.einsum("gok,gk->go", per, mean.reshape(groups, cin_g)).reshape(-1)


def _subtract_bias(model: onnx.ModelProto, node: onnx.NodeProto, inits: dict,
                   shift: np.ndarray) -> None:
    if node.op_type == "Conv" and len(node.input) > 2 and node.input[2] in inits:
        b = numpy_helper.to_array(inits[node.input[2]]).astype(np.float64)
        inits[node.input[2]].CopyFrom(numpy_helper.from_array(
            (b - shift).astype(np.float32), node.input[2]))
        return
    name = f"{node.output[0]}/bias_correction"
    model.graph.initializer.append(numpy_helper.from_array((-shift).astype(np.float32), name))
    if node.op_type == "Conv":
        if len(node.input) == 2:
            node.input.append(name)
        return
    out = node.output[0]  # MatMul: add the correction after it
    node.output[0] = f"{out}/uncorrected"
    model.graph.node.append(helper.make_node("Add", [node.output[0], name], [out]))


def grid(t: str, scheme: Scheme, lo: np.ndarray, hi: np.ndarray, pin: float
         ) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(scale, zero point, qmin, qmax) of tensor ``t``'s grid (arrays: per channel)."""
    lo, hi = np.minimum(lo, 0.0), np.maximum(hi, 0.0)
    if scheme.acts == "int16":
        s = np.full_like(hi, _PIN16) if pin else np.maximum(np.maximum(-lo, hi), 1e-6) / 32767
        return s, np.zeros_like(s), -32767.0, 32767.0
    s = np.maximum(hi - lo, 1e-6) / 255.0
    zp = np.clip(np.round(-128 - lo / s), -128, 127)
    if pin:
        s, zp = np.full_like(s, pin), np.full_like(s, -128.0)
    return s, zp, -128.0, 127.0


def fake_quantise(g: DataflowGraph, model: onnx.ModelProto, scheme: Scheme, names: list[str],
                  stats: Mapping, ranges: Mapping[str, tuple[float, float]]) -> dict[str, str]:
    """Insert a round to ``scheme``'s grid after every tensor of ``names`` (in place): per
    tensor over ``ranges`` (the campaign's), per channel over ``stats``; returns tensor -> its
    rounded name (readers are rewired to it)."""
    producer = {o: n.op_type for n in g.nodes for o in n.outputs}
    rounded: dict[str, str] = {}
    qnodes: dict[str, list[onnx.NodeProto]] = {}
    for t in names:
        lo, hi, _ = stats[t]
        if scheme.acts != "int8-channel" or len(g.tensors[t].shape) != 4:
            lo, hi = np.array([ranges[t][0]]), np.array([ranges[t][1]])
        s, zp, qmin, qmax = grid(t, scheme, lo, hi, PINNED_SCALES.get(producer.get(t, ""), 0.0))
        shape = (1, -1, 1, 1) if s.size > 1 else ()
        consts = {k: numpy_helper.from_array(np.asarray(v, np.float32).reshape(shape),
                                             f"{t}/fq_{k}")
                  for k, v in (("s", s), ("zp", zp))}
        consts.update({k: numpy_helper.from_array(np.float32(v), f"{t}/fq_{k}")
                       for k, v in (("lo", qmin), ("hi", qmax))})
        model.graph.initializer.extend(consts.values())
        o = f"{t}/fq"
        rounded[t] = o
        qnodes[t] = [helper.make_node("Div", [t, f"{t}/fq_s"], [o + "1"]),
                     helper.make_node("Round", [o + "1"], [o + "2"]),
                     helper.make_node("Add", [o + "2", f"{t}/fq_zp"], [o + "3"]),
                     helper.make_node("Clip", [o + "3", f"{t}/fq_lo", f"{t}/fq_hi"], [o + "4"]),
                     helper.make_node("Sub", [o + "4", f"{t}/fq_zp"], [o + "5"]),
                     helper.make_node("Mul", [o + "5", f"{t}/fq_s"], [o])]
    order = [q for t in g.graph_inputs if t in qnodes for q in qnodes[t]]
    for n in model.graph.node:
        n.input[:] = [rounded.get(t, t) for t in n.input]
        order.append(n)
        order.extend(q for o in n.output if o in qnodes for q in qnodes[o])
    del model.graph.node[:]
    model.graph.node.extend(order)
    return rounded


def scheme_model(g: DataflowGraph, scheme: Scheme, names: list[str], stats: Mapping,
                 ranges: Mapping[str, tuple[float, float]]
                 ) -> tuple[onnx.ModelProto, dict[str, str]]:
    model = onnx.ModelProto()
    model.CopyFrom(g.model)
    if scheme.weights:
        means = {t: v[2] for t, v in stats.items()} if scheme.bias_correction else None
        quantise_weights(g, model, means)
    rounded = fake_quantise(g, model, scheme, names, stats, ranges) if scheme.acts else {}
    outs = list(g.graph_outputs)
    return with_outputs(model, [rounded.get(o, o) for o in outs]), rounded


def errors(g: DataflowGraph, scheme: Scheme, names: list[str], stats: Mapping,
           ranges: Mapping[str, tuple[float, float]], steps: Mapping[str, float],
           seeds: list[int]) -> tuple[list[float], float]:
    """(max over outputs of the error in steps, per seed; argmax agreement on the first)."""
    model, rounded = scheme_model(g, scheme, names, stats, ranges)
    wanted = [rounded.get(o, o) for o in g.graph_outputs]
    out, agree = [], 1.0
    for k, seed in enumerate(seeds):
        feeds = random_inputs(g, seed)
        ref = reference_outputs(g.model, list(g.graph_outputs), feeds)
        got = reference_outputs(model, wanted, feeds)
        out.append(max(float(np.abs(np.asarray(got[rounded.get(o, o)], np.float64) - r).max())
                       / steps[o] for o, r in ref.items()))
        if k == 0:
            o0 = g.graph_outputs[0]
            top = np.argmax(got[rounded.get(o0, o0)], -1)
            agree = float(np.mean(top == np.argmax(ref[o0], -1)))
    return out, agree


def arguments(doc: str, schemes: Iterable[str], system: bool = False
              ) -> tuple[argparse.Namespace, list[int]]:
    """The command line of these benches: a packaged model, the seeds, the schemes (and the
    board where ``system``)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("model", help="a packaged model, pkg:NAME")
    if system:
        ap.add_argument("--system", default="ethos-u65-256")
    ap.add_argument("--seeds", default="0,11,12", help="check feeds (run uses seed 0)")
    ap.add_argument("--schemes", default=",".join(schemes))
    args = ap.parse_args()
    return args, [int(s) for s in args.seeds.split(",")]


def main() -> int:
    args, seeds = arguments(__doc__ or "", SCHEMES)
    name = args.model.removeprefix(packaged.PREFIX)
    g = load_graph(packaged.reference_model(name).SerializeToString())
    ranges = calibrate(g)
    names = quantised_tensors(g)
    stats = channel_stats(g, names, [random_inputs(g, s) for s in range(8)])
    pins = pinned_outputs(g.model, list(g.graph_outputs))
    steps = {o: int8_step(*ranges[o], pins.get(o, ((), 0.0))[1]) for o in g.graph_outputs}
    print("\n".join(machine()))
    print(f"\n{args.model}: fake-quantised in ONNX Runtime, max abs error of the outputs in "
          f"the check's steps (tolerance {INT8_STEPS:g}); {len(names)} tensors rounded; "
          f"seeds {seeds}\n")
    print("| scheme | activations | int8 weights | bias correction | steps per seed | argmax |")
    print("|---|---|---|---|---|---|")
    for label in args.schemes.split(","):
        s = SCHEMES[label]
        got, agree = errors(g, s, names, stats, ranges, steps, seeds)
        print(f"| {label} | {s.acts or 'fp32'} | {'yes' if s.weights else 'no'} | "
              f"{'yes' if s.bias_correction else 'no'} | {', '.join(f'{x:.1f}' for x in got)} "
              f"| {agree:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
