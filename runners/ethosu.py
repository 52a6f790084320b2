"""Simulated Arm Ethos-U: ONNX sub-model -> int8 TFLite -> Vela performance estimate ("vela").

Why simulated: there is no Ethos-U silicon in the farm, but Vela, the compiler every Ethos-U
deployment goes through, schedules the network for a given NPU configuration and memory system
and reports the cycles of every operator it places on the NPU. That estimate is what an embedded
team uses to size a model, it is deterministic, and it is the only Ethos-U cost the search can
have without a board. Rows from this toolchain therefore say ``kind=simulated``.

Build (inside the runner's worker process: Vela segfaults on malformed TFLite):

1. the candidate's ONNX sub-model is converted to a full-integer int8 TFLite flatbuffer by
   `runners.tflite` (NHWC once for the whole sub-graph, per-channel int8 weights, int32
   bias) with activation ranges from the whole fp32 model (`BuildInput.tensor_ranges`, computed
   once per model by `runners.calibration`). A tensor without a range (a build asked for outside
   a campaign) is calibrated on the sub-model itself, and ``details["ranges"]`` says how many;
2. the flatbuffer is compiled in-process by Vela's C++ core, ``ethosu.regor.compile`` (what
   ``vela`` runs for U55/U65/U85 since 4.x), with batch 1 as the model declares it;
3. the accelerator configuration comes from the target (``accelerator_config``: ethos-u55-32/64/
   128/256, ethos-u65-256/512, ethos-u85-128/256/512/1024/2048); the system configuration and
   memory mode are section names of the ``vela.ini`` bundled with ethos-u-vela, parsed by
   Vela's own ``ArchitectureFeatures`` (so an invalid combination fails the way ``vela``
   fails). Defaults are Vela's own defaults, as in `runners.vela_facts.VELA_DEFAULTS`:
   ``Ethos_U55_High_End_Embedded`` / ``Shared_Sram`` for U55 (500 MHz core clock, weights in
   off-chip flash, activations in SRAM), ``Ethos_U65_Client_Server`` / ``Dedicated_Sram_384KB``
   for U65 (1 GHz, DRAM behind a 384 KiB SRAM cache) and ``Ethos_U85_SYS_DRAM_Mid`` /
   ``Dedicated_Sram_384KB`` for U85 (1 GHz). ``optimise`` is Vela's ``--optimise``
   (``Performance`` by default) and ``arena_cache_size`` its ``--arena-cache-size`` (bytes;
   by default the memory mode's). Each is a target option, so a variant target (the built-in
   boards' ``-size`` NPU targets: ``optimise: Size``) has its own measure key and the search
   picks per partition. ``activations: int16`` (the catalogue's ``-a16`` targets) converts to
   TFLite's 16x8 instead (int16 activations, int8 weights, int64 bias), each bias corrected
   for its rounded weights' mean shift with the calibration's per-channel means
   (`BuildInput.channel_means`, `runners.calibration.channel_means`).

Cost: ``seconds = Vela total cycles / core clock of the system config`` for the NPU part, plus the
host's cycle model for the operators Vela leaves on the CPU. Per-operator cycles are kept in
``details["ops"]``: Vela's per-layer rows (its optimised database: ``perf`` rows -> ``source``
operators -> ``ext_key`` = TFLite operator index) summed per TFLite operator and mapped back to
the ONNX node names through `ConvertedModel.op_nodes`; they add up to Vela's total exactly.
``details["node_cycles"]`` gives the same per ONNX node (a fused Relu's cycles are its Conv's).

Operators Vela cannot place on the NPU stay as "Passthrough" TFLite operators with 0 NPU cycles.
On a real system they run on the host; they are costed with `HOST_MODEL`, an *analytic* model of
a Cortex-M55 running TFLM int8 kernels (its figures and sources are in `runners.host_model`;
a campaign's host is also a target of its own, `runners.cortex_m`), and that part is labelled
``analytic`` in the details (``details["analytic"]``) so nobody mistakes it for a Vela number.
A campaign's candidates hold only operators `VelaCapabilities` places on the NPU, so this part
is non-zero only where Vela places an operator differently from those checks.

The Vela configuration, the compile and the reading of Vela's report live in
`runners.vela_estimate` (`vela_config`, `vela_estimate`); this module holds the capability
check and the toolchain, and re-exports those names.

Samples: a simulated estimate is deterministic (the same TFLite and configuration give the same
cycles, every time), so `measure` returns the one estimate as its one sample (n=1) whatever
`MeasureConfig` asks for; the config is still stored with the row.

Capabilities: a node is taken when the converter maps it (`runners.tflite.convertible`) and the
TFLite operator it becomes satisfies Vela's constraints for the target's accelerator (U55/U65
share one set; the U85's own set drops the stride and TRANSPOSE shape limits: `VelaCapabilities`,
`VelaToolchain.capabilities_for_target`). Vela publishes those as text
(``ethosu.regor.tflite_operator_constraints``, the source of ``vela --supported-ops-report``), not
as callable checks, so the numeric ones that the converter's output can violate are restated in
`vela_why_not` from that text (ethos-u-vela 5.2.0) and a unit test confirms each by compiling: the
accepted side lands on the NPU, the refused side becomes Passthrough. Compiling showed two of the
texts to be off by one ("less than 65536" for Softmax H*W and "less than 4096" for a MEAN axis
both accept the bound itself); the checks follow what Vela does. `VELA_TFLITE_OPS` lists the
TFLite operators Vela takes; a unit test compares it with the installed Vela. Capability checks
import nothing heavy (no Vela, no flatbuffers).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import numpy as np

from collage_farm.core.graph import load_graph
from runners.base import (
    BuildInput,
    BuildResult,
    Capabilities,
    DeviceDescription,
    Kind,
    MeasureInput,
    MeasureResult,
    Status,
    Toolchain,
)
from runners.deterministic import (
    A16_SOFTMAX_MAX_ROW,
    ConversionFailed,
    activation_bits,
    convert_for_build,
    one_sample,
    row_fields,
    wide_softmax_why,
)
from runners.host_model import HOST_MODEL_REVISION
from runners.runtime import PartitionRuntime, RuntimeInput
from runners.runtime_sim import simulated_runtime
from runners.tflite import ActivationBits, convertible
from runners.tflite.attrs import _attr, _ints
from runners.tflite.fold import _folded, _init_array
from runners.tflite.layout import _layout_noop
from runners.tflite.params import _pool_geometry, _resize_params, _resolve_pads
from runners.vela_estimate import (
    HOST_MODEL,
    HostModel,
    VelaConfig,
    resolve_vela_config,
    vela_estimate,
    vela_ini,
)
from runners.vela_facts import VELA_DEFAULTS, accelerator_family

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node
    from collage_farm.core.target import Target
    from runners.tflite import ConvertedModel

__all__ = [
    "A16_SOFTMAX_MAX_ROW",  # runners.deterministic's, where the host and the simulator read it
    "HOST_MODEL",
    "VELA_TFLITE_OPS",
    "HostModel",
    "VelaCapabilities",
    "VelaConfig",
    "VelaToolchain",
    "vela_config",
    "vela_estimate",
    "vela_why_not",
    "wide_softmax_why",
]

#: TFLite builtin operators Vela 5.2.0 compiles for Ethos-U55/U65
#: (``sorted(ethosu.regor.tflite_operator_constraints("EthosU55"))``, ARGMAX spelled ARG_MAX)
VELA_TFLITE_OPS: frozenset[str] = frozenset("""
    ABS ADD ARG_MAX AVERAGE_POOL_2D BATCH_MATMUL CONCATENATION CONV_2D DEPTHWISE_CONV_2D ELU EXP
    EXPAND_DIMS FULLY_CONNECTED GELU HARD_SWISH LEAKY_RELU LOG LOGISTIC MAXIMUM MAX_POOL_2D MEAN
    MINIMUM MIRROR_PAD MUL NEG PACK PAD PADV2 PRELU QUANTIZE REDUCE_MAX REDUCE_MIN RELU RELU6
    RELU_0_TO_1 RELU_N1_TO_1 RESHAPE RESIZE_BILINEAR RESIZE_NEAREST_NEIGHBOR REVERSE_V2 RSQRT SLICE
    SOFTMAX SPLIT SPLIT_V SQUARED_DIFFERENCE SQUEEZE STRIDED_SLICE SUB SUM TANH TILE TRANSPOSE
    TRANSPOSE_CONV UNIDIRECTIONAL_SEQUENCE_LSTM UNPACK
""".split())

#: ONNX op -> TFLite operators the converter may emit for it (all must be in VELA_TFLITE_OPS)
ONNX_TO_TFLITE: dict[str, tuple[str, ...]] = {
    "Conv": ("CONV_2D", "DEPTHWISE_CONV_2D", "PAD"),
    "BatchNormalization": ("DEPTHWISE_CONV_2D",),  # int8: 1x1, or folded into its Conv
    "MaxPool": ("MAX_POOL_2D", "PADV2"),
    "AveragePool": ("AVERAGE_POOL_2D", "PAD"),
    "GlobalAveragePool": ("MEAN",),
    "GlobalMaxPool": ("REDUCE_MAX",),
    "Add": ("ADD",),
    "Sub": ("SUB",),
    "Mul": ("MUL",),
    "Div": ("MUL",),
    "Reshape": ("RESHAPE", "TRANSPOSE"),
    "Identity": ("RESHAPE",),
    "Expand": ("RESHAPE",),  # int8: an Expand to its own shape only
    "Flatten": ("RESHAPE", "TRANSPOSE"),
    "Squeeze": ("RESHAPE", "TRANSPOSE"),
    "Unsqueeze": ("RESHAPE", "TRANSPOSE"),
    "Gemm": ("FULLY_CONNECTED",),
    "MatMul": ("FULLY_CONNECTED",),
    "Softmax": ("SOFTMAX",),
    "Concat": ("CONCATENATION", "QUANTIZE"),
    "Relu": ("RELU",),
    "Clip": ("RELU", "RELU6", "RELU_N1_TO_1", "MAXIMUM", "MINIMUM"),
    "Sigmoid": ("LOGISTIC",),
    "Tanh": ("TANH",),
    "LeakyRelu": ("LEAKY_RELU",),
    "HardSwish": ("HARD_SWISH",),
    "HardSigmoid": ("MUL", "ADD"),
    "Resize": ("RESIZE_NEAREST_NEIGHBOR", "RESIZE_BILINEAR"),
    "ConvTranspose": ("TRANSPOSE_CONV",),
    "Pad": ("PAD",),
}

#: Vela's "The sum of absolute weights cannot exceed 8323072" (8-bit IFM), per output channel
MAX_ABS_WEIGHT_SUM = 8323072
MAX_STRIDE = 3
MAX_KERNEL_PRODUCT = 256 * 256
MAX_KERNEL_HEIGHT = 256
MAX_SAME_AVGPOOL_KERNEL = 8
MAX_SOFTMAX_HW = 65536  # "product of IFM width and height must be less than 65536"; 65536 compiles
MAX_MEAN_AXIS = 4096  # "Reduced axis must be less than 4096"; 4096 itself compiles
MAX_MEAN_ELEMENTS = 16777216  # "Amount of reduced elements cannot exceed: 16777216(Int8)"
MAX_TRANSPOSE_DIM = 65536  # "(H, W, C) <= (2^16, 2^16, 2^16)" for NCHW-type permutations

#: the int8 converter's tag in the toolchain version (cost-table rows of another are not reused);
#: bumped when the int8 TFLite written for a sub-graph changes (2: BatchNormalization / Mul / Add
#: folded into Conv and ConvTranspose, HARD_SWISH, int8 BatchNormalization, HardSigmoid, Resize
#: and ConvTranspose)
CONVERTER_VERSION = "tflite_convert/2"


# ----------------------------------------------------------------------------------------
# capabilities: the converter's mapping plus Vela's numeric constraints


def _shape(graph: DataflowGraph, name: str) -> tuple[int, ...]:
    return graph.tensors[name].shape


def _nhwc4(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The TFLite shape padded to 4-D (N, H, W, C) the way Vela sees it."""
    if len(shape) == 4:
        return (shape[0], shape[2], shape[3], shape[1])
    return (1,) * (4 - len(shape)) + tuple(shape) if len(shape) < 4 else tuple(shape)


def _weight_sum_why(graph: DataflowGraph, name: str, out_axis: int) -> str | None:
    """Vela's weight-sum limit on the int8 weights the converter writes (per-channel symmetric).

    Per output channel the int8 weights sum to at most 127 x (weights per channel), so the
    initializer is only read when that bound passes the limit (K > 65536): the check is free for
    ordinary layers and costs one pass over the data for the rare huge ones.
    """
    dims = tuple(graph.initializers[name].dims)
    per_channel = math.prod(dims) // max(dims[out_axis], 1)
    if 127 * per_channel <= MAX_ABS_WEIGHT_SUM:
        return None
    w = _init_array(graph, name)
    a = np.abs(np.asarray(w, dtype=np.float64))
    a = np.moveaxis(a, out_axis, 0).reshape(a.shape[out_axis], -1)
    peak = a.max(axis=1)
    sums = np.where(peak > 0, np.round(a / np.maximum(peak, 1e-30)[:, None] * 127).sum(axis=1), 0)
    worst = float(sums.max()) if sums.size else 0.0
    if worst > MAX_ABS_WEIGHT_SUM:
        return (f"sum of absolute int8 weights {worst:.0f} exceeds Vela's limit "
                f"{MAX_ABS_WEIGHT_SUM} for one output channel")
    return None


def _conv_why(node: Node, graph: DataflowGraph, family: str = "u55") -> str | None:
    x = _shape(graph, node.inputs[0])
    y = _shape(graph, node.outputs[0])
    if node.inputs[1] not in graph.initializers:
        return "weights must be a constant initializer"
    wshape = tuple(graph.initializers[node.inputs[1]].dims)
    group = int(_attr(node, "group", 1))  # type: ignore[arg-type]
    s = _ints(_attr(node, "strides"), (1, 1))
    d = _ints(_attr(node, "dilations"), (1, 1))
    k_eff = tuple((wshape[2 + i] - 1) * d[i] + 1 for i in range(2))
    padding, _ = _resolve_pads(node, x[2:], k_eff, s, y[2:])
    if group != 1:
        if max(s) > MAX_STRIDE and family != "u85":
            return f"depthwise stride {s} is outside Vela's range 1..{MAX_STRIDE}"
        return _weight_sum_why(graph, node.inputs[1], 0)
    if max(s) > MAX_STRIDE and (padding != "VALID" or max(d) != 1) and family != "u85":
        return f"stride {s} > {MAX_STRIDE} needs dilation 1 and VALID padding on the NPU"
    return _weight_sum_why(graph, node.inputs[1], 0)


def _resize_why(node: Node, graph: DataflowGraph, family: str = "u55") -> str | None:
    """Vela's RESIZE rule: a 1x1 input, no change, or one 2x / 4x / 8x factor on H and W
    (on (size - 1) with align_corners); a 1-high or 1-wide output may scale the other axis
    alone."""
    _, _, ih, iw = _shape(graph, node.inputs[0])
    _, _, oh, ow = _shape(graph, node.outputs[0])
    if (ih == iw == 1) or (ih, iw) == (oh, ow):
        return None
    align = _resize_params(node, graph)[1]
    fh = (oh - 1) / (ih - 1) if align and ih != 1 else (1.0 if align else oh / ih)
    fw = (ow - 1) / (iw - 1) if align and iw != 1 else (1.0 if align else ow / iw)
    ok = fh in (1.0, 2.0, 4.0, 8.0) and fw in (1.0, 2.0, 4.0, 8.0) and (
        fh == fw if oh != 1 and ow != 1 else (fh == ih == 1) or (fw == iw == 1))
    return None if ok else (f"resize {ih}x{iw} -> {oh}x{ow} is not a 1x1 input or one "
                            "2x / 4x / 8x factor")


def _convtranspose_why(node: Node, graph: DataflowGraph, family: str = "u55") -> str | None:
    """Vela's TRANSPOSE_CONV rules: stride 1x1 or 2x2 (2x1 for a 1-high input and kernel);
    SAME: output = input x stride; VALID: output = input x stride + max(kernel - stride, 0)."""
    _, _, ih, iw = _shape(graph, node.inputs[0])
    _, _, oh, ow = _shape(graph, node.outputs[0])
    kh, kw = tuple(graph.initializers[node.inputs[1]].dims)[2:]
    sh, sw = _ints(_attr(node, "strides"), (1, 1))
    if not ((sh, sw) in ((1, 1), (2, 2)) or ((sw, sh) == (2, 1) and ih == kh == 1)):
        return f"transposed convolution stride {(sh, sw)} (Vela: 1x1, 2x2)"
    if any(_ints(_attr(node, "pads"), (0, 0, 0, 0))):  # written with SAME padding
        ok = (oh, ow) == (ih * sh, iw * sw)
    else:
        ok = (oh, ow) == (ih * sh + max(kh - sh, 0), iw * sw + max(kw - sw, 0))
    if not ok:
        return f"transposed convolution output {(oh, ow)} is not Vela's for input {(ih, iw)}"
    return _weight_sum_why(graph, node.inputs[1], 1)


def _pool_why(node: Node, graph: DataflowGraph, family: str = "u55") -> str | None:
    x, y, k, s = _pool_geometry(node, graph)
    padding, _ = _resolve_pads(node, x[2:], k, s, y[2:])
    if max(s) > MAX_STRIDE and padding != "VALID" and family != "u85":
        return f"pool stride {s} > {MAX_STRIDE} needs VALID padding on the NPU"
    if node.op_type == "AveragePool" and padding == "SAME" \
            and max(k) > MAX_SAME_AVGPOOL_KERNEL:
        return (f"average pool kernel {k} with SAME padding exceeds "
                f"{MAX_SAME_AVGPOOL_KERNEL}x{MAX_SAME_AVGPOOL_KERNEL}")
    if k[0] * k[1] > MAX_KERNEL_PRODUCT or k[0] > MAX_KERNEL_HEIGHT:
        return f"pool kernel {k} exceeds Vela's limits (product 65536, height 256)"
    return None


def _gemm_why(node: Node, graph: DataflowGraph, family: str = "u55") -> str | None:
    if node.inputs[1] not in graph.initializers:
        return "weights (B) must be a constant initializer"
    trans_b = node.op_type == "Gemm" and int(_attr(node, "transB", 0))  # type: ignore[arg-type]
    return _weight_sum_why(graph, node.inputs[1], 0 if trans_b else 1)  # B's output axis


def _softmax_why(node: Node, graph: DataflowGraph, family: str = "u55") -> str | None:
    _, h, w, _ = _nhwc4(_shape(graph, node.inputs[0]))[-4:]
    if h * w > MAX_SOFTMAX_HW:
        return f"softmax input H*W = {h * w} exceeds {MAX_SOFTMAX_HW}"
    return None


def _global_pool_why(node: Node, graph: DataflowGraph, family: str = "u55") -> str | None:
    """Vela's MEAN rules on GlobalAveragePool; GlobalMaxPool (REDUCE_MAX) has no shape rule.
    A rank-3 input [N, C, L] is reduced over L (the converter keeps its ONNX layout)."""
    shape = _shape(graph, node.inputs[0])
    n, h, w = (shape[0], shape[2], shape[3]) if len(shape) == 4 else (shape[0], 1, shape[-1])
    if node.op_type == "GlobalAveragePool":
        if n != 1:
            return f"MEAN needs batch 1 (batch {n})"
        if h > MAX_MEAN_AXIS or w > MAX_MEAN_AXIS:
            return f"MEAN reduced axis ({h}, {w}) exceeds {MAX_MEAN_AXIS}"
        if h * w > MAX_MEAN_ELEMENTS:
            return f"MEAN over {h * w} elements exceeds {MAX_MEAN_ELEMENTS}"
    return None


def _reshape_why(node: Node, graph: DataflowGraph, family: str = "u55") -> str | None:
    if family == "u85":  # Vela's U85 TRANSPOSE has no shape constraints
        return None
    for t in (node.inputs[0], node.outputs[0]):
        shape = _shape(graph, t)
        if len(shape) == 4 and not _layout_noop(shape) and max(shape) > MAX_TRANSPOSE_DIM:
            return f"layout transpose of {shape} exceeds Vela's 2^16 per-axis limit"
    return None


_VELA_CHECKS = {
    "Conv": _conv_why,
    "MaxPool": _pool_why,
    "AveragePool": _pool_why,
    "Gemm": _gemm_why,
    "MatMul": _gemm_why,
    "Softmax": _softmax_why,
    "GlobalAveragePool": _global_pool_why,
    "GlobalMaxPool": _global_pool_why,
    "Resize": _resize_why,
    "ConvTranspose": _convtranspose_why,
    "Reshape": _reshape_why,
    "Flatten": _reshape_why,
    "Squeeze": _reshape_why,
    "Unsqueeze": _reshape_why,
}


def vela_why_not(node: Node, graph: DataflowGraph, family: str = "u55") -> str | None:
    """None when the TFLite operators this node becomes satisfy Vela's constraints for the
    accelerator ``family`` (``"u55"``, ``"u65"``: the same rules; ``"u85"``: without the
    stride and transpose-shape limits, see `VelaCapabilities`).

    Assumes `runners.tflite.convertible` accepted the node. Never raises.
    """
    ops = ONNX_TO_TFLITE.get(node.op_type)
    if ops is None:
        return f"no Vela mapping for {node.op_type}"
    missing = [o for o in ops if o not in VELA_TFLITE_OPS]
    if missing:
        return f"Vela does not compile {', '.join(missing)}"
    check = _VELA_CHECKS.get(node.op_type)
    if check is None:
        return None
    try:
        return check(node, graph, family)
    except Exception as e:  # a malformed node reads as unsupported
        return f"cannot inspect node ({type(e).__name__}: {e})"


class VelaCapabilities(Capabilities):
    """Nodes the converter maps to int8 TFLite and Vela places on the NPU (a node the
    converter folds into a constant emits no operator, so Vela has nothing to refuse).

    ``family`` is the accelerator's (`runners.vela_facts.accelerator_family`). Vela 5.2 checks
    the U85 with rules of its own (``tflite_operator_constraints("EthosU85")``): among the
    operators the converter writes, it has no stride limit (a depthwise convolution of stride
    4, a convolution or pool of stride 4 with SAME padding: Vela splits them into several NPU
    operations) and no shape limit on TRANSPOSE, where the U55 / U65 leave those on the CPU
    ("Unsupported kernel stride"); a unit test compiles each both ways.

    ``wide``: the target compiles 16x8 (``activations: int16``), and a Softmax with rows
    longer than `A16_SOFTMAX_MAX_ROW` stays on the host (`wide_softmax_why`).
    """

    style = "graph"

    def __init__(self, family: str = "u55", wide: bool = False) -> None:
        self.family = family
        self.wide = wide

    def why_not(self, node: Node, graph: DataflowGraph) -> str | None:
        why = convertible(node, graph)
        if why is not None:
            return why
        if _folded(node, graph):  # a conversion-time constant: emits no operator at all
            return None
        if self.wide and node.op_type == "Softmax":
            why = wide_softmax_why(node, graph)
            if why is not None:
                return why
        return vela_why_not(node, graph, self.family)


# ----------------------------------------------------------------------------------------
# the target's Vela configuration


def vela_config(target: Target) -> VelaConfig:
    """The target's Vela configuration with Vela's defaults filled in (see the module docstring).

    Raises Vela's own error (``ethosu.vela.errors.VelaError``) for an invalid combination.
    """
    accel = str(target.option("accelerator_config", target.name) or target.name)
    family = accelerator_family(accel)
    system = str(target.option("system_config", None) or VELA_DEFAULTS[family][0])
    mode = str(target.option("memory_mode", None) or VELA_DEFAULTS[family][1])
    optimise = str(target.option("optimise", None) or "Performance")
    arena = target.option("arena_cache_size", None)
    return resolve_vela_config(accel, system, mode, optimise,
                               None if arena is None else int(arena))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------
# the toolchain


class VelaToolchain(Toolchain):
    """ONNX -> int8 TFLite -> Vela estimate; see the module docstring."""

    name = "vela"
    device_kind = "ethos-u"
    kind = Kind.SIMULATED

    def __init__(self, host: HostModel = HOST_MODEL) -> None:
        self.host = host

    def capabilities(self) -> Capabilities:
        return VelaCapabilities()

    def capabilities_for_target(self, target: Target) -> Capabilities:
        accel = str(target.option("accelerator_config", target.name) or target.name)
        wide = activation_bits(target.option("activations")) is ActivationBits.INT16
        return VelaCapabilities(accelerator_family(accel), wide)

    def available(self) -> str | None:
        try:
            import flatbuffers  # noqa: F401
            from ethosu import regor  # noqa: F401
            from ethosu.vela.architecture_features import ArchitectureFeatures  # noqa: F401
            from ethosu.vela.tflite import Model  # noqa: F401
        except ImportError as e:
            return f"ethos-u-vela is not installed ({e})"
        try:
            vela_ini()
        except RuntimeError as e:
            return str(e)
        return None

    def version(self) -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            v = version("ethos-u-vela")
        except PackageNotFoundError:
            v = "missing"
        return f"ethos-u-vela {v}; {CONVERTER_VERSION}; host model {HOST_MODEL_REVISION}"

    def device_description(self, target: Target) -> DeviceDescription:
        try:
            cfg = vela_config(target)
        except Exception as e:
            accel = str(target.option("accelerator_config", target.name))
            return DeviceDescription("ethos-u", accel, config=f"invalid config: {e}")
        return DeviceDescription("ethos-u", cfg.accelerator_config, cores=cfg.cores,
                                 driver="simulated (Vela)", config=cfg.describe())

    def estimate(self, tflite: bytes, cfg: VelaConfig, conv: ConvertedModel | None = None,
                 host: HostModel | None = None) -> dict:
        """`runners.vela_estimate.vela_estimate` of a flatbuffer: for a compile that must run
        in a worker child (`WorkerProcess.invoke`), where a Vela crash costs the child only."""
        return vela_estimate(tflite, cfg, conv, host or self.host)

    # --- build ---------------------------------------------------------------------------
    def build(self, inp: BuildInput) -> BuildResult:
        t0 = time.perf_counter()

        def failed(status: Status, error: str) -> BuildResult:
            return BuildResult(inp.fingerprint, inp.target, status, error=error,
                               build_s=time.perf_counter() - t0)

        try:
            graph = load_graph(inp.onnx_bytes)
        except Exception as e:
            return failed(Status.BUILD_FAILED, f"cannot load the ONNX sub-model: "
                                               f"{type(e).__name__}: {e}")
        caps = self.capabilities_for_target(inp.target)
        for node in graph.nodes:
            why = caps.why_not(node, graph)
            if why is not None:
                return failed(Status.UNSUPPORTED, f"{node.op_type} node {node.name!r}: {why}")
        try:
            cfg = vela_config(inp.target)
        except Exception as e:
            return failed(Status.BUILD_FAILED, f"Vela configuration: {type(e).__name__}: {e}")
        try:
            conv, note = convert_for_build(graph, "int8", inp.tensor_ranges,
                                           activations=activation_bits(inp.target.option("activations")),
                                           channel_means=inp.channel_means)
        except ConversionFailed as e:
            return failed(e.status, e.error)
        try:
            est = vela_estimate(conv.tflite, cfg, conv, self.host)
        except Exception as e:  # Vela raises RuntimeError / VelaError on what it rejects
            return failed(Status.BUILD_FAILED, f"Vela: {type(e).__name__}: {e}")
        est["ranges"] = note
        est["tflite_bytes"] = len(conv.tflite)
        est["config"] = cfg.describe()
        est["accelerator_config"] = cfg.accelerator_config
        return BuildResult(
            inp.fingerprint, inp.target, Status.OK, artifact=conv.tflite,
            artifact_kind="tflite", build_s=time.perf_counter() - t0,
            details=(("vela", est), ("label", inp.label)),
        )

    # --- measure -------------------------------------------------------------------------
    def measure(self, inp: MeasureInput) -> MeasureResult:
        """The build's Vela estimate as one sample; recompiles the artifact when it has none."""
        t0 = time.perf_counter()
        build, config = inp.build, inp.config
        common, failed = row_fields(self, inp)
        if failed is not None:
            return failed
        est = build.detail("vela")
        if not isinstance(est, dict):
            try:
                cfg = vela_config(build.target)
                est = vela_estimate(build.artifact, cfg, None, self.host)
            except Exception as e:
                return MeasureResult.failed(build, Status.RUNTIME_ERROR,
                                            f"Vela: {type(e).__name__}: {e}", config,
                                            measure_s=time.perf_counter() - t0, **common)
        details = {k: v for k, v in est.items() if k != "vela_log"}
        details["estimate"] = "simulated: Vela cycles / clock" + (
            " + analytic host model" if est.get("analytic") else "")
        if est.get("vela_log"):
            details["vela_log"] = est["vela_log"][-1000:]
        return one_sample(build, config, float(est["seconds"]), "Vela estimate", details, t0,
                          common)

    def runtime(self, inp: RuntimeInput) -> PartitionRuntime:
        """A plan partition: simulated latency, int8 numerics (`runners.runtime_sim`)."""
        return simulated_runtime(inp, self.name)
