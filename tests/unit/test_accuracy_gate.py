"""The accuracy gate of a campaign on an Ethos-U board (`collage_farm.campaign.accuracy`).

A model whose int8 activations cannot carry it: one hidden channel 100x the others, so a
per-tensor int8 scale rounds the small channels away, and the next layer reads only those. The
campaign's first plan (int8 NPU) fails `run`'s check; the gate searches the board again with
16-bit NPU activations, whose plan passes, and says both in the summary and its printed line.
``accuracy_check=False`` writes the int8 plan, which `collage-farm run` then refuses: the gate
and ``run`` agree. Real Vela compiles and LiteRT reference kernels, the ``local`` estimator.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("ethosu.regor")
pytest.importorskip("ai_edge_litert.interpreter")

from collage_farm.campaign import TuneOptions, run_tune
from collage_farm.campaign.accuracy import AccuracyVerdict, check_plan, wider_targets
from collage_farm.cli.main import main
from collage_farm.cli.tune import print_summary
from collage_farm.config import load_config
from collage_farm.core.graph import MAX_IR_VERSION
from collage_farm.core.target import BUILTIN_TARGETS
from collage_farm.execute import PlanExecutor
from runners.base import Summary


def _outlier_model() -> onnx.ModelProto:
    """x (16x64) -> MatMul (hidden channel 0 scaled 100x) -> MatMul that ignores channel 0;
    large enough that the NPU is faster than the host for both."""
    rng = np.random.default_rng(7)
    w1 = (rng.normal(size=(64, 256)) / 8).astype(np.float32)
    w1[:, 0] *= 100.0
    w2 = (rng.normal(size=(256, 32)) / 16).astype(np.float32)
    w2[0, :] = 0.0
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
             helper.make_node("MatMul", ["h", "w2"], ["y"], name="fc2")]
    g = helper.make_graph(
        nodes, "outlier", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 32])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = MAX_IR_VERSION
    return m


def _placement(out: Path) -> list[tuple[str, list[str]]]:
    plan = json.loads((out / "plan.json").read_text())
    return [(p["target"], p["nodes"]) for p in plan["partitions"]]


def _opts(tmp: Path, model: Path, **kw: object) -> TuneOptions:
    cfg = load_config(builtin_system="ethos-u65-256")
    return TuneOptions(**{"model": str(model), "targets": tuple(cfg.selected_targets),
                          "out": tmp / "out", "estimator": "local",
                          "transition": cfg.transition, "report": False, **kw})


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gate") / "outlier.onnx"
    onnx.save(_outlier_model(), path)
    return path


def test_a_plan_that_fails_int8_is_searched_again_with_16_bit_activations(
        tmp_path: Path, model: Path) -> None:
    s = run_tune(_opts(tmp_path, model))
    acc = s["accuracy"]
    assert acc["replanned"] is True
    first = acc["first"]["check"]
    assert first["verdict"] == "failed" and first["worst_output"] == "y"
    assert first["worst_steps"] > 12  # the int8 plan is far out of tolerance
    assert first["targets"] == ["ethos-u65-256", "cortex-m55"]
    assert acc["verdict"] == "passed" and acc["worst_steps"] <= 12
    assert s["targets"] == acc["targets"] == ["ethos-u65-256-a16", "cortex-m55"]
    assert len(acc["refused"]) == 1  # the NPU's 16 bits were enough: the host stays int8
    assert "ethos-u65-256-a16" in s["partitions_per_target"]
    # the written plan is the 16-bit one, and `run` verifies it
    assert main(["run", str(tmp_path / "out"), "--no-singles", "--rounds", "1"]) == 0
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_summary(s)
    line = next(ln for ln in printed.getvalue().splitlines() if ln.startswith("accuracy"))
    assert "passed" in line and "failed" in line and "16-bit" in line
    assert s["phases_s"]["accuracy"] > 0
    # the directory holds the written plan's files only, not the refused plan's
    files = {p.name for p in (tmp_path / "out" / "partitions").iterdir()}
    assert files == {Path(p["file"]).name for p in json.loads(
        (tmp_path / "out" / "plan.json").read_text())["partitions"]}
    # `run`'s simulated figure is the plan's estimate: partitions and their boundaries
    ex = PlanExecutor(tmp_path / "out")
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert ex.timing(Summary.of([0.0])).simulated_s == pytest.approx(
        sum(p["estimated_s"] + p["penalty_s"] for p in plan["partitions"]))
    assert ex.timing(Summary.of([0.0])).simulated_s == pytest.approx(s["estimated_total_s"])
    # offline on the table the campaign left: the same two searches, the same plan
    off = run_tune(_opts(tmp_path / "offline", model, estimator="offline",
                         cost_table=tmp_path / "out" / "costs"))
    assert off["accuracy"]["replanned"] is True and off["accuracy"]["verdict"] == "passed"
    assert off["measured"] == 0 and off["estimated_total_s"] == s["estimated_total_s"]
    assert _placement(tmp_path / "offline" / "out") == _placement(tmp_path / "out")


def test_without_the_gate_the_int8_plan_is_written_and_run_refuses_it(
        tmp_path: Path, model: Path) -> None:
    s = run_tune(_opts(tmp_path, model, accuracy_check=False))
    assert "accuracy" not in s
    assert s["targets"] == ["ethos-u65-256", "cortex-m55"]
    assert main(["run", str(tmp_path / "out"), "--no-singles", "--rounds", "1"]) == 1
    check = check_plan(tmp_path / "out", [BUILTIN_TARGETS["ethos-u65-256"]], None)
    assert check.verdict is AccuracyVerdict.FAILED and not check.ok


def test_wider_targets_climb_the_precision_ladder_npu_then_host() -> None:
    u65, m55 = BUILTIN_TARGETS["ethos-u65-256"], BUILTIN_TARGETS["cortex-m55"]
    size = BUILTIN_TARGETS["ethos-u65-256-size"]
    npu16 = wider_targets([u65, size, m55])
    assert npu16 is not None
    assert [t.id for t in npu16] == ["ethos-u65-256-a16", "ethos-u65-256-size-a16", "cortex-m55"]
    assert npu16[0] == BUILTIN_TARGETS["ethos-u65-256-a16"]  # the catalogue's own variants
    assert dict(npu16[1].options)["optimise"] == "Size"
    both16 = wider_targets(npu16)
    assert both16 is not None and both16[2] == BUILTIN_TARGETS["cortex-m55-a16"]
    assert both16[:2] == npu16[:2]
    assert wider_targets(both16) is None  # nothing left to widen
    assert [t.id for t in wider_targets([m55]) or ()] == ["cortex-m55-a16"]


def test_a_check_that_cannot_run_is_an_error_verdict_not_a_crash(tmp_path: Path,
                                                                 model: Path) -> None:
    run_tune(_opts(tmp_path, model, accuracy_check=False))
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    (tmp_path / "out" / plan["partitions"][0]["file"]).write_bytes(b"not an onnx model")
    check = check_plan(tmp_path / "out", [BUILTIN_TARGETS["ethos-u65-256"]], None)
    assert check.verdict is AccuracyVerdict.ERROR and not check.ok
    assert plan["partitions"][0]["file"].split("/")[-1] in check.message


def _host_outlier_model() -> onnx.ModelProto:
    """x -> 1x1 Conv (output channel 0 scaled 100x) -> Conv of stride 4 with SAME padding (the
    U65 leaves it to the host) that reads every channel but channel 0: int8 on the host
    rounds the small channels away whatever the NPU runs."""
    rng = np.random.default_rng(3)
    w1 = (rng.normal(size=(16, 8, 1, 1)) / 3).astype(np.float32)
    w1[0] *= 100.0
    w2 = (rng.normal(size=(16, 16, 5, 5)) / 20).astype(np.float32)
    w2[:, 0] = 0.0
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], name="conv1"),
             helper.make_node("Conv", ["h", "w2"], ["y"], name="conv2", strides=[4, 4],
                              pads=[0, 0, 1, 1])]
    g = helper.make_graph(
        nodes, "hostout", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                          [1, 8, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = MAX_IR_VERSION
    return m


def test_the_ladder_widens_the_host_when_the_npu_alone_is_not_enough(tmp_path: Path) -> None:
    path = tmp_path / "hostout.onnx"
    onnx.save(_host_outlier_model(), path)
    s = run_tune(_opts(tmp_path, path))
    acc = s["accuracy"]
    assert [r["check"]["targets"] for r in acc["refused"]] == [
        ["ethos-u65-256", "cortex-m55"], ["ethos-u65-256-a16", "cortex-m55"]]
    assert all(r["check"]["verdict"] == "failed" for r in acc["refused"])
    assert acc["verdict"] == "passed" and acc["targets"] == ["ethos-u65-256-a16",
                                                             "cortex-m55-a16"]
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert {p["target"] for p in plan["partitions"] if "conv2" in p["nodes"]} == {
        "cortex-m55-a16"}
    assert main(["run", str(tmp_path / "out"), "--no-singles", "--rounds", "1"]) == 0
