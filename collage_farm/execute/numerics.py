"""Does a plan compute what its model computes? Tolerances, the output check, the reference.

A plan's outputs are checked against the original model run whole in ONNX Runtime CPU
(`reference_model` finds the original: the given one, else plan.json's ``source``). The
tolerance follows the loosest arithmetic among the plan's partitions (`PRECISIONS`, `loosest`),
since a check must fail on wiring errors, not on a toolchain doing what it was asked:

- fp32: ``|got - ref| <= 1e-4 + 1e-3 * |ref|`` (ORT and OpenVINO reorder float sums; 1e-3 is
  far above that and far below any real wiring error);
- tf32 (ORT's CUDA EP and TensorRT on Ampere and later by default: products with a 10-bit
  mantissa; measured on an H100, resnet18's logits differ from ORT CPU by up to 1.1e-3 absolute,
  10% relative on a near-zero logit): rtol=1e-2, atol=1e-2 x max|ref|;
- fp16 (TensorRT ``fp16``, OpenVINO ``precision: f16``): rtol=2e-2, atol=2e-2 x max|ref|;
- bf16 (OpenVINO ``precision: bf16``): rtol=5e-2, atol=5e-2 x max|ref|;
- int8 with known output ranges (a plan's Ethos-U NPU and Cortex-M host partitions, built as
  int8 TFLite with the whole model's calibrated ranges): ``|got - ref| <= INT8_STEPS x step``,
  ``step = (max(hi, 0) - min(lo, 0)) / 255`` the int8 quantisation step of the output's
  calibrated range (`int8_step`), or the fixed scale the int8 kernel gives the output when
  that is coarser (a Sigmoid or Softmax computed in an int8 partition: 1/256, also through an
  Identity / Reshape after it, `TIED_OPS`; a probability map whose calibrated range is [0,
  0.32] has a range step of 1/797, a third of what its int8 tensor can resolve). Why steps:
  the output is itself an int8 tensor, so rounding it alone costs half a step, and every int8
  tensor before it adds its own rounding, carried forward by the layers after it. Measured
  (``bench/int8_check.py``) with the reference kernels (`runners.runtime_sim`), whole-model
  ranges and 8 random calibration samples, on two feeds each: 1.5-2.4 steps for mnist, 2.5-3.4
  for resnet18 and 3.4-4.1 for mobilenet_v2 (both at 32x32; whole on the NPU or cut into 3
  partitions alternating NPU and host: the same errors), 3.1-4.3 for a one-layer GPT-2 (Vela's
  split, 20 partitions, or 14), 3.8 for the 17-partition plan a campaign wrote for it; 8.1 for
  the pooler output of a two-layer BERT (a Tanh of a wide-range Gemm: the Gemm's coarser step,
  carried through the Tanh's slope of up to 1, is several steps of the Tanh's narrow output
  range), on every Ethos-U board (``bench/ethos_u.py``, its ``run`` column); PP-OCRv4 det's
  probability map (a Sigmoid, calibrated range [0, 0.324]): 9.5 steps of its 1/256 int8 scale,
  29 of its range, where ONNX Runtime with every tensor fake-quantised per tensor (fp32
  weights) is already 16.6 of its range. 12 steps leaves half again the largest of the others;
  a wrong wiring, a swapped or stale partition or a miscalibrated tensor (GPT-2's attention
  mask quantised over [-10000, 4]: 47-52 steps; a partition calibrated on one sample and fed
  another: 14-16) lands beyond it, the last by a thin margin;
- int16 (a 16x8 Ethos-U partition: ``activations: int16``, int16 activations and int8
  weights) with known output ranges: the int8 rule, ``INT8_STEPS`` int8 steps of the range;
  its pinned scales (1/32768) are finer than any range step, so outputs are held to their
  range's step (`int8_step` with no pin);
- int8 otherwise (any model that quantizes itself: `quantized`; no ranges known): rtol=0.1,
  atol=0.1 x max|ref|.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx

from collage_farm import zoo
from collage_farm.core.plan import Plan, PlanError
from collage_farm.zoo import packaged
from runners.ort import ort_session
from runners.tflite import PINNED_SCALES

__all__ = [
    "FP32_ATOL",
    "FP32_RTOL",
    "INT8_STEPS",
    "PRECISIONS",
    "QUANT_ATOL_FRAC",
    "QUANT_RTOL",
    "TIED_OPS",
    "ExecutionMismatch",
    "compare_outputs",
    "int8_step",
    "loosest",
    "pinned_outputs",
    "quantized",
    "reference_model",
    "reference_outputs",
    "tolerance_label",
]


FP32_RTOL = 1e-3
FP32_ATOL = 1e-4
QUANT_RTOL = 0.1
QUANT_ATOL_FRAC = 0.1  # of max |reference|
# precision -> (rtol, atol, atol is a fraction of max|ref|); ordered loosest last
PRECISIONS: dict[str, tuple[float, float, bool]] = {
    "fp32": (FP32_RTOL, FP32_ATOL, False),
    "tf32": (1e-2, 1e-2, True),
    "fp16": (2e-2, 2e-2, True),
    "bf16": (5e-2, 5e-2, True),  # OpenVINO's bf16 hint: an 8-bit mantissa
    "int16": (QUANT_RTOL, QUANT_ATOL_FRAC, True),  # 16x8: int16 activations, int8 weights
    "int8": (QUANT_RTOL, QUANT_ATOL_FRAC, True),
}
#: precisions whose outputs with a known range are held to `INT8_STEPS` int8 steps of it
STEPPED = frozenset({"int8", "int16"})


#: int8 outputs with a calibrated range: tolerance in int8 steps of that range (docstring)
INT8_STEPS = 12.0


def int8_step(lo: float, hi: float, pinned: float = 0.0) -> float:
    """The int8 quantisation step of a calibrated range (which always includes 0), or the
    ``pinned`` scale of an output whose int8 kernel fixes it (a Sigmoid's or Softmax's 1/256,
    `runners.tflite.PINNED_SCALES`) when that is coarser: the int8 tensor carrying such an
    output cannot resolve less than its fixed scale, whatever range calibration saw."""
    return max((max(hi, 0.0) - min(lo, 0.0)) / 255.0, pinned)


#: single-input operators that move values without computing new ones: their int8 output holds
#: the very values of their input (the converter ties the two tensors' scales, and in fp32 the
#: values pass unchanged), so a pinned scale before them is the scale of their output too
TIED_OPS = frozenset({"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze"})


def pinned_outputs(model: onnx.ModelProto, outputs: Sequence[str]
                   ) -> dict[str, tuple[tuple[str, ...], float]]:
    """Graph ``outputs`` computed by an operator whose int8 kernel pins its output scale
    (`runners.tflite.PINNED_SCALES`: Sigmoid, Softmax, Tanh), directly or through `TIED_OPS`
    (a classifier's Softmax followed by an Identity): output -> (the tensors from that
    operator's output to the graph output, in order; the pinned scale)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    found: dict[str, tuple[tuple[str, ...], float]] = {}
    for name in outputs:
        chain = [name]
        node = producer.get(name)
        while node is not None and node.op_type in TIED_OPS and node.input and node.input[0]:
            chain.append(node.input[0])
            node = producer.get(node.input[0])
        if node is not None and node.op_type in PINNED_SCALES:
            found[name] = (tuple(reversed(chain)), PINNED_SCALES[node.op_type])
    return found


def loosest(precisions: Sequence[str]) -> str:
    """The loosest of ``precisions`` (fp32 when empty); unknown names count as fp16."""
    order = list(PRECISIONS)
    return max(precisions, key=lambda p: order.index(p) if p in order else 2, default="fp32")


#: operators that round to integers inside a model (QDQ, dynamic quantization, QLinear*)
QUANTIZING_OPS = frozenset({
    "QuantizeLinear", "DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
    "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearConcat",
    "QLinearSigmoid", "QLinearLeakyRelu", "QLinearAveragePool", "QLinearGlobalAveragePool",
    "QLinearSoftmax", "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM",
})


def quantized(model: onnx.ModelProto) -> bool:
    """Whether the model quantizes inside itself (any of `QUANTIZING_OPS` at its top level):
    running it cut, or on another toolchain, may round differently by one step."""
    return any(n.op_type in QUANTIZING_OPS for n in model.graph.node)


def tolerance_label(precision: str, steps: Mapping[str, float] | None = None) -> str:
    """``precision``'s tolerance in words; with ``steps`` (int8 outputs' quantisation steps)
    the int8 tolerance in steps."""
    if precision in STEPPED and steps:
        return (f"{precision} ({INT8_STEPS:g} int8 steps of each output's calibrated range, or of "
                "its pinned int8 scale where coarser: "
                + ", ".join(f"{k} atol={INT8_STEPS * v:.3g}" for k, v in steps.items()) + ")")
    rtol, atol, rel = PRECISIONS.get(precision, PRECISIONS["fp16"])
    return f"{precision} (rtol={rtol:g}, atol={atol:g}{'*max|ref|' if rel else ''})"


class ExecutionMismatch(AssertionError):
    """The plan's outputs differ from the whole model's beyond tolerance."""

    def __init__(self, output: str, max_abs: float, max_rel: float, detail: str = "") -> None:
        self.output = output
        self.max_abs = max_abs
        self.max_rel = max_rel
        msg = (f"output {output!r} differs from the whole model: max abs error {max_abs:.3g}, "
               f"max rel error {max_rel:.3g}")
        super().__init__(msg + (f" ({detail})" if detail else ""))


def _load_model_file(path: Path) -> onnx.ModelProto:
    """``onnx.load`` with its failures as `PlanError` naming the file."""
    try:
        return onnx.load(str(path), load_external_data=True)
    except Exception as e:  # DecodeError, OSError, missing external data, ...
        raise PlanError(f"the original model {path} is not a readable ONNX model "
                        f"({type(e).__name__}: {str(e)[:200]})") from None


def reference_model(plan: Plan, model: str | os.PathLike | onnx.ModelProto | None,
                    plan_dir: Path | None = None,
                    shapes: Mapping[str, Sequence[int]] | None = None) -> onnx.ModelProto:
    """The original model: the given one, else plan.json's ``source`` (zoo:NAME, pkg:NAME or
    a path).

    A ``pkg:`` model's inputs are bound as the campaign bound them (plan.json's ``shapes``,
    the entry's defaults for the rest), overridden by ``shapes``: its file has dynamic dims,
    and whole-model runs on each toolchain need static ones.
    """
    if isinstance(model, onnx.ModelProto):
        return model
    if model is not None:
        return _load_model_file(Path(model))
    source = str(plan.extra.get("source") or "")
    if source.startswith("zoo:"):
        layers = plan.extra.get("layers")
        return zoo.build(source[4:], **({} if layers is None else {"layers": int(layers)}))
    if source.startswith(packaged.PREFIX):
        bound = {**(plan.extra.get("shapes") or {}), **(shapes or {})}
        return packaged.reference_model(source[len(packaged.PREFIX):], bound)
    if source:
        p = Path(source)
        if not p.is_absolute() and plan_dir is not None and not p.exists():
            p = plan_dir / p
        if p.exists():
            return _load_model_file(p)
    raise PlanError(f"plan {plan.model!r}: the original model is unknown (source "
                    f"{source!r} not found); pass it explicitly (--model FILE)")


def reference_outputs(model: onnx.ModelProto, outputs: Sequence[str],
                      feeds: Mapping[str, np.ndarray], threads: int = 1
                      ) -> dict[str, np.ndarray]:
    """The model run whole in ONNX Runtime CPU on ``feeds``: its ``outputs`` (all of its
    outputs when it has none of them), by name."""
    sess = ort_session(model.SerializeToString(), ["CPUExecutionProvider"], threads)
    names = [o.name for o in sess.get_outputs()]
    want = [n for n in outputs if n in names] or names
    return dict(zip(want, sess.run(want, {i.name: feeds[i.name] for i in sess.get_inputs()})))


def compare_outputs(got: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray], *,
                    precision: str = "fp32", steps: Mapping[str, float] | None = None
                    ) -> dict[str, float]:
    """Max abs error per output; raises `ExecutionMismatch` outside ``precision``'s tolerance.

    ``precision`` is a key of `PRECISIONS` (unknown names are held to fp16's tolerance).
    ``steps``: int8 outputs' quantisation steps (`int8_step`); under ``int8`` precision an
    output with one is held to `INT8_STEPS` of them (module docstring).
    """
    rtol0, atol0, relative = PRECISIONS.get(precision, PRECISIONS["fp16"])
    errors: dict[str, float] = {}
    for name, r in ref.items():
        if name not in got:
            raise ExecutionMismatch(name, float("inf"), float("inf"), "missing from the plan")
        g = np.asarray(got[name])
        r = np.asarray(r)
        if g.shape != r.shape:
            raise ExecutionMismatch(name, float("inf"), float("inf"),
                                    f"shape {g.shape} vs {r.shape}")
        if r.dtype.kind not in "fc":
            bad = int(np.count_nonzero(g != r))
            if bad:
                raise ExecutionMismatch(name, float(bad), 1.0, f"{bad} elements differ")
            errors[name] = 0.0
            continue
        g64, r64 = g.astype(np.float64), r.astype(np.float64)
        diff = np.abs(g64 - r64)
        max_abs = float(np.nanmax(diff)) if diff.size else 0.0
        max_rel = float(np.nanmax(diff / np.maximum(np.abs(r64), 1e-12))) if diff.size else 0.0
        rtol = rtol0
        atol = atol0 * float(np.max(np.abs(r64)) or 1.0) if relative else atol0
        label = f"{precision} tolerance rtol={rtol:g}, atol={atol:.3g}"
        if precision in STEPPED and steps and name in steps:
            rtol, atol = 0.0, INT8_STEPS * steps[name]
            label = (f"{precision} tolerance {INT8_STEPS:g} steps of the output's int8 step: "
                     f"atol={atol:.3g}, max abs error = {max_abs / steps[name]:.1f} steps")
        nan_differs = bool(np.isnan(g64).any() != np.isnan(r64).any())
        if nan_differs or not np.all(diff <= atol + rtol * np.abs(r64)):
            raise ExecutionMismatch(name, max_abs, max_rel, label)
        errors[name] = max_abs
    return errors
