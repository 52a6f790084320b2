"""The options each toolchain accepts: names, types, allowed values and defaults.

Option names are the ones the runners read (`runners.onnx_base`, `runners.ort`,
`runners.openvino_cpu`, `runners.cuda`, `runners.litert`, `runners.ethosu`, `runners.cortex_m`,
`runners.null`; the toolchain -> module map is `runners.registry`); defaults are the runners'
own, so they are *implicit* (a configuration that states one is the same target as one that
leaves it out) except TensorRT's ``fp16`` and the Cortex-M ``core``, which the built-in
catalogue states explicitly. Options that are hardware facts are *locked* (Vela's
``accelerator_config`` and ``system_config``, the Cortex-M ``core``: a configuration layer above
the one that declares the board may repeat them, never change them).
`collage_farm.config` checks configuration files against `TOOLCHAIN_OPTIONS`; a runner gets a
target's full set with `effective_options`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from collage_farm.core.target import CORTEX_M_CORES, ETHOS_U_CONFIGS, Target
from runners.vela_facts import (
    VELA_DEFAULTS,
    vela_family,
    vela_memory_modes,
    vela_system_configs,
)

__all__ = ["TOOLCHAIN_OPTIONS", "OptionSpec", "effective_options", "full_options"]


@dataclass(frozen=True)
class OptionSpec:
    """One toolchain option: type, allowed values, default and whether an app may change it.

    ``default`` may depend on the other options (Vela's default system config depends on the
    accelerator). ``explicit`` defaults are always written into `Target.options`; the others are
    applied by the toolchain itself, so they are dropped from the options when stated (same
    measurement either way, same measure key).
    """

    kind: str  # "bool" | "int" | "number" | "str"
    doc: str
    choices: tuple[object, ...] | Callable[[Mapping[str, object]], tuple[object, ...]] | None = None
    minimum: float | None = None
    default: object | Callable[[Mapping[str, object]], object] = None
    explicit: bool = False
    locked: bool = False
    required: bool = False

    def default_for(self, options: Mapping[str, object]) -> object:
        return self.default(options) if callable(self.default) else self.default

    def choices_for(self, options: Mapping[str, object]) -> tuple[object, ...] | None:
        return self.choices(options) if callable(self.choices) else self.choices


_ORT_COMMON = {
    "threads": OptionSpec("int", "intra-op threads of the session", minimum=1, default=1),
    "iobinding": OptionSpec("bool", "time run_with_iobinding (true) or plain run()",
                            default=True),
}
_ORT_CUDA = {
    **_ORT_COMMON,
    "cudnn_conv_algo_search": OptionSpec("str", "ORT CUDA EP convolution algorithm search",
                                         choices=("EXHAUSTIVE", "HEURISTIC", "DEFAULT"),
                                         default="EXHAUSTIVE"),
    "tf32": OptionSpec("bool", "TF32 math for fp32 convolutions and matrix products on Ampere "
                       "and later (CUDA EP use_tf32; false: strict fp32)", default=True),
}
TOOLCHAIN_OPTIONS: dict[str, dict[str, OptionSpec]] = {
    "ort-cpu": dict(_ORT_COMMON),
    "openvino": {
        "threads": OptionSpec("int", "INFERENCE_NUM_THREADS", minimum=1, default=1),
        "precision": OptionSpec("str", "INFERENCE_PRECISION_HINT", choices=("f32", "bf16", "f16"),
                                default="f32"),
    },
    "litert": {
        "threads": OptionSpec("int", "interpreter threads", minimum=1, default=1),
    },
    "ort-cuda": dict(_ORT_CUDA),
    "ort-tensorrt": {
        **_ORT_CUDA,
        "fp16": OptionSpec("bool", "TensorRT FP16 kernels (trt_fp16_enable)", default=False,
                           explicit=True),
        "max_workspace_bytes": OptionSpec("int", "trt_max_workspace_size", minimum=1),
    },
    "vela": {
        "accelerator_config": OptionSpec("str", "Vela --accelerator-config (the NPU itself)",
                                         choices=ETHOS_U_CONFIGS, locked=True, required=True),
        "system_config": OptionSpec(
            "str", "Vela --system-config: a System_Config section of vela.ini (the board)",
            choices=vela_system_configs, locked=True,
            default=lambda o: VELA_DEFAULTS[vela_family(o)][0]),
        "memory_mode": OptionSpec(
            "str", "Vela --memory-mode: a Memory_Mode section of vela.ini",
            choices=vela_memory_modes, default=lambda o: VELA_DEFAULTS[vela_family(o)][1]),
        "optimise": OptionSpec("str", "Vela --optimise", choices=("Performance", "Size"),
                               default="Performance"),
        "activations": OptionSpec(
            "str", "activation precision of the TFLite Vela compiles: int8, or int16 with int8 "
            "weights (TFLite's 16x8, biases corrected with the calibration's channel means)",
            choices=("int8", "int16"), default="int8"),
        "arena_cache_size": OptionSpec(
            "int", "Vela --arena-cache-size in bytes (default: the memory mode's; the hard "
            "SRAM cache limit in Dedicated_Sram modes)", minimum=1),
    },
    "cortex-m": {
        "core": OptionSpec("str", "the Cortex-M core of the host cycle model (runners.host_model)",
                           choices=CORTEX_M_CORES, default="cortex-m55", explicit=True,
                           locked=True),
    },
    "null": {
        "speed": OptionSpec("number", "divides every fake cost", minimum=0, default=1.0),
        "sleep_s": OptionSpec("number", "sleep per measure (load tests)", minimum=0,
                              default=0.0),
        "fail_on": OptionSpec("str", "fault injection: fingerprint/label substring or '*'"),
        "crash_on": OptionSpec("str", "fault injection: fingerprint/label substring or '*'"),
        "hang_on": OptionSpec("str", "fault injection: fingerprint/label substring or '*'"),
        "leak_on": OptionSpec("str", "fault injection: fingerprint/label substring or '*'"),
        "leak_max_mb": OptionSpec("number", "where leak_on stops growing (then hangs)",
                                  minimum=0, default=4096.0),
        "crash_mode": OptionSpec("str", "how crash_on dies", choices=("abort", "segv", "exit"),
                                 default="abort"),
        "fault_phase": OptionSpec("str", "where faults fire",
                                  choices=("build", "measure", "both"), default="both"),
    },
}


def full_options(toolchain: str, options: Mapping[str, object]) -> dict[str, object]:
    """``options`` with every default of ``toolchain`` that it leaves out filled in."""
    out = dict(options)
    for key, s in TOOLCHAIN_OPTIONS.get(toolchain, {}).items():
        if key not in out:
            d = s.default_for(out)
            if d is not None:
                out[key] = d
    return out


def effective_options(target: Target) -> dict[str, object]:
    """A target's options with every default filled in (what a runner passes on)."""
    return full_options(target.toolchain, dict(target.options))
