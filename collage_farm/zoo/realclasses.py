"""Small models with the shapes real exports have and the seeded zoo avoids, one per class.

Why: users bring exported models, and exports carry things the clean zoo models never do:
quantization (QDQ pairs, dynamic quantization, QLinear operators), control flow with
sub-graphs (If, Loop, Scan bodies reading outer-scope tensors and holding their own
initializers), recurrent layers with initial states as graph inputs, detector heads (old
opsets, Resize, dynamic height and width, many outputs, shape computations), IR versions below
what their opsets need, and opset imports of domains no node uses. Each builder here makes the
smallest model of its class, in code, so tests and ``bench/realmodels.py`` share them and every
machine has them:

* quantized models come from ONNX Runtime's own tools (`onnxruntime.quantization`:
  ``quantize_static`` with a seeded `CalibrationDataReader` in QDQ and QOperator formats,
  ``quantize_dynamic``) applied to the zoo's mnist, exactly what a user runs on a model;
* the others are written with `onnx.helper` at the opset and IR version their exporters use.

They are zoo models (``zoo:qdq_mnist``, ...; `collage_farm.zoo.build`), seeded like the rest,
but unlike the rest they keep their exporters' irregularities on purpose: other opsets and IR
versions, dynamic dimensions, integer inputs, custom domains. `CLASSES` maps each model to its
class and to the ``--shape`` it needs.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper

from collage_farm import zoo
from collage_farm.core.feeds import random_feeds
from collage_farm.zoo import GraphBuilder

__all__ = ["CLASSES", "RealClass"]

F32 = TensorProto.FLOAT


@dataclass(frozen=True)
class RealClass:
    """A zoo model standing for one class of real exports, and what a campaign must bind."""

    model: str  # the zoo name
    klass: str  # quantized | control-flow | recurrent | detector | versions
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # --shape it needs
    note: str = ""


# --- quantized: ONNX Runtime's own tools on the zoo's mnist --------------------------------


def _quantize(fmt: str, seed: int, calibration_samples: int = 16) -> onnx.ModelProto:
    """mnist (seeded) through `onnxruntime.quantization`: ``qdq``, ``qoperator`` or ``dynamic``.

    The tools read and write files, so they work in a temporary directory; calibration reads
    seeded random images (`random_feeds`), so the result is the same for a seed.
    """
    from onnxruntime.quantization import (  # heavy: only when a quantized model is built
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    class _Reader(CalibrationDataReader):
        def __init__(self, model: onnx.ModelProto) -> None:
            self._it = iter([random_feeds(model, seed + i) for i in range(calibration_samples)])

        def get_next(self) -> dict | None:
            return next(self._it, None)

    src_model = zoo.build("mnist", seed=seed)
    with tempfile.TemporaryDirectory(prefix="collage-quant-") as d:
        src, dst = os.path.join(d, "fp32.onnx"), os.path.join(d, "int8.onnx")
        onnx.save(src_model, src)
        if fmt == "dynamic":
            quantize_dynamic(src, dst, op_types_to_quantize=["Conv", "MatMul"],
                             weight_type=QuantType.QInt8)
        else:
            qdq = fmt == "qdq"
            quantize_static(src, dst, _Reader(src_model),
                            quant_format=QuantFormat.QDQ if qdq else QuantFormat.QOperator,
                            # QDQ: around Conv and MatMul only; QOperator: every op it can
                            op_types_to_quantize=["Conv", "MatMul"] if qdq else None,
                            activation_type=QuantType.QInt8 if qdq else QuantType.QUInt8,
                            weight_type=QuantType.QInt8)
        model = onnx.load(dst)
    model.graph.name = f"{fmt}_mnist"
    helper.set_model_props(model, {"zoo_model": f"{fmt}_mnist", "seed": str(seed),
                                   "made_by": f"onnxruntime.quantization ({fmt})"})
    return model


def qdq_mnist(*, seed: int = 0) -> onnx.ModelProto:
    """mnist quantized statically in QDQ format: QuantizeLinear/DequantizeLinear around
    Conv and MatMul (int8 activations and weights, calibrated on seeded images)."""
    return _quantize("qdq", seed)


def dynquant_mnist(*, seed: int = 0) -> onnx.ModelProto:
    """mnist through ``quantize_dynamic``: DynamicQuantizeLinear, ConvInteger, MatMulInteger."""
    return _quantize("dynamic", seed)


def qlinear_mnist(*, seed: int = 0) -> onnx.ModelProto:
    """mnist quantized statically in QOperator format: QLinearConv, QLinearMatMul and
    ONNX Runtime's com.microsoft QLinearAdd (uint8 activations)."""
    return _quantize("qoperator", seed)


# --- shared helpers for helper-built models ------------------------------------------------


def _finish(b: GraphBuilder, opset: int, ir_version: int, doc: str,
            domains: Mapping[str, int] | None = None) -> onnx.ModelProto:
    """``b``'s model at ``opset`` and ``ir_version``, with extra opset imports ``domains``."""
    model = b.model(doc)
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("", opset))
    for dom, ver in (domains or {}).items():
        model.opset_import.append(helper.make_opsetid(dom, ver))
    model.ir_version = ir_version
    return model


def _weight(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    return (rng.standard_normal(shape) * math.sqrt(1.0 / fan_in)).astype(np.float32)


def _body(name: str, nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
          outputs: list[onnx.ValueInfoProto],
          inits: list[onnx.TensorProto] = ()) -> onnx.GraphProto:  # type: ignore[assignment]
    return helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))


# --- control flow: If, Loop, Scan ----------------------------------------------------------


def if_gate(*, seed: int = 0, width: int = 16) -> onnx.ModelProto:
    """A gated block: ``If(ReduceSum(h) > 0)`` picks one of two bodies.

    The then-branch has its own initializer and reads the outer-scope initializer
    ``gate/bias``; the else-branch reads the outer-scope node output ``h`` and scales it by
    an outer-scope constant. Opset 13, IR 7 (a PyTorch 1.8-era scripted export).
    """
    b = GraphBuilder("if_gate", seed)
    x = b.input("x", [1, width])
    h = b.op("MatMul", [x, b.param("fc1.weight", (width, width), math.sqrt(2 / width))], "fc1")
    h = b.op("Relu", [h], "relu1", out="h")
    s = b.op("ReduceSum", [h], "gate/sum", keepdims=0)
    cond = b.op("Greater", [s, b.const("gate/threshold", 1.0)], "gate/cond")
    bias = b.param("gate/bias", (width,), 0.1)
    scale = b.const("gate/scale", np.full((1, width), 0.5, np.float32))
    out_vi = [helper.make_tensor_value_info("branch_y", F32, [1, width])]
    w_then = helper.make_tensor("then/w", F32, [width, width],
                                _weight(b.rng, (width, width), width).ravel().tolist())
    then_g = _body("then", [
        helper.make_node("MatMul", [h, "then/w"], ["then/mm"], name="then/matmul"),
        helper.make_node("Add", ["then/mm", bias], ["branch_y"], name="then/add"),
    ], [], out_vi, [w_then])
    else_g = _body("else", [
        helper.make_node("Mul", [h, scale], ["branch_y"], name="else/mul"),
    ], [], [helper.make_tensor_value_info("branch_y", F32, [1, width])])
    y = b.op("If", [cond], "gate/if", out="gated", then_branch=then_g, else_branch=else_g)
    y = b.op("Tanh", [y], "tanh")
    y = b.op("MatMul", [y, b.param("fc2.weight", (width, 4), math.sqrt(1 / width))], "fc2",
             out="logits")
    b.output(y, [1, 4])
    return _finish(b, 13, 7, "If with two bodies, outer-scope reads and a body initializer")


def loop_rnn(*, seed: int = 0, width: int = 8, steps: int = 3) -> onnx.ModelProto:
    """A Loop of ``steps`` iterations: ``s = Tanh(s @ W + xp + b)``, state and scan output.

    The body reads the outer-scope initializer ``loop/W`` and node output ``xp`` and holds its
    own bias initializer; the trip count and condition are initializers. Two outputs: the final
    state through a head, and the mean of the per-step states. Opset 11, IR 6.
    """
    b = GraphBuilder("loop_rnn", seed)
    x = b.input("x", [1, width])
    xp = b.op("MatMul", [x, b.param("in.weight", (width, width), math.sqrt(1 / width))],
              "in_proj", out="xp")
    s0 = b.op("Relu", [xp], "s0")
    w = b.param("loop/W", (width, width), 0.5 / math.sqrt(width))
    trip = b.const("loop/trip_count", np.int64(steps), np.int64)
    keep = b.const("loop/cond", np.bool_(True), np.bool_)
    bias = helper.make_tensor("body/b", F32, [width], [0.01] * width)
    body = _body("loop_body", [
        helper.make_node("MatMul", ["s_in", w], ["body/mm"], name="body/matmul"),
        helper.make_node("Add", ["body/mm", xp], ["body/add1"], name="body/add_x"),
        helper.make_node("Add", ["body/add1", "body/b"], ["body/add2"], name="body/add_b"),
        helper.make_node("Tanh", ["body/add2"], ["s_out"], name="body/tanh"),
        helper.make_node("Identity", ["cond_in"], ["cond_out"], name="body/cond"),
        helper.make_node("Identity", ["s_out"], ["step_out"], name="body/step"),
    ], [helper.make_tensor_value_info("iter", TensorProto.INT64, []),
        helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
        helper.make_tensor_value_info("s_in", F32, [1, width])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("s_out", F32, [1, width]),
         helper.make_tensor_value_info("step_out", F32, [1, width])], [bias])
    s_final, steps_out = b.op_multi("Loop", [trip, keep, s0], "loop", n_out=2,
                                    outs=["s_final", "steps"], body=body)
    y = b.op("MatMul", [s_final, b.param("head.weight", (width, 3), math.sqrt(1 / width))],
             "head", out="logits")
    m = b.op("ReduceMean", [steps_out], "steps/mean", axes=[0], keepdims=0, out="step_mean")
    b.output(y, [1, 3])
    b.output(m, [1, width])
    return _finish(b, 11, 6, "Loop with loop-carried state, scan output and outer-scope reads")


def scan_cumsum(*, seed: int = 0, width: int = 8, steps: int = 6) -> onnx.ModelProto:
    """A Scan over the sequence axis: ``acc += x_t * gain``, emitting ``Relu(acc)`` per step.

    The body reads the outer-scope node output ``gain`` (computed from the input); the
    initial state comes from the first frame. Opset 16, IR 8.
    """
    b = GraphBuilder("scan_cumsum", seed)
    x = b.input("frames", [1, steps, width])
    gain = b.op("Sigmoid", [b.op("ReduceMean", [x], "gain/mean", axes=[1], keepdims=0)],
                "gain/sigmoid", out="gain")
    acc0 = b.op("MatMul", [gain, b.param("acc0.weight", (width, width),
                                         math.sqrt(1 / width))], "acc0")
    body = _body("scan_body", [
        helper.make_node("Mul", ["x_t", "gain"], ["body/scaled"], name="body/mul"),
        helper.make_node("Add", ["acc_in", "body/scaled"], ["acc_out"], name="body/add"),
        helper.make_node("Relu", ["acc_out"], ["y_t"], name="body/relu"),
    ], [helper.make_tensor_value_info("acc_in", F32, [1, width]),
        helper.make_tensor_value_info("x_t", F32, [1, width])],
        [helper.make_tensor_value_info("acc_out", F32, [1, width]),
         helper.make_tensor_value_info("y_t", F32, [1, width])])
    acc, ys = b.op_multi("Scan", [acc0, x], "scan", n_out=2, outs=["acc", "ys"], body=body,
                         num_scan_inputs=1, scan_input_axes=[1], scan_output_axes=[1])
    y = b.op("MatMul", [acc, b.param("head.weight", (width, 2), math.sqrt(1 / width))],
             "head", out="logits")
    b.output(y, [1, 2])
    b.output(ys, [1, steps, width])
    return _finish(b, 16, 8, "Scan over the sequence axis with an outer-scope read")


# --- recurrent: LSTM and GRU with initial states as inputs ---------------------------------


def lstm_tagger(*, seed: int = 0, vocab: int = 50, embed: int = 16, hidden: int = 16,
                seq_len: int = 8, tags: int = 5) -> onnx.ModelProto:
    """Token ids (int64, an embedding Gather) -> LSTM -> per-token tags.

    ``initial_h`` and ``initial_c`` are graph inputs (a streaming export); the outputs are the
    tags and the final states ``Y_h``/``Y_c``. Opset 14, IR 7.
    """
    b = GraphBuilder("lstm_tagger", seed)
    ids = b.input("tokens", [1, seq_len], TensorProto.INT64)
    h0 = b.input("initial_h", [1, 1, hidden])
    c0 = b.input("initial_c", [1, 1, hidden])
    e = b.op("Gather", [b.param("embed.weight", (vocab, embed), 1.0), ids], "embed", axis=0)
    e = b.op("Transpose", [e], "to_time_major", perm=[1, 0, 2])
    w = b.param("lstm.W", (1, 4 * hidden, embed), math.sqrt(1 / embed))
    r = b.param("lstm.R", (1, 4 * hidden, hidden), math.sqrt(1 / hidden))
    bias = b.param("lstm.B", (1, 8 * hidden), 0.05)
    y, yh, yc = b.op_multi("LSTM", [e, w, r, bias, "", h0, c0], "lstm", n_out=3,
                           outs=["lstm_y", "Y_h", "Y_c"], hidden_size=hidden)
    y = b.op("Squeeze", [y, b.const("squeeze_axes", [1], np.int64)], "squeeze_dir")
    y = b.op("MatMul", [y, b.param("tag.weight", (hidden, tags), math.sqrt(1 / hidden))],
             "tag", out="tag_logits")
    b.output(y, [seq_len, 1, tags])
    b.output(yh, [1, 1, hidden])
    b.output(yc, [1, 1, hidden])
    return _finish(b, 14, 7, "embedding + LSTM with initial states as inputs")


def gru_speech(*, seed: int = 0, frames: int = 10, features: int = 12, hidden: int = 16,
               speakers: int = 2) -> onnx.ModelProto:
    """Audio frames -> GRU (PyTorch's ``linear_before_reset=1``) -> frame classes.

    ``initial_h`` is a graph input; ``speaker`` (int64 [1]) indexes a table of ``speakers``
    rows (2: a random id in [0, 4) would be out of range). Opset 12, IR 7.
    """
    b = GraphBuilder("gru_speech", seed)
    x = b.input("frames", [frames, 1, features])
    h0 = b.input("initial_h", [1, 1, hidden])
    spk = b.input("speaker", [1], TensorProto.INT64)
    table = b.param("speaker.table", (speakers, features), 0.5)
    x = b.op("Add", [x, b.op("Gather", [table, spk], "speaker/embed", axis=0)], "speaker/add")
    w = b.param("gru.W", (1, 3 * hidden, features), math.sqrt(1 / features))
    r = b.param("gru.R", (1, 3 * hidden, hidden), math.sqrt(1 / hidden))
    bias = b.param("gru.B", (1, 6 * hidden), 0.05)
    y, yh = b.op_multi("GRU", [x, w, r, bias, "", h0], "gru", n_out=2, outs=["gru_y", "Y_h"],
                       hidden_size=hidden, linear_before_reset=1)
    y = b.op("MatMul", [y, b.param("cls.weight", (hidden, 4), math.sqrt(1 / hidden))],
             "cls", out="frame_logits")
    b.output(y, [frames, 1, 1, 4])
    b.output(yh, [1, 1, hidden])
    return _finish(b, 12, 7, "GRU with its initial state and a speaker id as inputs")


# --- detector head: old opset, Resize, dynamic H/W, many outputs ----------------------------


def detector_fpn(*, seed: int = 0, opset: int = 11, classes: int = 3) -> onnx.ModelProto:
    """A three-level FPN detector head, as PyTorch exports it at ``opset`` (11..17).

    Input ``image`` [1, 3, height, width] with dynamic height and width (bind them with
    ``--shape image=1x3xHxW``, multiples of 8). Top-down path: ``Resize`` to the lateral's
    size computed in the graph (``Shape -> Slice -> Concat``, what ``F.interpolate(size=)``
    exports) and ``Resize`` by scales 2 (``scale_factor=2``); a class map (Sigmoid) and a box
    map per level: six outputs.
    """
    if not 11 <= opset <= 17:
        raise ValueError(f"detector_fpn: opset must be 11..17, not {opset}")
    b = GraphBuilder("detector_fpn", seed)
    x = b.input("image", [1, 3, "height", "width"])  # type: ignore[list-item]
    feats, c_in = [], 3
    for i, c in enumerate((8, 16, 32), start=1):
        x = _conv3(b, x, f"backbone/c{i}", c_in, c, stride=2)
        feats.append((x, c))
        c_in = c
    lat = [b.op("Conv", [f, b.param(f"fpn/lat{i}.weight", (16, c, 1, 1), math.sqrt(1 / c))],
                f"fpn/lat{i}", kernel_shape=[1, 1]) for i, (f, c) in enumerate(feats, start=1)]
    empty = b.const("resize/empty", np.zeros(0, np.float32))
    p3 = lat[2]
    # F.interpolate(p3, size=lat2.shape[-2:]): the sizes are computed in the graph
    hw = b.op("Slice", [b.op("Shape", [lat[1]], "fpn/lat2_shape"), b.const("i2", [2], np.int64),
                        b.const("i4", [4], np.int64), b.const("i0", [0], np.int64)],
              "fpn/lat2_hw")
    nc = b.op("Slice", [b.op("Shape", [p3], "fpn/p3_shape"), b.const("i0b", [0], np.int64),
                        b.const("i2b", [2], np.int64)], "fpn/p3_nc")
    sizes = b.op("Concat", [nc, hw], "fpn/up3_sizes", axis=0)
    resize = dict(mode="nearest", coordinate_transformation_mode="asymmetric",
                  nearest_mode="floor")
    roi = empty if opset < 13 else ""
    up3 = b.op("Resize", [p3, roi, empty, sizes], "fpn/up3", **resize)
    p2 = b.op("Add", [lat[1], up3], "fpn/p2")
    scales = b.const("resize/x2", [1.0, 1.0, 2.0, 2.0], np.float32)
    up2 = b.op("Resize", [p2, roi, scales], "fpn/up2", **resize)
    p1 = b.op("Add", [lat[0], up2], "fpn/p1")
    for lvl, p in ((1, p1), (2, p2), (3, p3)):
        p = b.op("Relu", [_conv3(b, p, f"head{lvl}/conv", 16, 16)], f"head{lvl}/relu")
        cls = b.op("Conv", [p, b.param(f"head{lvl}/cls.weight", (classes, 16, 1, 1), 0.25)],
                   f"head{lvl}/cls", kernel_shape=[1, 1])
        b.output(b.op("Sigmoid", [cls], f"head{lvl}/cls_sigmoid", out=f"scores_p{lvl}"),
                 [1, classes, f"h{lvl}", f"w{lvl}"])  # type: ignore[list-item]
        box = b.op("Conv", [p, b.param(f"head{lvl}/box.weight", (4, 16, 1, 1), 0.25)],
                   f"head{lvl}/box", kernel_shape=[1, 1], out=f"boxes_p{lvl}")
        b.output(box, [1, 4, f"h{lvl}", f"w{lvl}"])  # type: ignore[list-item]
    return _finish(b, opset, 6 if opset < 13 else 7,
                   f"FPN detector head, opset {opset}, dynamic H/W, Resize, six outputs")


def _conv3(b: GraphBuilder, x: str, name: str, c_in: int, c_out: int,
           stride: int = 1) -> str:
    w = b.param(f"{name}.weight", (c_out, c_in, 3, 3), math.sqrt(2 / (c_in * 9)))
    y = b.op("Conv", [x, w, b.param(f"{name}.bias", (c_out,), 0.05)], name,
             kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride])
    return b.op("Relu", [y], f"{name}/relu") if stride > 1 else y


# --- versions: IR below the opsets' need, unused domain imports ------------------------------


def old_ir(*, seed: int = 0) -> onnx.ModelProto:
    """The zoo's mnist saved as an old exporter does: opset 12 but IR version 6 (opset 12
    needs IR 7), plus an unused ``com.microsoft.nchwc`` import."""
    model = zoo.build("mnist", seed=seed)
    model.graph.name = "old_ir"
    del model.opset_import[:]
    model.opset_import.extend([helper.make_opsetid("", 12),
                               helper.make_opsetid("com.microsoft.nchwc", 1)])
    model.ir_version = 6
    return model


def unused_domains(*, seed: int = 0) -> onnx.ModelProto:
    """The zoo's mnist importing domains no node uses: ``ai.onnx.ml``, ``com.microsoft``,
    ``ai.onnx.training``, ``org.pytorch.aten`` (what converters leave behind)."""
    model = zoo.build("mnist", seed=seed)
    model.graph.name = "unused_domains"
    model.opset_import.extend([helper.make_opsetid(d, v) for d, v in (
        ("ai.onnx.ml", 3), ("com.microsoft", 1), ("ai.onnx.training", 1),
        ("org.pytorch.aten", 1))])
    return model


#: every class model, with the bindings a campaign needs
CLASSES: dict[str, RealClass] = {c.model: c for c in (
    RealClass("qdq_mnist", "quantized", note="QDQ around Conv/MatMul"),
    RealClass("dynquant_mnist", "quantized",
              note="DynamicQuantizeLinear, ConvInteger, MatMulInteger"),
    RealClass("qlinear_mnist", "quantized", note="QLinearConv, QLinearMatMul, QLinearAdd"),
    RealClass("if_gate", "control-flow", note="If, outer-scope reads, body initializer"),
    RealClass("loop_rnn", "control-flow", note="Loop, loop-carried state, scan output"),
    RealClass("scan_cumsum", "control-flow", note="Scan over the sequence axis"),
    RealClass("lstm_tagger", "recurrent", note="embedding + LSTM, initial_h/c inputs"),
    RealClass("gru_speech", "recurrent", note="GRU, initial_h input, 2-row speaker table"),
    RealClass("detector_fpn", "detector", {"image": (1, 3, 64, 96)},
              note="opset 11, Resize, dynamic H/W, six outputs"),
    RealClass("old_ir", "versions", note="opset 12 at IR 6"),
    RealClass("unused_domains", "versions", note="four unused domain imports"),
)}
