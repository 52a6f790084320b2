"""An analytic cycle model of TensorFlow Lite Micro kernels on an Arm Cortex-M host.

Why a model and not a measurement: an Ethos-U board is an NPU next to a Cortex-M core, and every
operator the NPU cannot take runs on that core, inside the same TensorFlow Lite Micro (TFLM)
interpreter that invokes the NPU. There is no such core in the farm, and Vela reports 0 cycles
for the operators it leaves to the CPU. This module prices them, one TFLite operator at a time,
from what the converter (`runners.tflite`) knows of each: its multiply-accumulates (MACs), the
bytes it moves (activations read and written, constants read) and the bytes it writes. Its
figures are *analytic* (rows say ``kind=analytic``): they rank partitions, they do not replace
a board.

The cost of one operator, in host cycles::

    cycles = cycles_per_op + MACs x cycles_per_mac(kernel) + bytes x cycles_per_byte(kernel)

where ``kernel`` is what TFLM runs for that operator and precision:

* **int8, CMSIS-NN** (``cmsis-nn``): TFLM's ``kernels/cmsis_nn`` directory has optimised
  kernels for CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, BATCH_MATMUL, TRANSPOSE_CONV,
  ADD, MUL, MAX_POOL_2D, AVERAGE_POOL_2D, SOFTMAX, MAXIMUM, MINIMUM, PAD, TRANSPOSE (and the
  LSTM/SVDF ops the converter never writes). On a Helium (MVE) core they are vectorised.
* **int8, reference** (``reference``): every other int8 operator runs TFLM's portable C kernel
  (scalar; a per-element requantisation for arithmetic, a copy for data movement).
* **float32, reference**: operators the converter maps only in fp32 (GATHER, the LayerNorm
  decomposition, attention's BATCH_MATMUL between activations, ...) run TFLM's float reference
  kernels on the core's FPU. A host partition is converted in int8 when the converter maps all
  of its nodes in int8, else in fp32; an fp32 partition also pays a DEQUANTIZE of each float
  input and a QUANTIZE of each output, because the tensors between partitions of an Ethos-U
  system are int8 (`fp32_boundary_cycles`).

Figures and where they come from (Cortex-M55; assumptions, not measured on silicon here):

* clock 400 MHz: the high-performance Cortex-M55 cores of Alif Ensemble MCUs, the first
  production parts pairing a Cortex-M55 with an Ethos-U55 (Alif Semiconductor, "Power
  Management" white paper: high-performance region up to 400 MHz). The Cortex-M85 host of the
  U85 boards: 480 MHz (Renesas RA8M1, the first production Cortex-M85).
* CMSIS-NN MAC kernels: 0.25 cycles per int8 MAC. The Helium datapath peaks at 8 x 8-bit MACs per
  cycle ("2x32-bit or 4x16-bit or 8x8-bit MACs/cycle", WikiChip, Cortex-M55 microarchitecture);
  CMSIS-NN is taken to reach half of that peak. Depthwise convolutions reuse no input across
  output channels and reach half as much again (0.5 cycles per MAC).
* bytes: 0.25 cycles per byte for vectorised kernels: the 64-bit internal bus moves 8 bytes per
  cycle at best (same source), again at half of peak. CMSIS-NN elementwise kernels (ADD, MUL)
  requantise every element: 0.5 cycles per byte; CMSIS-NN's int8 SOFTMAX evaluates a fixed-point
  exponential per element: 4 cycles per byte (~8 per element).
* reference int8 kernels (scalar C): 2 cycles per MAC (two loads, an offset subtraction and a
  multiply-accumulate per MAC, without unrolling); 6 cycles per byte for arithmetic (a
  fixed-point ``MultiplyByQuantizedMultiplier`` per element is ~15 instructions, over 2-3 bytes
  moved per element); 20 cycles per byte for LOGISTIC / TANH / EXP and the like (fixed-point
  polynomial evaluations, ~40 cycles per element); 0.5 cycles per byte for pure data movement
  (RESHAPE, CONCATENATION, GATHER, SLICE, ...: a word copy moves 4 bytes in ~2 cycles).
* 16x8 (int16 activations, int8 weights; the ``-a16`` host targets): CMSIS-NN's s16 kernels
  for CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, ADD, MUL, the pools and SOFTMAX at twice
  the int8 cycles per MAC (Helium: 4 x 16-bit MACs per cycle) and the int8 cycles per byte
  (an int16 tensor has twice the bytes); the reference kernel for every other operator.
* float32 reference kernels: 2 cycles per MAC (one scalar fused multiply-add per cycle, bound by
  its two loads); 1 cycle per byte for arithmetic (4 bytes, ~4 cycles per element); 10 cycles per
  byte for transcendental functions (a libm ``expf`` is ~40 cycles); 0.5 cycles per byte for
  data movement.
* 2,000 cycles per operator: TFLM's interpreter dispatch and the kernel's prologue (parameter
  unpacking, the quantisation multipliers computed per call). An order of magnitude, not
  measured here.
* GATHER reads only the rows it writes: its bytes are twice its output bytes, not the table.

The same per-cycle figures serve the Cortex-M85 (the same 64-bit Helium datapath): only its
clock differs. `HOST_MODELS` holds both; `host_model` picks one by core name.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CORTEX_M55", "CORTEX_M85", "HOST_MODEL", "HOST_MODELS", "HOST_MODEL_REVISION",
           "HostModel", "KernelCost", "KernelLibrary", "OpCost", "host_model"]

#: bumped when a figure of the model changes: part of the toolchain version of the rows it
#: prices, so rows of an older model are not reused under the default (exact) strictness
HOST_MODEL_REVISION = 2


class KernelLibrary(str, enum.Enum):
    """Which TFLM kernel runs an operator."""

    CMSIS_NN = "cmsis-nn"  # the optimised int8 kernels of kernels/cmsis_nn
    REFERENCE = "reference"  # TFLM's portable C kernel


@dataclass(frozen=True)
class KernelCost:
    """The per-MAC and per-byte cycles of one kernel."""

    library: KernelLibrary
    cycles_per_mac: float
    cycles_per_byte: float


_CMSIS = KernelLibrary.CMSIS_NN
_REF = KernelLibrary.REFERENCE
_MOVE_OPS = ("RESHAPE", "CONCATENATION", "GATHER", "SLICE", "STRIDED_SLICE", "SPLIT", "SPLIT_V",
             "PACK", "UNPACK", "SQUEEZE", "EXPAND_DIMS", "TILE", "MIRROR_PAD", "REVERSE_V2")
_TRANSCENDENTAL = ("LOGISTIC", "TANH", "EXP", "LOG", "RSQRT", "SQRT", "GELU", "POW", "ELU",
                   "HARD_SWISH", "SOFTMAX")

#: int8 operators with a CMSIS-NN kernel in TFLM (module docstring)
INT8_KERNELS: dict[str, KernelCost] = {
    "CONV_2D": KernelCost(_CMSIS, 0.25, 0.25),
    "FULLY_CONNECTED": KernelCost(_CMSIS, 0.25, 0.25),
    "BATCH_MATMUL": KernelCost(_CMSIS, 0.25, 0.25),
    "TRANSPOSE_CONV": KernelCost(_CMSIS, 0.25, 0.25),
    "DEPTHWISE_CONV_2D": KernelCost(_CMSIS, 0.5, 0.25),
    "ADD": KernelCost(_CMSIS, 0.0, 0.5),
    "MUL": KernelCost(_CMSIS, 0.0, 0.5),
    "MAX_POOL_2D": KernelCost(_CMSIS, 0.0, 0.25),
    "AVERAGE_POOL_2D": KernelCost(_CMSIS, 0.0, 0.25),
    "MAXIMUM": KernelCost(_CMSIS, 0.0, 0.25),
    "MINIMUM": KernelCost(_CMSIS, 0.0, 0.25),
    "PAD": KernelCost(_CMSIS, 0.0, 0.25),
    "PADV2": KernelCost(_CMSIS, 0.0, 0.25),
    "TRANSPOSE": KernelCost(_CMSIS, 0.0, 0.5),
    "SOFTMAX": KernelCost(_CMSIS, 0.0, 4.0),
    **{op: KernelCost(_REF, 0.0, 0.5) for op in _MOVE_OPS},
    **{op: KernelCost(_REF, 0.0, 20.0) for op in _TRANSCENDENTAL if op != "SOFTMAX"},
}
#: any other int8 operator: the reference kernel, per-element requantisation
INT8_REFERENCE = KernelCost(_REF, 2.0, 6.0)

#: 16x8 operators (int16 activations, int8 weights) with a CMSIS-NN s16 kernel: convolutions,
#: fully connected, element-wise ADD / MUL, pooling and SOFTMAX (CMSIS-NN's ``*_s16``
#: functions). Helium multiplies 4 x 16-bit per cycle against 8 x 8-bit, so a MAC costs twice
#: its int8 figure; per byte as int8 (the converter counts int16 activations at 2 bytes, so a
#: tensor already costs twice its int8 bytes)
INT16_KERNELS: dict[str, KernelCost] = {
    op: KernelCost(k.library, 2 * k.cycles_per_mac, k.cycles_per_byte)
    for op, k in INT8_KERNELS.items()
    if k.library is _REF or op in ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "ADD",
                                   "MUL", "MAX_POOL_2D", "AVERAGE_POOL_2D", "SOFTMAX")
}

#: float32 operators (all reference kernels) whose cost differs from `FP32_REFERENCE`
FP32_KERNELS: dict[str, KernelCost] = {
    **{op: KernelCost(_REF, 0.0, 0.5) for op in _MOVE_OPS},
    **{op: KernelCost(_REF, 0.0, 10.0) for op in _TRANSCENDENTAL},
}
FP32_REFERENCE = KernelCost(_REF, 2.0, 1.0)


@dataclass(frozen=True)
class OpCost:
    """One operator priced by the host model."""

    op: str
    mode: str  # "int8" | "int16" | "fp32"
    kernel: KernelLibrary
    macs: int
    bytes: int
    cycles: float

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "mode": self.mode, "kernel": self.kernel.value,
                "macs": self.macs, "bytes": self.bytes, "cycles": self.cycles}


@dataclass(frozen=True)
class HostModel:
    """Analytic cycles of TFLM int8 / fp32 kernels on one Cortex-M core (module docstring)."""

    name: str = "Arm Cortex-M55 @ 400 MHz, TFLM + CMSIS-NN (analytic)"
    core: str = "cortex-m55"
    clock_hz: float = 400e6
    cycles_per_op: float = 2000.0
    int8: Mapping[str, KernelCost] = field(default_factory=lambda: dict(INT8_KERNELS))
    int8_default: KernelCost = INT8_REFERENCE
    fp32: Mapping[str, KernelCost] = field(default_factory=lambda: dict(FP32_KERNELS))
    fp32_default: KernelCost = FP32_REFERENCE
    int16: Mapping[str, KernelCost] = field(default_factory=lambda: dict(INT16_KERNELS))

    def kernel(self, op: str, mode: str) -> KernelCost:
        """The kernel TFLM runs for TFLite operator ``op`` in ``mode`` ("int8" | "int16":
        16x8 | "fp32"). An int16 operator without a CMSIS-NN s16 kernel runs the reference
        kernel at its int8 per-byte rate (scalar either way; its bytes are twice int8's)."""
        if mode == "int8":
            return self.int8.get(op, self.int8_default)
        if mode == "int16":
            return self.int16.get(op, self.int8_default)
        return self.fp32.get(op, self.fp32_default)

    def op_cost(self, op: str, mode: str, macs: int, nbytes: int, out_bytes: int = 0
                ) -> OpCost:
        """One operator's cycles; GATHER is charged twice its ``out_bytes`` (the rows it
        reads and writes) instead of ``nbytes`` (which counts the whole table)."""
        k = self.kernel(op, mode)
        moved = 2 * out_bytes if op == "GATHER" and out_bytes else nbytes
        cycles = self.cycles_per_op + macs * k.cycles_per_mac + moved * k.cycles_per_byte
        return OpCost(op, mode, k.library, int(macs), int(moved), float(cycles))

    def fp32_boundary_cycles(self, elements_in: int, elements_out: int) -> float:
        """A float partition between int8 ones: DEQUANTIZE its inputs, QUANTIZE its outputs
        (each element: one int8 byte and four float bytes moved, reference kernel)."""
        cost = 0.0
        for op, n in (("DEQUANTIZE", elements_in), ("QUANTIZE", elements_out)):
            if n:
                cost += self.op_cost(op, "int8", 0, 5 * n).cycles
        return cost

    def requantise_cycles(self, elements: int) -> float:
        """An int8 <-> int16 QUANTIZE of one tensor of ``elements`` (where a 16x8 partition
        meets an int8 one): TFLM's reference requantisation, an int8 and an int16 value (3
        bytes) per element, plus the operator's dispatch."""
        return self.op_cost("QUANTIZE", "int8", 0, 3 * max(0, int(elements))).cycles

    def seconds(self, cycles: float) -> float:
        return cycles / self.clock_hz

    def describe(self) -> dict[str, Any]:
        return {"host": self.name, "core": self.core, "clock_hz": self.clock_hz,
                "cycles_per_op": self.cycles_per_op,
                "int8_cmsis_nn": sorted(o for o, k in self.int8.items() if k.library is _CMSIS),
                "source": "runners.host_model (analytic)"}


CORTEX_M55 = HostModel()
CORTEX_M85 = HostModel(name="Arm Cortex-M85 @ 480 MHz, TFLM + CMSIS-NN (analytic)",
                       core="cortex-m85", clock_hz=480e6)
HOST_MODELS: dict[str, HostModel] = {m.core: m for m in (CORTEX_M55, CORTEX_M85)}
#: the host of the U55 / U65 boards
HOST_MODEL = CORTEX_M55


def host_model(core: str) -> HostModel:
    """The model of ``core`` ("cortex-m55" | "cortex-m85"); ValueError names the known ones."""
    try:
        return HOST_MODELS[core]
    except KeyError:
        raise ValueError(f"no host model for core {core!r} ({', '.join(HOST_MODELS)})") from None
