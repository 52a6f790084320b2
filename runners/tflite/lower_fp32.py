"""ONNX node -> TFLite ops for the fp32-only mappings (LiteRT)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from runners.tflite.attrs import _attr, _ints
from runners.tflite.fold import _init_array, _slice_spec
from runners.tflite.fuse import FusionPlan
from runners.tflite.ir import _act_enum
from runners.tflite.layout import (
    _NHWC_AXIS,
    _NHWC_ORDER,
    _perm_nhwc,
)
from runners.tflite.params import (
    _bn_scale_shift,
    _dyn_rank,
    _pow_exponent,
    _reduce_axes,
    _split_sizes,
)
from runners.tflite.typed import TypedLowering

if TYPE_CHECKING:
    from collage_farm.core.graph import Node


class _Fp32Lowering(TypedLowering):
    """Emitters of the ops mapped in fp32 mode only (LiteRT); no int8 emission is written.

    Every emitter takes (node, the ONNX tensor its TFLite output stands for: the last fused
    node's output, the ONNX names of the nodes it implements, the fused activation name).
    """

    fusion: FusionPlan  # set by the lowering before any emitter runs

    def _emit_batchnormalization(self, n: Node, out: str, nodes: tuple[str, ...],
                                 act: str) -> None:
        shape = self.g.tensors[n.inputs[0]].shape
        r = len(shape)
        scale, shift = _bn_scale_shift(n, self.g)
        cshape = [1] * r
        cshape[3 if r == 4 else 1] = shape[1]  # channels are last in NHWC
        x = self.act(n.inputs[0])
        s = self.const(f"{n.name}/scale", scale.reshape(cshape), "const")
        b = self.const(f"{n.name}/shift", shift.reshape(cshape), "const")
        mid = self._tmp(n, "scaled", self.tensors[x].shape)
        self.op("MUL", [x, s], [mid], nodes, {"FusedActivationFunction": 0})
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("ADD", [mid, b], [y], nodes, {"FusedActivationFunction": _act_enum(act)})

    def _emit_sqrt(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("SQRT", [self.act(n.inputs[0])], [y], nodes)

    def _emit_exp(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("EXP", [self.act(n.inputs[0])], [y], nodes)

    def _emit_reciprocal(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y_shape = self.g.tensors[out].shape
        y = self.new_act(out, y_shape)
        one = self._scalar(n, "one", 1.0, len(y_shape))
        self.op("DIV", [one, self.act(n.inputs[0])], [y], nodes, {"FusedActivationFunction": 0})

    def _emit_max(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        """Max / Min of two operands (one may be a constant): MAXIMUM / MINIMUM."""
        r = len(self.g.tensors[out].shape)
        a, b = (self._typed_operand(n, t, r, "float32") for t in n.inputs)
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("MAXIMUM" if n.op_type == "Max" else "MINIMUM", [a, b], [y], nodes)

    _emit_min = _emit_max

    def _emit_pow(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        e = _pow_exponent(n, self.g)
        y_shape = self.g.tensors[out].shape
        x = self.act(n.inputs[0])
        y = self.new_act(out, y_shape)
        if e == 2.0:
            self.op("MUL", [x, x], [y], nodes, {"FusedActivationFunction": 0})
        elif e == 0.5:
            self.op("SQRT", [x], [y], nodes)
        else:
            self.op("POW", [x, self._scalar(n, "exponent", e, len(y_shape))], [y], nodes)  # type: ignore[arg-type]

    def _emit_transpose(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        r = _dyn_rank(self.g, n.inputs[0])
        perm = _ints(_attr(n, "perm"), tuple(reversed(range(r))))
        tperm = _perm_nhwc(perm) if r == 4 else perm
        x = self.act(n.inputs[0])
        y = self.new_act(out, self.g.tensors[out].shape)
        self.tie(x, y)
        self.op("TRANSPOSE", [x, self.const(f"{n.name}/perm", np.array(tperm), "int32")], [y],
                nodes)

    def _emit_reducemean(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        axes = _reduce_axes(n, self.g)
        keep = bool(int(_attr(n, "keepdims", 1)))  # type: ignore[arg-type]
        r = _dyn_rank(self.g, n.inputs[0])
        x = self.act(n.inputs[0])
        taxes: Sequence[int] = axes  # type: ignore[assignment]
        if r == 4:
            remaining = [a for a in _NHWC_ORDER if a not in axes]
            if keep or remaining == sorted(remaining):
                taxes = sorted(_NHWC_AXIS[a] for a in axes)  # type: ignore[union-attr]
            else:  # the kept axes would come out in NHWC order: reduce in NCHW instead
                x = self._to_nchw(x, n, "in")
        code = {"ReduceMean": "MEAN", "ReduceMax": "REDUCE_MAX", "ReduceSum": "SUM"}[n.op_type]
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op(code, [x, self.const(f"{n.name}/axes", np.array(list(taxes)), "int32")], [y],
                nodes, {"KeepDims": keep})

    _emit_reducemax = _emit_reducesum = _emit_reducemean

    def _emit_slice(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        shape = self.g.tensors[n.inputs[0]].shape
        begin, end, stride = _slice_spec(n, self.g, shape)  # type: ignore[misc]
        if len(shape) == 4:
            begin, end, stride = ([v[a] for a in _NHWC_ORDER] for v in (begin, end, stride))
        ins = [self.act(n.inputs[0])] + [
            self.const(f"{n.name}/{tag}", np.array(v), "int32")
            for tag, v in (("begin", begin), ("end", end), ("strides", stride))]
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("STRIDED_SLICE", ins, [y], nodes,
                {"BeginMask": 0, "EndMask": 0, "EllipsisMask": 0, "NewAxisMask": 0,
                 "ShrinkAxisMask": 0})

    def _emit_gather(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        g = self.g
        x_shape = g.tensors[n.inputs[0]].shape
        axis = int(_attr(n, "axis", 0))  # type: ignore[arg-type]
        axis = axis + len(x_shape) if axis < 0 else axis
        table = _init_array(g, n.inputs[0])
        if table is not None:  # an embedding table: kept in the ONNX layout
            p = self.const(f"{n.name}/params", table.astype(np.float32, copy=False), "const")
        else:
            p = self.act(n.inputs[0])
            if len(x_shape) == 4:
                p = self._to_nchw(p, n, "params")
        idx = _init_array(g, n.inputs[1])
        i = self.const(f"{n.name}/indices", idx, "int32") if idx is not None \
            else self.act(n.inputs[1])
        y_shape = g.tensors[out].shape
        y = self._tmp(n, "nchw", y_shape) if len(y_shape) == 4 else self.new_act(out, y_shape)
        self.op("GATHER", [p, i], [y], nodes, {"Axis": axis, "BatchDims": 0})
        if len(y_shape) == 4:
            self._from_nchw(y, out, nodes)

    def _emit_split(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        axis, sizes = _split_sizes(n, self.g)  # type: ignore[misc]
        if _dyn_rank(self.g, n.inputs[0]) == 4:
            axis = _NHWC_AXIS[axis]
        ys = [self.new_act(o, self.g.tensors[o].shape) for o in n.outputs]
        self.op("SPLIT_V", [self.act(n.inputs[0]),
                            self.const(f"{n.name}/sizes", np.array(sizes), "int32"),
                            self.const(f"{n.name}/axis", np.array(axis), "int32")],
                ys, nodes, {"NumSplits": len(sizes)})

    def _emit_layernormalization(self, n: Node, out: str, nodes: tuple[str, ...],
                                 act: str) -> None:
        # (x - mean) * rsqrt(mean((x - mean)^2) + eps) * scale + bias, over axes axis..r-1
        g = self.g
        shape = g.tensors[n.inputs[0]].shape
        r = len(shape)
        axis = int(_attr(n, "axis", -1))  # type: ignore[arg-type]
        axis = axis + r if axis < 0 else axis
        eps = float(_attr(n, "epsilon", 1e-5))  # type: ignore[arg-type]
        red = tuple(1 if a >= axis else d for a, d in enumerate(shape))
        axes = self.const(f"{n.name}/axes", np.arange(axis, r), "int32")
        x = self.act(n.inputs[0])
        mean = self._tmp(n, "mean", red)
        self.op("MEAN", [x, axes], [mean], nodes, {"KeepDims": True})
        d = self._tmp(n, "centered", shape)
        self.op("SUB", [x, mean], [d], nodes, {"FusedActivationFunction": 0})
        sq = self._tmp(n, "squared", shape)
        self.op("MUL", [d, d], [sq], nodes, {"FusedActivationFunction": 0})
        var = self._tmp(n, "var", red)
        self.op("MEAN", [sq, axes], [var], nodes, {"KeepDims": True})
        ve = self._tmp(n, "var_eps", red)
        self.op("ADD", [var, self._scalar(n, "eps", eps, r)], [ve], nodes,
                {"FusedActivationFunction": 0})
        inv = self._tmp(n, "rstd", red)
        self.op("RSQRT", [ve], [inv], nodes)
        nrm = self._tmp(n, "normalized", shape)
        self.op("MUL", [d, inv], [nrm], nodes, {"FusedActivationFunction": 0})
        bshape = (1,) * axis + tuple(shape[axis:])

        def per_axes(t: str) -> np.ndarray:  # a scale / bias over the normalised axes
            v = _init_array(g, t).astype(np.float32)  # type: ignore[union-attr]
            v = v.reshape(bshape) if v.size > 1 else v.reshape((1,) * r)
            return np.ascontiguousarray(np.broadcast_to(v, bshape))

        has_bias = len(n.inputs) > 2 and bool(n.inputs[2])
        sc = self.const(f"{n.name}/scale", per_axes(n.inputs[1]), "const")
        y = self._tmp(n, "scaled", shape) if has_bias else self.new_act(out, shape)
        self.op("MUL", [nrm, sc], [y], nodes, {"FusedActivationFunction": 0})
        if has_bias:
            b = self.const(f"{n.name}/bias", per_axes(n.inputs[2]), "const")
            yb = self.new_act(out, shape)
            self.op("ADD", [y, b], [yb], nodes, {"FusedActivationFunction": 0})

    def _emit_gelu(self, n: Node, out: str, nodes: tuple[str, ...]) -> None:
        x = self.act(self.fusion.gelu_of[n.index])
        y = self.new_act(out, self.g.tensors[out].shape)
        self.op("GELU", [x], [y], nodes, {"Approximate": False})

    def _emit_batch_matmul(self, n: Node, out: str, nodes: tuple[str, ...]) -> None:
        a_shape = self.g.tensors[n.inputs[0]].shape
        y_shape = self.g.tensors[out].shape
        a, b = self.act(n.inputs[0]), self.act(n.inputs[1])
        if len(a_shape) == 4:  # attention: both operands back to the ONNX layout
            a, b = self._to_nchw(a, n, "a"), self._to_nchw(b, n, "b")
        y = self._tmp(n, "nchw", y_shape) if len(y_shape) == 4 else self.new_act(out, y_shape)
        self.op("BATCH_MATMUL", [a, b], [y], nodes, {"AdjX": False, "AdjY": False},
                int(np.prod(y_shape)) * a_shape[-1])
        if len(y_shape) == 4:
            self._from_nchw(y, out, nodes)
