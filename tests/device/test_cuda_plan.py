"""Mixed CPU + CUDA plans on a real GPU: the executor's host/device hand-offs, checked and timed.

Why: the executor keeps a tensor that only CUDA partitions read on the device and binds host
buffers where a CPU partition is on either side; on the H100 only single-toolchain plans ran,
so the hand-offs between ORT CPU and ORT CUDA partitions had never executed on a GPU. Numerics
are checked against the whole model on ORT CPU at the plan's tolerance (tf32 with ort-cuda's
defaults). Speed is printed, never asserted. Skipped without a CUDA-capable onnxruntime.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from collage_farm import zoo
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.core.plan import make_plan, write_plan
from collage_farm.core.search import PlannedPartition, SearchResult
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import Target, parse_targets
from collage_farm.execute import PlanExecutor, compare_interleaved
from runners.base import MeasureConfig
from runners.registry import get_toolchain

pytestmark = pytest.mark.device
CPU_T, CUDA_T = parse_targets("ort-cpu,ort-cuda")
QUICK = MeasureConfig(warmup_runs=2, rounds=3, min_round_runs=5, min_round_s=0.005)


@pytest.fixture(autouse=True)
def _need_cuda() -> None:
    why = get_toolchain("ort-cuda").available()
    if why:
        pytest.skip(f"ort-cuda: {why}")


def plan_dir(graph: DataflowGraph, assignment: list[tuple[range, Target]], out: Path) -> Path:
    """Write a plan whose partitions are the given node ranges (execution order) on targets."""
    parts = tuple(
        PlannedPartition(CandidatePartition(SubGraph(graph, sum(1 << i for i in nodes)), t),
                         Cost(1e-5), 0.0)
        for nodes, t in assignment)
    result = SearchResult(parts, 1e-5 * len(parts), 0, 0, 0, 0, 0.0)
    write_plan(make_plan(graph, result, [CPU_T, CUDA_T], estimator="device-test"), graph,
               result, out)
    return out


def runs(graph: DataflowGraph, targets: list[Target]) -> list[tuple[range, Target]]:
    n = len(graph.nodes)
    cut = [round(i * n / len(targets)) for i in range(len(targets) + 1)]
    return [(range(a, b), t) for (a, b), t in zip(itertools.pairwise(cut), targets) if b > a]


@pytest.mark.parametrize("pattern", ["cpu,cuda", "cuda,cpu,cuda", "cpu,cuda,cuda,cpu"])
def test_resnet18_mixed_cpu_cuda_plan_matches_and_runs(pattern: str, tmp_path: Path) -> None:
    g = load_graph(zoo.build("resnet18", image_size=64), name="resnet18")
    targets = [CUDA_T if p == "cuda" else CPU_T for p in pattern.split(",")]
    ex = PlanExecutor(plan_dir(g, runs(g, targets), tmp_path / "plan"), model=g.model)
    assert ex.precision == "tf32"
    ex.check()
    t = ex.measure(QUICK)
    cmp = compare_interleaved(g.model, ["ort-cpu", "ort-cuda"], QUICK, plan=ex, multi_ep=False)
    assert t.total_s > 0 and cmp.plan is not None and set(cmp.singles) == {"ort-cpu", "ort-cuda"}
    print(f"{pattern}: plan {cmp.plan.total_s * 1e3:.3f} ms, "
          + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in cmp.singles.items()))


def test_mnist_every_node_alternating_cpu_and_cuda(tmp_path: Path) -> None:
    g = load_graph(zoo.build("mnist"), name="mnist")
    assignment = [(range(i, i + 1), (CPU_T, CUDA_T)[i % 2]) for i in range(len(g.nodes))]
    ex = PlanExecutor(plan_dir(g, assignment, tmp_path / "plan"), model=g.model)
    ex.check()
    assert ex.measure(QUICK).total_s > 0
