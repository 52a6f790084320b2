"""PlanExecutor and `collage-farm run`: real ORT and OpenVINO sessions on zoo models.

Plans here are written from hand-made partitions (so they really mix toolchains and cut the
model in awkward places); the checks are against the whole model in ONNX Runtime CPU. Speed is
never asserted: only numerics, mismatch detection and the shape of the CLI output.
"""

from __future__ import annotations

import io
import itertools
import json
import math
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import onnx
import pytest

from collage_farm import zoo
from collage_farm.cli import main
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.core.plan import make_plan, write_plan
from collage_farm.core.search import PlannedPartition, SearchResult
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import parse_targets
from collage_farm.execute import ExecutionMismatch, PlanExecutor, compare_outputs
from collage_farm.execute.builder import Part
from runners.base import MeasureConfig

pytest.importorskip("openvino")
ORT, OV = parse_targets("ort-cpu,openvino-cpu")


def write_parts(graph: DataflowGraph, parts: list[Part], out: Path, source: str = "") -> Path:
    """A plan directory for ``parts`` (in execution order), estimates 10 us each."""
    planned = tuple(PlannedPartition(CandidatePartition(SubGraph(graph, p.mask), p.target),
                                     Cost(1e-5), 0.0) for p in parts)
    result = SearchResult(planned, 1e-5 * len(parts), 0, 0, 0, 0, 0.0)
    plan = make_plan(graph, result, [ORT, OV], estimator="test")
    if source:
        plan.extra["source"] = source
    write_plan(plan, graph, result, out)
    return out


def alternating(graph: DataflowGraph) -> list[Part]:
    return [Part(1 << i, (ORT, OV)[i % 2]) for i in range(len(graph.nodes))]


def chunks(graph: DataflowGraph, k: int) -> list[Part]:
    """``k`` runs of the post-DFS order, alternating targets (runs are convex in a chain)."""
    n = len(graph.nodes)
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [Part(sum(1 << j for j in range(a, b)), (ORT, OV)[i % 2])
            for i, (a, b) in enumerate(itertools.pairwise(bounds)) if b > a]


@pytest.fixture(scope="module")
def mnist() -> DataflowGraph:
    return load_graph(zoo.build("mnist"), name="mnist")


@pytest.fixture(scope="module")
def resnet18() -> DataflowGraph:
    return load_graph(zoo.build("resnet18", image_size=32), name="resnet18")


def test_mnist_alternating_every_node_matches_whole_model(mnist: DataflowGraph, tmp_path: Path
                                                          ) -> None:
    d = write_parts(mnist, alternating(mnist), tmp_path / "plan", "zoo:mnist")
    ex = PlanExecutor(d)
    assert {rt.toolchain for rt in ex.partitions} == {"ort-cpu", "openvino"}
    errors = ex.check()  # reference rebuilt from plan.json's source
    assert set(errors) == set(mnist.graph_outputs)
    # a second, different input still matches (buffers are rebound by value, not stale)
    feeds = {k: v * 3.0 + 1.0 for k, v in ex.random_feeds(seed=1).items()}
    ex.check(feeds)


def test_the_builder_checks_against_its_cached_ort_whole_model(
        mnist: DataflowGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    """A builder that holds ort-cpu's whole-model session (the cut-cost probe builds it)
    takes the reference outputs from it instead of compiling the whole model again; they are
    the outputs a fresh ORT CPU session gives, so a plan checks the same either way."""
    from collage_farm.execute import builder as builder_mod
    from collage_farm.execute.builder import PlanBuilder
    from collage_farm.execute.numerics import reference_outputs

    b = PlanBuilder(mnist)
    whole = b.executor([Part(mnist.all_mask, ORT)])

    def no_fresh_session(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("a second session of the whole model was built")
    monkeypatch.setattr(builder_mod, "reference_outputs", no_fresh_session)
    errors = b.check(b.executor(chunks(mnist, 3)))
    assert set(errors) == set(mnist.graph_outputs)
    fresh = reference_outputs(mnist.model, mnist.graph_outputs, b.feeds(whole))
    for name, ref in fresh.items():
        np.testing.assert_array_equal(b._reference[name], ref)  # type: ignore[index]
    # without that session, the builder compiles the reference itself
    monkeypatch.undo()
    other = PlanBuilder(mnist)
    assert set(other.check(other.executor(chunks(mnist, 3)))) == set(mnist.graph_outputs)


def test_resnet18_chunks_on_two_toolchains(resnet18: DataflowGraph, tmp_path: Path) -> None:
    parts = chunks(resnet18, 5)
    d = write_parts(resnet18, parts, tmp_path / "plan")
    ex = PlanExecutor(d, model=resnet18.model)
    errors = ex.check()
    assert all(math.isfinite(v) for v in errors.values())
    t = ex.measure()
    assert t.summary.n > 0 and t.total_s > 0 and t.simulated_s == 0.0
    assert len(t.measured_partitions) == len(parts)


def test_corrupted_partition_is_a_mismatch_and_run_exits_1(mnist: DataflowGraph,
                                                           tmp_path: Path) -> None:
    d = write_parts(mnist, chunks(mnist, 3), tmp_path / "plan", "zoo:mnist")
    plan = json.loads((d / "plan.json").read_text())
    victim = next(p for p in plan["partitions"] if "Conv" in p["op_types"])
    f = d / victim["file"]
    m = onnx.load(str(f))
    w = max(m.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    arr = onnx.numpy_helper.to_array(w).copy()
    arr.flat[0] += 10.0  # one weight: a real wiring-or-compile error of the smallest kind
    w.CopyFrom(onnx.numpy_helper.from_array(arr, w.name))
    onnx.save(m, str(f))
    with pytest.raises(ExecutionMismatch, match="differs from the whole model"):
        PlanExecutor(d).check()
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        rc = main(["run", str(d), "--no-singles", "--rounds", "1", "--min-round-s", "0.001"])
    assert rc == 1
    assert "NUMERICS MISMATCH" in err.getvalue()


def test_compare_outputs_tolerances() -> None:
    ref = {"y": np.array([1.0, 2.0, 3.0], dtype=np.float32)}
    compare_outputs({"y": ref["y"] * (1 + 5e-4)}, ref)  # within fp32 rtol 1e-3
    with pytest.raises(ExecutionMismatch):
        compare_outputs({"y": ref["y"] * 1.01}, ref)
    compare_outputs({"y": ref["y"] * 1.05}, ref, precision="int8")
    with pytest.raises(ExecutionMismatch, match="missing"):
        compare_outputs({}, ref)
    with pytest.raises(ExecutionMismatch, match="shape"):
        compare_outputs({"y": ref["y"][:2]}, ref)


def test_tf32_tolerance_accepts_what_an_h100_gave_and_still_catches_wiring() -> None:
    """resnet18's logits on ORT CUDA (TF32) vs ORT CPU, measured on an H100: 1.1e-3 absolute,
    10.6% relative on a near-zero logit. fp32's tolerance rejects that; tf32's must accept it,
    and must still reject a swapped pair of outputs (the error a wiring bug makes)."""
    rng = np.random.default_rng(0)
    ref = {"y": rng.standard_normal(1000).astype(np.float32) * 0.3}
    ref["y"][7] = 0.0107
    got = {"y": ref["y"] + rng.uniform(-1.1e-3, 1.1e-3, 1000).astype(np.float32)}
    with pytest.raises(ExecutionMismatch, match="fp32 tolerance"):
        compare_outputs(got, ref)
    compare_outputs(got, ref, precision="tf32")
    swapped = {"y": got["y"].copy()}
    hi, lo = int(np.argmax(ref["y"])), int(np.argmin(ref["y"]))
    swapped["y"][[hi, lo]] = swapped["y"][[lo, hi]]
    with pytest.raises(ExecutionMismatch, match="tf32 tolerance"):
        compare_outputs(swapped, ref, precision="tf32")
    with pytest.raises(ExecutionMismatch):
        compare_outputs({"y": ref["y"][::-1].copy()}, ref, precision="fp16")


def test_loosest_precision_orders_fp32_tf32_fp16_int8() -> None:
    from collage_farm.execute import loosest, tolerance_label

    assert loosest([]) == "fp32"
    assert loosest(["fp32", "tf32"]) == "tf32"
    assert loosest(["tf32", "int8", "fp16"]) == "int8"
    assert loosest(["fp32", "fp16"]) == "fp16"
    assert tolerance_label("tf32") == "tf32 (rtol=0.01, atol=0.01*max|ref|)"
    assert tolerance_label("fp32") == "fp32 (rtol=0.001, atol=0.0001)"


def test_cuda_targets_state_their_precision() -> None:
    from collage_farm.core.target import CUDA0, Target
    from runners.cuda import OrtCudaToolchain, OrtTensorRTToolchain

    cuda, trt = OrtCudaToolchain(), OrtTensorRTToolchain()
    assert cuda.precision(Target.make("a", "ort-cuda", CUDA0)) == "tf32"
    strict = Target.make("b", "ort-cuda", CUDA0, {"tf32": False})
    assert cuda.precision(strict) == "fp32"
    assert cuda._cuda_options(strict)["use_tf32"] == 0
    assert trt.precision(Target.make("c", "ort-tensorrt", CUDA0, {"fp16": True})) == "fp16"
    assert trt.precision(Target.make("d", "ort-tensorrt", CUDA0)) == "tf32"


def test_run_cli_json_reports_measured_and_additive_error(mnist: DataflowGraph,
                                                          tmp_path: Path) -> None:
    d = write_parts(mnist, chunks(mnist, 2), tmp_path / "plan", "zoo:mnist")
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["run", str(d), "--json", "--rounds", "2", "--min-round-s", "0.005",
                   "--report"])
    assert rc == 0
    out = json.loads(buf.getvalue())
    for key in ("plan_measured_s", "estimated_total_s", "additive_error", "singles_s",
                "best_single", "apparent_loss", "check", "partitions", "report",
                "partition_measured_s"):
        assert key in out, key
    assert out["check"]["ok"] is True
    assert set(out["singles_s"]) == {"ort-cpu", "openvino-cpu"}  # target names, as tune
    est, meas = out["estimated_total_s"], out["plan_measured_s"]
    assert out["additive_error"] == pytest.approx((meas - est) / meas)
    best = min(out["singles_s"].values())
    assert out["apparent_loss"] == pytest.approx(meas / best - 1.0)
    assert Path(out["report"]).exists()


def test_executors_sharing_runtimes_keep_their_own_buffers(mnist: DataflowGraph) -> None:
    """Refinement times two plans side by side with shared sessions: no cross-talk."""
    from collage_farm.execute.builder import PlanBuilder

    b = PlanBuilder(mnist)
    a_parts = chunks(mnist, 2)
    ex_a = b.executor(a_parts)
    ex_b = b.executor(a_parts)  # the same cached sessions, bound twice
    fa = ex_a.random_feeds(seed=3)
    fb = {k: -v for k, v in fa.items()}
    ya = ex_a.run(fa)
    yb = ex_b.run(fb)
    ya2 = ex_a.run(fa)
    for k in ya:
        np.testing.assert_array_equal(ya[k], ya2[k])
        assert not np.allclose(ya[k], yb[k])
    b.check(ex_a)


def test_run_times_each_plan_target_whole_with_its_options(mnist: DataflowGraph, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """`run`'s singles are the plan's targets, labelled as `tune` labels them and built with
    the plan's options: a partition on an OpenVINO f16 variant is compared with OpenVINO f16
    whole (it was OpenVINO's defaults, labelled "openvino"), and two variants of one toolchain
    are two singles, not one."""
    import collage_farm.execute.compare as executor_mod  # where compare_interleaved looks it up
    from collage_farm.core.target import CPU0, Target
    from collage_farm.execute import Single, compare_interleaved

    ov16 = Target.make("ov16", "openvino", CPU0, {"precision": "f16"})
    parts = [Part(p.mask, ORT if p.target == ORT else ov16) for p in chunks(mnist, 2)]
    planned = tuple(PlannedPartition(CandidatePartition(SubGraph(mnist, p.mask), p.target),
                                     Cost(1e-5), 0.0) for p in parts)
    result = SearchResult(planned, 1e-5 * len(parts), 0, 0, 0, 0, 0.0)
    d = tmp_path / "plan"
    plan = make_plan(mnist, result, [ORT, ov16], estimator="test")
    plan.extra["source"] = "zoo:mnist"
    write_plan(plan, mnist, result, d)

    built: list[tuple[str, dict | None]] = []
    real = executor_mod.single_executor

    def spy(model, toolchain, **kw):
        built.append((toolchain, kw.get("options")))
        return real(model, toolchain, **kw)

    monkeypatch.setattr(executor_mod, "single_executor", spy)
    buf = io.StringIO()
    with redirect_stdout(buf):
        rc = main(["run", str(d), "--json", "--rounds", "2", "--min-round-s", "0.005"])
    assert rc == 0
    out = json.loads(buf.getvalue())
    assert set(out["singles_s"]) == {"ort-cpu", "ov16"} and not out["single_errors"]
    assert sorted(built, key=lambda b: b[0]) == [("openvino", {"precision": "f16"}),
                                                 ("ort-cpu", None)]
    built.clear()
    res = compare_interleaved(mnist.model, [Single.of(OV), Single.of(ov16)],
                              MeasureConfig(rounds=2, min_round_s=0.005), multi_ep=False)
    assert set(res.singles) == {"openvino-cpu", "ov16"}  # two variants, two singles
