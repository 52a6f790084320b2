"""int8 against 16x8 (int16 activations, int8 weights), with and without bias correction, on
Vela whole's split of a model: the check's error in LiteRT's reference kernels, and Vela's cost.

Why: `collage-farm run` holds an Ethos-U plan to `collage_farm.execute.numerics.INT8_STEPS`
steps of each output's range (or pinned scale). A model whose channels differ too widely for
one int8 scale per tensor (PP-OCRv4 rec) fails it in any split; ``bench/int8_fakequant.py``
emulates which scheme could pass. This runs the real thing, side by side on the same feeds:
Vela's own NPU / host split of the model (`collage_farm.postsearch.vela_whole`), every
partition the converter maps in int8 mode converted (`runners.tflite.convert`) as

* ``int8``: what ``run`` builds today (whole-model ranges, `runners.calibration`);
* ``int8+bc``: the same, each Conv / FC bias corrected for its rounded weights' mean shift,
  with the per-channel means of its input on the same calibration samples;
* ``16x8``, ``16x8+bc``: `ActivationBits.INT16` (TFLite's 16x8 scheme), without / with it;

and run in LiteRT's reference kernels (the arithmetic TFLM and Vela implement); partitions the
converter maps in fp32 only run fp32 in ONNX Runtime, as ``run`` runs them, and so does an
int8 Softmax with rows of >= 512 entries (`runners.runtime_sim.softmax_abort_risk`; the int16
kernel runs them). Errors: the
largest over the graph outputs, in the check's steps (`PlanExecutor.int8_steps`), on the
seeded feeds ``run`` checks (seed 0) and others. Cost: Vela's estimate of every NPU partition,
summed (simulated: Vela's cycles at the board clock; Vela's own CPU fallbacks priced by the
analytic host model), and the partitions Vela leaves on the CPU.

    python bench/int16x8.py pkg:ppocr-rec [--system ethos-u65-256] [--seeds 0,11,12]
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parent))

from int8_check import machine, write
from int8_fakequant import arguments, channel_stats
from int8_layers import parts_of

from collage_farm.config import load_config
from collage_farm.core.graph import load_graph, random_inputs
from collage_farm.execute import PlanExecutor
from collage_farm.execute.numerics import INT8_STEPS, reference_outputs
from collage_farm.postsearch.vela_whole import ethos_u_board
from collage_farm.zoo import packaged
from runners.ethosu import vela_config
from runners.runtime_sim import softmax_abort_risk
from runners.tflite import ActivationBits, ConversionError, ConvertedModel, convert
from runners.vela_estimate import vela_estimate

SCHEMES = {"int8": (ActivationBits.INT8, False), "int8+bc": (ActivationBits.INT8, True),
           "16x8": (ActivationBits.INT16, False), "16x8+bc": (ActivationBits.INT16, True)}


def integer_model(data: bytes, ranges: Mapping, bits: ActivationBits,
                  means: Mapping[str, np.ndarray] | None) -> ConvertedModel | None:
    """The partition as integer TFLite, or None where the converter maps it in fp32 only."""
    try:
        return convert(data, "int8", ranges, activations=bits, channel_means=means)
    except ConversionError:
        return None


def run_partitions(models: list[tuple[object, ConvertedModel | None, bytes]],
                   feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every partition in plan order on the values before it: LiteRT's reference kernels for
    the integer ones, ONNX Runtime fp32 for the others."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType  # heavy

    values = dict(feeds)
    for rt, conv, data in models:
        ins = {n: values[n] for n in rt.inputs}  # type: ignore[attr-defined]
        if conv is None:
            outs = reference_outputs(onnx.load_from_string(data), rt.outputs, ins)  # type: ignore[attr-defined]
        else:
            it = Interpreter(model_content=conv.tflite,
                             experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
            it.allocate_tensors()
            for s in conv.inputs:
                it.set_tensor(s.index, s.to_tflite(ins[s.name]))
            it.invoke()
            outs = {s.name: s.from_tflite(it.get_tensor(s.index)) for s in conv.outputs}
        values.update(outs)
    return values


def scheme_row(ex: PlanExecutor, targets: list, label: str, means: Mapping, seeds: list[int]
               ) -> str:
    bits, bc = SCHEMES[label]
    models, npu_s, cpu_ops = [], 0.0, 0
    for rt in ex.partitions:
        data = ex.files[rt.id].read_bytes()
        conv = integer_model(data, ex.tensor_ranges, bits, means if bc else None)
        risk = bits is ActivationBits.INT8 and softmax_abort_risk(data)  # int16's runs
        models.append((rt, None if risk else conv, data))
        if rt.toolchain == "vela" and conv is not None:
            target = next(t for t in targets if t.name == rt.target)
            est = vela_estimate(conv.tflite, vela_config(target), conv)
            npu_s += float(est["seconds"])
            cpu_ops += int(est["cpu_ops"])
    steps = ex.int8_steps or {}
    errs = []
    for seed in seeds:
        feeds = ex.random_feeds(seed)
        ref = reference_outputs(ex.reference(), ex.plan.graph_outputs, feeds)
        got = run_partitions(models, feeds)
        errs.append(max(float(np.abs(np.asarray(got[o], np.float64) - r).max()) / steps[o]
                        for o, r in ref.items()))
    ints = sum(c is not None for _, c, _ in models)
    return (f"| {label} | {', '.join(f'{e:.1f}' for e in errs)} | "
            f"{'ok' if errs[0] <= INT8_STEPS else 'FAILED'} | {ints} of {len(models)} | "
            f"{npu_s * 1e3:.3f} | {cpu_ops} |")


def main() -> int:
    args, seeds = arguments(__doc__ or "", SCHEMES, system=True)
    name = args.model.removeprefix(packaged.PREFIX)
    model = packaged.reference_model(name)
    print("\n".join(machine()))
    print(f"\n{args.model} on {args.system}, Vela whole's split: max abs error of the outputs "
          f"in the check's steps (tolerance {INT8_STEPS:g}; `run` checks the first seed); "
          "NPU partitions' simulated cost (Vela)\n")
    print("| scheme | steps per seed | check | integer partitions | NPU partitions (ms) "
          "| ops Vela leaves on the CPU |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "model.onnx"
        onnx.save(model, src)
        g = load_graph(src, packaged.input_shapes(name))
        targets = list(load_config(builtin_system=args.system).selected_targets)
        board = ethos_u_board(targets)
        assert board is not None
        ex = PlanExecutor(write(g, parts_of(g, board, "boundaries"), targets,
                                Path(tmp) / "plan", args.model), model=str(src))
        names = [t for t in ex.tensor_ranges if t in g.tensors and len(g.tensors[t].shape)]
        means = {t: v[2] for t, v in channel_stats(
            g, names, [random_inputs(g, s) for s in range(8)]).items()}
        for label in args.schemes.split(","):
            print(scheme_row(ex, targets, label, means, seeds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
