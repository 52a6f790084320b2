"""The runner interface: small typed messages, toolchains, and device-owning runners.

A *toolchain* knows how to turn an ONNX sub-model into an artifact (`Toolchain.build`) and how to
time that artifact (`Toolchain.measure`); it also declares which ONNX nodes it can take
(`Capabilities`), which feeds the op-predicate partition rules. A *runner* owns one device and
serves one or more toolchains on it, running toolchain code in a worker process so that a
toolchain that hangs or segfaults costs one result row, not the farm.

Every message is a frozen dataclass built from plain values (str, int, float, bytes, tuples), so
it crosses process and Ray boundaries without custom pickling and can be written into a cost
table row as is. Failure is data: a `MeasureResult` carries either samples or an error, with a
`Status` saying which.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import json
import math
import platform
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from collage_farm.core.target import Target

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node
    from runners.profile import Profiler
    from runners.runtime import PartitionRuntime, RuntimeInput, WholeGraph


class Status(str, enum.Enum):
    """Outcome of a build or a measurement."""

    OK = "ok"
    UNSUPPORTED = "unsupported"  # the toolchain does not take this sub-graph
    BUILD_FAILED = "build_failed"  # it tried and failed to compile
    RUNTIME_ERROR = "runtime_error"  # it compiled but failed to run
    TIMEOUT = "timeout"  # killed at MeasureConfig.timeout_s
    CRASHED = "crashed"  # the worker process died (segfault, OOM kill, ...)


class RuntimeUnavailable(RuntimeError):
    """A plan partition that cannot run here on its toolchain (`Toolchain.runtime`): the
    toolchain is unavailable, has no runtime, or cannot build the partition."""


class Kind(str, enum.Enum):
    """Where a cost comes from."""

    MEASURED = "measured"  # wall-clock timing of real execution
    SIMULATED = "simulated"  # a simulator's estimate (Vela cycles / clock)
    ANALYTIC = "analytic"  # a formula (roofline bound, host model)
    PROFILED = "profiled"  # a toolchain's in-network per-operator profile (runners.profile)


#: the mode of a profile request (`runners.profile`): the whole model timed warm, then profiled
PROFILE_MODE = "profile"
#: measurement modes (see runners.measure); old names read as their new ones
MEASURE_MODES = ("warm", "flush", "network", PROFILE_MODE)
MODE_ALIASES = {"isolated": "warm", "cache_flush": "flush"}
#: what a row written before modes existed was measured with
LEGACY_MODE = "warm"
#: the default of `MeasureConfig`: end-to-end runs of whole models and plans, where the model
#: run again and again *is* the network around each of its parts
DEFAULT_MODE = "warm"
#: the mode campaigns measure candidates in: each inside its own network (runners.measure),
#: chosen by its error against chunks timed in a running chain (bench/results/inchain-vm.md)
#: and plans run end to end (bench/results/additive-vm-network.md)
CANDIDATE_MODE = "network"


def canonical_mode(mode: str) -> str:
    """The canonical name of a measurement mode; ValueError names the known ones."""
    m = MODE_ALIASES.get(mode, mode)
    if m not in MEASURE_MODES:
        known = ", ".join((*MEASURE_MODES, *MODE_ALIASES))
        raise ValueError(f"unknown measure mode {mode!r} ({known})")
    return m


@dataclass(frozen=True)
class MeasureConfig:
    """How a measurement is taken; stored with every row so rows are comparable.

    Warm-up runs are discarded; then ``rounds`` rounds, each of at least ``min_round_runs`` runs
    and ``min_round_s`` seconds. The cost is the median of all samples (RFC Appendix E); a round
    whose median is more than ``outlier_ratio`` from the median of round medians is re-run once.

    ``mode`` says what the caches hold when a timed run starts (`runners.measure`): ``warm``
    (repeated runs, everything the candidate touched is still cached), ``flush`` (every cache
    evicted before each run) or ``network`` (what the rest of the network touches is evicted,
    then the candidate's inputs are read back, as if its producer had just written them).
    ``profile`` (`PROFILE_MODE`) is not a cache state but a profile request of a whole model
    (`runners.profile`): timed warm, then profiled per operator.

    ``network_bytes`` (``network`` mode) is how many bytes the *rest of the network* touches
    between two runs of this candidate: the model's weights and activations minus the
    candidate's own (`SubGraph.rest_of_network_bytes`). Campaigns set it per request; the runner
    evicts that much, at most 2 x LLC of *its* machine (`runners.measure.
    network_eviction_bytes`); 0 evicts the core's private caches only. ``flush_bytes``, when
    > 0, overrides the eviction size of ``flush`` and ``network`` modes (0: twice the LLC for
    ``flush``). Rows written before modes existed have no ``mode`` in their JSON and read as
    ``warm``; ``isolated`` and ``cache_flush`` are the old spellings of ``warm`` and ``flush``.
    """

    warmup_runs: int = 3
    rounds: int = 5
    min_round_runs: int = 5
    min_round_s: float = 0.02
    max_samples: int = 2000
    outlier_ratio: float = 0.25
    timeout_s: float = 120.0
    threads: int = 1
    mode: str = DEFAULT_MODE
    flush_bytes: int = 0
    network_bytes: int = 0

    @property
    def measure_mode(self) -> str:
        """The canonical mode (raises ValueError for an unknown one)."""
        return canonical_mode(self.mode)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @staticmethod
    def from_json(text: str) -> MeasureConfig:
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(MeasureConfig)}
        kw = {k: v for k, v in data.items() if k in known}
        kw.setdefault("mode", LEGACY_MODE)
        return MeasureConfig(**kw)


@dataclass(frozen=True)
class DeviceDescription:
    """What a measurement ran on; part of the cost-table lookup key."""

    kind: str  # "cpu", "cuda", "ethos-u"
    name: str  # CPU model / GPU name / accelerator config
    cores: int = 0
    driver: str = ""
    config: str = ""  # CUDA version, Vela system config + memory mode, ...

    def describe(self) -> str:
        parts = [self.kind, self.name]
        if self.cores:
            parts.append(f"{self.cores}c")
        if self.driver:
            parts.append(self.driver)
        if self.config:
            parts.append(self.config)
        return " | ".join(parts)

    @staticmethod
    def host_cpu() -> DeviceDescription:
        import os

        name = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        return DeviceDescription("cpu", name, os.cpu_count() or 1)


@dataclass(frozen=True)
class Summary:
    """Statistics of a sample set (seconds)."""

    median: float
    mean: float
    std: float
    p10: float
    p90: float
    min: float
    n: int
    cv: float  # coefficient of variation of round medians

    @staticmethod
    def of(samples: Sequence[float], round_medians: Sequence[float] = ()) -> Summary:
        import numpy as np

        a = np.asarray(samples, dtype=np.float64)
        if a.size == 0:
            nan = math.nan
            return Summary(nan, nan, nan, nan, nan, nan, 0, nan)
        rm = np.asarray(round_medians if len(round_medians) else [float(np.median(a))])
        cv = float(rm.std() / rm.mean()) if rm.size > 1 and rm.mean() > 0 else 0.0
        return Summary(
            median=float(np.median(a)),
            mean=float(a.mean()),
            std=float(a.std()),
            p10=float(np.percentile(a, 10)),
            p90=float(np.percentile(a, 90)),
            min=float(a.min()),
            n=int(a.size),
            cv=cv,
        )


@dataclass(frozen=True)
class BuildInput:
    """A candidate sub-model to build for a target.

    ``onnx_bytes`` is a standalone model (from `SubGraph.extract`) whose tensor names are the
    original model's. ``tensor_ranges`` maps tensor names to calibrated (min, max) from the whole
    fp32 model, for toolchains that quantise (Ethos-U); empty for the others.
    ``channel_means`` (tensor name, per-channel means) are the same calibration's, for a
    target whose int16 activations correct their biases with them (a Vela target with
    ``activations: int16``); empty for the others.
    """

    fingerprint: str
    target: Target
    onnx_bytes: bytes
    tensor_ranges: tuple[tuple[str, float, float], ...] = ()
    label: str = ""  # human-readable: model and node names, for logs and rows
    channel_means: tuple[tuple[str, tuple[float, ...]], ...] = ()


#: `MeasureResult.details` key set on results the farm produced itself (not a runner): its value
#: says why (`NO_RUNNER`: no runner serves the toolchain; ``runner_died``: the runner was lost)
FARM_DETAIL = "farm"
NO_RUNNER = "no_runner"


@dataclass(frozen=True)
class MeasureRequest:
    """One candidate to build and measure: the sub-model and how to time it."""

    build: BuildInput
    config: MeasureConfig = field(default_factory=MeasureConfig)

    @property
    def fingerprint(self) -> str:
        return self.build.fingerprint

    @property
    def target(self) -> Target:
        return self.build.target

    @property
    def label(self) -> str:
        return self.build.label


@dataclass(frozen=True)
class BuildResult:
    """A toolchain artifact (or why there is none)."""

    fingerprint: str
    target: Target
    status: Status
    artifact: bytes = b""  # e.g. ONNX bytes for ORT/OpenVINO, TFLite (+Vela output) for Ethos-U
    artifact_kind: str = ""  # "onnx", "tflite", "vela", ...
    error: str = ""
    build_s: float = 0.0
    details: tuple[tuple[str, object], ...] = ()  # toolchain extras (e.g. vela cycles per op)

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    def detail(self, key: str, default: object = None) -> object:
        return dict(self.details).get(key, default)


@dataclass(frozen=True)
class MeasureInput:
    """A built artifact to time."""

    build: BuildResult
    config: MeasureConfig = field(default_factory=MeasureConfig)

    @property
    def fingerprint(self) -> str:
        return self.build.fingerprint

    @property
    def target(self) -> Target:
        return self.build.target


@dataclass(frozen=True)
class MeasureResult:
    """Samples or an error, never both; plus everything a cost-table row needs."""

    fingerprint: str
    target: Target
    status: Status
    config: MeasureConfig
    samples: tuple[float, ...] = ()
    summary: Summary | None = None
    kind: Kind = Kind.MEASURED
    error: str = ""
    device: DeviceDescription | None = None
    toolchain_version: str = ""
    build_s: float = 0.0
    measure_s: float = 0.0
    details: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        if self.status is Status.OK and not self.samples:
            raise ValueError("an ok MeasureResult needs samples")
        if self.status is not Status.OK and self.samples:
            raise ValueError("a failed MeasureResult carries an error, not samples")

    @property
    def ok(self) -> bool:
        return self.status is Status.OK

    @property
    def seconds(self) -> float:
        """The cost: the median, or +inf when the candidate cannot run."""
        if self.status is not Status.OK or self.summary is None:
            return math.inf
        return self.summary.median

    @staticmethod
    def failed(build: BuildResult | BuildInput, status: Status, error: str,
               config: MeasureConfig, **kw: object) -> MeasureResult:
        return MeasureResult(
            fingerprint=build.fingerprint,
            target=build.target,
            status=status,
            config=config,
            error=error,
            **kw,  # type: ignore[arg-type]
        )


# ----------------------------------------------------------------------------------------
# capabilities and toolchains


class Capabilities(abc.ABC):
    """Which ONNX nodes a toolchain can take. Feeds `OpPredicatePartitionRule`.

    Contract: `why_not` is a pure function of the node and its graph (types, shapes, attrs):
    ``None`` when the toolchain takes the node, else a short reason. It must never raise for an
    unknown op; unknown means unsupported.
    """

    #: "graph": a graph compiler that takes arbitrary convex regions (fuses across ops);
    #: "library": takes single operators (or small patterns) and fuses nothing.
    style: str = "graph"

    @abc.abstractmethod
    def why_not(self, node: Node, graph: DataflowGraph) -> str | None:
        """None if supported, else the reason."""

    def supports(self, node: Node, graph: DataflowGraph) -> bool:
        return self.why_not(node, graph) is None


class Toolchain(abc.ABC):
    """A compiler/runtime for one device kind: capabilities, build, measure.

    Contract:
    * `build` and `measure` run inside the runner's worker process; they may crash or hang, and
      the runner turns that into `Status.CRASHED` / `Status.TIMEOUT` rows.
    * `build` never raises for a sub-model it cannot take: it returns a `BuildResult` with
      `Status.UNSUPPORTED` or `Status.BUILD_FAILED` and the error text.
    * `measure` returns samples in seconds following `MeasureConfig`, timing only the
      toolchain's execution (inputs bound once, outputs not copied per run where possible).
    * `runtime` (optional) runs a plan's partition in the executor's process.
    * Importing the module that defines a toolchain must not import its heavy packages;
      `available()` imports them and says whether the toolchain can run here.
    """

    #: toolchain id, as in `Target.toolchain` ("ort-cpu", "openvino", ...)
    name: str = ""
    #: device kind it runs on ("cpu", "cuda", "ethos-u")
    device_kind: str = "cpu"
    #: what its costs are
    kind: Kind = Kind.MEASURED

    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """Which nodes this toolchain takes."""

    def capabilities_for_target(self, target: Target) -> Capabilities:
        """Which nodes this toolchain takes for ``target`` (its options may narrow or widen
        them: Vela's accelerator); by default `capabilities`."""
        return self.capabilities()

    @abc.abstractmethod
    def available(self) -> str | None:
        """None when usable on this machine, else why not (missing package, no device)."""

    @abc.abstractmethod
    def version(self) -> str:
        """Version string(s) of the toolchain packages, stored with every row."""

    @abc.abstractmethod
    def build(self, inp: BuildInput) -> BuildResult:
        """Turn a sub-model into an artifact, or say why not."""

    @abc.abstractmethod
    def measure(self, inp: MeasureInput) -> MeasureResult:
        """Time a built artifact (or return the simulator's estimate)."""

    def device_description(self, target: Target) -> DeviceDescription:
        return DeviceDescription.host_cpu()

    def timer(self, build: BuildResult, config: MeasureConfig
              ) -> Callable[[MeasureConfig], list[float]]:
        """A function that times ``build`` again and again, each call under the config it is
        given (warm rounds; the samples in seconds, as `measure` would take them), for callers
        that interleave several builds (the prefix profiler): what the build needs to run is
        made once, here, and the function holds it alive. Raises when the build cannot run.
        The default measures through `measure` on every call; toolchains that cache only one
        compiled session (ONNX Runtime, OpenVINO) or a bounded set (LiteRT) override it."""
        def measured(cfg: MeasureConfig) -> list[float]:
            m = self.measure(MeasureInput(build, cfg))
            if not m.ok:
                raise RuntimeError(f"{build.fingerprint} does not run: {m.error[:200]}")
            return list(m.samples)
        return measured

    def profiler(self) -> Profiler | None:
        """This toolchain's per-operator profiler (`runners.profile`), or None when it has
        none (a profile request then fails, and the campaign measures its candidates in
        isolation)."""
        return None

    def runtime(self, inp: RuntimeInput) -> PartitionRuntime:
        """A plan partition compiled for this toolchain, ready to run and bind in the plan
        executor (`runners.runtime`); it runs in the executor's process, not a worker.

        Raises `RuntimeUnavailable` when the partition cannot run here (toolchain unavailable,
        build failed); the toolchain's own exception when its file does not load. The default says
        the toolchain runs no plan partitions (the ``null`` test toolchain); ONNX Runtime,
        OpenVINO, LiteRT and Vela override it.
        """
        raise RuntimeUnavailable(f"partition {inp.id}: toolchain {self.name} cannot run plan "
                                 "partitions (it has no runtime)")

    def slice_cuts(self, whole: WholeGraph) -> frozenset[int] | None:
        """Where `runtime` can cut one compilation of ``whole``'s graph into slices: the
        positions p (0 < p < nodes, in the graph's node order) between two nodes at which the
        compiled whole can be split. A partition given with ``whole`` (`RuntimeInput.whole`)
        that is a contiguous run of nodes starting and ending at such positions (or the
        graph's ends) is built as a slice of that compilation, which may differ from the
        partition compiled alone (the whole model's fusions and layouts); any other is
        compiled alone. None (the default): this toolchain compiles every partition alone
        and ignores ``whole``."""
        return None


class Runner(abc.ABC):
    """Owns one device and serves toolchains on it, isolated in a worker process.

    Contract: `build` and `measure` never raise for anything a candidate does; a crash, hang or
    error in toolchain code becomes a result with a failure status, and the runner keeps
    serving. `resources` are the Ray resources the runner's actor must hold.
    """

    @abc.abstractmethod
    def toolchains(self) -> Sequence[str]:
        """Toolchain ids served."""

    @abc.abstractmethod
    def resources(self) -> Mapping[str, float]:
        """Ray resources needed (e.g. {"CPU": 1, "cpu_slot_0": 1} or {"GPU": 1})."""

    @abc.abstractmethod
    def device_description(self, target: Target) -> DeviceDescription:
        """The device as stored in rows."""

    @abc.abstractmethod
    def build(self, inp: BuildInput) -> BuildResult:
        """Build in isolation; never raises for candidate faults."""

    @abc.abstractmethod
    def measure(self, inp: MeasureInput) -> MeasureResult:
        """Measure in isolation; never raises for candidate faults."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the worker process and device."""
