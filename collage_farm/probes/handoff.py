"""A toolchain's hand-off probe: identity partitions alone and chained as a plan runs them.

`runners.transitions` defines the rows (fingerprints, the identity models, the ``iso``
measurement of one identity partition timed like a candidate, device copies);
`measure_toolchain_transitions` takes a target's ``launch``, ``iso`` and ``pipe`` rows on
this machine. A ``pipe`` (`measure_pipe`) is two identity partitions chained with the plan
executor's binding (`collage_farm.execute`, the first one's output buffer bound as the second
one's input) and timed warm end to end, like a plan; the boundary excess the transition model
fits is ``pipe - 2 x iso`` (`collage_farm.probes.transitions`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from onnx import TensorProto, helper

from collage_farm.core.target import Target
from collage_farm.execute.executor import PlanExecutor, make_runtime
from runners.base import DeviceDescription, Kind, MeasureConfig, MeasureResult, Status
from runners.measure import summarize, time_callable
from runners.registry import get_toolchain
from runners.transitions import (
    HANDOFF_SIZES,
    LAUNCH_BYTES,
    PROBED_TOOLCHAINS,
    identity_model,
    measure_iso,
    transition_fingerprint,
    warm_config,
)

__all__ = ["measure_pipe", "measure_toolchain_transitions"]


def _stage_model(nbytes: int, src: str, dst: str) -> bytes:
    """One ``Identity`` from ``src`` to ``dst`` on a float32 [1, nbytes/4] tensor (a pipe's
    stage: its tensor names chain it to the next one)."""
    n = max(1, int(nbytes) // 4)
    g = helper.make_graph(
        [helper.make_node("Identity", [src], [dst], name=f"id_{src}")], f"stage_{src}",
        [helper.make_tensor_value_info(src, TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info(dst, TensorProto.FLOAT, [1, n])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m.SerializeToString()


def measure_pipe(target: Target, nbytes: int, config: MeasureConfig, fp: str,
                 device: DeviceDescription, version: str) -> MeasureResult:
    """Two identity partitions chained with the executor's binding, timed warm end to end."""
    t0 = time.perf_counter()
    warm = warm_config(config)
    common: dict[str, Any] = dict(device=device, toolchain_version=version, kind=Kind.MEASURED)
    try:
        threads = max(1, int(config.threads))
        opts = dict(target.options)
        a = make_runtime("a", target.id, target.toolchain, _stage_model(nbytes, "t0", "t1"),
                         ("t0",), ("t1",), 0.0, opts, threads)
        b = make_runtime("b", target.id, target.toolchain, _stage_model(nbytes, "t1", "t2"),
                         ("t1",), ("t2",), 0.0, opts, threads)
        ex = PlanExecutor.from_runtimes([a, b], ("t0",), ("t2",), identity_model(nbytes, 2))
        fn = ex.timed_callable()
        samples, medians = time_callable(fn, warm)
    except Exception as e:
        return MeasureResult(fp, target, Status.RUNTIME_ERROR, warm,
                             error=f"{type(e).__name__}: {str(e)[:2000]}",
                             measure_s=time.perf_counter() - t0, **common)
    return MeasureResult(fp, target, Status.OK, warm, samples=tuple(samples),
                         summary=summarize(samples, medians),
                         measure_s=time.perf_counter() - t0,
                         details=(("stages", 2), ("nbytes", int(nbytes)),
                                  ("binding", "collage_farm.execute")), **common)


def measure_toolchain_transitions(target: Target, config: MeasureConfig | None = None,
                                  sizes: Sequence[int] = HANDOFF_SIZES
                                  ) -> Iterator[MeasureResult]:
    """Launch, iso and pipe results for ``target`` on this machine (in this process).

    Yields results as they are taken (each a cost-table row via `row_from_result`). A
    toolchain that is not available yields nothing; a probe that fails yields a failed result.
    """
    config = config or MeasureConfig()
    tc = get_toolchain(target.toolchain)
    if tc.available() is not None or target.toolchain not in PROBED_TOOLCHAINS:
        return
    dev_label = target.device.label
    device = tc.device_description(target)
    version = tc.version()
    yield measure_iso(tc, target, LAUNCH_BYTES, config,
                      transition_fingerprint("launch", target.toolchain, dev_label))
    for nb in sizes:
        yield measure_iso(tc, target, nb, config,
                          transition_fingerprint("iso", target.toolchain, dev_label, nb))
        yield measure_pipe(target, nb, config,
                           transition_fingerprint("pipe", target.toolchain, dev_label, nb),
                           device, version)
    if hasattr(tc, "clear_cache"):
        tc.clear_cache()
