"""Run a plan's partitions in order, tensors wired by name, and time them end to end.

Why: a plan is only a claim until it runs. The search adds up isolated sub-graph costs, and
cuts cost real time (layout reorders, lost fusion) that isolated warm runs do not see. So
`PlanExecutor` (1) executes the partitions in file order, wiring tensors by name, (2) checks
the outputs against the original model run whole in ONNX Runtime CPU
(`collage_farm.execute.numerics`), and (3) times the plan with the same loop as candidates
(`runners.measure.time_callable`); `collage_farm.execute.compare` times it interleaved with
every single-toolchain whole model.

Each partition runs on its toolchain's runtime (`Toolchain.runtime`, `runners.runtime`):
`make_runtime` asks the registry's toolchain for it, so ONNX Runtime partitions run in sessions
configured exactly as candidates' (`runners.ort.session_options`).

Binding: after one discovery pass (plain ``run`` calls, learning every tensor's shape and dtype)
every tensor gets one buffer, allocated once: host tensors are numpy arrays shared by producer
and consumers (ORT binds them by pointer with IOBinding, OpenVINO wraps them as shared-memory
``ov.Tensor`` on its inputs *and* outputs); a tensor produced by a GPU partition and read only
by GPU partitions (`PartitionRuntime.on_gpu`) stays on the device as an ``OrtValue``. The timed
call is then just the partitions' run calls, with no per-call Python conversion or copies.

Simulated partitions (Ethos-U via Vela, its Cortex-M host) cannot run on this hardware: their
latency is the simulated cost from the plan's ``estimated_s`` (`Timing.simulated_s`), their
numerics come from `runners.runtime_sim`. Those partitions are int8 builds, quantised with the
ranges the costed builds used: the source model calibrated whole, once (`runners.calibration`),
on the samples plan.json's ``int8_calibration`` records (`CalibrationData`: seeded random
feeds, or the campaign's ``--calibration-data``), so chained int8 partitions agree on the
scale of every tensor they share, as in the deployed model.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from collage_farm.core.calibration_data import CalibrationData, CalibrationSource
from collage_farm.core.feeds import (
    FeedSpec,
    attach_input_values,
    feed_specs,
    feeds_from_specs,
    fit_value,
    merge_specs,
)
from collage_farm.core.graph import load_graph
from collage_farm.core.plan import PartitionEntry, Plan, PlanError, load_plan
from collage_farm.core.target import get_target
from collage_farm.execute.numerics import (
    compare_outputs,
    int8_step,
    loosest,
    pinned_outputs,
    quantized,
    reference_model,
    reference_outputs,
    tolerance_label,
)
from runners.base import Kind, MeasureConfig, RuntimeUnavailable, Summary
from runners.calibration import INT8_TOOLCHAINS, calibrate, channel_means
from runners.measure import time_callable
from runners.registry import get_toolchain
from runners.runtime import PartitionRuntime, RuntimeInput, WholeGraph

__all__ = ["CALIBRATION_KEY", "PlanExecutor", "Timing", "make_runtime"]

#: plan.json's key for the calibration the campaign's int8 builds used (`CalibrationData`)
CALIBRATION_KEY = "int8_calibration"


def make_runtime(pid: str, target: str, toolchain: str, data: bytes, inputs: Sequence[str],
                 outputs: Sequence[str], est: float, options: Mapping[str, Any] | None = None,
                 threads: int = 1, *,
                 tensor_ranges: Mapping[str, tuple[float, float]] | None = None,
                 channel_means: Mapping[str, np.ndarray] | None = None,
                 whole: WholeGraph | None = None, nodes: Sequence[str] = ()
                 ) -> PartitionRuntime:
    """Partition ``pid`` (ONNX bytes ``data``) as ``toolchain``'s runtime; its target's
    ``threads`` option wins over ``threads``; ``tensor_ranges`` are the whole model's
    calibrated ranges, for a toolchain that builds int8 (`INT8_TOOLCHAINS`), and
    ``channel_means`` the same calibration's per-channel means, for a 16x8 target
    (``activations: int16``); ``whole`` and ``nodes``: the graph the partition is cut from
    and its node names there, for a toolchain that builds slices of one whole compilation
    (`RuntimeInput.whole`). Raises `PlanError` when it cannot run here."""
    opts = dict(options or {})
    threads = int(opts.get("threads", threads) or threads)
    int8 = toolchain in INT8_TOOLCHAINS
    ranges = (tuple((k, float(lo), float(hi)) for k, (lo, hi) in sorted(tensor_ranges.items()))
              if tensor_ranges and int8 else ())
    means = (tuple((k, tuple(float(x) for x in v)) for k, v in sorted(channel_means.items()))
             if channel_means and int8 and opts.get("activations") == "int16" else ())
    inp = RuntimeInput(pid, target, data, tuple(inputs), tuple(outputs), est,
                       tuple(sorted(opts.items())), threads, ranges, means, whole, tuple(nodes))
    try:
        return get_toolchain(toolchain).runtime(inp)
    except RuntimeUnavailable as e:
        raise PlanError(str(e)) from None


def _target_options(plan: Plan, target_id: str) -> dict[str, Any]:
    for t in plan.targets:
        if isinstance(t, dict) and t.get("id") == target_id:
            return dict(t.get("options") or {})
    return {}



@dataclass(frozen=True)
class Timing:
    """End-to-end latency: measured parts (timed together) plus simulated parts (added)."""

    summary: Summary  # of the measured partitions' run, end to end
    simulated_s: float
    measured_partitions: tuple[str, ...]
    simulated_partitions: tuple[str, ...]

    @property
    def total_s(self) -> float:
        return self.summary.median + self.simulated_s

    def to_json(self) -> dict:
        return {"total_s": self.total_s, "measured_s": self.summary.median,
                "simulated_s": self.simulated_s,
                "measured_partitions": list(self.measured_partitions),
                "simulated_partitions": list(self.simulated_partitions),
                "summary": dataclasses.asdict(self.summary)}


class PlanExecutor:
    """Loads a plan directory and runs its partitions in file order, tensors wired by name.

    ``threads`` is the intra-op thread count of every session (1 by default, like candidates).
    ``model`` (path or ModelProto) is the original model for `check`; else plan.json's
    ``source`` (``zoo:NAME`` rebuilt with `collage_farm.zoo.build`, ``pkg:NAME`` from its pip
    package, or a path). ``inputs`` fixes input values of the feeds (over those the partition
    files carry from the campaign). ``calibration``: the samples int8 partitions are
    calibrated on (default: what plan.json's ``int8_calibration`` records, seeded random for a
    plan without it); the original model is calibrated whole at load, once, when the plan has
    int8 partitions (`calibration`, `tensor_ranges`).
    """

    def __init__(self, plan_dir: str | Path, *, threads: int = 1,
                 model: str | os.PathLike | onnx.ModelProto | None = None,
                 shapes: Mapping[str, Sequence[int]] | None = None,
                 inputs: Mapping[str, np.ndarray] | None = None,
                 calibration: CalibrationData | None = None) -> None:
        self.plan_dir = Path(plan_dir)
        self.input_values = dict(inputs or {})
        self.plan, self.files = load_plan(plan_dir)
        self.threads = threads
        self.model_arg = model
        self.shapes = dict(shapes or {})
        self.partitions: list[PartitionRuntime] = []
        if not self.plan.partitions:
            raise PlanError(f"plan {self.plan_dir}: no partitions")
        datas = {p.id: self._read(p.id) for p in self.plan.partitions}
        toolchains = {p.id: p.toolchain or _toolchain_of_target(self.plan, p.target)
                      for p in self.plan.partitions}
        self._input_specs: dict[str, FeedSpec] = {}
        self._quantized = False
        try:
            models = [onnx.load_from_string(d) for d in datas.values()]
            self._input_specs = _specs_of(models, self.plan.graph_inputs)
            self._quantized = any(quantized(m) for m in models)
            specs_error = None
        except Exception as e:  # said after the toolchains had their say on the files
            specs_error = PlanError(f"plan {self.plan_dir}: its graph inputs are not read by "
                                    f"its partition files ({type(e).__name__}: "
                                    f"{str(e)[:200]})")
        self._fit_input_values()
        #: the calibration the int8 partitions are built with (None: the plan has none)
        self.calibration: CalibrationData | None = None
        #: the whole model's ranges those partitions are quantised with (empty: none)
        self.tensor_ranges: dict[str, tuple[float, float]] = {}
        #: the same calibration's per-channel means, for 16x8 partitions (empty: none)
        self.channel_means: dict[str, np.ndarray] = {}
        #: graph outputs carrying a pinned int8 scale (`pinned_outputs`; int8 plans only)
        self._pins: dict[str, tuple[tuple[str, ...], float]] = {}
        if specs_error is None and any(tc in INT8_TOOLCHAINS for tc in toolchains.values()):
            self.calibration = calibration or CalibrationData.from_json(
                self.plan.extra.get(CALIBRATION_KEY))
            self.tensor_ranges = self.whole_model_ranges(self.calibration)
            self.channel_means = self._wide_means(toolchains)
            self._pins = pinned_outputs(self.reference(), self.plan.graph_outputs)
        for p in self.plan.partitions:
            self.partitions.append(self._runtime(p, toolchains[p.id], datas[p.id]))
        if specs_error is not None:
            raise specs_error
        self._buffers: dict[str, Any] | None = None
        self._shapes_bound: dict[str, tuple[int, ...]] = {}
        self._keep: list[Any] = []
        self._steps: list[Callable[[], None]] = []

    def _read(self, pid: str) -> bytes:
        f = self.files[pid]
        try:
            return f.read_bytes()
        except OSError as e:
            raise PlanError(f"partition {pid}: cannot read {f} ({e.strerror or e})") from None

    def _fit_input_values(self) -> None:
        for name, v in self.input_values.items():  # each fits its input: ModelError if not
            spec = self._input_specs.get(name)
            if spec is not None:
                self.input_values[name] = fit_value(
                    name, self.shapes.get(name, spec.shape), spec.dtype, v)

    def _runtime(self, p: PartitionEntry, tc: str, data: bytes) -> PartitionRuntime:
        """Partition ``p`` on toolchain ``tc``, its int8 build with the whole model's ranges."""
        try:
            return make_runtime(p.id, p.target, tc, data, p.inputs, p.outputs, p.estimated_s,
                                _target_options(self.plan, p.target), self.threads,
                                tensor_ranges=self.tensor_ranges,
                                channel_means=self.channel_means)
        except PlanError:
            raise
        except Exception as e:  # a corrupt or swapped file: the toolchain's own words
            why = " ".join(str(e).split())  # OpenVINO's errors span lines
            raise PlanError(f"partition {p.id}: {self.files[p.id].name} does not load on {tc} "
                            f"({type(e).__name__}: {why[:300]})") from None

    def whole_model_ranges(self, calibration: CalibrationData
                           ) -> dict[str, tuple[float, float]]:
        """Per-tensor (min, max) of the original model run whole on ``calibration``'s samples
        (`runners.calibration.calibrate`): the model loaded as the campaign loaded it (inputs
        bound as plan.json's ``shapes`` and ``shapes``, fixed input values attached), so its
        tensor names and ranges are those the campaign's int8 builds were costed with."""
        return calibrate(load_graph(self.reference(), self._bound_shapes() or None),
                         data=calibration)

    def _wide_means(self, toolchains: Mapping[str, str]) -> dict[str, np.ndarray]:
        """The whole model's per-channel means on the plan's calibration
        (`runners.calibration.channel_means`) when a partition is 16x8 (its target says
        ``activations: int16``), else none."""
        if not any(toolchains[p.id] in INT8_TOOLCHAINS
                   and _target_options(self.plan, p.target).get("activations") == "int16"
                   for p in self.plan.partitions):
            return {}
        assert self.calibration is not None
        return channel_means(load_graph(self.reference(), self._bound_shapes() or None),
                             data=self.calibration)

    def _bound_shapes(self) -> dict[str, Any]:
        return {**(self.plan.extra.get("shapes") or {}), **self.shapes}

    @classmethod
    def from_runtimes(cls, runtimes: Sequence[PartitionRuntime], graph_inputs: Sequence[str],
                      graph_outputs: Sequence[str], model_bytes: bytes | onnx.ModelProto
                      ) -> PlanExecutor:
        """An executor over given runtimes (whole models, in-memory plans being refined).

        Runtimes may be shared between executors: each executor binds its own steps.
        """
        self = cls.__new__(cls)
        self.plan_dir = Path(".")
        self.plan = Plan(model="", targets=(), partitions=(), estimated_total_s=0.0,
                         graph_inputs=tuple(graph_inputs), graph_outputs=tuple(graph_outputs))
        self.files = {}
        self.threads = 1
        self.model_arg = (model_bytes if isinstance(model_bytes, onnx.ModelProto)
                          else onnx.load_from_string(model_bytes))
        self.shapes = {}
        self.input_values = {}
        self.partitions = list(runtimes)
        self._input_specs = _specs_of([self.model_arg], graph_inputs)
        self._quantized = quantized(self.model_arg)
        self.calibration = None
        self.tensor_ranges = {}
        self.channel_means = {}
        self._pins = {}
        self._buffers = None
        self._shapes_bound = {}
        self._keep = []
        self._steps = []
        return self

    # --- feeds and buffers -------------------------------------------------------------
    def random_feeds(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded feeds for the graph inputs (`collage_farm.core.feeds`, as
        `graph.random_inputs`): indices in range, fixed values as the plan's files hold them,
        overridden by ``inputs``."""
        specs = [dataclasses.replace(s, value=self.input_values[n])
                 if n in self.input_values else s for n, s in self._input_specs.items()]
        return feeds_from_specs(specs, seed, self.shapes)

    def _bind(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        shapes = {k: tuple(np.shape(v)) for k, v in feeds.items()}
        if self._buffers is not None and shapes == self._shapes_bound:
            return self._buffers
        # discovery pass: plain runs learn every tensor's shape and dtype
        env: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in feeds.items()}
        for rt in self.partitions:
            missing = [n for n in rt.inputs if n not in env]
            if missing:
                raise PlanError(f"partition {rt.id} needs {missing} that no earlier partition "
                                f"or graph input provides (partitions out of order?)")
            env.update(rt.plain(env))
        self._discovered = env
        gpu_producers = {n for rt in self.partitions if rt.on_gpu for n in rt.outputs}
        readers: dict[str, list[PartitionRuntime]] = {}
        for rt in self.partitions:
            for n in rt.inputs:
                readers.setdefault(n, []).append(rt)
        outs = set(self.plan.graph_outputs)
        buffers: dict[str, Any] = {}
        for name, val in env.items():
            on_dev = (name in gpu_producers and name not in outs
                      and all(r.on_gpu for r in readers.get(name, [])))
            if on_dev:
                import onnxruntime as ort  # heavy: only for plans with GPU partitions

                buffers[name] = ort.OrtValue.ortvalue_from_shape_and_type(
                    val.shape, val.dtype, "cuda", 0)
            else:
                buffers[name] = np.array(val, copy=True, order="C")  # 0-d stays 0-d
        self._steps = []
        for rt in self.partitions:
            rt.step = rt.bind(buffers)  # the latest binding, for callers holding a runtime
            self._steps.append(rt.step)
        self._buffers, self._shapes_bound = buffers, shapes
        return buffers

    def _load_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
        buffers = self._bind(feeds)
        for k, v in feeds.items():
            if k in buffers:
                np.copyto(buffers[k], np.asarray(v, dtype=buffers[k].dtype))
        return buffers

    # --- run / check / measure ---------------------------------------------------------
    def run(self, feeds: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Run every partition once on ``feeds`` (default: seeded random); graph outputs."""
        feeds = self.random_feeds() if feeds is None else feeds
        buffers = self._load_feeds(feeds)
        for step in self._steps:
            step()
        return {n: np.array(buffers[n], copy=True) for n in self.plan.graph_outputs}

    @property
    def precision(self) -> str:
        """The loosest arithmetic among the partitions: what the output check tolerates.

        A model that quantizes itself (QDQ, dynamic quantization, QLinear operators) is held to
        int8's: a cut or another toolchain moves a rounding step, by design of the model.
        """
        return loosest([rt.precision for rt in self.partitions]
                       + (["int8"] if self._quantized else []))

    def target_options(self, target_id: str) -> dict[str, Any]:
        """The options the plan records for ``target_id`` (what its partitions were built with)."""
        return _target_options(self.plan, target_id)

    def reference(self) -> onnx.ModelProto:
        """The original model, holding the feeds' fixed input values (so whole-model runs of
        it are fed as the plan is)."""
        model = reference_model(self.plan, self.model_arg, self.plan_dir, self.shapes)
        fixed = {n: s.value for n, s in self._input_specs.items() if s.value is not None}
        fixed.update(self.input_values)
        if not fixed:
            return model
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        attach_input_values(copy, fixed)
        return copy

    def check(self, feeds: Mapping[str, np.ndarray] | None = None,
              model: str | os.PathLike | onnx.ModelProto | None = None) -> dict[str, float]:
        """Compare with the original model run whole in ORT CPU; max abs error per output.

        Raises `ExecutionMismatch` naming the first output out of tolerance.
        """
        feeds = self.random_feeds() if feeds is None else feeds
        ref_model = reference_model(self.plan, model if model is not None else self.model_arg,
                                    self.plan_dir, self.shapes)
        ref = reference_outputs(ref_model, self.plan.graph_outputs, feeds, self.threads)
        got = self.run(feeds)
        return compare_outputs(got, ref, precision=self.precision, steps=self.int8_steps)

    @property
    def int8_steps(self) -> dict[str, float]:
        """The graph outputs' int8 quantisation steps, for a plan whose int8 partitions are
        built with the whole model's ranges (empty otherwise, and for a model that quantizes
        itself: its own rounding is not in those ranges). An output that an int8 partition
        computes with a pinned scale (Sigmoid, Softmax, Tanh: `runners.tflite.PINNED_SCALES`),
        directly or through an Identity / Reshape after it (`pinned_outputs`), has at least
        that step;
        one whose pinned operator ran in an fp32 or a 16x8 partition (whose pinned scales are
        finer than any range step) has its range's step. The pinned
        operator's partition is the one writing the first tensor of its chain that a partition
        writes (the tensors before it are internal to that partition)."""
        if not self.tensor_ranges or self._quantized:
            return {}
        written = {o: rt.precision for rt in self.partitions for o in rt.outputs}

        def pin(name: str) -> float:
            chain, scale = self._pins.get(name, ((), 0.0))
            first = next((t for t in chain if t in written), None)
            return scale if first is not None and written[first] == "int8" else 0.0

        return {n: int8_step(*self.tensor_ranges[n], pin(n))
                for n in self.plan.graph_outputs if n in self.tensor_ranges}

    @property
    def tolerance(self) -> str:
        """The output check's tolerance in words (`tolerance_label`)."""
        return tolerance_label(self.precision, self.int8_steps)

    def check_feeds(self) -> dict[str, np.ndarray]:
        """The feeds `collage-farm run` checks on: the first sample of the calibration data
        when it is the user's (random feeds would leave the range the int8 partitions were
        calibrated for and saturate), else seeded random feeds (`random_feeds`)."""
        cal = self.calibration
        if cal is None or cal.source is not CalibrationSource.FILE:
            return self.random_feeds()
        graph = load_graph(self.reference(), self._bound_shapes() or None)
        first = next(cal.feeds(graph))
        return {n: np.asarray(first[n]) for n in self._input_specs if n in first}

    def measure(self, config: MeasureConfig | None = None,
                feeds: Mapping[str, np.ndarray] | None = None) -> Timing:
        """End-to-end latency; inputs bound once, simulated partitions added, not timed."""
        config = config or MeasureConfig()
        fn = self.timed_callable(feeds)
        samples, medians = time_callable(fn, config)
        return self.timing(Summary.of(samples, medians))

    def timed_callable(self, feeds: Mapping[str, np.ndarray] | None = None
                       ) -> Callable[[], None]:
        """The measured partitions' steps as one call (binds ``feeds`` once)."""
        self._load_feeds(self.random_feeds() if feeds is None else feeds)
        steps = [st for rt, st in zip(self.partitions, self._steps)
                 if rt.kind is Kind.MEASURED]
        buffers = self._buffers  # bound by pointer: must live as long as the callable

        def run_all() -> None:
            for s in steps:
                s()

        run_all.buffers = buffers  # type: ignore[attr-defined]
        return run_all

    def timing(self, summary: Summary) -> Timing:
        """``summary`` of the measured partitions plus the simulated ones' figures: each
        simulated partition's ``estimated_s`` and, on a plan of simulated partitions only (an
        Ethos-U board, whose boundaries are as simulated as its partitions: NPU invocations,
        hand-overs, requantisations), its ``penalty_s`` as plan.json records it."""
        measured = [rt for rt in self.partitions if rt.kind is Kind.MEASURED]
        simulated = [rt for rt in self.partitions if rt.kind is Kind.SIMULATED]
        penalties = ({p.id: p.penalty_s for p in self.plan.partitions}
                     if not measured and getattr(self, "plan", None) is not None else {})
        return Timing(
            summary=summary,
            simulated_s=sum(rt.estimated_s + penalties.get(rt.id, 0.0) for rt in simulated),
            measured_partitions=tuple(rt.id for rt in measured),
            simulated_partitions=tuple(rt.id for rt in simulated),
        )

    def measure_in_chain(self, runs: int, *, warmup: int = 0,
                         feeds: Mapping[str, np.ndarray] | None = None
                         ) -> tuple[list[float], dict[str, list[float]]]:
        """``runs`` runs of the whole chain; (chain seconds per run, each measured partition's
        seconds per run *inside* the running chain, by partition id).

        Unlike `measure_partitions` (each partition again and again on its own), every sample
        here finds the caches and layouts its real neighbours left. Callers interleave chains
        and take medians; ``warmup`` runs are not recorded."""
        if not self._steps or feeds is not None:
            self._load_feeds(self.random_feeds() if feeds is None else feeds)
        steps = [(rt.id, step) for rt, step in zip(self.partitions, self._steps)
                 if rt.kind is Kind.MEASURED]
        clock = time.perf_counter_ns
        totals: list[float] = []
        per: dict[str, list[float]] = {pid: [] for pid, _ in steps}
        for r in range(warmup + runs):
            times = []
            start = clock()
            for _pid, step in steps:
                a = clock()
                step()
                times.append(clock() - a)
            end = clock()
            if r >= warmup:
                totals.append((end - start) * 1e-9)
                for (pid, _), dt in zip(steps, times):
                    per[pid].append(dt * 1e-9)
        return totals, per

    def measure_partitions(self, config: MeasureConfig | None = None,
                           feeds: Mapping[str, np.ndarray] | None = None) -> dict[str, float]:
        """Each measured partition timed alone inside the bound pipeline (median seconds)."""
        config = config or MeasureConfig()
        self._load_feeds(self.random_feeds() if feeds is None else feeds)
        out = {}
        for rt, step in zip(self.partitions, self._steps):
            if rt.kind is Kind.MEASURED:
                s, _ = time_callable(step, config)
                out[rt.id] = float(statistics.median(s))
            else:
                out[rt.id] = rt.estimated_s
        return out


def _toolchain_of_target(plan: Plan, target_id: str) -> str:
    for t in plan.targets:
        if isinstance(t, dict) and t.get("id") == target_id:
            return str(t.get("toolchain", ""))
    return get_target(target_id).toolchain


def _specs_of(models: Any, graph_inputs: Sequence[str]) -> dict[str, FeedSpec]:
    # a dynamic dim (no value, 0 or paddle2onnx's -1) gets 1 unless the caller binds it
    merged = merge_specs(feed_specs(m, dynamic_as=1) for m in models)
    return {n: merged[n] for n in graph_inputs if n in merged}
