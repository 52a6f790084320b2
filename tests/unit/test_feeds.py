"""Generated inputs are valid for what the model does with them; ``--input`` fixes a value.

Index inputs (Gather, GatherElements, TopK's k, through Cast/Reshape) are drawn inside the axis
they index; every other input gets exactly the draws it always had, so cost tables measured
before stay comparable. Fixed values travel with the model's metadata into every cut of it,
into plan files, the executor and the LiteRT runner.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from collage_farm import zoo
from collage_farm.cli import main
from collage_farm.core.feeds import (
    INPUT_VALUES_KEY,
    attach_input_values,
    feed_specs,
    input_values,
    parse_input_value,
    random_feeds,
)
from collage_farm.core.graph import ModelError, load_graph
from collage_farm.core.subgraph import SubGraph
from collage_farm.execute import PlanExecutor


def _gather_model(rows: int, axis: int = 0, via_cast: bool = False,
                  idx_type: int = TensorProto.INT64) -> onnx.ModelProto:
    data = np.arange(rows * 3, dtype=np.float32).reshape((rows, 3) if axis == 0 else (3, rows))
    nodes, idx = [], "idx"
    if via_cast:
        nodes.append(helper.make_node("Cast", ["idx"], ["idx64"], to=TensorProto.INT64))
        idx = "idx64"
    nodes.append(helper.make_node("Gather", ["data", idx], ["y"], axis=axis))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("idx", idx_type, [5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [onnx.numpy_helper.from_array(data, "data")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 6), axis=st.sampled_from([0, 1]), via_cast=st.booleans(),
       seed=st.integers(0, 2**16))
def test_gather_indices_are_in_range(rows: int, axis: int, via_cast: bool, seed: int) -> None:
    m = _gather_model(rows, axis, via_cast, TensorProto.INT32 if via_cast else TensorProto.INT64)
    idx = random_feeds(m, seed)["idx"]
    assert idx.min() >= 0 and idx.max() < min(rows, 4)
    _run(m, {"idx": idx})  # ONNX Runtime accepts them


def test_unbounded_integers_keep_their_draws() -> None:
    """An index into an axis of 4 or more, or an integer nothing indexes with, is drawn exactly
    as before bounds existed (rng.integers(0, 4)): earlier cost tables stay comparable."""
    m = _gather_model(50)
    expect = np.random.default_rng(7).integers(0, 4, size=(5,)).astype(np.int64)
    np.testing.assert_array_equal(random_feeds(m, 7)["idx"], expect)
    assert random_feeds(zoo.build("lstm_tagger"), 0)["tokens"].max() < 4


def test_topk_k_is_at_least_one_and_at_most_the_axis() -> None:
    g = helper.make_graph(
        [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2]),
         helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("i", TensorProto.INT64, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    spec = feed_specs(m)["k"]
    assert (spec.low, spec.high) == (1, 3)
    for seed in range(20):
        assert 1 <= int(random_feeds(m, seed)["k"][0]) <= 2


def test_scalar_feeds_stay_zero_dimensional() -> None:
    g = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
                           helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    s = random_feeds(m)["s"]
    assert isinstance(s, np.ndarray) and s.shape == ()


def test_fixed_values_travel_into_every_cut() -> None:
    g = load_graph(zoo.build("gru_speech"), inputs={"speaker": np.asarray(1)})
    assert input_values(g.model) == {"speaker": np.asarray(1)}
    assert random_feeds(g.model, 5)["speaker"].tolist() == [1]
    gather = next(n for n in g.nodes if n.op_type == "Gather")
    sub = SubGraph.of(g, [gather.index]).extract()
    assert json.loads({p.key: p.value for p in sub.metadata_props}[INPUT_VALUES_KEY]) == {
        "speaker": 1}
    other = next(n for n in g.nodes if n.op_type == "MatMul")
    assert INPUT_VALUES_KEY not in {p.key for p in SubGraph.of(g, [other.index])
                                    .extract().metadata_props}


@pytest.mark.parametrize("text, why", [
    ("speaker", "expected NAME=VALUE"), ("=3", "expected NAME=VALUE"),
    ("speaker=x", "must be a number"), ("speaker=", "expected NAME=VALUE")])
def test_parse_input_value_refuses_malformed(text: str, why: str) -> None:
    with pytest.raises(ModelError, match=why):
        parse_input_value(text)


@pytest.mark.parametrize("values, why", [
    ({"nope": 1}, "not an input of the model"),
    ({"speaker": 1.5}, "whole numbers"),
    ({"speaker": [0, 1]}, "do not fit its shape 1")])
def test_attach_refuses_what_does_not_fit(values: dict, why: str) -> None:
    with pytest.raises(ModelError, match=why):
        attach_input_values(zoo.build("gru_speech"), {k: np.asarray(v)
                                                       for k, v in values.items()})


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_input_flag_on_tune_run_and_compare(tmp_path: Path) -> None:
    plan = tmp_path / "gru"
    rc, _, err = _cli(["tune", "zoo:gru_speech", "--mock", "--input", "speaker=1",
                       "--targets", "ort-cpu,openvino-cpu", "--out", str(plan), "--no-report"])
    assert rc == 0, err
    files = sorted((plan / "partitions").glob("*.onnx"))
    assert any(input_values(onnx.load(str(f))) for f in files)
    ex = PlanExecutor(plan)
    assert ex.random_feeds()["speaker"].tolist() == [1]
    assert input_values(ex.reference())["speaker"].tolist() == 1
    assert PlanExecutor(plan, inputs={"speaker": 0}).random_feeds()["speaker"].tolist() == [0]
    rc, out, err = _cli(["run", str(plan), "--input", "speaker=0", "--rounds", "2", "--json"])
    assert rc == 0 and json.loads(out)["check"]["ok"], err
    rc, out, _ = _cli(["compare", "zoo:gru_speech", "--input", "speaker=1", "--targets",
                       "ort-cpu", "--rounds", "2", "--json"])
    assert rc == 0 and "ort-cpu" in json.loads(out)["singles_s"]
    assert not json.loads(out)["single_errors"]


@pytest.mark.parametrize("argv, why", [
    (["tune", "zoo:gru_speech", "--mock", "--input", "speaker=2.5"], "whole numbers"),
    (["tune", "zoo:gru_speech", "--mock", "--input", "nope=1"], "not an input"),
    (["tune", "zoo:gru_speech", "--mock", "--input", "speaker"], "NAME=VALUE"),
    (["compare", "zoo:gru_speech", "--input", "speaker=1,2", "--targets", "ort-cpu"],
     "do not fit")])
def test_bad_input_flag_is_one_line_exit_2(argv: list[str], why: str, tmp_path: Path) -> None:
    if argv[0] == "tune":
        argv = [*argv, "--out", str(tmp_path / "o"), "--no-report"]
    rc, _, err = _cli(argv)
    assert rc == 2 and why in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_run_refuses_an_input_the_plan_has_not(tmp_path: Path) -> None:
    assert _cli(["tune", "zoo:gru_speech", "--mock", "--out", str(tmp_path / "p"),
                 "--no-report"])[0] == 0
    rc, _, err = _cli(["run", str(tmp_path / "p"), "--input", "nope=1"])
    assert rc == 2 and "--input names 'nope'" in err
    rc, _, err = _cli(["run", str(tmp_path / "p"), "--input", "speaker=1,1"])
    assert rc == 2 and "do not fit" in err
