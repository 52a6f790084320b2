"""Run a plan directory end to end, check it against the whole model, time it.

One module per concept; this package re-exports their public names:

* `collage_farm.execute.executor`: `PlanExecutor` (a plan's partitions in order, tensors wired
  by name, buffers bound once) and `Timing` (measured plus simulated latency);
* `collage_farm.execute.numerics`: tolerances per arithmetic (`PRECISIONS`), the output check
  (`compare_outputs`, `ExecutionMismatch`) and the original model (`reference_model`);
* `collage_farm.execute.interleaved`: interleaved timing rounds (`measure_interleaved`);
* `collage_farm.execute.compare`: a plan against every single-toolchain whole model in one
  interleaved run (`compare_interleaved`, `CompareResult`);
* `collage_farm.execute.builder`: in-memory plans over one graph (`Part`, `PlanBuilder`).

Each partition's session is its toolchain's (`Toolchain.runtime`, `runners.runtime`).
"""

from __future__ import annotations

from collage_farm.execute.compare import (
    CompareResult,
    Single,
    compare_interleaved,
    measure_single,
    ort_multi_ep,
    single_executor,
)
from collage_farm.execute.executor import CALIBRATION_KEY, PlanExecutor, Timing, make_runtime
from collage_farm.execute.interleaved import (
    Interleaved,
    measure_interleaved,
    measure_interleaved_rounds,
)
from collage_farm.execute.numerics import (
    FP32_ATOL,
    FP32_RTOL,
    INT8_STEPS,
    PRECISIONS,
    QUANT_ATOL_FRAC,
    QUANT_RTOL,
    ExecutionMismatch,
    compare_outputs,
    loosest,
    reference_model,
    tolerance_label,
)
from runners.runtime import SIMULATED_TOOLCHAINS, PartitionRuntime

__all__ = [
    "CALIBRATION_KEY",
    "FP32_ATOL",
    "FP32_RTOL",
    "INT8_STEPS",
    "PRECISIONS",
    "QUANT_ATOL_FRAC",
    "QUANT_RTOL",
    "SIMULATED_TOOLCHAINS",
    "CompareResult",
    "ExecutionMismatch",
    "Interleaved",
    "PartitionRuntime",
    "PlanExecutor",
    "Single",
    "Timing",
    "compare_interleaved",
    "compare_outputs",
    "loosest",
    "make_runtime",
    "measure_interleaved",
    "measure_interleaved_rounds",
    "measure_single",
    "ort_multi_ep",
    "reference_model",
    "single_executor",
    "tolerance_label",
]
