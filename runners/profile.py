"""In-network operator profiles: what each ONNX node of a whole model costs inside that model.

A campaign in ``profile`` measure mode does not time thousands of candidate partitions in
isolation; it runs each target's whole model once, in network, and reads the toolchain's own
per-operator profile (`Profiler`): ONNX Runtime's session trace (`runners.profilers.
OrtTraceProfiler`), OpenVINO's per-layer performance counters (`OpenVinoCountersProfiler`), or,
for a toolchain with no per-operator timer reachable from Python (LiteRT), the differences of
timed prefixes cut at thin cuts (`PrefixProfiler`, in this module: it is also every
toolchain's fallback when its own profiler fails or is not trusted, `profile_measure`). Vela's
per-operator cycles are already kept in every Ethos-U row's details and need no profile run.

A profile run is a farm measurement like any other: a `MeasureRequest` of the whole model whose
`MeasureConfig.mode` is `PROFILE_MODE`. The runner's worker sends it to `profile_measure`
instead of `Toolchain.measure`: the whole model is timed *unprofiled* (warm) interleaved with
its profiled runs (one unprofiled round before each, so the machine's drift hits both
alike), and the result is one `MeasureResult` of kind
`Kind.PROFILED` whose samples are the unprofiled whole-model times and whose details carry the
`OperatorProfile` as JSON under `PROFILE_DETAIL`. Profiling adds a few percent to the kernels;
consumers scale the profile to the unprofiled time (`OperatorProfile.ratio`).

An `OperatorProfile` is a list of *groups*: the ONNX nodes one toolchain kernel (or one
segment) ran, and the seconds per model run it took (the median over the profiled runs).
A group of more than one node is a fusion the toolchain made: a candidate that splits it is
uncertain. Time the profiler could not attribute to any ONNX node (a layout reorder with no
original layer, a kernel whose name maps to nothing) is kept in ``unattributed_s``; nodes no
group names are the profile's ``unaccounted`` nodes (folded or eliminated by the toolchain).
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runners.base import (
    PROFILE_MODE,
    BuildInput,
    BuildResult,
    Kind,
    MeasureConfig,
    MeasureInput,
    MeasureResult,
    Status,
    Summary,
    Toolchain,
)
from runners.topology import OnnxTopology

__all__ = ["DEFAULT_TOLERANCE", "PER_KERNEL_TOLERANCE_S", "PROFILE_DETAIL", "PROFILE_PREFIX",
           "PROFILE_STEPS", "PROFILE_TIMEOUT_S", "OnnxTopology", "OperatorProfile",
           "PrefixProfiler", "ProfileMethod", "Profiler", "monotone_totals", "paired_segments",
           "profile_config", "profile_measure", "profiled_runs", "thin_cuts"]

#: details key of a profile row: the `OperatorProfile` as JSON
PROFILE_DETAIL = "profile"
#: details key of a profile row: where the worker's seconds went (JSON: ``profiler_s``, the
#: toolchain's own profiler, and inside it ``unprofiled_s``, the unprofiled whole-model
#: rounds interleaved with its runs; for prefix
#: profiles ``prefix_builds`` and ``prefix_build_s``, the prefixes built, and
#: ``prefix_timing_s``, their interleaved timing)
PROFILE_STEPS = "profile_steps"
#: fingerprint prefix of profile rows (never a candidate's fingerprint)
PROFILE_PREFIX = "profile:"
#: how far (relative) a profile's per-operator sum may be from its unprofiled whole-model time
DEFAULT_TOLERANCE = 0.20
#: how far (absolute, per timed kernel) it may be instead: a profiler's own bookkeeping per
#: kernel measured 1-1.5 us here (ORT after its calibrated overhead is taken off, OpenVINO's
#: counters); 2 us bounds it
PER_KERNEL_TOLERANCE_S = 2e-6


class ProfileMethod(str, enum.Enum):
    """How a profile's per-node seconds were obtained."""

    ORT_TRACE = "ort-trace"  # ONNX Runtime session profiling, Node events' kernel durations
    OPENVINO_COUNTERS = "openvino-counters"  # InferRequest.get_profiling_info() per layer
    PREFIXES = "prefixes"  # differences of timed prefixes cut at thin cuts (no op timer)
    # each chunk of the cut-cost probe's one-toolchain chain, timed inside the running chain
    # (a toolchain with no op timer, when the campaign times that chain on the runners' device)
    CHAIN = "probe-chain"


@dataclass(frozen=True)
class OperatorProfile:
    """Per-group seconds of one whole-model run on one toolchain (module docstring).

    ``groups``: (ONNX node names, seconds per run) for every kernel or segment the profiler
    attributed; ``unattributed_s``: kernel time attributed to no node; ``runs``: profiled runs
    the medians come from; ``whole_s``: the same worker's *unprofiled* whole-model median,
    filled by `profile_measure`; ``notes``: one line on anything the consumer should know;
    ``kernels``: the kernels (or segments) the profiler timed (0: not recorded, the groups
    count instead); ``rejected``: when this profile stands in for the toolchain's own
    profiler's, why that one was not used (one line; `profile_measure`).
    """

    method: ProfileMethod
    groups: tuple[tuple[tuple[str, ...], float], ...]
    unattributed_s: float = 0.0
    runs: int = 0
    whole_s: float = 0.0
    notes: str = ""
    kernels: int = 0
    rejected: str = ""

    @property
    def profiled_total_s(self) -> float:
        """The per-operator sum: every group plus the unattributed time."""
        return sum(s for _, s in self.groups) + self.unattributed_s

    @property
    def ratio(self) -> float:
        """Per-operator sum / unprofiled whole-model time (nan when the latter is unknown)."""
        return self.profiled_total_s / self.whole_s if self.whole_s > 0 else float("nan")

    def problem(self, tolerance: float = DEFAULT_TOLERANCE,
                per_kernel_s: float = PER_KERNEL_TOLERANCE_S) -> str | None:
        """Why the profile's per-node shares cannot be trusted as costs (one line), or None.

        The shares are normalised to ``whole_s``, so every single-toolchain whole-model
        estimate is exact whatever the profile says; what must hold is that the per-operator
        sum is the whole model's time spread over its operators. It may differ from
        ``whole_s`` by ``tolerance`` (relative) *or* by ``per_kernel_s`` per timed kernel
        (absolute): on a model of ~50 us a profiler's fixed bookkeeping of 1-2 us per kernel
        is a large ratio but not a wrong share. Beyond both, or with more than ``tolerance``
        of the profiled time on no ONNX node, the shares are not trusted."""
        total = self.profiled_total_s
        attributed = sum(s for _, s in self.groups)
        name = self.method.value
        if not (self.whole_s > 0 and math.isfinite(self.whole_s)) or total <= 0:
            return f"{name} profile has no time (whole {self.whole_s!r} s, operators {total!r} s)"
        kernels = self.kernels or len(self.groups)
        slack = max(tolerance * self.whole_s, per_kernel_s * kernels)
        if abs(total - self.whole_s) > slack:
            return (f"{name} per-operator sum {total * 1e3:.3f} ms is {self.ratio:.2f}x the "
                    f"unprofiled whole model's {self.whole_s * 1e3:.3f} ms (more than "
                    f"{tolerance:.0%} or {per_kernel_s * 1e6:.1f} us x {kernels} kernels off)")
        if attributed < (1.0 - tolerance) * total:
            return f"{name} profile puts only {attributed / total:.0%} of its time on ONNX nodes"
        return None

    def to_json(self) -> str:
        return json.dumps({"method": self.method.value,
                           "groups": [[list(n), s] for n, s in self.groups],
                           "unattributed_s": self.unattributed_s, "runs": self.runs,
                           "whole_s": self.whole_s, "notes": self.notes,
                           "kernels": self.kernels, "rejected": self.rejected},
                          sort_keys=True)

    @staticmethod
    def from_json(text: str | Mapping[str, Any]) -> OperatorProfile:
        d = json.loads(text) if isinstance(text, str) else dict(text)
        return OperatorProfile(
            method=ProfileMethod(d["method"]),
            groups=tuple((tuple(str(x) for x in n), float(s)) for n, s in d["groups"]),
            unattributed_s=float(d.get("unattributed_s", 0.0)), runs=int(d.get("runs", 0)),
            whole_s=float(d.get("whole_s", 0.0)), notes=str(d.get("notes", "")),
            kernels=int(d.get("kernels", 0)), rejected=str(d.get("rejected", "")))


class Profiler(abc.ABC):
    """A toolchain's per-operator profiler (`Toolchain.profiler`).

    Contract: `profile` runs the built whole model (``build``, an ok `BuildResult` of the
    toolchain that made this profiler) ``runs`` times with profiling on, on the thread count
    of ``config``, and returns an `OperatorProfile` whose groups name the ONNX nodes of the
    build's model; it raises for anything that goes wrong (`profile_measure` turns that into
    a failed result). It leaves ``whole_s`` at 0. ``between``, when given, is called before
    each profiled run after the warm-ups: the caller times the *unprofiled* model there, so
    both timings see the same moments of a drifting machine (a profiler that times no
    profiled run of the whole model, the prefix profiler, may ignore it).
    """

    method: ProfileMethod

    @abc.abstractmethod
    def profile(self, build: BuildResult, onnx_bytes: bytes, config: MeasureConfig,
                runs: int, between: Callable[[], None] | None = None) -> OperatorProfile:
        """The profile of ``build`` (whose source model is ``onnx_bytes``)."""


#: how long a profile request may take (seconds): a whole model timed, profiled, timed again,
#: and where the profiler is not trusted, prefixes built and timed (a candidate's 120 s
#: killed gpt2-2L's OpenVINO profile on a loaded 2-core host, and every candidate on that
#: target was then measured in isolation instead)
PROFILE_TIMEOUT_S = 900.0
#: seconds of profiled runs a profile request aims at (`profiled_runs`): 20 runs of a 100 ms
#: model (and as many unprofiled rounds between them) were 4 of gpt2-2L's 8 s per profiled
#: target; a long run averages itself, so fewer of them give as steady a per-kernel median
PROFILE_RUNS_BUDGET_S = 1.0
#: the fewest profiled runs a request takes, however long the model runs
MIN_PROFILE_RUNS = 8


def profiled_runs(asked: int, run_s: float) -> int:
    """How many profiled runs a request that ``asked`` for that many takes of a model whose
    warm run took ``run_s`` seconds: as many as fill `PROFILE_RUNS_BUDGET_S`, at least
    `MIN_PROFILE_RUNS` (or ``asked`` if fewer) and at most ``asked``."""
    asked = max(1, int(asked))
    if not run_s > 0:
        return asked
    return min(asked, max(MIN_PROFILE_RUNS, math.ceil(PROFILE_RUNS_BUDGET_S / run_s)))


def profile_config(rounds: int = 5, runs: int = 20, threads: int = 1,
                   timeout_s: float = PROFILE_TIMEOUT_S) -> MeasureConfig:
    """The `MeasureConfig` of a profile request: `PROFILE_MODE`; ``rounds`` rounds of the
    unprofiled whole-model timing; up to ``runs`` profiled runs (``min_round_runs`` carries
    it; a model whose run is long takes fewer, `profiled_runs`); ``timeout_s`` the worker's
    limit for all of it."""
    return MeasureConfig(mode=PROFILE_MODE, rounds=rounds, min_round_runs=runs,
                         threads=threads, timeout_s=timeout_s)


def profile_measure(tc: Toolchain, inp: MeasureInput, onnx_bytes: bytes | None = None, *,
                    timer: Callable[[MeasureConfig], list[float]] | None = None
                    ) -> MeasureResult:
    """The worker's answer to a profile request: unprofiled whole-model timing, then the
    toolchain's profile, as one `Kind.PROFILED` result (module docstring).

    When the toolchain's own profiler raises, or its profile fails `OperatorProfile.problem`
    against this timing, the profile is taken again by prefix differences at thin cuts
    (`PrefixProfiler`: timing only, any toolchain), and the result's profile says in
    ``rejected`` why. A toolchain with no profiler, or whose fallback fails too, gives a
    failed result that says so. A toolchain whose own profiler *is* the prefix profiler
    (LiteRT) times no separate whole model: the whole model is one of its interleaved
    prefixes, and those samples are the result's (`_prefix_result`).

    The unprofiled whole model is timed *interleaved* with the profiled runs (`Profiler`'s
    ``between``: one round of at least one run and ``config.min_round_s`` before each
    profiled run, so a 100 ms model runs once, a 50 us one hundreds of times): both see the
    same moments of the machine, and a load burst during the profile does not read as
    profiling overhead. Its median is what the profile's sum is checked against
    (`DEFAULT_TOLERANCE`, 20%) and the result's samples; the campaign scales the shares to
    the cut-cost probe's whole-model time when it has one. The result's details say where
    the worker's seconds went (`PROFILE_STEPS`).

    ``timer``: the unprofiled whole model already readied by the caller (a `Toolchain.timer`
    contract: each call times warm rounds under the config given), used instead of readying
    ``inp.build`` again: a campaign that profiles in its own process times the whole-model
    session its cut-cost probe built (on gpt2-2L a second session was ~3 s)."""
    t0 = time.perf_counter()
    build, config = inp.build, inp.config
    profiler = tc.profiler()
    if profiler is None:
        return MeasureResult.failed(build, Status.UNSUPPORTED,
                                    f"toolchain {tc.name} has no per-operator profiler",
                                    config, kind=Kind.PROFILED)
    source = onnx_bytes if onnx_bytes is not None else build.artifact
    if isinstance(profiler, PrefixProfiler):
        return _prefix_result(profiler, inp, source, t0)
    steps: dict[str, float] = {}
    unprofiled: list[float] = []
    try:
        between = _unprofiled_timer(tc, build, config, unprofiled, timer)
    except Exception as e:
        return MeasureResult.failed(build, Status.RUNTIME_ERROR, f"the whole model does not "
                                    f"run: {type(e).__name__}: {e}"[:4000], config,
                                    kind=Kind.PROFILED, measure_s=time.perf_counter() - t0)
    runs = profiled_runs(config.min_round_runs, between.warm_s)
    steps["profiled_runs"] = float(runs)
    t1 = time.perf_counter()
    try:
        prof: OperatorProfile | None = profiler.profile(
            build, source, dataclasses.replace(config, mode="warm"), runs, between=between)
    except Exception as e:
        prof = None
        rejected = f"profiler {profiler.method.value} failed: {type(e).__name__}: {e}"
    steps["profiler_s"] = time.perf_counter() - t1
    if len(unprofiled) < 3:  # the profiler stopped early: time the whole model on its own
        unprofiled += between.rest()
    steps["unprofiled_s"] = between.seconds
    base = MeasureResult(build.fingerprint, build.target, Status.OK, config,
                         samples=tuple(unprofiled), summary=Summary.of(unprofiled),
                         kind=Kind.PROFILED, build_s=build.build_s)
    if prof is not None:
        prof = _with_whole(prof, base.seconds)
        rejected = prof.problem() or ""
    if rejected:
        prof, rejected = _fallback(tc, build, source, config, rejected, base.seconds, steps)
    if prof is None:
        return MeasureResult.failed(build, Status.RUNTIME_ERROR, rejected[:4000], config,
                                    kind=Kind.PROFILED, device=base.device,
                                    toolchain_version=base.toolchain_version)
    return dataclasses.replace(
        base, config=config, kind=Kind.PROFILED, measure_s=time.perf_counter() - t0,
        details=(*base.details, *_profile_details(prof, steps)))


def _fallback(tc: Toolchain, build: BuildResult, source: bytes, config: MeasureConfig,
              rejected: str, unprofiled_s: float, steps: dict[str, float]
              ) -> tuple[OperatorProfile | None, str]:
    """The prefix profile standing in for a profiler's ``rejected`` one (its ``rejected``
    says why), or None and why not; its steps go into ``steps``."""
    fallback = PrefixProfiler(tc)
    try:
        prof = _with_whole(fallback.profile(build, source, _prefix_config(config),
                                            max(1, int(config.min_round_runs))), unprofiled_s)
        return dataclasses.replace(prof, rejected=" ".join(rejected.split())[:300]), rejected
    except Exception as e:
        return None, rejected + f"; prefixes failed too: {type(e).__name__}: {e}"
    finally:
        steps.update(fallback.steps)


class _Unprofiled:
    """``between`` of a profile (`Profiler`): each call times the unprofiled whole model for
    one round and keeps the round's median in ``samples``; ``seconds`` is its time spent."""

    def __init__(self, timer: Callable[[MeasureConfig], list[float]], config: MeasureConfig,
                 samples: list[float]) -> None:
        self.timer = timer
        self.round = dataclasses.replace(config, mode="warm", rounds=1, min_round_runs=1,
                                         warmup_runs=0)
        self.config = config
        self.samples = samples
        self.seconds = 0.0
        self.warm_s = 0.0  # the warm-up's run (`_unprofiled_timer`)

    def __call__(self) -> None:
        t0 = time.perf_counter()
        self.samples.append(float(statistics.median(self.timer(self.round))))
        self.seconds += time.perf_counter() - t0

    def rest(self) -> list[float]:
        """The request's rounds of the whole model on its own (the profiler stopped early)."""
        t0 = time.perf_counter()
        cfg = dataclasses.replace(self.config, mode="warm", min_round_runs=1)
        out = self.timer(cfg)
        self.seconds += time.perf_counter() - t0
        return out


def _unprofiled_timer(tc: Toolchain, build: BuildResult, config: MeasureConfig,
                      samples: list[float],
                      timer: Callable[[MeasureConfig], list[float]] | None = None
                      ) -> _Unprofiled:
    """The whole model readied (`Toolchain.timer`, unless ``timer`` is given) and warmed up
    (``config.warmup_runs``) for `_Unprofiled` rounds that append to ``samples`` (its
    ``warm_s``: the warm-up's timed run); raises when it does not run."""
    if timer is None:
        timer = tc.timer(build, dataclasses.replace(config, mode="warm"))
    warm = timer(dataclasses.replace(config, mode="warm", rounds=1, min_round_runs=1,
                                     min_round_s=0))
    out = _Unprofiled(timer, config, samples)
    out.warm_s = float(statistics.median(warm)) if warm else 0.0
    return out


def _prefix_config(config: MeasureConfig) -> MeasureConfig:
    """The prefix profiler's timing: warm, rounds of at least 5 runs (a segment is the median
    over rounds of two prefixes' round medians' difference, so each round median needs the
    runs)."""
    return dataclasses.replace(config, mode="warm", min_round_runs=5)


def _profile_details(prof: OperatorProfile, steps: Mapping[str, float]
                     ) -> tuple[tuple[str, object], ...]:
    return ((PROFILE_DETAIL, prof.to_json()), ("profile_method", prof.method.value),
            ("profile_ratio", prof.ratio),
            (PROFILE_STEPS, json.dumps({k: round(v, 4) for k, v in steps.items()},
                                       sort_keys=True)))


def _prefix_result(profiler: PrefixProfiler, inp: MeasureInput, source: bytes, t0: float
                   ) -> MeasureResult:
    """A prefix-profiled toolchain's answer: the prefix profile, and as the result's samples
    the whole model's own samples from the same interleaved rounds (its last prefix)."""
    build, config = inp.build, inp.config
    runs = max(1, int(config.min_round_runs))
    try:
        prof = profiler.profile(build, source, _prefix_config(config), runs)
    except Exception as e:
        return MeasureResult.failed(build, Status.RUNTIME_ERROR,
                                    f"profiler {profiler.method.value} failed: "
                                    f"{type(e).__name__}: {e}"[:4000], config,
                                    kind=Kind.PROFILED, measure_s=time.perf_counter() - t0)
    samples = tuple(profiler.whole_samples)
    prof = _with_whole(prof, float(statistics.median(samples)))
    return MeasureResult(build.fingerprint, build.target, Status.OK, config, samples=samples,
                         summary=Summary.of(samples), kind=Kind.PROFILED,
                         build_s=build.build_s, measure_s=time.perf_counter() - t0,
                         details=_profile_details(prof, profiler.steps))


def _with_whole(prof: OperatorProfile, unprofiled_s: float) -> OperatorProfile:
    """``prof`` with its ``whole_s``: the unprofiled timing, or for a prefix profile its own
    last prefix (the whole model): its segments add up to that by construction, and the
    unprofiled timing of the same model seconds apart differs from it by the machine's drift,
    not by a wrong share."""
    own = prof.method is ProfileMethod.PREFIXES and prof.profiled_total_s > 0
    return dataclasses.replace(prof, whole_s=prof.profiled_total_s if own else unprofiled_s)


# ----------------------------------------------------------------------------------------
# prefixes (no per-operator timer)


def thin_cuts(topo: OnnxTopology, segments: int) -> list[int]:
    """Up to ``segments - 1`` cut positions (prefix lengths) of the model's node order where the
    fewest tensors cross, spread evenly; each cut keeps at least one node on either side."""
    n = len(topo.names)
    if n < 2 or segments < 2:
        return []
    index = {name: i for i, name in enumerate(topo.names)}
    last_use: dict[str, int] = {}
    for name in topo.names:
        for t in topo.inputs[name]:
            if t in topo.producer:
                last_use[t] = max(last_use.get(t, 0), index[name])
    crossing = []
    for p in range(1, n):
        crossing.append(sum(1 for t, u in last_use.items()
                            if index[topo.producer[t]] < p <= u))
    thin = min(crossing)
    positions = [p for p, c in zip(range(1, n), crossing) if c == thin]
    k = min(segments - 1, len(positions))
    picks = {positions[round(i * (len(positions) - 1) / max(1, k - 1))] for i in range(k)} \
        if k > 1 else {positions[len(positions) // 2]}
    return sorted(picks)


class PrefixProfiler(Profiler):
    """Differences of timed prefixes (module docstring); any toolchain's build and measure.

    After `profile`: ``whole_samples``, the whole model's (the last prefix's) samples from the
    interleaved rounds, and ``steps``, where the seconds went (`PROFILE_STEPS`' keys)."""

    method = ProfileMethod.PREFIXES

    def __init__(self, toolchain: Toolchain, segments: int = 6) -> None:
        self.toolchain = toolchain
        self.segments = segments
        self.whole_samples: list[float] = []
        self.steps: dict[str, float] = {}

    def _prefix_build(self, build: BuildResult, model: Any, names: Sequence[str],
                      tag: str) -> BuildResult:
        import onnx.utils

        topo_outputs = _prefix_outputs(model, set(names))
        sub = onnx.utils.Extractor(model).extract_model(
            [i.name for i in model.graph.input
             if i.name not in {x.name for x in model.graph.initializer}], topo_outputs)
        sub.ir_version = model.ir_version
        fp = f"{build.fingerprint}:{tag}"
        b = self.toolchain.build(BuildInput(fp, build.target, sub.SerializeToString()))
        if not b.ok:
            raise RuntimeError(f"prefix {tag} does not build: {b.error[:200]}")
        return b

    def _interleaved(self, timers: Sequence[Callable[[MeasureConfig], list[float]]],
                     config: MeasureConfig) -> list[list[float]]:
        """Each build's samples, timed in ``config.rounds`` rounds that visit every build once
        (drift hits every prefix alike, as it hits every segment's difference); a round's
        median per build is one sample. The first round warms each build up as ``config``
        says; later rounds with one run (the build is loaded and was run a round ago; the
        median of a round's runs takes the rest)."""
        first = dataclasses.replace(config, mode="warm", rounds=1)
        later = dataclasses.replace(first, warmup_runs=min(1, first.warmup_runs))
        samples: list[list[float]] = [[] for _ in timers]
        for r in range(max(1, int(config.rounds))):
            for i, timer in enumerate(timers):
                samples[i].append(float(statistics.median(timer(first if r == 0 else later))))
        return samples

    def _prefix_builds(self, build: BuildResult, onnx_bytes: bytes, topo: OnnxTopology,
                       cuts: Sequence[int]) -> Iterator[BuildResult]:
        """The prefixes' builds, one per cut, in order: each prefix extracted from the ONNX
        model and built by the toolchain. Subclasses may make them another way (the same
        nodes, the same fingerprints ``<whole>:p<i>``)."""
        import onnx

        model = onnx.load_from_string(onnx_bytes)
        for i, p in enumerate(cuts):
            yield self._prefix_build(build, model, topo.names[:p], f"p{i}")

    def profile(self, build: BuildResult, onnx_bytes: bytes, config: MeasureConfig,
                runs: int, between: Callable[[], None] | None = None) -> OperatorProfile:
        t0 = time.perf_counter()
        topo = OnnxTopology.of(onnx_bytes)
        cuts = thin_cuts(topo, self.segments)
        bounds = [0, *cuts, len(topo.names)]
        timers = []
        build_s = 0.0
        builds = self._prefix_builds(build, onnx_bytes, topo, cuts)
        # each prefix readied right after its build (`Toolchain.timer`: the rounds reuse its
        # session instead of compiling it once a round)
        for _ in cuts:
            t1 = time.perf_counter()
            b = next(builds)
            build_s += time.perf_counter() - t1
            timers.append(self.toolchain.timer(b, config))
        timers.append(self.toolchain.timer(build, config))
        t1 = time.perf_counter()
        samples = self._interleaved(timers, config)
        self.steps = {"prefix_builds": float(len(cuts)), "prefix_build_s": build_s,
                      "prefix_timing_s": time.perf_counter() - t1,
                      "prefixes_s": time.perf_counter() - t0}
        self.whole_samples = samples[-1]
        seconds, clipped = paired_segments(samples)
        groups = [(tuple(topo.names[bounds[i]:bounds[i + 1]]), seconds[i])
                  for i in range(len(bounds) - 1)]
        notes = (f"{len(groups)} segments at thin cuts {cuts}, prefixes timed interleaved, "
                 "segments by paired differences per round")
        if clipped:
            notes += f"; {clipped} negative segment difference(s) set to 0"
        return OperatorProfile(self.method, tuple(groups), 0.0, int(config.rounds),
                               notes=notes, kernels=len(groups))


def _prefix_outputs(model: Any, inside: set[str]) -> list[str]:
    """The tensors a prefix (the nodes named ``inside``) must give: those read after it, and the
    model's outputs it makes."""
    made: list[str] = []
    after: set[str] = set(o.name for o in model.graph.output)
    for i, n in enumerate(model.graph.node):
        name = n.name or f"{n.op_type}_{i}"
        if name in inside:
            made += [o for o in n.output if o]
        else:
            after.update(x for x in n.input if x)
    return [t for t in made if t in after]


def paired_segments(samples: Sequence[Sequence[float]]) -> tuple[list[float], int]:
    """Each segment's seconds from the prefixes' interleaved samples (``samples[i][r]``:
    prefix ``i`` in round ``r``, the last prefix the whole model), and how many were clipped.

    A segment is the median over rounds of the difference between consecutive prefixes *in
    the same round* (the first prefix less nothing), so drift between rounds (a load burst
    that slows one round) cancels in each difference instead of landing in whichever
    prefix's median came from the slow round. Negative medians (noise on a segment cheaper
    than the noise) are set to 0, and the segments are scaled so they add up to the whole
    model's median: the profile's total stays the whole model's time. Rounds missing a
    prefix's sample are left out of that segment's differences."""
    k = len(samples)
    rounds = min((len(x) for x in samples), default=0)
    if k == 0 or rounds == 0:
        return [], 0
    seg: list[float] = []
    for i in range(k):
        diffs = [samples[i][r] - (samples[i - 1][r] if i else 0.0) for r in range(rounds)]
        seg.append(float(statistics.median(diffs)))
    clipped = sum(1 for x in seg if x < 0)
    seg = [max(0.0, x) for x in seg]
    whole = float(statistics.median(samples[-1]))
    total = sum(seg)
    if total <= 0:  # every difference noise: the monotone prefix medians instead
        fixed = monotone_totals([0.0, *(float(statistics.median(x)) for x in samples)])
        return [fixed[i + 1] - fixed[i] for i in range(k)], clipped
    return [x * whole / total for x in seg], clipped


def monotone_totals(totals: Sequence[float]) -> list[float]:
    """Prefix times made non-decreasing and bounded by the whole model's (the last): each
    clipped to [the previous one, the last]. A longer prefix cannot cost less; timing noise
    can say so, and clipping (rather than counting a negative difference as 0) keeps the
    segments' sum equal to the whole model's time."""
    out: list[float] = []
    whole = totals[-1]
    for t in totals:
        out.append(min(max(t, out[-1] if out else 0.0), whole))
    return out
