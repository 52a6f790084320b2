"""int8 quantisation: activation parameters from calibrated ranges, ties, pins, tensor data.

int8 mode follows the TFLite 8-bit quantization spec: activations per-tensor asymmetric int8
with scale / zero point from the calibrated (min, max) of each ONNX tensor (`tensor_ranges`,
from `runners.calibration`; the range always includes 0); weights per-channel symmetric int8
(zero point 0, values in [-127, 127]); int32 bias with scale = input scale x weight scale and
zero point 0; constant operands of elementwise ops per-tensor asymmetric int8. Operators whose
int8 kernels require equal input/output quantization (pools, reshape, transpose, pad,
concatenation, min/max) share one set of parameters (a union of the ranges of the tensors they
tie together); LOGISTIC/SOFTMAX outputs are pinned to (1/256, -128) and TANH to (1/128, 0). Where
two pinned sets would have to meet (a Concat of a Sigmoid and a Tanh) a QUANTIZE (requantise)
op is inserted.

16x8 (`ActivationBits.INT16`, TFLite's 16-bit activation scheme): activations per-tensor
*symmetric* int16 (zero point 0, ``scale = max(|lo|, |hi|) / 32767``), every pin (1/32768, 0),
constant operands of elementwise ops int16 the same way, weights unchanged, int64 bias. A
channel whose folded weights are all but zero (a pruned channel after BatchNormalization)
would need an int64 bias beyond the 40 bits Vela accepts: its weight scale is raised until
the bias fits (the weights of such a channel round to zero either way).

Bias correction (either scheme, when the builder has ``channel_means``: the per-channel means
of the tensors that weights read, measured on the calibration samples): rounding a weight
matrix shifts each output channel's mean by ``sum_c (Wq - W)[o, c] * mean(x_c)``; the bias
absorbs it (Nagel et al., "Data-Free Quantization Through Weight Equalization and Bias
Correction", 2019, with measured means). CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from runners.tflite.ir import _T, _Builder, _Op
from runners.tflite.result import (
    INT8_MAX,
    INT8_MIN,
    INT16_MAX,
    INT40_MAX,
    MIN_RANGE,
    ActivationBits,
    ConversionError,
    MissingRangeError,
)


def act_qparams(lo: float, hi: float) -> tuple[float, int]:
    """Per-tensor asymmetric int8 (scale, zero point) for a real range; 0 is always exact."""
    lo = min(float(lo), 0.0)
    hi = max(float(hi), 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise ConversionError(f"non-finite calibration range ({lo}, {hi})")
    if hi - lo < MIN_RANGE:
        hi = lo + MIN_RANGE
    scale = (hi - lo) / 255.0
    zp = round(INT8_MIN - lo / scale)
    return scale, max(INT8_MIN, min(INT8_MAX, zp))


def act_qparams16(lo: float, hi: float) -> tuple[float, int]:
    """Per-tensor symmetric int16 (scale, zero point 0) for a real range (16x8 activations)."""
    m = max(abs(float(lo)), abs(float(hi)))
    if not math.isfinite(m):
        raise ConversionError(f"non-finite calibration range ({lo}, {hi})")
    return max(m, MIN_RANGE) / INT16_MAX, 0


_PIN_SIGMOID = (1.0 / 256.0, -128)
#: int16 LOGISTIC / SOFTMAX / TANH outputs (TFLite's 16x8 kernels require it)
_PIN_INT16 = (1.0 / 32768.0, 0)


_PIN_TANH = (1.0 / 128.0, 0)

#: ONNX ops whose int8 output the converter pins to a fixed scale (TFLite's LOGISTIC and
#: SOFTMAX kernels require 1/256, TANH 1/128): the step of such an output's int8 tensor, however
#: narrow the output's calibrated range
PINNED_SCALES: dict[str, float] = {"Sigmoid": _PIN_SIGMOID[0], "Softmax": _PIN_SIGMOID[0],
                                   "Tanh": _PIN_TANH[0]}


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra


def resolve_qparams(ir: _Builder) -> dict[int, tuple[float, int]]:
    """Per activation tensor (scale, zero point): ties unioned, pins kept, concat requants.

    Ties without a requantising op (pools, reshapes, pads, min/max) must share parameters;
    two different pins meeting there is an error. A Concat's output is never pinned through
    one of its inputs (a Sigmoid input would otherwise squeeze a ReLU input into [0, 1)):
    its unpinned inputs join the output's group, its pinned inputs join only when every
    input carries that same pin, and otherwise each pinned input is requantised (QUANTIZE)
    into the output's calibrated parameters.
    """
    uf = _UnionFind()
    pins: dict[int, tuple[float, int]] = {}
    for i, t in enumerate(ir.tensors):
        if t.kind == "act":
            uf.find(i)
            if t.pin is not None:
                pins[i] = t.pin

    def union(a: int, b: int) -> None:
        ra, rb = uf.find(a), uf.find(b)
        if ra == rb:
            return
        pa, pb = pins.pop(ra, None), pins.pop(rb, None)
        if pa is not None and pb is not None and pa != pb:
            raise ConversionError(
                f"tensors {ir.tensors[a].name!r} and {ir.tensors[b].name!r} need "
                f"equal quantisation but are pinned differently")
        uf.union(ra, rb)
        if (pa or pb) is not None:
            pins[uf.find(ra)] = pa or pb  # type: ignore[assignment]

    concat: dict[int, list[tuple[int, int]]] = {}
    for a, b, op_idx in ir.ties:
        if op_idx is None:
            union(a, b)
        else:
            concat.setdefault(op_idx, []).append((a, b))
    requant: list[tuple[int, int]] = []  # (op index, input tensor)
    for op_idx, pairs in concat.items():
        pinned = [(a, b) for a, b in pairs if uf.find(a) in pins]
        for a, b in pairs:
            if (a, b) not in pinned:
                union(a, b)
        if not pinned:
            continue
        out = pairs[0][1]
        kinds = {pins[uf.find(a)] for a, _ in pinned}
        if len(pinned) == len(pairs) and len(kinds) == 1 \
                and pins.get(uf.find(out), next(iter(kinds))) in kinds:
            for a, b in pinned:
                union(a, b)
            continue
        for a, _ in pinned:
            if (op_idx, a) not in requant:
                requant.append((op_idx, a))
    q = _group_qparams(ir, uf, pins)
    _insert_requants(ir, q, requant)
    return q


def _group_qparams(ir: _Builder, uf: _UnionFind, pins: Mapping[int, tuple[float, int]]
                   ) -> dict[int, tuple[float, int]]:
    """Every activation gets its group's pin, else the qparams of the union of its ranges."""
    groups: dict[int, list[int]] = {}
    for i, t in enumerate(ir.tensors):
        if t.kind == "act":
            groups.setdefault(uf.find(i), []).append(i)
    wide = ir.activations is ActivationBits.INT16
    qparams = act_qparams16 if wide else act_qparams
    q: dict[int, tuple[float, int]] = {}
    for root, members in groups.items():
        if root in pins:
            qp = _PIN_INT16 if wide else pins[root]
        else:
            rs = [ir.tensors[m].range for m in members if ir.tensors[m].range]
            if not rs:
                names = ", ".join(ir.tensors[m].name for m in members)
                raise MissingRangeError(f"no calibrated range for tensor(s) {names}")
            qp = qparams(min(r[0] for r in rs), max(r[1] for r in rs))  # type: ignore[index]
        for m in members:
            q[m] = qp
    return q


def _insert_requants(ir: _Builder, q: dict[int, tuple[float, int]],
                     requant: list[tuple[int, int]]) -> None:
    """A QUANTIZE in front of each (concat op, pinned input) whose parameters differ from the
    concat's output (descending op index, so inserting before one op never shifts a
    later-handled one)."""
    for op_idx in sorted({i for i, _ in requant}, reverse=True):
        op = ir.ops[op_idx]
        inserted: list[_Op] = []
        for tid in (t for i, t in requant if i == op_idx):
            if q[tid] == q[op.outputs[0]]:
                continue
            src = ir.tensors[tid]
            rq = ir._add(_T(f"{src.name}/requantized", src.shape, "act"))
            q[rq] = q[op.outputs[0]]
            op.inputs = [rq if i == tid else i for i in op.inputs]
            inserted.append(_Op("QUANTIZE", [tid], [rq], ("QuantizeOptions", ()), op.nodes))
        ir.ops[op_idx:op_idx] = inserted


@dataclass
class _Encoded:
    ttype: int  # TensorType
    data: bytes | memoryview | None
    scale: tuple[float, ...] = ()
    zero_point: tuple[int, ...] = ()
    axis: int = 0


def _encode(conv: _Builder, tid: int, q: Mapping[int, tuple[float, int]],
            weight_scales: dict[int, np.ndarray]) -> _Encoded:
    t = conv.tensors[tid]
    int8 = conv.mode == "int8"
    if t.kind == "int32":
        return _Encoded(2, np.ascontiguousarray(t.data, np.int32).tobytes())  # type: ignore[arg-type]
    if t.kind == "int64":
        return _Encoded(4, np.ascontiguousarray(t.data, np.int64).tobytes())  # type: ignore[arg-type]
    if t.dtype != "float32":  # integer / boolean activation (fp32 mode): INT32 / INT64 / BOOL
        return _Encoded({"int32": 2, "int64": 4, "bool": 6}[t.dtype], None)
    if not int8:
        # the array's own bytes (a view, not a copy: the writer copies them once, into the
        # flatbuffer; a transformer's weights are a few hundred MB)
        data = (None if t.data is None
                else memoryview(np.ascontiguousarray(t.data, np.float32)).cast("B"))
        return _Encoded(0, data)
    wide = conv.activations is ActivationBits.INT16
    if t.kind == "act":
        s, zp = q[tid]
        return _Encoded(7 if wide else 9, None, (s,), (zp,))
    assert t.data is not None
    if t.kind == "weight":
        return _encode_weight(conv, tid, q, weight_scales)
    if t.kind == "bias":
        return _encode_bias(conv, tid, q, weight_scales)
    if t.kind == "like":
        s, zp = q[t.refs[0]]
    else:  # "const": its own per-tensor parameters
        s, zp = (act_qparams16 if wide else act_qparams)(float(t.data.min()),
                                                          float(t.data.max()))
    if wide:
        qc = np.clip(np.round(t.data.astype(np.float64) / s), -INT16_MAX, INT16_MAX)
        return _Encoded(7, qc.astype(np.int16).tobytes(), (s,), (zp,))
    qc = np.clip(np.round(t.data.astype(np.float64) / s) + zp, INT8_MIN, INT8_MAX)
    return _Encoded(9, qc.astype(np.int8).tobytes(), (s,), (zp,))


def _encode_weight(conv: _Builder, tid: int, q: Mapping[int, tuple[float, int]],
                   weight_scales: dict[int, np.ndarray]) -> _Encoded:
    """Per-channel symmetric int8 (max-abs scale); in 16x8 each scale at least what keeps
    its channel's int64 bias within Vela's 40 bits (twice over, for the bias correction)."""
    t = conv.tensors[tid]
    w = t.data
    assert w is not None
    other = tuple(a for a in range(w.ndim) if a != t.axis)
    maxabs = np.max(np.abs(w), axis=other) if other else np.abs(w)
    scales = np.maximum(maxabs, 1e-12).astype(np.float64) / 127.0
    bias = next((b for b in conv.tensors if b.kind == "bias" and b.refs[1:] == (tid,)), None)
    if conv.activations is ActivationBits.INT16 and bias is not None and bias.data is not None:
        floor = 2.0 * np.abs(bias.data.astype(np.float64)) / (q[bias.refs[0]][0] * INT40_MAX)
        scales = np.maximum(scales, floor.reshape(-1))
    shape = [1] * w.ndim
    shape[t.axis] = -1
    qw = np.clip(np.round(w / scales.reshape(shape)), -127, 127).astype(np.int8)
    weight_scales[tid] = scales
    return _Encoded(9, qw.tobytes(), tuple(float(x) for x in scales), (0,) * len(scales),
                    t.axis)


def _encode_bias(conv: _Builder, tid: int, q: Mapping[int, tuple[float, int]],
                 weight_scales: dict[int, np.ndarray]) -> _Encoded:
    """int32 (int8 activations) or int64 (16x8) at input scale x weight scale, less the mean
    shift of the rounded weights where the builder knows its input's channel means."""
    t = conv.tensors[tid]
    assert t.data is not None
    x_tid, w_tid = t.refs
    if w_tid not in weight_scales:
        _encode(conv, w_tid, q, weight_scales)
    scales = q[x_tid][0] * weight_scales[w_tid]
    data = t.data.astype(np.float64).reshape(-1) - _mean_shift(conv, tid, weight_scales)
    meta = (tuple(float(x) for x in scales), (0,) * len(scales), 0)
    if conv.activations is ActivationBits.INT16:
        qb = np.clip(np.round(data / scales), -INT40_MAX, INT40_MAX)
        return _Encoded(4, qb.astype(np.int64).tobytes(), *meta)
    qb = np.clip(np.round(data / scales), -(2**31), 2**31 - 1)
    return _Encoded(2, qb.astype(np.int32).tobytes(), *meta)


def _mean_shift(conv: _Builder, bias_tid: int, weight_scales: Mapping[int, np.ndarray]
                ) -> np.ndarray | float:
    """Per output channel, ``sum_c (Wq - W)[o, c] * mean(x_c)`` of the op reading bias
    ``bias_tid`` (module docstring); 0 without its input's channel means, or for an op other
    than CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED, or means of another length."""
    x_tid, w_tid = conv.tensors[bias_tid].refs
    mean = conv.channel_means.get(conv.tensors[x_tid].name)
    code = next((op.code for op in conv.ops if bias_tid in op.inputs), "")
    if mean is None or code not in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"):
        return 0.0
    wt = conv.tensors[w_tid]
    w = np.asarray(wt.data, np.float64)
    shape = [1] * w.ndim
    shape[wt.axis] = -1
    s = weight_scales[w_tid].reshape(shape)
    dw = np.clip(np.round(w / s), -127, 127) * s - w
    mean = np.asarray(mean, np.float64).reshape(-1)
    if code == "FULLY_CONNECTED":
        return dw @ mean if dw.ndim == 2 and dw.shape[1] == mean.size else 0.0
    if code == "CONV_2D":
        return dw.sum(axis=(1, 2)) @ mean if dw.shape[3] == mean.size else 0.0
    per = dw.sum(axis=(0, 1, 2))  # depthwise [1, H, W, C * multiplier]
    return np.repeat(mean, per.size // mean.size) * per if per.size % mean.size == 0 else 0.0
