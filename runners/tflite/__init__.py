"""ONNX sub-model -> TFLite flatbuffer, without TensorFlow (int8 full-integer or fp32).

Why this exists: two toolchains consume TFLite, not ONNX. Vela (Arm Ethos-U) compiles only
*int8 full-integer* TFLite, and LiteRT (the TFLite runtime, XNNPACK on CPU) runs TFLite. The
usual route (ONNX -> TensorFlow -> TFLiteConverter) drags in TensorFlow (gigabytes, minutes of
import on a device runner) and re-derives what Collage already knows. Candidate sub-graphs are
small and use a small set of CNN operators, so a direct writer is shorter and deterministic: the
flatbuffer is built with `flatbuffers.Builder` and the TFLite schema modules that ethos-u-vela
ships (``ethosu.vela.tflite.*``), and every TFLite tensor keeps its ONNX name.

Layout (the one decision everything else follows): **every rank-4 activation is held NHWC**
inside the TFLite model, converted once for the whole sub-graph; tensors of other ranks keep
their ONNX layout. So no transposes are inserted between ops: Conv weights become OHWI,
depthwise weights [1, H, W, C*M] (quantized_dimension 3), FC weights [out, in], channel-wise
constants are permuted to NHWC at conversion time, and axes (Concat, Softmax, Pad) are remapped.
The TFLite model's *graph inputs and outputs are NHWC too* (for rank 4): the caller transposes
at the boundary (`IOSpec.to_tflite` / `IOSpec.from_tflite` do it, and quantise / dequantise in
int8 mode). The one place where layout is observable is a rank change (Reshape / Flatten /
Squeeze / Unsqueeze of a rank-4 tensor): flattening NHWC memory differs from flattening NCHW,
so exactly there an explicit TRANSPOSE back to NCHW (and, for a rank-4 result, forward to NHWC)
is emitted, unless it is a no-op in memory (e.g. [1, C, 1, 1] after a global pool). fp32 ops
that need the ONNX layout (BATCH_MATMUL, a last-axis SOFTMAX, GATHER) are wrapped the same way.
In fp32 mode a peephole pass then removes the layout churn this leaves between ops (see
`runners.tflite.peephole`); the graph inputs and outputs stay NHWC, and int8 output is untouched
by the pass.

Padding: ONNX pads that TFLite's SAME/VALID express exactly are folded into the op; other pads
become an explicit PAD (zeros; PADV2 with the lowest value in front of a MaxPool). Fusions that
do not change results are applied: a per-channel constant ``Add`` after Conv/Gemm/MatMul folds
into the bias (after a Conv or ConvTranspose, with any BatchNormalization and per-channel constant
``Mul`` into its weights too), ``x * Clip(x + 3, 0, 6) / 6`` becomes one HARD_SWISH, and Relu /
Clip(0, 6) / Clip(-1, 1) following an op that has a fused-activation field becomes that field,
when the intermediate tensor has no other reader.

int8 mode follows the TFLite 8-bit quantization spec (see `runners.tflite.quant`): activations
per-tensor asymmetric int8 from the calibrated (min, max) of each ONNX tensor (`tensor_ranges`,
from `runners.calibration`), weights per-channel symmetric int8, int32 bias. On request
(`ActivationBits.INT16`) it writes TFLite's 16x8 scheme instead: symmetric int16 activations,
the same int8 weights, int64 bias; and given the calibration's per-channel means it corrects
each bias for the mean shift of its rounded weights.

`convertible(node, graph)` is the per-node capability check; `convert` runs the same check on
every node first and raises `UnsupportedOp` with the same reason, so the two always agree.
`ConvertedModel.op_nodes` maps every TFLite operator index to the ONNX node names it
implements (first name: the node it was emitted for; fused nodes follow).

The modules, in the order a conversion uses them:

* `result`: what a conversion returns (`ConvertedModel`, `IOSpec`, `OpInfo`), its errors and
  `CONVERTER_REVISION`;
* `attrs`: reading ONNX node attributes and element types;
* `layout`: the NCHW -> NHWC mapping of shapes, axes, permutations and weights;
* `fold`: conversion-time constants (initializers, shape arithmetic and ops on constants);
* `params`: the TFLite parameters an ONNX node needs (padding, clip bounds, axes, the GELU
  pattern), or why none exist;
* `support`: the capability check (`convertible`, `SUPPORTED_OPS`, `SUPPORTED_OPS_FP32`);
* `fuse`: the fusion plan made before lowering (bias folds; BatchNormalization / per-channel
  Mul / Add chains folded into a Conv or ConvTranspose; fused activations; HardSwish and GELU
  patterns);
* `ir`: the converter's own tensors and ops, and the builder the emitters share;
* `typed`: integer and boolean tensors (ids, masks; fp32 mode only): their checks and the
  Expand / Equal / Cast emitters;
* `lower`, `lower_fp32`: ONNX node -> TFLite ops (the fp32-only mappings in the second);
* `peephole`: the fp32 layout-transpose peephole over the emitted ops;
* `quant`: int8 parameters (ranges, ties, pins, requantisation) and quantised tensor data;
* `flatbuffer`: writing the TFLite flatbuffer;
* `converter`: `convert`, which runs them in that order.
"""

from __future__ import annotations

from runners.tflite.converter import convert
from runners.tflite.quant import PINNED_SCALES, act_qparams
from runners.tflite.result import (
    CONVERTER_REVISION,
    ActivationBits,
    ConversionError,
    ConvertedModel,
    IOSpec,
    MissingRangeError,
    OpInfo,
    UnsupportedOp,
)
from runners.tflite.support import SUPPORTED_OPS, SUPPORTED_OPS_FP32, convertible

__all__ = [
    "CONVERTER_REVISION",
    "PINNED_SCALES",
    "SUPPORTED_OPS",
    "SUPPORTED_OPS_FP32",
    "ActivationBits",
    "ConversionError",
    "ConvertedModel",
    "IOSpec",
    "MissingRangeError",
    "OpInfo",
    "UnsupportedOp",
    "act_qparams",
    "convert",
    "convertible",
]
