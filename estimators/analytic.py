"""AnalyticEstimator: a roofline lower bound on a candidate's latency, from FLOPs and bytes.

Why a bound and not an estimate: the search (`collage_farm.core.search`) evaluates edges lazily. It
pushes every edge with a cost no measurement can beat and measures an edge only when it reaches
the top of the heap, so a candidate whose bound already loses to the best cover is never sent to
the farm. For that to keep the search optimal the bound must never exceed what a runner would
measure, so everything here is deliberately optimistic:

* **work** counts only the arithmetic an operator cannot avoid (a convolution's multiply-adds,
  one operation per element of an elementwise op, ...); operators we do not model count 0;
  convolutions with a spatial kernel larger than 1 are divided by `FAST_CONV_FACTOR`, because
  Winograd / FFT algorithms do fewer multiplications than the direct form (F(6x6, 3x3) ~5x;
  measured here: ORT reaches 137 "direct" GFLOP/s on one core for a 3x3 conv);
* **bytes** count the tensors crossing the sub-graph's boundary (read once, written once) plus
  its weights (read once); intermediate tensors are assumed to stay in registers;
* **peaks** are above what any device of the kind reaches (`DEVICE_PEAKS`, documented there);
* the bound is ``max(flops / peak_flops, bytes / peak_bandwidth) + floor`` (roofline: a kernel
  is limited by whichever resource it saturates; a small per-call floor below any runtime's call
  overhead).

Where the bound is useful: it prunes large candidates on slow devices and many-node candidates
whose boundary traffic is large. It is no model of real performance, and costs it answers are
labelled "analytic" wherever they are shown. `TableEstimator(allow_analytic=True)` uses it to
answer costs a cost table does not hold.

On a simulated Ethos-U board the NPU and Cortex-M host bounds are raised to what their known
hardware allows (`estimators.embedded_bound`: MACs at the NPU's MACs per cycle and clock, or at
the host model's cheapest cycles per MAC); the larger of the two bounds is used.

Toolchains whose costs are not physical (the test toolchain ``null`` gives deterministic fake
numbers) get a bound of 0: a physical bound could exceed a fake cost and break optimality.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import DataflowGraph, Node, OpKind
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import Target
from estimators.base import CostEstimator, EstimatorKind, EstimatorStats
from estimators.embedded_bound import embedded_bound_s


@dataclass(frozen=True)
class DevicePeak:
    """Optimistic peaks of one device kind; the roofline divides by these."""

    flops_per_s: float  # arithmetic operations per second (a multiply-add counts 2)
    bytes_per_s: float  # memory traffic per second, from the fastest level a kernel can use
    floor_s: float = 0.0  # a per-call floor no runtime gets under
    element_bytes: float | None = None  # bytes per tensor element if the device re-types data
    note: str = ""

    def bound(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flops_per_s, nbytes / self.bytes_per_s) + self.floor_s


#: Peaks per device kind. Each is chosen above any real device of that kind so the bound holds:
#:
#: * ``cpu`` (per thread): 5 GHz x 2 AVX-512 FMA units x 16 fp32 lanes x 2 = 320 GFLOP/s, rounded
#:   up to 400 GFLOP/s (int8 VNNI reaches 4x fp32, so int8 sub-graphs get ``int8_speedup``);
#:   600 GB/s is L1 load bandwidth at 5 GHz (2 x 64 B/cycle), above any L2/DRAM stream; a call
#:   into ONNX Runtime / OpenVINO costs >= 3 us (as measured on this project's CPU runners),
#:   the floor is 1 us.
#: * ``cuda``: 2,000 TFLOP/s is H100/H200 dense FP8 tensor-core peak (FP16 is half of it);
#:   12 TB/s is above H200 HBM3e (4.8 TB/s) and near L2 bandwidth; a kernel launch is >= 2 us,
#:   the floor is 1 us.
#: * ``ethos-u``: MACs/cycle from the accelerator config (ethos-u55-128: 128) x 2 x 1 GHz (the
#:   U55's usual 500 MHz doubled; the U65's 1 GHz); 64 GB/s is above the 16 B/cycle AXI at 1 GHz;
#:   tensors are int8 on the NPU, so bytes are counted at one byte per element.
DEVICE_PEAKS: dict[str, DevicePeak] = {
    "cpu": DevicePeak(400e9, 600e9, 1e-6, None, "per thread; AVX-512 FMA at 5 GHz, L1 bandwidth"),
    "cuda": DevicePeak(2000e12, 12e12, 1e-6, None, "H100/H200 FP8 tensor-core peak, > HBM3e"),
    "ethos-u": DevicePeak(512e9, 64e9, 0.0, 1.0, "256 MACs x 2 x 1 GHz; int8 elements"),
}

#: Winograd F(6x6, 3x3) does 5.06x fewer multiplications than a direct 3x3 convolution; FFT
#: convolutions save more only on kernels larger than any CNN uses at inference. 6 covers both.
FAST_CONV_FACTOR = 6.0

#: toolchains whose costs are synthetic: their bound is 0
UNBOUNDED_TOOLCHAINS = frozenset({"null"})

_INT8_TYPES = {2, 3}  # onnx UINT8, INT8


@dataclass(frozen=True)
class Work:
    """What a sub-graph must at least do per run."""

    flops: float
    boundary_bytes: int  # inputs read + outputs written
    weight_bytes: int  # initializers read
    boundary_elements: int
    weight_elements: int
    int8: bool  # all float-free (quantised) sub-graph

    @property
    def nbytes(self) -> int:
        return self.boundary_bytes + self.weight_bytes


def _numel(shape: Sequence[int] | None) -> int:
    if shape is None:
        return 0
    n = 1
    for d in shape:
        n *= max(int(d), 0)
    return n


def _shape(graph: DataflowGraph, tensor: str) -> tuple[int, ...] | None:
    if not tensor:
        return None
    info = graph.tensors.get(tensor)
    return info.shape if info is not None else None


def _out_numel(node: Node, graph: DataflowGraph) -> int:
    return sum(_numel(_shape(graph, o)) for o in node.outputs if o)


def _in_numel(node: Node, graph: DataflowGraph, i: int = 0) -> int:
    return _numel(_shape(graph, node.inputs[i])) if len(node.inputs) > i else 0


_ELEMWISE_COST = {  # arithmetic per output element that any implementation needs (>= 1)
    "Identity": 0, "Dropout": 0, "Cast": 0, "CastLike": 0,
}
_NORM_COST = {  # per element, a lower bound on a fused normalisation
    "BatchNormalization": 2,  # x * scale + shift once folded
    "InstanceNormalization": 4,  # mean, variance, normalise, affine
    "GroupNormalization": 4,
    "LayerNormalization": 4,
    "SimplifiedLayerNormalization": 3,
    "RMSNormalization": 3,
    "SkipLayerNormalization": 5,
    "LRN": 3,
}


def node_flops(node: Node, graph: DataflowGraph) -> float:
    """Arithmetic operations (a multiply-add is 2) any implementation of ``node`` performs."""
    op = node.op_type
    if op in ("Conv", "ConvInteger", "QLinearConv"):
        w = _shape(graph, node.inputs[3 if op == "QLinearConv" else 1])
        if not w:
            return 0.0
        direct = 2.0 * _out_numel(node, graph) * _numel(w[1:])  # per output: Cin/g x kernel
        return direct / FAST_CONV_FACTOR if _numel(w[2:]) > 1 else direct
    if op == "ConvTranspose":
        w = _shape(graph, node.inputs[1])
        if not w:
            return 0.0
        direct = 2.0 * _in_numel(node, graph) * _numel(w[1:])  # per input: Cout/g x kernel
        return direct / FAST_CONV_FACTOR if _numel(w[2:]) > 1 else direct
    if op in ("MatMul", "MatMulInteger", "QLinearMatMul", "FusedMatMul"):
        a = _shape(graph, node.inputs[0])
        if not a:
            return 0.0
        return 2.0 * _out_numel(node, graph) * a[-1]
    if op == "Gemm":
        a = _shape(graph, node.inputs[0])
        if not a or len(a) != 2:
            return 0.0
        k = a[0] if node.attrs.get("transA", 0) else a[1]
        return 2.0 * _out_numel(node, graph) * k
    if op in ("MaxPool", "AveragePool", "LpPool"):
        kernel = node.attrs.get("kernel_shape") or ()
        return float(_numel(_shape(graph, node.outputs[0])) * _numel(kernel))
    if op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
        return float(_in_numel(node, graph))
    if op in _NORM_COST:
        return float(_NORM_COST[op] * _numel(_shape(graph, node.outputs[0])))
    if op in ("Softmax", "LogSoftmax"):
        return 3.0 * _out_numel(node, graph)  # exp, sum, scale per element
    if node.kind is OpKind.COMM_REDUCE:
        return float(_in_numel(node, graph))  # every input element is combined once
    if node.kind in (OpKind.ELEMWISE, OpKind.BROADCAST):
        return float(_ELEMWISE_COST.get(op, 1) * _out_numel(node, graph))
    return 0.0  # injective (data movement: counted in bytes at the boundary), opaque, unknown


def sub_graph_work(sub_graph: SubGraph) -> Work:
    """FLOPs of the inside nodes, bytes across the boundary and of the weights."""
    g = sub_graph.graph
    flops = sum(node_flops(n, g) for n in sub_graph.nodes)
    bin_, bout = sub_graph.boundary_bytes()
    wbytes = 0
    welems = 0
    for t in sub_graph.initializer_names:
        info = g.tensors.get(t)
        if info is not None:
            wbytes += info.nbytes
            welems += info.size
    belems = 0
    types: set[int] = set()
    for t in sub_graph.input_tensors + sub_graph.output_tensors:
        info = g.tensors.get(t)
        if info is not None:
            belems += info.size
            types.add(info.elem_type)
    return Work(
        flops=float(flops),
        boundary_bytes=bin_ + bout,
        weight_bytes=wbytes,
        boundary_elements=belems,
        weight_elements=welems,
        int8=bool(types) and types <= _INT8_TYPES,
    )


def ethos_u_peak(target: Target, base: DevicePeak) -> DevicePeak:
    """Scale the Ethos-U peak by the MACs/cycle in the accelerator config name."""
    cfg = str(target.option("accelerator_config", target.name))
    try:
        macs = int(cfg.rsplit("-", 1)[1])
    except (IndexError, ValueError):
        return base
    return replace(base, flops_per_s=macs * 2 * 1e9)


class AnalyticEstimator(CostEstimator):
    """Roofline lower bound per candidate; `estimate` and `lower_bound` both return it.

    ``peaks`` overrides `DEVICE_PEAKS` per device kind; ``threads`` scales the CPU peak (match
    `MeasureConfig.threads`); ``int8_speedup`` multiplies the arithmetic peak for all-int8
    sub-graphs on CPU and CUDA (VNNI / int8 tensor cores).
    """

    label = "analytic"
    kind = EstimatorKind.ANALYTIC
    has_lower_bound = True

    def __init__(
        self,
        peaks: Mapping[str, DevicePeak] | None = None,
        *,
        threads: int = 1,
        int8_speedup: float = 4.0,
    ) -> None:
        self.peaks = dict(DEVICE_PEAKS)
        if peaks:
            self.peaks.update(peaks)
        self.threads = max(1, int(threads))
        self.int8_speedup = int8_speedup
        self._memo: dict[str, float] = {}
        self._work: dict[tuple[int, int], Work] = {}
        self._requested = 0
        self._answered: set[str] = set()

    def peak_for(self, target: Target) -> DevicePeak | None:
        kind = target.device.kind
        peak = self.peaks.get(kind)
        if peak is None:
            return None
        if kind == "cpu" and self.threads > 1:
            peak = replace(peak, flops_per_s=peak.flops_per_s * self.threads,
                           bytes_per_s=peak.bytes_per_s * self.threads)
        if kind == "ethos-u":
            peak = ethos_u_peak(target, peak)
        return peak

    def work(self, candidate: CandidatePartition) -> Work:
        key = (id(candidate.sub_graph.graph), candidate.mask)
        w = self._work.get(key)
        if w is None:
            w = sub_graph_work(candidate.sub_graph)
            self._work[key] = w
        return w

    def bound_seconds(self, candidate: CandidatePartition) -> float:
        fp = candidate.fingerprint
        got = self._memo.get(fp)
        if got is not None:
            return got
        t = candidate.target
        peak = self.peak_for(t)
        if peak is None or t.toolchain in UNBOUNDED_TOOLCHAINS:
            s = 0.0
        else:
            w = self.work(candidate)
            flops_peak = peak.flops_per_s
            if w.int8 and t.device.kind in ("cpu", "cuda"):
                flops_peak *= self.int8_speedup
            if peak.element_bytes is not None:
                nbytes = (w.boundary_elements + w.weight_elements) * peak.element_bytes
            else:
                nbytes = w.nbytes
            s = max(w.flops / flops_peak, nbytes / peak.bytes_per_s) + peak.floor_s
            s = max(s, embedded_bound_s(candidate) or 0.0)  # an Ethos-U board's own hardware
        if not math.isfinite(s) or s < 0:
            s = 0.0
        self._memo[fp] = s
        return s

    def lower_bound(self, candidate: CandidatePartition) -> Cost:
        return Cost(self.bound_seconds(candidate))

    def estimate(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        self._requested += len(candidates)
        out = []
        for c in candidates:
            self._answered.add(c.fingerprint)
            out.append(Cost(self.bound_seconds(c)))
        return out

    def stats(self) -> EstimatorStats:
        n = len(self._answered)
        return EstimatorStats(requested=self._requested, distinct=n, analytic=n)
