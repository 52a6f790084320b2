"""The Cortex-M host of an Ethos-U board as a target of its own ("cortex-m"): analytic costs.

An Ethos-U system runs one TensorFlow Lite Micro (TFLM) interpreter on its Cortex-M core; the
NPU takes the operators Vela compiles and the core runs every other one. So the host is a target
like any other: the search may put any operator the TFLite converter (`runners.tflite`) maps on
it, and it must take every operator the NPU cannot.

Build: the candidate's ONNX sub-model is converted to TFLite, in int8 with the whole model's
ranges (`BuildInput.tensor_ranges`, calibrated once per model) when the converter maps every
node in int8, else in float32 (GATHER, the LayerNorm decomposition, attention's BATCH_MATMUL
between activations: TFLM's float reference kernels run them on the core's FPU). Each TFLite
operator is then priced by the host's cycle model (`runners.host_model`, its figures and
sources are there), with the DEQUANTIZE / QUANTIZE a float partition needs at its boundary. A
node the converter cannot map in either precision is refused before any conversion, with one
line naming it (``Status.UNSUPPORTED``). The conversion stops short of writing the flatbuffer
(nothing runs it: the model prices operators), and the build's artifact is the priced operator
table as JSON (``artifact_kind="host-ops-json"``).

Cost: ``seconds = cycles / host clock``; rows say ``kind=analytic`` (no board, no simulator: a
formula over the converter's MACs and bytes). It is deterministic, so `measure` returns the one
figure as its one sample (n=1) whatever `MeasureConfig` asks for. ``details["host"]`` keeps
every operator's kernel (CMSIS-NN or reference), MACs, bytes and cycles, mapped back to the
ONNX nodes it implements.

Options: ``core`` (``cortex-m55`` for the U55 / U65 boards, ``cortex-m85`` for the U85 ones)
picks the model; ``activations: int16`` (the catalogue's ``cortex-m55-a16`` / ``cortex-m85-a16``)
writes integer partitions as TFLite 16x8 (int16 activations, int8 weights, biases corrected
with the calibration's channel means, as the NPU's ``-a16`` targets) priced with the host
model's int16 kernels, and maps a Softmax over rows the int16 kernel does not resolve in fp32.
Plan partitions on this target are not timed here: the plan executor adds the
estimate and computes the numerics with the int8 TFLite in LiteRT (fp32 ONNX Runtime where the
partition is float), as for Vela's partitions (`runners.runtime_sim`).
"""

from __future__ import annotations

import json
import math
import time
from typing import TYPE_CHECKING, Any

from collage_farm.core.graph import load_graph
from runners.base import (
    BuildInput,
    BuildResult,
    Capabilities,
    DeviceDescription,
    Kind,
    MeasureInput,
    MeasureResult,
    Status,
    Toolchain,
)
from runners.deterministic import (
    ConversionFailed,
    activation_bits,
    convert_for_build,
    one_sample,
    row_fields,
    wide_softmax_why,
)
from runners.host_model import HOST_MODEL_REVISION, HostModel, host_model
from runners.runtime import PartitionRuntime, RuntimeInput
from runners.runtime_sim import simulated_runtime
from runners.tflite import CONVERTER_REVISION, ActivationBits, ConvertedModel, convertible
from runners.tflite.params import _gelu_chain

if TYPE_CHECKING:
    from collage_farm.core.graph import DataflowGraph, Node
    from collage_farm.core.target import Target

__all__ = ["CortexMCapabilities", "CortexMToolchain", "host_mode", "host_of", "joint_groups",
           "price"]

DEFAULT_CORE = "cortex-m55"


def host_mode(node: Node, graph: DataflowGraph, wide: bool = False
              ) -> tuple[str | None, str | None]:
    """(the precision the converter maps ``node`` in, "int8" before "fp32"; why not, if
    neither). ``wide``: a 16x8 host target, whose int16 SOFTMAX does not resolve long rows
    (`runners.deterministic.wide_softmax_why`): such a Softmax is mapped in fp32."""
    if convertible(node, graph, "int8") is None and not (
            wide and node.op_type == "Softmax" and wide_softmax_why(node, graph)):
        return "int8", None
    why = convertible(node, graph, "fp32")
    return ("fp32", None) if why is None else (None, why)


def joint_groups(graph: DataflowGraph) -> list[frozenset[int]]:
    """Node indices the converter maps only together (an Erf exists in TFLite only as part of
    the exact-GELU pattern around it): a partition holding one of them must hold them all."""
    out = []
    for node in graph.nodes:
        if node.op_type == "Erf":
            chain = _gelu_chain(graph, node)
            if not isinstance(chain, str):
                out.append(frozenset(n.index for n in chain))
    return out


class CortexMCapabilities(Capabilities):
    """Every node the TFLite converter maps, in int8 or in float32."""

    style = "graph"

    def why_not(self, node: Node, graph: DataflowGraph) -> str | None:
        return host_mode(node, graph)[1]


def host_of(target: Target) -> HostModel:
    """The cycle model of the target's ``core`` option (ValueError for an unknown core)."""
    return host_model(str(target.option("core", DEFAULT_CORE) or DEFAULT_CORE))


def price(conv: ConvertedModel, host: HostModel, wide: bool = False) -> dict[str, Any]:
    """The host model's cost of a converted model: total, per operator, boundary conversions
    (``wide``: an integer model written 16x8, priced with the int16 kernels)."""
    ops = []
    cycles = 0.0
    mode = "int16" if wide and conv.mode == "int8" else conv.mode
    for info in conv.ops:
        c = host.op_cost(info.op, mode, info.macs, info.bytes, info.out_bytes)
        ops.append({**c.to_json(), "index": info.index, "nodes": list(info.nodes)})
        cycles += c.cycles
    boundary = 0.0
    if conv.mode == "fp32":
        floats_in = sum(math.prod(s.onnx_shape) for s in conv.inputs if s.dtype == "float32")
        floats_out = sum(math.prod(s.onnx_shape) for s in conv.outputs)
        boundary = host.fp32_boundary_cycles(floats_in, floats_out)
    total = cycles + boundary
    return {"mode": mode, "cycles": total, "op_cycles": cycles,
            "boundary_cycles": boundary, "seconds": host.seconds(total), "ops": ops,
            **host.describe()}


class CortexMToolchain(Toolchain):
    """ONNX -> TFLite -> analytic TFLM cycles on a Cortex-M core; see the module docstring."""

    name = "cortex-m"
    device_kind = "cpu"
    kind = Kind.ANALYTIC

    def capabilities(self) -> Capabilities:
        return CortexMCapabilities()

    def available(self) -> str | None:
        try:
            import flatbuffers  # noqa: F401
            from ethosu.vela.tflite import Model  # noqa: F401  (the TFLite schema we write)
        except ImportError as e:
            return f"the TFLite writer needs flatbuffers and ethos-u-vela's schema ({e})"
        return None

    def version(self) -> str:
        return (f"host model {HOST_MODEL_REVISION}; tflite_convert/{CONVERTER_REVISION}")

    def device_description(self, target: Target) -> DeviceDescription:
        try:
            host = host_of(target)
        except ValueError as e:
            return DeviceDescription("cpu", str(target.option("core", "?")),
                                     config=f"invalid config: {e}")
        return DeviceDescription("cpu", host.core, driver="analytic (TFLM cycle model)",
                                 config=host.name)

    def build(self, inp: BuildInput) -> BuildResult:
        t0 = time.perf_counter()

        def failed(status: Status, error: str) -> BuildResult:
            return BuildResult(inp.fingerprint, inp.target, status, error=error,
                               build_s=time.perf_counter() - t0)

        try:
            host = host_of(inp.target)
            graph = load_graph(inp.onnx_bytes)
        except Exception as e:
            return failed(Status.BUILD_FAILED, f"{type(e).__name__}: {e}")
        bits = activation_bits(inp.target.option("activations"))
        wide = bits is ActivationBits.INT16
        modes = set()
        for node in graph.nodes:
            mode, why = host_mode(node, graph, wide)
            if mode is None:
                return failed(Status.UNSUPPORTED, f"{host.core}: the TFLite converter cannot "
                              f"map {node.op_type} node {node.name!r} ({why})")
            modes.add(mode)
        try:
            # the cycle model prices operators, never runs bytes: no flatbuffer is written
            conv, note = convert_for_build(graph, "fp32" if "fp32" in modes else "int8",
                                           inp.tensor_ranges, write=False, activations=bits,
                                           channel_means=inp.channel_means if wide else ())
        except ConversionFailed as e:
            return failed(e.status, e.error)
        est = price(conv, host, wide)
        est["ranges"] = note
        # the artifact is what was priced: the TFLite operators and their cycles, as JSON
        ops = json.dumps(est["ops"], sort_keys=True, default=str).encode()
        return BuildResult(inp.fingerprint, inp.target, Status.OK, artifact=ops,
                           artifact_kind="host-ops-json", build_s=time.perf_counter() - t0,
                           details=(("host", est), ("label", inp.label)))

    def measure(self, inp: MeasureInput) -> MeasureResult:
        """The build's analytic cost as one sample."""
        t0 = time.perf_counter()
        build, config = inp.build, inp.config
        common, failed = row_fields(self, inp)
        if failed is not None:
            return failed
        est = build.detail("host")
        if not isinstance(est, dict):
            est = {"seconds": math.nan}
        details = {**est, "estimate": "analytic: TFLM cycle model / host clock"}
        return one_sample(build, config, float(est["seconds"]), "the host model's figure",
                          details, t0, common)

    def runtime(self, inp: RuntimeInput) -> PartitionRuntime:
        """A plan partition: the estimate as latency, int8 (or fp32) numerics
        (`runners.runtime_sim`)."""
        return simulated_runtime(inp, self.name)
