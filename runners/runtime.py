"""A plan partition on its toolchain: what the heterogeneous executor runs and binds.

`collage_farm.execute.PlanExecutor` runs a plan's partitions in order, each on the toolchain of
its target. It asks the toolchain for a `PartitionRuntime` (`Toolchain.runtime`) from a
`RuntimeInput` (the partition's ONNX bytes, tensor names and its target's options), so each
toolchain owns how its partitions compile, run and bind buffers:

* ``plain(feeds)`` runs the partition once on named arrays and returns its outputs (the
  executor's discovery pass, which learns every tensor's shape and dtype);
* ``bind(buffers)`` binds the partition to the executor's buffers (one per tensor, allocated
  once: numpy arrays on the host, ONNX Runtime ``OrtValue``s on a GPU) and returns the step
  the executor times: just the toolchain's run call, no per-call conversion or copies.

Toolchains with their own runtime: ONNX Runtime CPU (`runners.ort`), the CUDA and TensorRT
execution providers (`runners.cuda`), OpenVINO (`runners.openvino_cpu`), Vela (simulated latency,
int8 numerics: `runners.runtime_sim`). `generic_runtime` serves any toolchain that can
``build`` a partition and run the artifact with ``run_outputs`` (LiteRT).

A caller that builds many partitions of one graph (the cut-cost probe's chunks) may hand each
with its `WholeGraph` and node names (`RuntimeInput.whole`, ``nodes``): a toolchain whose
compiler can cut one compilation of the whole graph into partitions (`Toolchain.slice_cuts`:
LiteRT) builds it as such a slice, compiling the whole graph once per `WholeGraph`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from collage_farm.core.target import CPU0, Target, VirtualDevice
from runners.base import BuildInput, Kind, RuntimeUnavailable, Toolchain

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph

__all__ = ["SIMULATED_TOOLCHAINS", "PartitionRuntime", "RuntimeInput", "WholeGraph",
           "generic_runtime", "runner_runtime"]

class WholeGraph:
    """A graph whose partitions a toolchain may build as slices of one compilation of the
    whole graph (`RuntimeInput.whole`), and those compilations, kept per key for as long as
    this object lives: its holder (`collage_farm.execute.builder.PlanBuilder`) decides how
    long a whole compilation stays in memory."""

    def __init__(self, graph: DataflowGraph) -> None:
        self.graph = graph
        self._made: dict[str, tuple[bool, Any]] = {}

    def compiled(self, key: str, make: Callable[[DataflowGraph], Any]) -> Any:
        """``make(graph)`` (a compiler's whole-graph lowering), made once per ``key``; what it
        raised is raised again on every later call (a graph a compiler cannot take whole is not
        tried twice)."""
        if key not in self._made:
            try:
                self._made[key] = (True, make(self.graph))
            except Exception as e:
                self._made[key] = (False, e)
        ok, value = self._made[key]
        if not ok:
            raise value
        return value


#: toolchains whose partitions are never timed: their latency is the simulator's estimate (Vela)
#: or a cycle model's (the Cortex-M host of an Ethos-U board, `runners.cortex_m`)
SIMULATED_TOOLCHAINS = ("vela", "cortex-m")


@dataclass(frozen=True)
class RuntimeInput:
    """One partition of a plan to make a runtime for.

    ``target`` is the target's id as the plan names it; ``options`` its options (sorted pairs,
    as in `Target.options`); ``threads`` the intra-op thread count of the session (the target's
    ``threads`` option when it has one). ``estimated_s`` is the plan's estimate, which a
    simulated partition reports as its latency. ``tensor_ranges`` (name, min, max) are the
    whole model's calibrated ranges (`runners.calibration`), for toolchains that build int8
    (as `BuildInput.tensor_ranges`: a plan's int8 partitions are built as they were costed);
    empty for the others. ``channel_means``: as `BuildInput.channel_means`.
    """

    id: str
    target: str
    onnx_bytes: bytes
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    estimated_s: float = 0.0
    options: tuple[tuple[str, Any], ...] = ()
    threads: int = 1
    tensor_ranges: tuple[tuple[str, float, float], ...] = ()
    channel_means: tuple[tuple[str, tuple[float, ...]], ...] = ()
    #: the whole graph the partition is cut from, with the partition's node names in it, for
    #: a toolchain that builds partitions as slices of one whole compilation (module
    #: docstring); None: the partition is built from ``onnx_bytes`` alone
    whole: WholeGraph | None = None
    nodes: tuple[str, ...] = ()

    def target_on(self, toolchain: str, device: VirtualDevice = CPU0) -> Target:
        """The partition's target on ``device``, with its options."""
        return Target.make(self.target, toolchain, device, dict(self.options))


@dataclass
class PartitionRuntime:
    """A partition's compiled session and its bound step (module docstring).

    Not frozen: the executor records the latest binding in ``step``, and a simulated partition
    whose int8 model fails at its first run says so in ``numerics`` and ``precision``. Runtimes
    may be shared between executors (each binds its own buffers); copy one with
    `dataclasses.replace` to give it another id or estimate.
    """

    id: str
    target: str
    toolchain: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    estimated_s: float
    kind: Kind  # MEASURED: timed in the plan; SIMULATED: ``estimated_s`` is its latency
    numerics: str  # how outputs are computed ("ort-cpu fp32", "openvino f32", "litert int8", ...)
    plain: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]
    bind: Callable[[dict[str, Any]], Callable[[], None]]
    precision: str = "fp32"  # its arithmetic, for the output check (execute.PRECISIONS)
    on_gpu: bool = False  # its outputs may stay on the GPU for GPU readers (OrtValue buffers)
    step: Callable[[], None] | None = None

    @staticmethod
    def of(inp: RuntimeInput, toolchain: str, kind: Kind, numerics: str,
           plain: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]],
           bind: Callable[[dict[str, Any]], Callable[[], None]], *, precision: str = "fp32",
           on_gpu: bool = False) -> PartitionRuntime:
        """A runtime for ``inp`` (its id, target, tensor names and estimate)."""
        return PartitionRuntime(inp.id, inp.target, toolchain, inp.inputs, inp.outputs,
                                inp.estimated_s, kind, numerics, plain, bind,
                                precision=precision, on_gpu=on_gpu)

    def renamed(self, id: str, estimated_s: float) -> PartitionRuntime:
        """This runtime (same session) under another partition id and estimate."""
        return dataclasses.replace(self, id=id, estimated_s=estimated_s)


def generic_runtime(tc: Toolchain, inp: RuntimeInput) -> PartitionRuntime:
    """A runtime for a toolchain with ``build`` + ``run_outputs(build, feeds, threads)``.

    The partition is built once (`Toolchain.build` on the ONNX bytes, target on the CPU);
    every run, bound or not, is one ``run_outputs`` call whose outputs are copied into the
    bound buffers. A toolchain that also has ``runner_for(build, threads)`` gives a callable
    (feeds -> outputs, as ``run_outputs``) made once here and used for every run instead: it
    holds the ready executable for the runtime's life, so a toolchain cache that evicts it
    cannot put a rebuild inside a timed run. Raises `RuntimeUnavailable` when the toolchain
    cannot run here or cannot build the partition.
    """
    why = tc.available()
    if why:
        raise RuntimeUnavailable(f"partition {inp.id}: toolchain {tc.name} cannot run here: {why}")
    run_outputs = getattr(tc, "run_outputs", None)
    if run_outputs is None:
        raise RuntimeUnavailable(f"partition {inp.id}: toolchain {tc.name} has no run_outputs()")
    t = inp.target_on(tc.name, CPU0)
    build = tc.build(BuildInput(f"exec-{inp.id}", t, inp.onnx_bytes, label=inp.id))
    if not build.ok:
        raise RuntimeUnavailable(f"partition {inp.id}: {tc.name} build failed: {build.error}")
    threads = inp.threads
    runner_for = getattr(tc, "runner_for", None)
    try:
        run: Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]] = (
            runner_for(build, threads) if runner_for is not None
            else lambda feeds: run_outputs(build, feeds, threads))
    except Exception as e:
        raise RuntimeUnavailable(f"partition {inp.id}: {tc.name} cannot load its build: "
                                 f"{type(e).__name__}: {e}") from e
    return runner_runtime(inp, tc.name, run)


def runner_runtime(inp: RuntimeInput, toolchain: str,
                   run: Callable[[Mapping[str, np.ndarray]], Mapping[str, Any]]
                   ) -> PartitionRuntime:
    """A measured runtime whose every run, bound or not, is one ``run(feeds)`` call (named
    ONNX-layout arrays in, named outputs out) whose outputs are copied into the bound
    buffers."""
    inputs, outputs = inp.inputs, inp.outputs

    def plain(feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        res = run({n: feeds[n] for n in inputs})
        return {n: np.asarray(res[n]) for n in outputs}

    def bind(buffers: dict[str, Any]) -> Callable[[], None]:
        ins = {n: buffers[n] for n in inputs}
        outs = {n: buffers[n] for n in outputs}

        def step() -> None:
            res = run(ins)
            for n, b in outs.items():
                np.copyto(b, np.asarray(res[n]).reshape(b.shape))

        return step

    return PartitionRuntime.of(inp, toolchain, Kind.MEASURED, toolchain, plain, bind)
