"""A campaign's accuracy gate: a plan with int8 partitions is checked as ``run`` checks it, and
a plan that fails is searched again with 16-bit activations (the NPU's, then the host's).

Why: the search prices partitions by simulated cycles alone, so on an Ethos-U board it takes
the fastest int8 NPU partitions whatever their numerics. Where int8 activations cannot carry a
model (pkg:ppocr-rec: every int8 plan's CTC Softmax is 107-134 int8 steps off, against 12
allowed), the written plan would fail ``collage-farm run``'s check: a fast plan that is wrong.

The gate, run after the plan is written:

1. `check_plan`: the written plan run by `collage_farm.execute.PlanExecutor` on the feeds
   ``run`` checks with (the first sample of the user's calibration data, else seeded random
   feeds), its int8 partitions built with the campaign's calibration, compared with the whole
   model in ONNX Runtime under the int8 tolerance (`collage_farm.execute.numerics`). Seeded and
   deterministic: an offline campaign on the same table decides the same way.
2. When it fails, `wider_targets` gives the next step of a precision ladder, and the board is
   searched again on those targets, on the same cost table, and the new plan checked, until a
   plan passes or the ladder ends: first the NPU's 16x8 variant (option ``activations:
   int16``: int16 activations, int8 weights) beside the int8 host, each tensor crossing between
   the two precisions paying the host's requantisation
   (`collage_farm.campaign.costs.with_requantise`); then the host's 16x8 variant too (CMSIS-NN's
   s16 kernels; what it cannot run in 16x8 runs in fp32), where every partition is 16-bit and
   nothing is requantised. A plan that fails at the ladder's end is written with its failure
   said (`AccuracyVerdict.FAILED`), never silently.

The gate is per campaign, not per partition: a wider search may keep no int8 NPU partition
at all, even where one would have passed. A search with accuracy as a constraint per candidate
would need each candidate's error contribution, which the check of a whole plan does not give.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collage_farm.core.target import A16_VARIANT, Target
from collage_farm.execute import ExecutionMismatch, PlanExecutor
from runners.calibration import INT8_TOOLCHAINS, CalibrationData

__all__ = ["AccuracyCheck", "AccuracyVerdict", "check_plan", "needs_check", "wider_targets"]

#: the option (and its value) that makes an NPU or host target's activations 16-bit
WIDE_OPTION = ("activations", "int16")


class AccuracyVerdict(str, enum.Enum):
    """What the check of a written plan found."""

    PASSED = "passed"  # every output within the int8 tolerance
    FAILED = "failed"  # an output out of tolerance (`ExecutionMismatch`)
    ERROR = "error"  # the check could not run (the plan's files, a missing toolchain)


@dataclass(frozen=True)
class AccuracyCheck:
    """One plan's check. ``worst_steps``: the largest error over the outputs that have an int8
    step, in those steps (None when no output has one); ``worst_output`` names that output, or
    the failing one."""

    verdict: AccuracyVerdict
    targets: tuple[str, ...]
    tolerance: str
    worst_output: str | None
    worst_steps: float | None
    message: str
    check_s: float

    @property
    def ok(self) -> bool:
        return self.verdict is AccuracyVerdict.PASSED

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "verdict": self.verdict.value,
                "targets": list(self.targets)}


def needs_check(targets: Sequence[Target]) -> bool:
    """Whether a plan on ``targets`` can hold int8 partitions (an Ethos-U NPU or its host)."""
    return any(t.toolchain in INT8_TOOLCHAINS for t in targets)


def check_plan(plan_dir: str | Path, targets: Sequence[Target],
               calibration: CalibrationData | None) -> AccuracyCheck:
    """The plan in ``plan_dir`` checked as ``collage-farm run`` checks it (module docstring),
    its int8 partitions built with ``calibration`` (None: the one plan.json records)."""
    t0 = time.perf_counter()
    names = tuple(t.id for t in targets)
    try:
        ex = PlanExecutor(plan_dir, threads=1, calibration=calibration)
        errors = ex.check(ex.check_feeds())
    except ExecutionMismatch as e:
        # the steps as the check held the outputs to them (read after the plan ran)
        step = ex.int8_steps.get(e.output)
        return AccuracyCheck(AccuracyVerdict.FAILED, names, ex.tolerance, e.output,
                             e.max_abs / step if step else None, str(e),
                             time.perf_counter() - t0)
    except Exception as e:  # the plan's files, a toolchain missing: said, the plan is kept
        return AccuracyCheck(AccuracyVerdict.ERROR, names, "", None, None,
                             f"{type(e).__name__}: {' '.join(str(e).split())[:400]}",
                             time.perf_counter() - t0)
    steps, tolerance = ex.int8_steps, ex.tolerance
    in_steps = {n: err / steps[n] for n, err in errors.items() if steps.get(n)}
    worst = max(in_steps, key=in_steps.__getitem__) if in_steps else None
    return AccuracyCheck(AccuracyVerdict.PASSED, names, tolerance, worst,
                         in_steps[worst] if worst is not None else None,
                         "every output within tolerance", time.perf_counter() - t0)


def _wide(t: Target) -> Target:
    name = t.name if t.name.endswith(A16_VARIANT) else f"{t.name}{A16_VARIANT}"
    wide = Target.make(name, t.toolchain, t.device, {**dict(t.options), WIDE_OPTION[0]:
                                                      WIDE_OPTION[1]})
    return dataclasses.replace(wide, calibration=t.calibration)


def wider_targets(targets: Sequence[Target]) -> tuple[Target, ...] | None:
    """The next step of the precision ladder (deduplicated, in order): with an int8 Ethos-U NPU
    target among ``targets``, every NPU target replaced by its 16x8 variant (the host kept);
    else, with an int8 Cortex-M host target, every host target replaced by its 16x8 variant;
    else None (every target is 16x8 already: nothing left to widen)."""
    def narrow(t: Target) -> bool:
        return t.option(WIDE_OPTION[0]) != WIDE_OPTION[1]

    for toolchain in ("vela", "cortex-m"):
        if any(t.toolchain == toolchain and narrow(t) for t in targets):
            out: list[Target] = []
            for t in targets:
                w = _wide(t) if t.toolchain == toolchain else t
                if w not in out:
                    out.append(w)
            return tuple(out)
    return None
