"""ONNX node -> TFLite ops: the lowering of a whole graph into the converter's IR."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from runners.tflite.attrs import DTYPES, FLOAT, _attr, _ints
from runners.tflite.fold import _folded, _init_array, _is_const
from runners.tflite.fuse import plan_fusions
from runners.tflite.ir import _act_enum
from runners.tflite.layout import (
    _NHWC_AXIS,
    _conv_weights,
    _layout_noop,
    _nhwc,
    _nhwc_const,
    _transpose_conv_weights,
)
from runners.tflite.lower_fp32 import _Fp32Lowering
from runners.tflite.params import (
    _bn_scale_shift,
    _clip_bounds,
    _fused_act_code,
    _pool_geometry,
    _resize_params,
    _resolve_pads,
    _softmax_axis,
)
from runners.tflite.quant import _PIN_SIGMOID, _PIN_TANH
from runners.tflite.result import ConversionError, UnsupportedOp
from runners.tflite.support import convertible

if TYPE_CHECKING:
    from collage_farm.core.graph import Node


class _Lowering(_Fp32Lowering):
    """Emits the TFLite ops of every ONNX node of a graph (NHWC-held, see `runners.tflite`)."""

    def run(self) -> None:
        """Check every node (`UnsupportedOp` with `convertible`'s reason), plan the fusions,
        then emit the graph inputs and every node that is not folded into another."""
        g = self.g
        for n in g.nodes:
            why = convertible(n, g, self.mode)
            if why is not None:
                raise UnsupportedOp(n.name, n.op_type, why)
        self.fusion = plan_fusions(g, self.mode, self.activations)
        for name in g.graph_inputs:
            info = g.tensors.get(name)
            if info is not None and info.elem_type != FLOAT and info.elem_type in DTYPES \
                    and self.mode == "fp32":
                # integer / boolean inputs (token ids, bytes, masks) keep the ONNX layout
                self.new_act(name, tfl_shape=info.shape)
                continue
            if info is None or info.elem_type != FLOAT:
                raise ConversionError(f"graph input {name!r} is not a float32 tensor")
            self.new_act(name, info.shape)
        for n in g.nodes:
            if n.index in self.fusion.absorbed or _folded(n, g):
                continue
            fused, act_node = self.fusion.fused.get(n.index, ((), None))
            out = (act_node or (fused[-1] if fused else n)).outputs[0]
            nodes = tuple(x.name for x in (n, *fused, act_node) if x is not None)
            act = _fused_act_code(act_node, g) if act_node is not None else None
            if n.index in self.fusion.gelu_of:
                self._emit_gelu(n, out, nodes)
                continue
            if n.index in self.fusion.hardswish_of:  # x * Clip(x + 3, 0, 6) / 6
                y = self.new_act(out, g.tensors[out].shape)
                self.op("HARD_SWISH", [self.act(self.fusion.hardswish_of[n.index])], [y], nodes)
                continue
            getattr(self, f"_emit_{n.op_type.lower()}")(n, out, nodes, act or "NONE")
        for o in g.graph_outputs:
            if o not in self.by_name:
                raise ConversionError(f"graph output {o!r} is not produced by a converted node")

    def _emit_conv(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        g = self.g
        x_shape = g.tensors[n.inputs[0]].shape
        y_shape = g.tensors[n.outputs[0]].shape
        w = _init_array(g, n.inputs[1]).astype(np.float32)  # type: ignore[union-attr]
        o_ch, _, kh, kw = w.shape
        bias = np.zeros(o_ch, np.float32)
        if len(n.inputs) > 2 and n.inputs[2]:
            bias = bias + _init_array(g, n.inputs[2]).astype(np.float32).reshape(-1)  # type: ignore[union-attr]
        if n.index in self.fusion.bn_of:  # BN / Mul / Add folded into the weights and bias
            scale, shift = self.fusion.bn_of[n.index]
            w = w * scale.reshape(-1, 1, 1, 1)
            bias = bias * scale + shift
        group = int(_attr(n, "group", 1))  # type: ignore[arg-type]
        d = _ints(_attr(n, "dilations"), (1, 1))
        s = _ints(_attr(n, "strides"), (1, 1))
        k_eff = ((kh - 1) * d[0] + 1, (kw - 1) * d[1] + 1)
        padding, explicit = _resolve_pads(n, x_shape[2:], k_eff, s, y_shape[2:])
        x = self.act(n.inputs[0])
        if explicit is not None:
            x = self._pad(x, explicit, n, "PAD")
        y = self.new_act(out, y_shape)
        depthwise = group != 1
        wt, w_axis = _conv_weights(w, depthwise)
        wid = self.const(f"{n.name}/weights", wt, "weight", axis=w_axis)
        bid = self.const(f"{n.name}/bias", bias, "bias", refs=(x, wid))
        macs = int(np.prod(y_shape)) * kh * kw * w.shape[1]
        opts: dict[str, Any] = {"Padding": 0 if padding == "SAME" else 1, "StrideW": s[1],
                                "StrideH": s[0], "FusedActivationFunction": _act_enum(act),
                                "DilationWFactor": d[1], "DilationHFactor": d[0]}
        if depthwise:
            opts["DepthMultiplier"] = o_ch // x_shape[1]
        self.op("DEPTHWISE_CONV_2D" if depthwise else "CONV_2D", [x, wid, bid], [y], nodes,
                opts, macs)

    def _emit_batchnormalization(self, n: Node, out: str, nodes: tuple[str, ...],
                                 act: str) -> None:
        """int8: a 1x1 DEPTHWISE_CONV_2D (the per-channel scale as per-channel int8 weights,
        the shift as its int32 bias: no per-tensor constant); fp32: MUL and ADD."""
        if self.mode == "fp32":
            super()._emit_batchnormalization(n, out, nodes, act)
            return
        scale, shift = _bn_scale_shift(n, self.g)
        x = self.act(n.inputs[0])
        y = self.new_act(out, self.g.tensors[out].shape)
        wid = self.const(f"{n.name}/weights", scale.reshape(1, 1, 1, -1), "weight", axis=3)
        bid = self.const(f"{n.name}/bias", shift, "bias", refs=(x, wid))
        self.op("DEPTHWISE_CONV_2D", [x, wid, bid], [y], nodes,
                {"Padding": 1, "StrideW": 1, "StrideH": 1, "DepthMultiplier": 1,
                 "FusedActivationFunction": _act_enum(act), "DilationWFactor": 1,
                 "DilationHFactor": 1}, int(np.prod(self.g.tensors[out].shape)))

    def _emit_hardsigmoid(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        """max(0, min(1, a*x + b)) = relu6(6a*x + 6b) / 6: MUL (left out when 6a = 1), ADD
        with fused RELU6, MUL; in int8 the intermediates get the ranges their arithmetic
        implies (x's range times 6a, then [0, 6])."""
        alpha = float(_attr(n, "alpha", 0.2))  # type: ignore[arg-type]
        beta = float(_attr(n, "beta", 0.5))  # type: ignore[arg-type]
        y_shape = self.g.tensors[out].shape
        r = len(y_shape)
        x = self.act(n.inputs[0])
        shape = self.tensors[x].shape
        cur = x
        if abs(6.0 * alpha - 1.0) > 1e-6:
            cur = self._tmp(n, "scaled", shape)
            lo, hi = self.tensors[x].range or (0.0, 0.0)
            self.tensors[cur].range = (min(6 * alpha * lo, 6 * alpha * hi),
                                       max(6 * alpha * lo, 6 * alpha * hi))
            self.op("MUL", [x, self._scalar(n, "alpha6", 6.0 * alpha, r)], [cur], nodes,
                    {"FusedActivationFunction": 0})
        t2 = self._tmp(n, "shifted", shape)
        self.tensors[t2].range = (0.0, 6.0)
        self.op("ADD", [cur, self._scalar(n, "beta6", 6.0 * beta, r)], [t2], nodes,
                {"FusedActivationFunction": _act_enum("RELU6")})
        y = self.new_act(out, y_shape)
        self.op("MUL", [t2, self._scalar(n, "sixth", 1.0 / 6.0, r)], [y], nodes,
                {"FusedActivationFunction": 0})

    def _emit_resize(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        """RESIZE_NEAREST_NEIGHBOR / RESIZE_BILINEAR; int8 input and output share parameters
        (TFLite's int8 kernels interpolate the stored values)."""
        code, align, half = _resize_params(n, self.g)  # type: ignore[misc]
        y_shape = self.g.tensors[out].shape
        size = self.const(f"{n.name}/size", np.array(y_shape[2:]), "int32")
        x = self.act(n.inputs[0])
        y = self.new_act(out, y_shape)
        self.tie(x, y)
        self.op(code, [x, size], [y], nodes, {"AlignCorners": align, "HalfPixelCenters": half})

    def _emit_convtranspose(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        """TRANSPOSE_CONV with the per-channel affine chain after it folded in (`FusionPlan.
        bn_of`); the bias: int8, TRANSPOSE_CONV's int32 bias input; fp32, an ADD."""
        g = self.g
        x_shape = g.tensors[n.inputs[0]].shape
        y_shape = g.tensors[out].shape
        w = _init_array(g, n.inputs[1]).astype(np.float32)  # type: ignore[union-attr]
        bias = np.zeros(w.shape[1], np.float32)
        if len(n.inputs) > 2 and n.inputs[2]:
            bias = bias + _init_array(g, n.inputs[2]).astype(np.float32).reshape(-1)  # type: ignore[union-attr]
        if n.index in self.fusion.bn_of:
            scale, shift = self.fusion.bn_of[n.index]
            w = w * scale.reshape(1, -1, 1, 1)
            bias = bias * scale + shift
        s = _ints(_attr(n, "strides"), (1, 1))
        pads = _ints(_attr(n, "pads"), (0, 0, 0, 0))
        x = self.act(n.inputs[0])
        osh = self.const(f"{n.name}/output_shape", np.array(_nhwc(y_shape)), "int32")
        wid = self.const(f"{n.name}/weights", _transpose_conv_weights(w), "weight", axis=0)
        ins = [osh, wid, x]
        add_bias = self.mode == "fp32" and bool(np.any(bias))
        if self.mode == "int8":
            ins.append(self.const(f"{n.name}/bias", bias, "bias", refs=(x, wid)))
        y = self._tmp(n, "conv", _nhwc(y_shape)) if add_bias else self.new_act(out, y_shape)
        macs = int(np.prod(x_shape)) * w.shape[1] * w.shape[2] * w.shape[3]
        self.op("TRANSPOSE_CONV", ins, [y], nodes,
                {"Padding": 1 if not any(pads) else 0, "StrideW": s[1], "StrideH": s[0]}, macs)
        if add_bias:
            b = self.const(f"{n.name}/bias", bias.reshape(1, 1, 1, -1), "const")
            yb = self.new_act(out, y_shape)
            self.op("ADD", [y, b], [yb], nodes, {"FusedActivationFunction": 0})

    def _pad(self, x: int, explicit: tuple, n: Node, code: str) -> int:
        (pt, pb), (pl, pr) = explicit
        shape = self.tensors[x].shape
        padded_shape = (shape[0], shape[1] + pt + pb, shape[2] + pl + pr, shape[3])
        pads = self.const(f"{n.name}/paddings", np.array([[0, 0], [pt, pb], [pl, pr], [0, 0]]),
                          "int32")
        xp = self.new_act(f"{n.name}/padded", tfl_shape=padded_shape, calibrated=False)
        ins = [x, pads]
        if code == "PADV2":  # MaxPool: pad with the lowest value, never selected
            low = self.const(f"{n.name}/pad_value", np.array([np.finfo(np.float32).min]),
                             "like", refs=(x,))
            ins.append(low)
        self.tie(x, xp)
        self.op(code, ins, [xp], (n.name,))
        return xp

    def _emit_gemm(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        g = self.g
        if n.op_type == "MatMul" and not _is_const(g, n.inputs[1]):
            self._emit_batch_matmul(n, out, nodes)
            return
        a_shape = g.tensors[n.inputs[0]].shape
        y_shape = g.tensors[n.outputs[0]].shape
        # no copy of a float32 weight (a fresh array: gpt2's 154 MB LM head copied in seconds)
        b = _init_array(g, n.inputs[1]).astype(np.float32, copy=False)  # type: ignore[union-attr]
        if n.op_type == "Gemm":
            w = b if int(_attr(n, "transB", 0)) else b.T  # type: ignore[arg-type]
            w = w * np.float32(_attr(n, "alpha", 1.0))
        else:
            w = b.T
        n_out = w.shape[0]
        bias = np.zeros(n_out, np.float32)
        if n.op_type == "Gemm" and len(n.inputs) > 2 and n.inputs[2]:
            c = _init_array(g, n.inputs[2]).astype(np.float32).reshape(-1)  # type: ignore[union-attr]
            bias = bias + np.float32(_attr(n, "beta", 1.0)) * np.broadcast_to(c, (n_out,))
        if n.index in self.fusion.bias_of:
            bias = bias + self.fusion.bias_of[n.index]
        x = self.act(n.inputs[0])
        y = self.new_act(out, y_shape)
        wid = self.const(f"{n.name}/weights", np.ascontiguousarray(w), "weight", axis=0)
        bid = self.const(f"{n.name}/bias", bias, "bias", refs=(x, wid))
        macs = int(np.prod(y_shape)) * w.shape[1]
        self.op("FULLY_CONNECTED", [x, wid, bid], [y], nodes,
                {"FusedActivationFunction": _act_enum(act),
                 "KeepNumDims": len(a_shape) > 2}, macs)

    _emit_matmul = _emit_gemm

    def _operand(self, n: Node, t: str, out_rank: int, kind: str = "const",
                 transform: Callable[[np.ndarray], np.ndarray] | None = None,
                 refs: tuple[int, ...] = ()) -> int:
        arr = _init_array(self.g, t)
        if arr is None:
            return self.act(t)
        arr = arr.astype(np.float32, copy=False)
        if transform is not None:
            arr = transform(arr)
        arr = _nhwc_const(arr, out_rank)
        return self.const(f"{n.name}/{t}", np.ascontiguousarray(arr), kind, refs=refs)

    def _emit_binary(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y_shape = self.g.tensors[n.outputs[0]].shape
        r = len(y_shape)
        code = {"Add": "ADD", "Sub": "SUB", "Mul": "MUL", "Div": "MUL"}[n.op_type]
        dyn_div = n.op_type == "Div" and not _is_const(self.g, n.inputs[1])
        if dyn_div:  # fp32 only (the check refuses it in int8)
            code = "DIV"
        a = self._operand(n, n.inputs[0], r)
        recip = (lambda v: (1.0 / v).astype(np.float32)) if n.op_type == "Div" \
            and not dyn_div else None
        b = self._operand(n, n.inputs[1], r, transform=recip)
        y = self.new_act(out, y_shape)
        self.op(code, [a, b], [y], nodes, {"FusedActivationFunction": _act_enum(act)})

    _emit_add = _emit_sub = _emit_mul = _emit_div = _emit_binary

    def _emit_maxpool(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        x_shape, y_shape, k, s = _pool_geometry(n, self.g)
        padding, explicit = _resolve_pads(n, x_shape[2:], k, s, y_shape[2:])
        avg = n.op_type == "AveragePool"
        if avg:
            pads = _ints(_attr(n, "pads"), (0, 0, 0, 0))
            if int(_attr(n, "count_include_pad", 0)) and padding == "SAME" and any(pads):  # type: ignore[arg-type]
                padding, explicit = "VALID", ((pads[0], pads[2]), (pads[1], pads[3]))
        x = self.act(n.inputs[0])
        if explicit is not None:
            # zero padding is exact for a max over non-negative input (after a ReLU) and,
            # unlike PADV2, XNNPACK takes it: the max pool stays in the delegate partition
            zero_ok = self.mode == "fp32" and self._non_negative(n.inputs[0])
            x = self._pad(x, explicit, n, "PAD" if avg or zero_ok else "PADV2")
        y = self.new_act(out, y_shape)
        self.tie(x, y)
        self.op("AVERAGE_POOL_2D" if avg else "MAX_POOL_2D", [x], [y], nodes,
                {"Padding": 0 if padding == "SAME" else 1, "StrideW": s[1], "StrideH": s[0],
                 "FilterWidth": k[1], "FilterHeight": k[0],
                 "FusedActivationFunction": _act_enum(act)})

    _emit_averagepool = _emit_maxpool

    def _non_negative(self, tensor: str) -> bool:
        """True when the tensor is the output of a ReLU or of a Clip with min >= 0."""
        idx = self.g.producer.get(tensor)
        if idx is None:
            return False
        p = self.g.nodes[idx]
        if p.domain not in ("", "ai.onnx"):
            return False
        if p.op_type in ("Relu", "Sigmoid", "HardSigmoid"):
            return True
        if p.op_type == "Clip":
            b = _clip_bounds(p, self.g)
            return not isinstance(b, str) and b[0] is not None and b[0] >= 0.0
        return False

    def _emit_globalaveragepool(self, n: Node, out: str, nodes: tuple[str, ...],
                                act: str) -> None:
        x = self.act(n.inputs[0])
        y = self.new_act(out, self.g.tensors[n.outputs[0]].shape)
        rank4 = len(self.g.tensors[n.inputs[0]].shape) == 4
        axes = self.const(f"{n.name}/axes", np.array([1, 2] if rank4 else [2]), "int32")
        if n.op_type == "GlobalMaxPool":
            self.tie(x, y)
        self.op("REDUCE_MAX" if n.op_type == "GlobalMaxPool" else "MEAN", [x, axes], [y], nodes,
                {"KeepDims": True})

    _emit_globalmaxpool = _emit_globalaveragepool

    def _emit_reshape(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        in_shape = self.g.tensors[n.inputs[0]].shape
        out_shape = self.g.tensors[n.outputs[0]].shape
        x = self.act(n.inputs[0])
        cur = x
        if len(in_shape) == 4 and not _layout_noop(in_shape):
            perm = self.const(f"{n.name}/to_nchw_perm", np.array([0, 3, 1, 2]), "int32")
            t = self.new_act(f"{n.name}/nchw", tfl_shape=in_shape, calibrated=False)
            self.tie(cur, t)
            self.op("TRANSPOSE", [cur, perm], [t], nodes)
            cur = t
        to_nhwc = len(out_shape) == 4 and not _layout_noop(out_shape)
        if to_nhwc:
            mid = self.new_act(f"{n.name}/reshaped", tfl_shape=out_shape, calibrated=False)
            target = out_shape
        else:
            mid = self.new_act(out, out_shape)
            target = _nhwc(out_shape)
        shp = self.const(f"{n.name}/shape", np.array(target), "int32")
        self.tie(cur, mid)
        self.op("RESHAPE", [cur, shp], [mid], nodes, {"NewShape": list(target)})
        if to_nhwc:
            perm = self.const(f"{n.name}/to_nhwc_perm", np.array([0, 2, 3, 1]), "int32")
            y = self.new_act(out, out_shape)
            self.tie(mid, y)
            self.op("TRANSPOSE", [mid, perm], [y], nodes)

    _emit_flatten = _emit_squeeze = _emit_unsqueeze = _emit_reshape

    def _emit_identity(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        """An ONNX Identity of a computed tensor (the same values, so the same scale)."""
        self._emit_same(n, out, nodes)

    def _emit_softmax(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        x = self.act(n.inputs[0])
        if isinstance(_softmax_axis(n, self.g), str):  # fp32: last ONNX axis of a rank-4 tensor
            t = self._to_nchw(x, n, "in")
            mid = self._tmp(n, "softmax_nchw", self.tensors[t].shape)
            self.op("SOFTMAX", [t], [mid], nodes, {"Beta": 1.0})
            self._from_nchw(mid, out, nodes)
            return
        y = self.new_act(out, self.g.tensors[n.outputs[0]].shape, pin=_PIN_SIGMOID)
        self.op("SOFTMAX", [x], [y], nodes, {"Beta": 1.0})

    def _emit_concat(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y_shape = self.g.tensors[n.outputs[0]].shape
        r = len(y_shape)
        axis = int(_attr(n, "axis", 1))  # type: ignore[arg-type]
        axis = axis + r if axis < 0 else axis
        if r == 4:
            axis = _NHWC_AXIS[axis]
        xs = [self.act(t) for t in n.inputs]
        y = self.new_act(out, y_shape)
        idx = len(self.ops)
        for x in xs:
            self.tie(x, y, requant_op=idx)
        self.op("CONCATENATION", xs, [y], nodes,
                {"Axis": axis, "FusedActivationFunction": _act_enum(act)})

    def _emit_unary(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y_shape = self.g.tensors[n.outputs[0]].shape
        x = self.act(n.inputs[0])
        t = n.op_type
        if t == "Sigmoid":
            y = self.new_act(out, y_shape, pin=_PIN_SIGMOID)
            self.op("LOGISTIC", [x], [y], nodes)
        elif t == "Tanh":
            y = self.new_act(out, y_shape, pin=_PIN_TANH)
            self.op("TANH", [x], [y], nodes)
        elif t == "LeakyRelu":
            y = self.new_act(out, y_shape)
            self.op("LEAKY_RELU", [x], [y], nodes, {"Alpha": float(_attr(n, "alpha", 0.01))})  # type: ignore[arg-type]
        elif t == "HardSwish":
            y = self.new_act(out, y_shape)
            self.op("HARD_SWISH", [x], [y], nodes)
        else:
            code = _fused_act_code(n, self.g)
            if code is not None:
                y = self.new_act(out, y_shape)
                self.op(code, [x], [y], nodes)
                return
            lo, hi = _clip_bounds(n, self.g)  # type: ignore[misc]
            cur = x
            for bound, op_code in ((lo, "MAXIMUM"), (hi, "MINIMUM")):
                if bound is None:
                    continue
                last = op_code == "MINIMUM" or hi is None
                c = self.const(f"{n.name}/{op_code.lower()}",
                               np.full((1,) * len(y_shape), bound, np.float32), "like",
                               refs=(cur,))
                y = self.new_act(out, y_shape) if last else self.new_act(
                    f"{n.name}/clipped_low", y_shape, calibrated=False)
                self.tie(cur, y)
                self.op(op_code, [cur, c], [y], nodes)
                cur = y

    _emit_relu = _emit_clip = _emit_sigmoid = _emit_tanh = _emit_unary

    _emit_leakyrelu = _emit_hardswish = _emit_unary

    def _emit_pad(self, n: Node, out: str, nodes: tuple[str, ...], act: str) -> None:
        y_shape = self.g.tensors[n.outputs[0]].shape
        r = len(y_shape)
        pads = _init_array(self.g, n.inputs[1]).astype(np.int64).reshape(-1)  # type: ignore[union-attr]
        pairs = [[int(pads[i]), int(pads[i + r])] for i in range(r)]
        if r == 4:
            pairs = [pairs[0], pairs[2], pairs[3], pairs[1]]
        x = self.act(n.inputs[0])
        p = self.const(f"{n.name}/paddings", np.array(pairs), "int32")
        y = self.new_act(out, y_shape)
        self.tie(x, y)
        self.op("PAD", [x, p], [y], nodes)
