"""The ``null`` toolchain: deterministic fake costs, for tests, load tests and fault drills.

Why it exists: the farm, the cost table and the search need a toolchain that takes every op,
costs nothing to "compile", answers in microseconds and gives the same number for the same
candidate every time, on any machine, so that their tests do not depend on ONNX Runtime timing
noise. Its costs are a formula over the sub-model's structure (a FLOP-ish count from shapes plus
a per-node and per-call overhead), scaled by a per-fingerprint factor in [0.95, 1.05), so that
equal fingerprints cost the same and different ones differ. Rows say what they are: ``kind`` is
`Kind.ANALYTIC` and details carry ``("fake", True)``; never mix them with measured rows.

Fault injection, through target options (a substring of the fingerprint or the label; ``"*"``
matches everything):

* ``crash_on``: the worker process dies (``crash_mode``: ``"abort"`` SIGABRT, the default,
  ``"segv"`` SIGSEGV like Vela on bad input, ``"exit"`` exit code 139);
* ``hang_on``: sleeps forever (the runner's timeout must kill it);
* ``leak_on``: allocates and touches memory, 32 MiB every 10 ms, like a toolchain leaking on
  one odd candidate (the worker's RSS cap must kill it). It stops growing at ``leak_max_mb``
  (default 4096) and then hangs, so a run without a cap ends in a timeout, not in the machine's
  OOM killer;
* ``fail_on``: build returns BUILD_FAILED, measure returns RUNTIME_ERROR;
* ``fault_phase``: ``"build"``, ``"measure"`` or ``"both"`` (default) says where faults fire;
* ``sleep_s``: every measure sleeps this long (simulates real measurement time in load tests);
* ``speed``: divides every cost (two null targets with different speeds make a search choose).
"""

from __future__ import annotations

import math
import os
import signal
import time
import zlib
from typing import TYPE_CHECKING, Any

from collage_farm import __version__
from runners.base import (
    BuildInput,
    BuildResult,
    Capabilities,
    Kind,
    MeasureInput,
    MeasureResult,
    Status,
    Toolchain,
)
from runners.measure import summarize

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node
    from collage_farm.core.target import Target

__all__ = ["NullCapabilities", "NullToolchain", "fake_cost"]

CALL_OVERHEAD_S = 2e-6
NODE_OVERHEAD_S = 0.5e-6
SECONDS_PER_MAC = 0.5e-9  # ~2 GMAC/s: the order of one scalar-ish CPU core
HEAVY = {"Conv", "ConvTranspose", "MatMul", "Gemm", "MatMulInteger", "ConvInteger",
         "QLinearConv", "QLinearMatMul", "Einsum", "Attention", "MultiHeadAttention"}


class NullCapabilities(Capabilities):
    """Takes every node."""

    style = "graph"

    def why_not(self, node: Node, graph: DataflowGraph) -> str | None:
        return None


def _factor(fingerprint: str) -> float:
    return 0.95 + (zlib.crc32(fingerprint.encode()) % 1000) / 10000.0


def fake_cost(onnx_bytes: bytes, fingerprint: str = "", speed: float = 1.0) -> float:
    """Seconds: call overhead + per-node overhead + MACs-ish from the model's shapes."""
    import onnx

    model = onnx.load_from_string(onnx_bytes)
    g = model.graph
    shapes: dict[str, tuple[int, ...]] = {}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            shapes[vi.name] = tuple(max(d.dim_value, 1) for d in vi.type.tensor_type.shape.dim)
    for t in g.initializer:
        shapes[t.name] = tuple(t.dims)

    def numel(name: str) -> int:
        return math.prod(shapes.get(name, (1,)))

    total = CALL_OVERHEAD_S
    for n in g.node:
        out = sum(numel(o) for o in n.output if o)
        work = float(out)
        if n.op_type in HEAVY and len(n.input) >= 2:
            a, w = shapes.get(n.input[0], ()), shapes.get(n.input[1], ())
            if n.op_type.startswith("Conv") or n.op_type == "QLinearConv":
                work = out * (math.prod(w[1:]) if len(w) > 1 else 1)
            else:
                work = out * (a[-1] if a else 1)
        total += NODE_OVERHEAD_S + work * SECONDS_PER_MAC
    return total * _factor(fingerprint) / max(speed, 1e-9)


def _matches(pattern: object, *texts: str) -> bool:
    if not pattern:
        return False
    p = str(pattern)
    return p == "*" or any(p in t for t in texts if t)


_LEAKED: list[bytearray] = []  # what `leak_on` holds on to, as a real leak would


def _leak(max_mb: float, chunk_mb: int = 32) -> None:
    """Grow resident memory until killed; never returns."""
    while len(_LEAKED) * chunk_mb < max_mb:
        _LEAKED.append(bytearray(b"\x01") * (chunk_mb << 20))  # written: resident, not lazy
        time.sleep(0.01)
    while True:
        time.sleep(3600)


class NullToolchain(Toolchain):
    """Fake, deterministic, analytic costs; every op supported; faults on request."""

    name = "null"
    device_kind = "cpu"
    kind = Kind.ANALYTIC

    def capabilities(self) -> Capabilities:
        return NullCapabilities()

    def available(self) -> str | None:
        return None

    def version(self) -> str:
        return f"null {__version__}"

    # --- faults --------------------------------------------------------------------------
    def _fault(self, target: Target, phase: str, *texts: str) -> str | None:
        """Crash or hang here if asked; returns an error text for ``fail_on``."""
        where = str(target.option("fault_phase", "both"))
        if where not in ("both", phase):
            return None
        if _matches(target.option("crash_on"), *texts):
            mode = str(target.option("crash_mode", "abort"))
            if mode == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            elif mode == "exit":
                os._exit(139)
            os.abort()
        if _matches(target.option("hang_on"), *texts):
            while True:
                time.sleep(3600)
        if _matches(target.option("leak_on"), *texts):
            _leak(float(target.option("leak_max_mb", 4096.0)))  # type: ignore[arg-type]
        if _matches(target.option("fail_on"), *texts):
            return f"injected failure ({phase}) for {texts[0]}"
        return None

    # --- Toolchain -----------------------------------------------------------------------
    def build(self, inp: BuildInput) -> BuildResult:
        t0 = time.perf_counter()
        err = self._fault(inp.target, "build", inp.fingerprint, inp.label)
        if err:
            return BuildResult(inp.fingerprint, inp.target, Status.BUILD_FAILED, error=err)
        try:
            cost = fake_cost(inp.onnx_bytes, inp.fingerprint,
                             float(inp.target.option("speed", 1.0)))  # type: ignore[arg-type]
        except Exception as e:
            return BuildResult(inp.fingerprint, inp.target, Status.BUILD_FAILED,
                               error=f"{type(e).__name__}: {e}")
        return BuildResult(
            inp.fingerprint, inp.target, Status.OK, artifact=inp.onnx_bytes,
            artifact_kind="onnx", build_s=time.perf_counter() - t0,
            details=(("fake", True), ("cost_s", cost), ("label", inp.label)),
        )

    def measure(self, inp: MeasureInput) -> MeasureResult:
        import numpy as np

        t0 = time.perf_counter()
        build, config = inp.build, inp.config
        common: dict[str, Any] = dict(
            kind=self.kind, device=self.device_description(build.target),
            toolchain_version=self.version(), build_s=build.build_s,
            details=(("fake", True),),
        )
        if not build.ok:
            return MeasureResult.failed(build, build.status, build.error or "build failed",
                                        config, **common)
        label = str(build.detail("label", "") or "")
        err = self._fault(build.target, "measure", build.fingerprint, label)
        if err:
            return MeasureResult.failed(build, Status.RUNTIME_ERROR, err, config, **common)
        cost = build.detail("cost_s")
        if not isinstance(cost, float):
            try:
                cost = fake_cost(build.artifact, build.fingerprint,
                                 float(build.target.option("speed", 1.0)))  # type: ignore[arg-type]
            except Exception as e:
                return MeasureResult.failed(build, Status.RUNTIME_ERROR,
                                            f"{type(e).__name__}: {e}", config, **common)
        sleep_s = float(build.target.option("sleep_s", 0.0))  # type: ignore[arg-type]
        if sleep_s > 0:
            time.sleep(sleep_s)
        rounds = max(1, config.rounds)
        per_round = max(1, min(config.min_round_runs, config.max_samples // rounds))
        rng = np.random.default_rng(zlib.crc32(build.fingerprint.encode()))
        noise = rng.normal(0.0, 0.01, size=(rounds, per_round))
        samples = cost * (1.0 + np.abs(noise))  # timing noise only ever adds
        medians = [float(np.median(r)) for r in samples]
        flat = tuple(float(x) for x in samples.ravel())
        return MeasureResult(
            fingerprint=build.fingerprint, target=build.target, status=Status.OK,
            config=config, samples=flat, summary=summarize(flat, medians),
            measure_s=time.perf_counter() - t0, **common,
        )
