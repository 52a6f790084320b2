"""int8 plans on an Ethos-U board run as they were costed: whole-model ranges, recorded samples.

The model is attention in miniature: scores = x W, plus an additive causal mask (-10000, as
GPT-2's), Softmax, times V, then a projection. Cut into NPU (int8) / host (fp32 Softmax) / NPU
(int8) partitions, the tensor between the mask Add and the Softmax is where calibrating each
partition on its own inputs (what `collage-farm run` did) breaks: its range is [-10000, 4], so
one int8 step (39) swallows every score. The whole model's calibration caps a Softmax input's
range (`runners.calibration.SOFTMAX_SPAN`), and every partition is built with those ranges.
``--calibration-data`` is checked on good and bad files through the CLI, recorded in plan.json
and re-used by ``run``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("ai_edge_litert")

from collage_farm.cli.main import main
from collage_farm.core.calibration_data import CalibrationData, CalibrationSource
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import MAX_IR_VERSION, DataflowGraph, load_graph
from collage_farm.core.plan import make_plan, write_plan
from collage_farm.core.search import PlannedPartition, SearchResult
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import parse_targets
from collage_farm.execute import (
    CALIBRATION_KEY,
    ExecutionMismatch,
    PlanExecutor,
    compare_outputs,
    make_runtime,
)
from collage_farm.execute.numerics import reference_outputs
from collage_farm.report import write_report
from runners.calibration import SOFTMAX_SPAN, calibrate
from runners.runtime_sim import calibrate_partition

NPU, HOST = parse_targets("ethos-u55-128,cortex-m55")
S, D = 8, 16


def _attention() -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def w(name: str, shape: tuple[int, ...], scale: float) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32),
                                       name)

    mask = np.triu(np.full((S, S), -10000.0, np.float32), k=1)[None]
    nodes = [helper.make_node("MatMul", ["x", "wk"], ["scores"], name="scores"),
             helper.make_node("Add", ["scores", "mask"], ["masked"], name="mask_add"),
             helper.make_node("Softmax", ["masked"], ["probs"], axis=-1, name="softmax"),
             helper.make_node("MatMul", ["probs", "v"], ["ctx"], name="context"),
             helper.make_node("MatMul", ["ctx", "wo"], ["y"], name="proj")]
    g = helper.make_graph(
        nodes, "attn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, S, D])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, S, D])],
        [w("wk", (D, S), 0.5), numpy_helper.from_array(mask, "mask"), w("v", (S, D), 1.0),
         w("wo", (D, D), 0.3)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = MAX_IR_VERSION
    return m


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("model") / "attn.onnx"
    onnx.save(_attention(), p)
    return p


def _plan(graph: DataflowGraph, out: Path, source: Path) -> Path:
    """NPU {scores, mask_add} -> host {softmax, context} -> NPU {proj}."""
    idx = {n.name: n.index for n in graph.nodes}
    parts = [(NPU, ("scores", "mask_add")), (HOST, ("softmax", "context")), (NPU, ("proj",))]
    planned = tuple(PlannedPartition(CandidatePartition(
        SubGraph(graph, sum(1 << idx[n] for n in names)), t), Cost(1e-5), 0.0)
        for t, names in parts)
    result = SearchResult(planned, 3e-5, 0, 0, 0, 0, 0.0)
    plan = make_plan(graph, result, [NPU, HOST], estimator="test")
    plan.extra["source"] = str(source)
    write_plan(plan, graph, result, out)
    return out


def test_partitions_use_the_whole_model_ranges_where_their_own_failed(model_file: Path,
                                                                       tmp_path: Path) -> None:
    graph = load_graph(model_file)
    ex = PlanExecutor(_plan(graph, tmp_path / "plan", model_file))
    whole = calibrate(graph, data=CalibrationData.random())
    assert ex.calibration is not None and ex.calibration.source is CalibrationSource.RANDOM
    assert ex.tensor_ranges == whole  # the ranges the costed builds used
    lo, hi = whole["masked"]
    assert hi - lo == pytest.approx(SOFTMAX_SPAN)  # capped: the mask no longer sets the scale
    int8 = [rt for rt in ex.partitions if rt.toolchain == "vela"]
    feeds = ex.random_feeds()
    got = ex.run(feeds)
    assert all("whole-model ranges" in rt.numerics for rt in int8), [rt.numerics for rt in int8]
    # calibrated on its own inputs (as run did), the NPU partition quantises the scores over
    # [-10000, ...]: one int8 step is wider than every score it must keep apart
    own = calibrate_partition(ex.files["p000"].read_bytes(), feeds)
    assert own["masked"][0] < -9000 and (own["masked"][1] - own["masked"][0]) / 255 > 30
    errors = ex.check(feeds)  # passes: within 12 int8 steps of y's calibrated range
    assert errors["y"] <= 8 * ex.int8_steps["y"]
    # the same partitions with per-partition calibration fail the same check
    per_partition = [make_runtime(rt.id, rt.target, rt.toolchain, ex.files[rt.id].read_bytes(),
                                  rt.inputs, rt.outputs, rt.estimated_s)
                     for rt in ex.partitions]
    bad = PlanExecutor.from_runtimes(per_partition, ["x"], ["y"], graph.model)
    ref = reference_outputs(graph.model, ["y"], feeds)
    with pytest.raises(ExecutionMismatch):
        compare_outputs(bad.run(feeds), ref, precision="int8", steps=ex.int8_steps)
    assert "own inputs" in bad.partitions[0].numerics
    assert np.abs(bad.run(feeds)["y"] - ref["y"]).max() > 4 * np.abs(got["y"] - ref["y"]).max()


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _tune(model: Path, out: Path, *extra: str) -> list[str]:
    return ["tune", str(model), "--targets", "ethos-u55-128", "--mock", "--no-report",
            "--out", str(out), *extra]


def test_tune_records_the_calibration_and_run_reuses_it(model_file: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    # the random default, recorded
    rc, _, err = _cli(_tune(model_file, tmp_path / "r"), capsys)
    assert rc == 0, err
    rec = json.loads((tmp_path / "r" / "plan.json").read_text())[CALIBRATION_KEY]
    assert rec == {"source": "random", "samples": 8, "seed": 0}
    # real data: 5 samples in [0, 1], stacked on a leading axis
    data = np.random.default_rng(3).random((5, 1, S, D)).astype(np.float32)
    npz = tmp_path / "cal.npz"
    np.savez(npz, x=data)
    rc, _, err = _cli(_tune(model_file, tmp_path / "f", "--calibration-data", str(npz)), capsys)
    assert rc == 0, err
    rec = json.loads((tmp_path / "f" / "plan.json").read_text())[CALIBRATION_KEY]
    assert rec["source"] == "file" and rec["samples"] == 5 and rec["path"] == str(npz.resolve())
    assert len(rec["sha256"]) == 64
    page = write_report(tmp_path / "f", {}).read_text()  # one line in the report says which
    assert "int8 builds calibrated on the whole model, file: 5 sample(s)" in page
    # run builds the int8 partitions with the same data's ranges, and checks on its samples
    ex = PlanExecutor(tmp_path / "f")
    want = calibrate(load_graph(model_file), data=CalibrationData.load(npz))
    assert ex.tensor_ranges == want != calibrate(load_graph(model_file))
    assert np.array_equal(ex.check_feeds()["x"], data[0])
    rc, out, err = _cli(["run", str(tmp_path / "f"), "--no-singles", "--json", "--rounds", "1",
                         "--min-round-s", "0.001"], capsys)
    assert rc == 0, err
    res = json.loads(out)
    assert res[CALIBRATION_KEY] == rec and res["check"]["ok"]
    assert "int8 steps" in res["check"]["tolerance"]
    # a changed file is refused, in one line; --calibration-data names the data to use
    np.savez(npz, x=data[:2])
    rc, _, err = _cli(["run", str(tmp_path / "f"), "--no-singles"], capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "changed since" in err, err
    d = tmp_path / "npy"
    d.mkdir()
    np.save(d / "x.npy", data[0])  # one sample, in the input's shape
    rc, out, err = _cli(["run", str(tmp_path / "f"), "--no-singles", "--json", "--rounds", "1",
                         "--min-round-s", "0.001", "--calibration-data", str(d)], capsys)
    assert rc == 0, err
    assert json.loads(out)[CALIBRATION_KEY]["samples"] == 1


@pytest.mark.parametrize("case", ["missing", "unknown", "dtype", "shape", "dir", "nan",
                                  "unreadable", "absent", "not_int8"])
def test_bad_calibration_data_is_one_line_exit_2(case: str, model_file: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    x = np.zeros((1, S, D), np.float32)
    path = tmp_path / "cal.npz"
    arrays = {"missing": {"y": x}, "unknown": {"x": x, "z": x},
              "dtype": {"x": x.astype(np.int64)}, "shape": {"x": x[0]},
              "nan": {"x": np.full_like(x, np.nan)}}.get(case)
    if arrays is not None:
        np.savez(path, **arrays)
    elif case == "dir":  # a directory of .npy files: one per input, named after it
        path = tmp_path / "npy"
        path.mkdir()
        np.save(path / "x.npy", np.zeros((2, 1, S, D), np.float32))
        np.save(path / "extra.npy", np.zeros((2, 1, S, D), np.float32))
    elif case == "unreadable":
        path.write_bytes(b"PK\x03\x04 not really a zip")
    elif case == "not_int8":
        np.savez(path, x=x)
    argv = _tune(model_file, tmp_path / "out", "--calibration-data", str(path))
    if case == "not_int8":
        argv[argv.index("ethos-u55-128")] = "ort-cpu"
    rc, _, err = _cli(argv, capsys)
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1, err
    assert "Traceback" not in err and "calibration data" in lines[0]
    want = {"missing": "no array for input 'x' (has: y)", "unknown": "'z' is not an input",
            "dtype": "is float32, the array is int64", "shape": "Nx1x8x16",
            "dir": "'extra' is not an input", "nan": "NaN", "unreadable": "not readable",
            "absent": "no such file", "not_int8": "builds int8"}[case]
    assert want in lines[0], lines[0]
    assert not (tmp_path / "out" / "plan.json").exists()
