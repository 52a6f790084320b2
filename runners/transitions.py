"""Measured transition costs: what crossing a partition boundary costs on this machine.

Why measure, and what exactly. The search adds, per partition, its candidate's measured cost
plus a transition penalty (`collage_farm.core.transition`). A candidate's measured cost already
contains one call of its toolchain (the session launch, the Python binding) and whatever the
toolchain does at its own edges (OpenVINO's reorders from NCHW into its blocked layout and
back): the candidate was measured as a standalone model with plain inputs and outputs. So the
penalty must be only what a chain of partitions costs *beyond* the sum of its parts measured
alone; charging the launch floor again would count it twice (a 50 us model would look ~20%
slower than it runs). That excess is measured directly, the same way plans run:

* ``iso``: an identity-like partition (one ``Identity`` node on a float32 tensor of ``nbytes``)
  measured alone, exactly like a candidate (the toolchain's ``measure``, the campaign's
  `MeasureConfig`, its mode included);
* ``pipe``: two such partitions chained, the first one's output buffer bound as the second
  one's input, run with the executor's binding (`collage_farm.execute`, how plans run) and
  timed warm, like a plan end to end (`collage_farm.probes.handoff` measures it, and drives
  the whole per-toolchain probe: it needs the executor, which runners may not use);
* the boundary excess is ``pipe - 2 x iso`` at each size; `collage_farm.core.transition`
  fits ``fixed + per_byte x nbytes`` over the sizes (`MeasuredTransitionModel`). The fixed part
  is the per-partition launch penalty, the per-byte part is split between the tensor's two
  sides (the search charges a hand-off on leaving one partition and on entering the next);
* ``launch``: the identity partition on a 4-byte tensor alone: the toolchain's call floor. It
  is recorded (what a partition costs even when it computes nothing) and reported, not charged
  (it is inside every candidate's cost);
* ``copy``: ``nbytes`` moved between two devices. Host<->host on one memory is zero and not
  measured; host<->CUDA is timed with ONNX Runtime ``OrtValue`` copies where a CUDA EP exists;
  pairs nobody can measure here (two GPUs in a config on a machine without them) come from
  rows measured elsewhere, or from the configuration.

Rows are ordinary cost-table rows (``kind=measured``) with fingerprints::

    transition:launch:<toolchain>:<device>
    transition:iso:<toolchain>:<device>:<nbytes>
    transition:pipe:<toolchain>:<device>:<nbytes>
    transition:copy:<src device>:<dst device>:<nbytes>

``<device>`` is the virtual device label (``cpu:0``, ``cuda:1``). The target column is the
target the rows were measured for (copy rows: a synthetic ``copy`` target on the source device),
so `collage_farm.core.transition.MeasuredTransitionModel.from_rows` can read them back on any
machine, offline included.

This module holds what needs only the runners: the fingerprints, the identity models, the
``iso`` measurement (`measure_iso`) and the device copies (`measure_copies`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from typing import Any

from collage_farm.core.target import Target, VirtualDevice
from runners.base import (
    BuildInput,
    DeviceDescription,
    MeasureConfig,
    MeasureInput,
    MeasureResult,
    Status,
    Toolchain,
)
from runners.cuda import preload_cuda
from runners.measure import summarize, time_callable

__all__ = [
    "HANDOFF_SIZES",
    "LAUNCH_BYTES",
    "PREFIX",
    "PROBED_TOOLCHAINS",
    "copy_fingerprint",
    "copy_target",
    "identity_model",
    "measure_copies",
    "measure_iso",
    "parse_fingerprint",
    "transition_fingerprint",
    "warm_config",
]

PREFIX = "transition:"
LAUNCH_BYTES = 4
#: hand-off probe sizes: a few activations' worth, from a vector to a 224x224x24 feature map
HANDOFF_SIZES = (4 * 1024, 64 * 1024, 512 * 1024, 2 * 1024 * 1024, 8 * 1024 * 1024)
#: toolchains whose partitions the executor can chain on the host (identity probes apply)
PROBED_TOOLCHAINS = ("ort-cpu", "openvino", "litert")


def transition_fingerprint(kind: str, toolchain: str, device: str, nbytes: int | None = None
                           ) -> str:
    """``transition:<kind>:<toolchain>:<device>[:<nbytes>]``."""
    base = f"{PREFIX}{kind}:{toolchain}:{device}"
    return base if nbytes is None else f"{base}:{int(nbytes)}"


def copy_fingerprint(src: str, dst: str, nbytes: int) -> str:
    """``transition:copy:<src>:<dst>:<nbytes>`` (device labels, e.g. ``cuda:0``)."""
    return f"{PREFIX}copy:{src}:{dst}:{int(nbytes)}"


def _split_label(parts: list[str]) -> tuple[str, list[str]]:
    """Re-join a device label (``cpu:0`` or ``cpu:0/mcu``) from the front of ``parts``."""
    return ":".join(parts[:2]), parts[2:]


def parse_fingerprint(fp: str) -> dict[str, Any] | None:
    """The fields of a transition fingerprint, or None for any other fingerprint."""
    if not fp.startswith(PREFIX):
        return None
    parts = fp[len(PREFIX):].split(":")
    kind = parts[0]
    try:
        if kind == "copy":
            src, rest = _split_label(parts[1:])
            dst, rest = _split_label(rest)
            return {"kind": kind, "src": src, "dst": dst, "nbytes": int(rest[0])}
        toolchain = parts[1]
        device, rest = _split_label(parts[2:])
        nbytes = int(rest[0]) if rest else LAUNCH_BYTES
        return {"kind": kind, "toolchain": toolchain, "device": device, "nbytes": nbytes}
    except (IndexError, ValueError):
        return None


def identity_model(nbytes: int, stages: int = 1) -> bytes:
    """``stages`` chained ``Identity`` nodes on a float32 [1, nbytes/4] tensor, as ONNX bytes.

    Tensor names: ``t0`` (input), ``t1`` ... ``t<stages>`` (the last is the output).
    """
    import onnx
    from onnx import TensorProto, helper

    n = max(1, int(nbytes) // 4)
    nodes = [helper.make_node("Identity", [f"t{i}"], [f"t{i + 1}"], name=f"id{i}")
             for i in range(stages)]
    g = helper.make_graph(
        nodes, "transition_probe",
        [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info(f"t{stages}", TensorProto.FLOAT, [1, n])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                          producer_name="collage-farm.transitions")
    m.ir_version = 10
    onnx.checker.check_model(m)
    return m.SerializeToString()


def warm_config(config: MeasureConfig) -> MeasureConfig:
    """``config`` in warm mode (no eviction): how pipes and copies are timed."""
    return dataclasses.replace(config, mode="warm", flush_bytes=0)


def measure_iso(tc: Toolchain, target: Target, nbytes: int, config: MeasureConfig, fp: str
                ) -> MeasureResult:
    """An identity partition of ``nbytes`` built and measured exactly like a candidate
    (``tc.build`` and ``tc.measure`` with ``config``), filed under fingerprint ``fp``."""
    data = identity_model(nbytes)
    build = tc.build(BuildInput(fp, target, data, label=fp))
    res: MeasureResult = tc.measure(MeasureInput(build, config))
    return dataclasses.replace(res, fingerprint=fp)


def copy_target(src: VirtualDevice) -> Target:
    """The synthetic target copy rows are filed under (toolchain ``copy`` on ``src``)."""
    return Target.make(f"copy-{src.label}", "copy", src)


def measure_copies(pairs: Sequence[tuple[VirtualDevice, VirtualDevice]],
                   config: MeasureConfig | None = None,
                   sizes: Sequence[int] = HANDOFF_SIZES) -> Iterator[MeasureResult]:
    """Copy results for device pairs this machine can time; pairs on one memory yield nothing.

    Host<->CUDA copies use ONNX Runtime ``OrtValue`` (host array -> device OrtValue, and
    ``OrtValue.numpy()`` back), timed with the measurement loop (warm). Other pairs, or CUDA
    without a CUDA build of onnxruntime, yield nothing: their rows must come from a machine
    that has the devices, or the configuration answers.
    """
    import numpy as np

    config = warm_config(config or MeasureConfig())
    try:
        import onnxruntime as ort

        has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    except ImportError:
        has_cuda = False
    if has_cuda:
        preload_cuda()  # device OrtValues need the CUDA libraries the EP would load
    for src, dst in pairs:
        if src.same_memory(dst):
            continue
        kinds = {src.kind, dst.kind}
        if kinds != {"cpu", "cuda"} or not has_cuda:
            continue
        gpu = dst if dst.kind == "cuda" else src
        for nb in sizes:
            fp = copy_fingerprint(src.label, dst.label, nb)
            host = np.ones(max(1, nb // 4), dtype=np.float32)
            t0 = time.perf_counter()
            try:
                if dst.kind == "cuda":
                    def fn(h: Any = host, d: int = gpu.device_id) -> None:
                        ort.OrtValue.ortvalue_from_numpy(h, "cuda", d)
                else:
                    dev_val = ort.OrtValue.ortvalue_from_numpy(host, "cuda", gpu.device_id)

                    def fn(v: Any = dev_val) -> None:
                        v.numpy()
                samples, medians = time_callable(fn, config)
            except Exception as e:
                yield MeasureResult(fp, copy_target(src), Status.RUNTIME_ERROR, config,
                                    error=f"{type(e).__name__}: {str(e)[:2000]}",
                                    measure_s=time.perf_counter() - t0,
                                    device=DeviceDescription("cuda", f"cuda:{gpu.device_id}"),
                                    toolchain_version=f"onnxruntime {ort.__version__}")
                continue
            yield MeasureResult(fp, copy_target(src), Status.OK, config, samples=tuple(samples),
                                summary=summarize(samples, medians),
                                measure_s=time.perf_counter() - t0,
                                device=DeviceDescription("cuda", f"cuda:{gpu.device_id}"),
                                toolchain_version=f"onnxruntime {ort.__version__}",
                                details=(("nbytes", int(nb)), ("api", "OrtValue")))
