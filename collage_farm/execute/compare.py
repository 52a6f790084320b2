"""Whole models on each toolchain and a plan, timed in one interleaved run.

`compare_interleaved` times the plan (optional) with every single-toolchain whole model (and
ONNX Runtime's own multi-EP assignment where a GPU is present) in interleaved rounds
(`collage_farm.execute.interleaved`), giving the **additive error** ((measured - sum of
estimates) / measured) and the **apparent loss** against the best single toolchain measured in
the same run (`CompareResult`). A whole model runs as a one-partition plan
(`single_executor`), so singles and plans share one binding and one timing loop.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from collage_farm.core.graph import load_graph
from collage_farm.execute.executor import PlanExecutor, Timing, make_runtime
from collage_farm.execute.interleaved import measure_interleaved
from runners.base import MeasureConfig, Summary
from runners.cuda import multi_ep_runtime
from runners.runtime import SIMULATED_TOOLCHAINS

__all__ = ["CompareResult", "Single", "compare_interleaved", "measure_single", "ort_multi_ep",
           "single_executor"]


def single_executor(model: str | os.PathLike | onnx.ModelProto, toolchain: str, *,
                    threads: int = 1, options: Mapping[str, Any] | None = None,
                    shapes: Mapping[str, Sequence[int]] | None = None) -> PlanExecutor:
    """The whole model as one partition on ``toolchain`` (same binding as plans)."""
    g = load_graph(model, shapes)
    data = g.model.SerializeToString()
    rt = make_runtime(f"whole-{toolchain}", toolchain, toolchain, data, g.graph_inputs,
                      g.graph_outputs, 0.0, options, threads)
    return PlanExecutor.from_runtimes([rt], g.graph_inputs, g.graph_outputs, data)


def measure_single(model: str | os.PathLike | onnx.ModelProto, toolchain: str,
                   config: MeasureConfig | None = None, *, threads: int = 1) -> Summary:
    """Latency of the whole model on one toolchain."""
    return single_executor(model, toolchain, threads=threads).measure(config).summary


@dataclass
class CompareResult:
    """One interleaved run: the plan (if any) and whole models per target."""

    singles: dict[str, float] = field(default_factory=dict)  # `Single.label` -> median seconds
    single_errors: dict[str, str] = field(default_factory=dict)
    plan: Timing | None = None
    estimated_total_s: float | None = None
    ort_multi_ep: dict[str, Any] = field(default_factory=dict)

    @property
    def best_single(self) -> tuple[str, float] | None:
        if not self.singles:
            return None
        k = min(self.singles, key=lambda n: self.singles[n])
        return k, self.singles[k]

    @property
    def additive_error(self) -> float | None:
        if self.plan is None or self.estimated_total_s is None:
            return None
        return (self.plan.total_s - self.estimated_total_s) / self.plan.total_s

    @property
    def apparent_loss(self) -> float | None:
        """plan / best single - 1 (positive: the plan is slower than the best single)."""
        b = self.best_single
        if self.plan is None or b is None:
            return None
        return self.plan.total_s / b[1] - 1.0

    def to_json(self) -> dict:
        b = self.best_single
        return {
            "singles_s": self.singles,
            "single_errors": self.single_errors,
            "best_single": b[0] if b else None,
            "best_single_s": b[1] if b else None,
            "plan_measured_s": self.plan.total_s if self.plan else None,
            "plan_timing": self.plan.to_json() if self.plan else None,
            "estimated_total_s": self.estimated_total_s,
            "additive_error": self.additive_error,
            "apparent_loss": self.apparent_loss,
            "ort_multi_ep": self.ort_multi_ep,
        }


def ort_multi_ep(model: str | os.PathLike | onnx.ModelProto, threads: int = 1
                 ) -> tuple[PlanExecutor | None, str]:
    """ORT's own assignment over [TensorRT, CUDA, CPU]; (executor, note) or (None, why not)."""
    g = load_graph(model)
    data = g.model.SerializeToString()
    rt, note = multi_ep_runtime(data, tuple(g.graph_inputs), tuple(g.graph_outputs), threads)
    if rt is None:
        return None, note
    return PlanExecutor.from_runtimes([rt], g.graph_inputs, g.graph_outputs, data), note


@dataclass(frozen=True)
class Single:
    """A whole model to time in `compare_interleaved`: shown as ``label`` (a target's name),
    built by ``toolchain`` with ``options`` (the target's: a TensorRT fp16 variant and its
    fp32 sibling are two singles, not one toolchain's defaults twice)."""

    label: str
    toolchain: str
    options: tuple[tuple[str, Any], ...] = ()

    @staticmethod
    def of(target: Any) -> Single:
        """The single of a `collage_farm.core.target.Target`."""
        return Single(target.id, target.toolchain, tuple(target.options))


def compare_interleaved(model: str | os.PathLike | onnx.ModelProto | None,
                        singles: Sequence[str | Single], config: MeasureConfig | None = None,
                        *, plan: PlanExecutor | None = None, threads: int = 1,
                        multi_ep: bool = True) -> CompareResult:
    """Plan (optional) and whole models, measured in one interleaved run.

    ``singles``: `Single` entries, or bare toolchain ids (labelled by the id, default options).
    """
    config = config or MeasureConfig()
    res = CompareResult()
    fns: dict[str, Callable[[], None]] = {}
    keep: list[PlanExecutor] = []
    if model is None and plan is not None:
        model = plan.reference()
    if model is not None:
        wanted = {s.label: s for s in (x if isinstance(x, Single) else Single(x, x)
                                        for x in singles)}
        for label, one in wanted.items():
            if one.toolchain in SIMULATED_TOOLCHAINS:
                res.single_errors[label] = "simulated toolchain: no whole-model measurement"
                continue
            try:
                ex = single_executor(model, one.toolchain, threads=threads,
                                     options=dict(one.options) or None)
                fns[label] = ex.timed_callable()
                keep.append(ex)
            except Exception as e:
                res.single_errors[label] = f"{type(e).__name__}: {str(e)[:300]}"
        if multi_ep:
            ex_m, note = ort_multi_ep(model, threads)
            res.ort_multi_ep = {"applies": ex_m is not None, "note": note}
            if ex_m is not None:
                try:
                    fns["ort-multi-ep"] = ex_m.timed_callable()
                    keep.append(ex_m)
                except Exception as e:
                    res.ort_multi_ep = {"applies": True, "note": f"failed: {e}"}
    if plan is not None:
        fns["plan"] = plan.timed_callable()
        res.estimated_total_s = plan.plan.estimated_total_s
    summaries = measure_interleaved(fns, config)
    for n, s in summaries.items():
        if n == "plan":
            assert plan is not None
            res.plan = plan.timing(s)
        elif n == "ort-multi-ep":
            res.ort_multi_ep["measured_s"] = s.median
        else:
            res.singles[n] = s.median
    return res
