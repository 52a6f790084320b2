"""CPU toolchains: ONNX Runtime's CPU execution provider ("ort-cpu") and OpenVINO ("openvino").

The toolchain registry (`runners.registry`) names this module for both; the code lives in one
module per concept:

* `runners.kernels`: the capability tables (ORT's CPU kernel registry, OpenVINO's ONNX
  frontend) and the tools that regenerate them;
* `runners.onnx_base`: the build/measure skeleton shared by the ONNX toolchains, and helpers
  other toolchains use (`classify_build_error`, `seed_of`, `error_text`, ...);
* `runners.ort`: ONNX Runtime's session builder (one for candidates and plans) and the CPU EP;
* `runners.openvino_cpu`: OpenVINO on the CPU.
"""

from __future__ import annotations

from runners.kernels import (
    OPENVINO_DTYPES,
    OPENVINO_OPS,
    ORT_CPU_KERNELS,
    ORT_CPU_KERNELS_RAW,
    OnnxOpTableCapabilities,
    elem_type_name,
    format_kernel_table,
    ort_cpu_kernel_table,
    probe_openvino_ops,
)
from runners.onnx_base import (
    OnnxToolchainBase,
    Prepared,
    artifact_digest,
    classify_build_error,
    error_text,
    feeds_for,
    option_bool,
    option_int,
    seed_of,
)
from runners.openvino_cpu import OpenVinoToolchain
from runners.ort import OrtCpuToolchain

__all__ = [
    "OPENVINO_DTYPES",
    "OPENVINO_OPS",
    "ORT_CPU_KERNELS",
    "ORT_CPU_KERNELS_RAW",
    "OnnxOpTableCapabilities",
    "OnnxToolchainBase",
    "OpenVinoToolchain",
    "OrtCpuToolchain",
    "Prepared",
    "artifact_digest",
    "classify_build_error",
    "elem_type_name",
    "error_text",
    "feeds_for",
    "format_kernel_table",
    "option_bool",
    "option_int",
    "ort_cpu_kernel_table",
    "probe_openvino_ops",
    "seed_of",
]
