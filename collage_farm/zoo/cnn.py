"""Convolutional zoo models: mnist, resnet18, resnet50, mobilenet_v2.

Topologies follow the common ONNX exports (torchvision / ONNX model zoo) after the usual export
simplifications: BatchNormalization is folded into each Conv's bias (what inference exports
and onnxsim produce), residuals are ``Add``, the head is ``GlobalAveragePool -> Flatten ->
Gemm(transB=1)``. These are the shapes of graphs Collage meets in practice: conv chains with
fusable elementwise tails, residual diamonds (which exercise the convexity checks), depthwise
convolutions that some toolchains handle badly, and many structurally identical blocks whose
fingerprints collide.

Weights: He scaling (std = sqrt(2 / fan_in), uniform draws) for convolutions reading a ReLU or
ReLU6 output, std = sqrt(1 / fan_in) for those reading a linear tensor (MobileNetV2's
bottleneck stream), so the pre-activation variance stays ~1 from layer to layer. The last
convolution of every residual branch is damped by 1/sqrt(number of residual blocks) (as in
Fixup / zero-init-residual training) so the residual stream grows by a bounded factor instead
of doubling per block. Biases are small (std 0.05). With N(0, 1) input images the ReLUs stay
roughly half active, ReLU6 rarely saturates, and logits come out with a spread of order one:
good for int8 calibration and numeric comparisons.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from collage_farm.zoo import GraphBuilder

BIAS_STD = 0.05


def _conv(b: GraphBuilder, x: str, name: str, c_in: int, c_out: int, k: int, *,
          stride: int = 1, group: int = 1, gain: float = 2.0, damp: float = 1.0) -> str:
    """Conv with bias (BN folded), 'same'-style explicit padding k // 2."""
    fan_in = (c_in // group) * k * k
    w = b.param(f"{name}.weight", (c_out, c_in // group, k, k),
                 damp * math.sqrt(gain / fan_in))
    bias = b.param(f"{name}.bias", (c_out,), BIAS_STD)
    p = k // 2
    return b.op("Conv", [x, w, bias], name, kernel_shape=[k, k], pads=[p, p, p, p],
                strides=[stride, stride], dilations=[1, 1], group=group)


def _head(b: GraphBuilder, x: str, c: int, num_classes: int) -> str:
    x = b.op("GlobalAveragePool", [x], "head/global_avg_pool")
    x = b.op("Flatten", [x], "head/flatten", axis=1)
    w = b.param("head/fc.weight", (num_classes, c), math.sqrt(1.0 / c))
    bias = b.param("head/fc.bias", (num_classes,), BIAS_STD)
    out = b.op("Gemm", [x, w, bias], "head/fc", alpha=1.0, beta=1.0, transB=1)
    b.output(out, [1, num_classes])
    return out


def _image_input(b: GraphBuilder, image_size: int, min_size: int) -> str:
    if image_size < min_size:
        raise ValueError(f"{b.name}: image_size must be >= {min_size}, got {image_size}")
    return b.input("input", [1, 3, image_size, image_size])


def mnist(*, seed: int = 0, image_size: int = 28, num_classes: int = 10) -> onnx.ModelProto:
    """MNIST CNN with the topology of ONNX model-zoo ``mnist-8`` (the Collage RFC's example).

    ``Conv(8, 5x5) -> Add -> Relu -> MaxPool(2) -> Conv(16, 5x5) -> Add -> Relu -> MaxPool(3)
    -> Reshape -> MatMul -> Add``; input ``Input3`` 1x1x28x28, output ``Plus214_Output_0``
    (mnist-8's tensor names). As in mnist-8 the conv bias is a separate broadcast ``Add``.
    Differences from mnist-8: explicit pads instead of ``auto_pad=SAME_UPPER`` (portable to
    every converter), and the fc weight is stored as [256, 10] (mnist-8 reshapes a constant
    16x4x4x10 in the graph, a node any runtime folds away).
    """
    b = GraphBuilder("mnist", seed)
    if image_size < 6:
        raise ValueError(f"mnist: image_size must be >= 6, got {image_size}")
    x = b.input("Input3", [1, 1, image_size, image_size])
    c_in = 1
    for i, (c, pool) in enumerate(((8, 2), (16, 3)), start=1):
        w = b.param(f"conv{i}.weight", (c, c_in, 5, 5), math.sqrt(2.0 / (c_in * 25)))
        bias = b.param(f"conv{i}.bias", (c, 1, 1), BIAS_STD)
        x = b.op("Conv", [x, w], f"conv{i}", kernel_shape=[5, 5], pads=[2, 2, 2, 2],
                 strides=[1, 1], dilations=[1, 1], group=1)
        x = b.op("Add", [x, bias], f"conv{i}/bias_add")
        x = b.op("Relu", [x], f"conv{i}/relu")
        x = b.op("MaxPool", [x], f"pool{i}", kernel_shape=[pool, pool], strides=[pool, pool],
                 pads=[0, 0, 0, 0])
        c_in = c
    side = image_size // 2 // 3
    feat = 16 * side * side
    shape = b.const("flatten_shape", [1, feat], dtype=np.int64)
    x = b.op("Reshape", [x, shape], "flatten")
    w = b.param("fc.weight", (feat, num_classes), math.sqrt(1.0 / feat))
    bias = b.param("fc.bias", (1, num_classes), BIAS_STD)
    x = b.op("MatMul", [x, w], "fc/matmul")
    x = b.op("Add", [x, bias], "fc/bias_add", out="Plus214_Output_0")
    b.output(x, [1, num_classes])
    return b.model("MNIST CNN, mnist-8 topology, seeded random weights",
                   image_size=image_size, num_classes=num_classes)


_RESNET_STAGES = {  # depth -> (block kind, blocks per stage)
    18: ("basic", (2, 2, 2, 2)),
    34: ("basic", (3, 4, 6, 3)),
    50: ("bottleneck", (3, 4, 6, 3)),
    101: ("bottleneck", (3, 4, 23, 3)),
    152: ("bottleneck", (3, 8, 36, 3)),
}


def _resnet(name: str, depth: int, kind: str, seed: int, image_size: int,
            num_classes: int) -> onnx.ModelProto:
    valid = sorted(d for d, (k, _) in _RESNET_STAGES.items() if k == kind)
    if depth not in valid:
        raise ValueError(f"{name}: layers (network depth) must be one of {valid}, got {depth}")
    stages = _RESNET_STAGES[depth][1]
    damp = 1.0 / math.sqrt(sum(stages))
    b = GraphBuilder(name, seed)
    x = _image_input(b, image_size, 32)
    x = _conv(b, x, "stem/conv", 3, 64, 7, stride=2)
    x = b.op("Relu", [x], "stem/relu")
    x = b.op("MaxPool", [x], "stem/maxpool", kernel_shape=[3, 3], strides=[2, 2],
             pads=[1, 1, 1, 1])
    c_in = 64
    expansion = 1 if kind == "basic" else 4
    for s, n_blocks in enumerate(stages, start=1):
        width = 64 * 2 ** (s - 1)
        c_out = width * expansion
        for j in range(n_blocks):
            stride = 2 if (j == 0 and s > 1) else 1
            p = f"layer{s}.{j}"
            if kind == "basic":
                y = _conv(b, x, f"{p}/conv1", c_in, width, 3, stride=stride)
                y = b.op("Relu", [y], f"{p}/relu1")
                y = _conv(b, y, f"{p}/conv2", width, c_out, 3, damp=damp)
            else:  # v1.5: the stride sits on the 3x3 conv
                y = _conv(b, x, f"{p}/conv1", c_in, width, 1)
                y = b.op("Relu", [y], f"{p}/relu1")
                y = _conv(b, y, f"{p}/conv2", width, width, 3, stride=stride)
                y = b.op("Relu", [y], f"{p}/relu2")
                y = _conv(b, y, f"{p}/conv3", width, c_out, 1, damp=damp)
            if stride != 1 or c_in != c_out:
                # a projection of the post-ReLU stream: gain 1 keeps its scale
                x = _conv(b, x, f"{p}/downsample", c_in, c_out, 1, stride=stride, gain=1.0)
            x = b.op("Add", [x, y], f"{p}/residual_add")
            x = b.op("Relu", [x], f"{p}/relu_out")
            c_in = c_out
    _head(b, x, c_in, num_classes)
    return b.model(f"ResNet-{depth} ({kind} blocks), BN folded, seeded random weights",
                   depth=depth, image_size=image_size, num_classes=num_classes)


def resnet18(*, seed: int = 0, layers: int = 18, image_size: int = 224,
             num_classes: int = 1000) -> onnx.ModelProto:
    """ResNet-18 (basic blocks). ``layers`` is the network depth: 18 (default) or 34.

    49 nodes at depth 18 (stem 3, 8 blocks x 5 + 3 downsample convs, head 3).
    """
    return _resnet("resnet18" if layers == 18 else f"resnet{layers}", layers, "basic", seed,
                   image_size, num_classes)


def resnet50(*, seed: int = 0, layers: int = 50, image_size: int = 224,
             num_classes: int = 1000) -> onnx.ModelProto:
    """ResNet-50 v1.5 (bottleneck blocks). ``layers`` is the depth: 50 (default), 101 or 152.

    122 nodes at depth 50 (stem 3, 16 blocks x 7 + 4 downsample convs, head 3).
    """
    return _resnet("resnet50" if layers == 50 else f"resnet{layers}", layers, "bottleneck",
                   seed, image_size, num_classes)


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: nearest multiple of 8, never more than 10% down."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


# (expansion t, output channels c, repeats n, first stride s), torchvision's table
_MBV2_SETTINGS = (
    (1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
    (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
)


def mobilenet_v2(*, seed: int = 0, image_size: int = 224, width_mult: float = 1.0,
                 num_classes: int = 1000) -> onnx.ModelProto:
    """MobileNetV2: inverted residuals, depthwise 3x3 Conv (group = channels), Clip(0, 6).

    Channel counts follow torchvision (rounded to multiples of 8 after ``width_mult``); the
    last conv has max(1280, 1280 * width_mult) channels. ReLU6 is ``Clip`` with min/max inputs
    (opset >= 11 form). 100 nodes at width_mult 1.0 (any width gives the same count).
    """
    if width_mult <= 0:
        raise ValueError(f"mobilenet_v2: width_mult must be > 0, got {width_mult}")
    b = GraphBuilder("mobilenet_v2", seed)
    lo = b.const("relu6_min", 0.0)
    hi = b.const("relu6_max", 6.0)

    def relu6(x: str, name: str) -> str:
        return b.op("Clip", [x, lo, hi], name)

    n_residual = sum(n - 1 for _, _, n, _ in _MBV2_SETTINGS)
    damp = 1.0 / math.sqrt(max(1, n_residual))
    x = _image_input(b, image_size, 32)
    c_in = _make_divisible(32 * width_mult)
    x = relu6(_conv(b, x, "features.0/conv", 3, c_in, 3, stride=2), "features.0/relu6")
    idx = 1
    for t, c, n, s in _MBV2_SETTINGS:
        c_out = _make_divisible(c * width_mult)
        for j in range(n):
            stride = s if j == 0 else 1
            p = f"features.{idx}"
            hidden = c_in * t
            y = x
            if t != 1:
                y = _conv(b, y, f"{p}/expand", c_in, hidden, 1, gain=1.0)  # reads the linear stream
                y = relu6(y, f"{p}/expand_relu6")
            y = _conv(b, y, f"{p}/depthwise", hidden, hidden, 3, stride=stride, group=hidden)
            y = relu6(y, f"{p}/depthwise_relu6")
            residual = stride == 1 and c_in == c_out
            # linear bottleneck: no activation after the projection
            y = _conv(b, y, f"{p}/project", hidden, c_out, 1, damp=damp if residual else 1.0)
            x = b.op("Add", [x, y], f"{p}/residual_add") if residual else y
            c_in = c_out
            idx += 1
    last = _make_divisible(1280 * max(1.0, width_mult))
    x = _conv(b, x, f"features.{idx}/conv", c_in, last, 1, gain=1.0)
    x = relu6(x, f"features.{idx}/relu6")
    _head(b, x, last, num_classes)
    return b.model("MobileNetV2, BN folded, seeded random weights", image_size=image_size,
                   width_mult=width_mult, num_classes=num_classes)
