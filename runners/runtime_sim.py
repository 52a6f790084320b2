"""Plan partitions on a simulated accelerator (Vela, Arm Ethos-U): numerics here, latency
from the plan.

An Ethos-U partition cannot run on this hardware: its latency is the simulated cost the plan
recorded (``estimated_s``; the runtime's kind is `Kind.SIMULATED`, so the executor adds it
instead of timing it). Its numerics come from the int8 TFLite model (`runners.tflite.convert`)
run in LiteRT when LiteRT is installed, else from the fp32 ONNX partition in ONNX Runtime CPU;
``numerics`` says which, and an int8 model that fails at its first run falls back to fp32 and
says so.

Kernels: LiteRT's reference kernels (``OpResolverType.BUILTIN_REF``), the arithmetic TFLite
Micro's reference and CMSIS-NN kernels and Vela's NPU code implement, not its optimised CPU
kernels (XNNPACK, NEON): those round differently and, measured on this machine, overflow on an
int8 ADD whose input scales differ by 500x (GPT-2's additive mask, -10000, added to scores in
[-3, 4]: every masked score came out at +4 instead of the saturated minimum, and the softmax
after it went wrong). The partition is never timed, so their speed does not matter.

One kernel is refused before it runs: LiteRT's int8 reference SOFTMAX aborts the whole process
(SIGABRT, not an exception) when 512 or more entries of a row equal the row's maximum (measured
with LiteRT's reference kernels: rows of 255-511 equal entries ran, 512-4100 aborted), which
happens when a row's logits all fall below the calibrated range and clamp to one value (a CTC
head over 6,625 characters did). A partition with a Softmax whose rows have >= 512 entries
(`SOFTMAX_ABORT_ROW`) therefore gets the fp32 stand-in, and ``numerics`` says why: `run`
must never lose its process to one partition's numerics. The int16 reference SOFTMAX (16x8)
does not abort (measured: rows of 6,625 equal entries, and random ones, run and agree with
fp32 to 1e-6 and 6e-4), so a 16x8 partition runs its Softmax.

16x8: a partition whose target says ``activations: int16`` (a Vela ``-a16`` target) is
converted to TFLite's 16x8 scheme with the bias correction its costed build had
(`RuntimeInput.channel_means`), and its ``precision`` is ``int16``. Partitions exchange float
tensors here: each quantises its inputs on its own scheme and dequantises its outputs, which
is the requantisation (int8 <-> int16, or a float host partition's DEQUANTIZE / QUANTIZE) a
board does where a 16x8 partition meets another.

Ranges: the int8 model is quantised with the ranges the costed build used, the whole model's
(`RuntimeInput.tensor_ranges`, from `runners.calibration`), so the tensor between two chained
int8 partitions has one scale and zero point on both sides, as in the deployed model. Only
without them (a runtime made outside a plan run), or for a tensor they lack, is the partition
calibrated on the first feeds it sees (`partition_ranges`); ``numerics`` says which.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx

from runners.base import Kind
from runners.deterministic import A16_SOFTMAX_MAX_ROW, activation_bits
from runners.ort import OrtCpuToolchain, ort_session
from runners.runtime import PartitionRuntime, RuntimeInput
from runners.tflite import ActivationBits, convert

__all__ = [
    "SOFTMAX_ABORT_ROW",
    "calibrate_partition",
    "partition_ranges",
    "simulated_runtime",
    "softmax_abort_risk",
]

_FP32 = OrtCpuToolchain()  # compiles the fp32 stand-ins (`runtime` keeps no state)
#: rows of at least this many entries may abort LiteRT's int8 reference SOFTMAX (module docstring)
SOFTMAX_ABORT_ROW = 512


class Int8KernelRisk(RuntimeError):
    """An int8 kernel that may abort the process on some inputs: the partition runs fp32."""


def _softmax_rows(data: bytes) -> list[tuple[str, int]]:
    """(name, row length) of each Softmax of partition ``data`` (0: shape inference cannot
    tell)."""
    m = onnx.load_from_string(data)
    if not any(n.op_type == "Softmax" for n in m.graph.node):
        return []
    m = onnx.shape_inference.infer_shapes(m)
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else 0
                       for d in v.type.tensor_type.shape.dim]
              for v in (*m.graph.input, *m.graph.value_info, *m.graph.output)}
    rows = []
    for n in m.graph.node:
        if n.op_type == "Softmax":
            shape = shapes.get(n.input[0], [])
            axis = next((a.i for a in n.attribute if a.name == "axis"), -1)
            rows.append((n.name or n.output[0],
                         shape[axis] if shape and -len(shape) <= axis < len(shape) else 0))
    return rows


def softmax_abort_risk(data: bytes) -> str | None:
    """Why partition ``data``'s int8 model may abort LiteRT (a Softmax whose rows have
    >= `SOFTMAX_ABORT_ROW` entries), or None. A row length that shape inference cannot tell
    counts as a risk."""
    for name, row in _softmax_rows(data):
        if row == 0 or row >= SOFTMAX_ABORT_ROW:
            return (f"LiteRT's int8 reference SOFTMAX can abort the process on rows of "
                    f">= {SOFTMAX_ABORT_ROW} equal entries; Softmax '{name}' "
                    f"has rows of {row or 'unknown length'}")
    return None


def wide_softmax_risk(data: bytes) -> str | None:
    """Why partition ``data`` cannot run 16x8 (a Softmax over rows longer than the int16
    kernel resolves, `runners.deterministic.A16_SOFTMAX_MAX_ROW`: a 16x8 host target builds
    such a partition in fp32, and its numerics follow), or None."""
    for name, row in _softmax_rows(data):
        if row > A16_SOFTMAX_MAX_ROW:
            return (f"the 16x8 SOFTMAX does not resolve rows of {row} entries (at most "
                    f"{A16_SOFTMAX_MAX_ROW}); Softmax '{name}' runs in fp32, as built")
    return None


def calibrate_partition(data: bytes, feeds: Mapping[str, np.ndarray]
                        ) -> dict[str, tuple[float, float]]:
    """(min, max) of every tensor of a partition on ``feeds`` (fp32 ORT, all nodes exposed)."""
    m = onnx.load_from_string(data)
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o and o not in have:
                m.graph.output.append(onnx.ValueInfoProto(name=o))
                have.add(o)
    sess = ort_session(m.SerializeToString(), ["CPUExecutionProvider"], 1)
    names = [o.name for o in sess.get_outputs()]
    ins = {i.name: feeds[i.name] for i in sess.get_inputs()}
    out = {k: (float(np.min(v)), float(np.max(v))) for k, v in ins.items()}
    for n, v in zip(names, sess.run(names, ins)):
        a = np.asarray(v)
        if a.size and a.dtype.kind == "f":
            out[n] = (float(a.min()), float(a.max()))
    return out


def partition_ranges(data: bytes, given: Mapping[str, tuple[float, float]],
                     feeds: Mapping[str, np.ndarray]
                     ) -> tuple[dict[str, tuple[float, float]], str]:
    """The ranges to quantise partition ``data`` with, and where they came from: ``given``
    (the whole model's), any float tensor of the partition they lack calibrated on ``feeds``
    (all of them when ``given`` is empty)."""
    if not given:
        return calibrate_partition(data, feeds), "ranges of this partition's own inputs"
    m = onnx.load_from_string(data)
    init = {i.name for i in m.graph.initializer}
    need = ({i.name for i in m.graph.input if i.name not in init}
            | {o for n in m.graph.node for o in n.output if o})
    missing = need - set(given)
    own = calibrate_partition(data, feeds) if missing else {}
    filled = {t: own[t] for t in sorted(missing) if t in own}
    note = "whole-model ranges" + (f"; {len(filled)} tensor(s) calibrated on this "
                                   "partition's own inputs" if filled else "")
    return {**given, **filled}, note


def simulated_runtime(inp: RuntimeInput, toolchain: str) -> PartitionRuntime:
    """``toolchain``'s partition: int8 TFLite in LiteRT when available (else fp32 ORT);
    latency simulated (module docstring)."""
    fp32 = dataclasses.replace(
        _FP32.runtime(dataclasses.replace(inp, options=())), toolchain=toolchain,
        kind=Kind.SIMULATED, numerics="ort-cpu fp32 stand-in")
    try:
        from ai_edge_litert.interpreter import (  # heavy: only where plans run
            Interpreter,
            OpResolverType,
        )
    except ImportError:
        return fp32
    data, threads = inp.onnx_bytes, inp.threads
    given = {k: (float(lo), float(hi)) for k, lo, hi in inp.tensor_ranges}
    bits = activation_bits(dict(inp.options).get("activations"))
    scheme, label = ("int16", "16x8") if bits is ActivationBits.INT16 else ("int8", "int8")
    state: dict[str, Any] = {}

    def plain(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if "model" not in state:  # ranges (the whole model's) at the first feeds, convert once
            risk = (softmax_abort_risk(data) if bits is ActivationBits.INT8
                    else wide_softmax_risk(data))
            if risk:
                raise Int8KernelRisk(risk)
            ranges, note = partition_ranges(data, given, feeds)
            conv = convert(data, "int8", ranges, activations=bits,
                           channel_means=dict(inp.channel_means))
            interp = Interpreter(model_content=conv.tflite, num_threads=max(1, threads),
                                 experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
            interp.allocate_tensors()
            state["model"], state["interp"] = conv, interp
            rt.numerics = f"litert {label} (runners.tflite; {note})"
        conv, interp = state["model"], state["interp"]
        for s in conv.inputs:
            interp.set_tensor(s.index, s.to_tflite(feeds[s.name]))
        interp.invoke()
        return {s.name: s.from_tflite(interp.get_tensor(s.index)) for s in conv.outputs}

    def safe_plain(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if state.get("failed"):
            return fp32.plain(feeds)
        try:
            return plain(feeds)  # conversion errors surface here
        except Exception as e:  # unsupported op, missing range: fp32 numerics, said so
            state["failed"] = f"{type(e).__name__}: {e}"
            rt.numerics = (f"ort-cpu fp32 stand-in (int8 not run: {str(e)[:200]})"
                           if isinstance(e, Int8KernelRisk) else
                           f"ort-cpu fp32 stand-in (int8 TFLite failed: {state['failed'][:120]})")
            rt.precision = "fp32"
            return fp32.plain(feeds)

    def bind(buffers: dict[str, Any]) -> Callable[[], None]:
        def step() -> None:  # never timed (simulated); keeps data flowing for run()
            res = safe_plain({n: buffers[n] for n in inp.inputs})
            for n in inp.outputs:
                np.copyto(buffers[n], np.asarray(res[n]).reshape(buffers[n].shape))

        return step

    rt = PartitionRuntime.of(inp, toolchain, Kind.SIMULATED, f"litert {label} (runners.tflite)",
                             safe_plain, bind, precision=scheme)
    return rt
