"""In-network operator profiles: what each ONNX node of a whole model costs inside that model.

A campaign in ``profile`` measure mode does not time thousands of candidate partitions in
isolation; it runs each target's whole model once, in network, and reads the toolchain's own
per-operator profile (`Profiler`): ONNX Runtime's session trace (`runners.profilers.
OrtTraceProfiler`), OpenVINO's per-layer performance counters (`OpenVinoCountersProfiler`), or,
for a toolchain with no per-operator timer reachable from Python (LiteRT), the differences of
timed prefixes cut at thin cuts (`PrefixProfiler`). Vela's per-operator cycles are already kept
in every Ethos-U row's details and need no profile run.

A profile run is a farm measurement like any other: a `MeasureRequest` of the whole model whose
`MeasureConfig.mode` is `PROFILE_MODE`. The runner's worker sends it to `profile_measure`
instead of `Toolchain.measure`: the whole model is timed *unprofiled* (warm, the request's
rounds) before and after it is profiled (the pooled samples bracket the profile, so the
machine's drift hits both alike), and the result is one `MeasureResult` of kind
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
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from runners.base import (
    PROFILE_MODE,
    BuildResult,
    Kind,
    MeasureConfig,
    MeasureInput,
    MeasureResult,
    Status,
    Summary,
    Toolchain,
)

__all__ = ["PROFILE_DETAIL", "PROFILE_PREFIX", "OnnxTopology", "OperatorProfile",
           "ProfileMethod", "Profiler", "attach_unassigned", "profile_config",
           "profile_measure"]

#: details key of a profile row: the `OperatorProfile` as JSON
PROFILE_DETAIL = "profile"
#: fingerprint prefix of profile rows (never a candidate's fingerprint)
PROFILE_PREFIX = "profile:"


class ProfileMethod(str, enum.Enum):
    """How a profile's per-node seconds were obtained."""

    ORT_TRACE = "ort-trace"  # ONNX Runtime session profiling, Node events' kernel durations
    OPENVINO_COUNTERS = "openvino-counters"  # InferRequest.get_profiling_info() per layer
    PREFIXES = "prefixes"  # differences of timed prefixes cut at thin cuts (no op timer)


@dataclass(frozen=True)
class OperatorProfile:
    """Per-group seconds of one whole-model run on one toolchain (module docstring).

    ``groups``: (ONNX node names, seconds per run) for every kernel or segment the profiler
    attributed; ``unattributed_s``: kernel time attributed to no node; ``runs``: profiled runs
    the medians come from; ``whole_s``: the same worker's *unprofiled* whole-model median,
    filled by `profile_measure`; ``notes``: one line on anything the consumer should know.
    """

    method: ProfileMethod
    groups: tuple[tuple[tuple[str, ...], float], ...]
    unattributed_s: float = 0.0
    runs: int = 0
    whole_s: float = 0.0
    notes: str = ""

    @property
    def profiled_total_s(self) -> float:
        """The per-operator sum: every group plus the unattributed time."""
        return sum(s for _, s in self.groups) + self.unattributed_s

    @property
    def ratio(self) -> float:
        """Per-operator sum / unprofiled whole-model time (nan when the latter is unknown)."""
        return self.profiled_total_s / self.whole_s if self.whole_s > 0 else float("nan")

    def to_json(self) -> str:
        return json.dumps({"method": self.method.value,
                           "groups": [[list(n), s] for n, s in self.groups],
                           "unattributed_s": self.unattributed_s, "runs": self.runs,
                           "whole_s": self.whole_s, "notes": self.notes}, sort_keys=True)

    @staticmethod
    def from_json(text: str | Mapping[str, Any]) -> OperatorProfile:
        d = json.loads(text) if isinstance(text, str) else dict(text)
        return OperatorProfile(
            method=ProfileMethod(d["method"]),
            groups=tuple((tuple(str(x) for x in n), float(s)) for n, s in d["groups"]),
            unattributed_s=float(d.get("unattributed_s", 0.0)), runs=int(d.get("runs", 0)),
            whole_s=float(d.get("whole_s", 0.0)), notes=str(d.get("notes", "")))


class Profiler(abc.ABC):
    """A toolchain's per-operator profiler (`Toolchain.profiler`).

    Contract: `profile` runs the built whole model (``build``, an ok `BuildResult` of the
    toolchain that made this profiler) ``runs`` times with profiling on, on the thread count
    of ``config``, and returns an `OperatorProfile` whose groups name the ONNX nodes of the
    build's model; it raises for anything that goes wrong (`profile_measure` turns that into
    a failed result). It leaves ``whole_s`` at 0.
    """

    method: ProfileMethod

    @abc.abstractmethod
    def profile(self, build: BuildResult, onnx_bytes: bytes, config: MeasureConfig,
                runs: int) -> OperatorProfile:
        """The profile of ``build`` (whose source model is ``onnx_bytes``)."""


def profile_config(rounds: int = 5, runs: int = 20, threads: int = 1) -> MeasureConfig:
    """The `MeasureConfig` of a profile request: `PROFILE_MODE`; ``rounds`` rounds of the
    unprofiled whole-model timing; ``runs`` profiled runs (``min_round_runs`` carries it)."""
    return MeasureConfig(mode=PROFILE_MODE, rounds=rounds, min_round_runs=runs,
                         threads=threads)


def profile_measure(tc: Toolchain, inp: MeasureInput, onnx_bytes: bytes | None = None
                    ) -> MeasureResult:
    """The worker's answer to a profile request: unprofiled whole-model timing, then the
    toolchain's profile, as one `Kind.PROFILED` result (module docstring). A toolchain with no
    profiler, or a profiler that raises, gives a failed result that says so."""
    t0 = time.perf_counter()
    build, config = inp.build, inp.config
    profiler = tc.profiler()
    if profiler is None:
        return MeasureResult.failed(build, Status.UNSUPPORTED,
                                    f"toolchain {tc.name} has no per-operator profiler",
                                    config, kind=Kind.PROFILED)
    warm = dataclasses.replace(config, mode="warm", min_round_runs=5)
    base = tc.measure(MeasureInput(build, warm))
    if not base.ok:
        return dataclasses.replace(base, config=config, kind=Kind.PROFILED)
    source = onnx_bytes if onnx_bytes is not None else build.artifact
    try:
        prof = profiler.profile(build, source, warm, max(1, int(config.min_round_runs)))
    except Exception as e:
        return MeasureResult.failed(build, Status.RUNTIME_ERROR,
                                    f"profiler {profiler.method.value} failed: "
                                    f"{type(e).__name__}: {e}"[:4000], config,
                                    kind=Kind.PROFILED, device=base.device,
                                    toolchain_version=base.toolchain_version)
    after = tc.measure(MeasureInput(build, warm))  # bracket the profile: drift hits both
    if after.ok:
        samples = (*base.samples, *after.samples)
        base = dataclasses.replace(base, samples=samples, summary=Summary.of(samples))
    prof = dataclasses.replace(prof, whole_s=base.seconds)
    return dataclasses.replace(
        base, config=config, kind=Kind.PROFILED, measure_s=time.perf_counter() - t0,
        details=(*base.details, (PROFILE_DETAIL, prof.to_json()),
                 ("profile_method", prof.method.value), ("profile_ratio", prof.ratio)))


# ----------------------------------------------------------------------------------------
# mapping kernels back to ONNX nodes


@dataclass(frozen=True)
class OnnxTopology:
    """The node names of an ONNX model in order, and who produces and consumes each tensor."""

    names: tuple[str, ...]
    inputs: Mapping[str, tuple[str, ...]]  # node -> its runtime input tensors
    outputs: Mapping[str, tuple[str, ...]]  # node -> its output tensors
    producer: Mapping[str, str]  # tensor -> node
    consumers: Mapping[str, tuple[str, ...]]  # tensor -> nodes

    @staticmethod
    def of(onnx_bytes: bytes) -> OnnxTopology:
        import onnx  # lazily: the worker imports this module before its thread environment

        model = onnx.load_from_string(onnx_bytes)
        inits = {i.name for i in model.graph.initializer}
        names: list[str] = []
        ins: dict[str, tuple[str, ...]] = {}
        outs: dict[str, tuple[str, ...]] = {}
        producer: dict[str, str] = {}
        consumers: dict[str, list[str]] = {}
        for i, node in enumerate(model.graph.node):
            name = node.name or f"{node.op_type}_{i}"
            names.append(name)
            ins[name] = tuple(t for t in node.input if t and t not in inits)
            outs[name] = tuple(t for t in node.output if t)
            for t in outs[name]:
                producer[t] = name
            for t in ins[name]:
                consumers.setdefault(t, []).append(name)
        return OnnxTopology(tuple(names), ins, outs, producer,
                            {k: tuple(v) for k, v in consumers.items()})

    def producers_of(self, node: str) -> list[str]:
        return [self.producer[t] for t in self.inputs[node] if t in self.producer]

    def consumers_of(self, node: str) -> list[str]:
        return [c for t in self.outputs[node] for c in self.consumers.get(t, ())]


def attach_unassigned(topo: OnnxTopology, group_of: dict[str, int]) -> None:
    """Give the nodes no kernel named to the group they were most likely fused into, in place.

    In topological order, a node without a group joins its only consumer's group when that
    consumer has one (a Conv fused into the Relu the kernel is named after), else the group of
    its producer whose outputs only it reads (an Add and Relu fused into the Conv before
    them). A node neither rule places stays without a group: the profile does not account
    for it.
    """
    for _ in range(2):  # a second pass places nodes whose consumer was placed after them
        for n in topo.names:
            if n in group_of:
                continue
            cons = set(topo.consumers_of(n))
            if len(cons) == 1:
                (c,) = cons
                if c in group_of:
                    group_of[n] = group_of[c]
                    continue
            for p in topo.producers_of(n):
                if p in group_of and set(topo.consumers_of(p)) == {n}:
                    group_of[n] = group_of[p]
                    break


def groups_from(topo: OnnxTopology, seconds: Mapping[int, float], group_of: Mapping[str, int]
                ) -> tuple[tuple[tuple[str, ...], float], ...]:
    """(nodes, seconds) per group id, nodes in model order, groups in first-node order."""
    members: dict[int, list[str]] = {}
    for n in topo.names:
        if n in group_of:
            members.setdefault(group_of[n], []).append(n)
    return tuple((tuple(m), float(seconds.get(g, 0.0))) for g, m in members.items())


def medians(samples: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """The median of each key's samples (keys with none are left out)."""
    return {k: float(statistics.median(v)) for k, v in samples.items() if len(v)}


def strip_suffixes(name: str, known: Iterable[str], suffixes: Sequence[str]) -> str | None:
    """``name`` or ``name`` less any of ``suffixes`` (repeatedly) when that is a known node."""
    known = set(known)
    cur = name
    while True:
        if cur in known:
            return cur
        for s in suffixes:
            if cur.endswith(s):
                cur = cur[: -len(s)]
                break
        else:
            return None
