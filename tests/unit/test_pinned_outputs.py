"""A pinned int8 scale reaches a graph output through an Identity after it (`run`'s check).

A classifier that ends in Softmax -> Identity (PP-OCR's direction classifier does) writes its
output from the Softmax's int8 tensor, whose scale the kernel pins to 1/256 whatever range
calibration saw: the output's step is that scale where the Softmax ran in int8, in the same
partition as the Identity or in the one before, and its calibrated range's step where the
Softmax ran in fp32 (a row of >= 512 entries gets the fp32 stand-in: `runners.runtime_sim`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("ai_edge_litert")

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import MAX_IR_VERSION, load_graph
from collage_farm.core.plan import make_plan, write_plan
from collage_farm.core.search import PlannedPartition, SearchResult
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import parse_targets
from collage_farm.execute import PlanExecutor
from collage_farm.execute.numerics import int8_step, pinned_outputs
from runners.tflite import PINNED_SCALES

NPU, HOST = parse_targets("ethos-u55-128,cortex-m55")


def _classifier(row: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array((rng.standard_normal((16, row)) * 0.5).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="fc"),
             helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
             helper.make_node("Identity", ["probs"], ["y"], name="out"),
             helper.make_node("Relu", ["logits"], ["r"], name="relu"),
             helper.make_node("Identity", ["r"], ["z"], name="out2")]
    g = helper.make_graph(
        nodes, "cls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, row]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4, row])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = MAX_IR_VERSION
    return m


def test_pinned_outputs_follow_tied_operators_back_to_the_pinned_one() -> None:
    found = pinned_outputs(_classifier(8), ["y", "z"])
    assert found == {"y": (("probs", "y"), PINNED_SCALES["Softmax"])}  # a Relu pins nothing


def _executor(tmp_path: Path, row: int, parts: list[tuple[object, tuple[str, ...]]]
              ) -> PlanExecutor:
    src = tmp_path / "cls.onnx"
    onnx.save(_classifier(row), src)
    graph = load_graph(src)
    idx = {n.name: n.index for n in graph.nodes}
    planned = tuple(PlannedPartition(CandidatePartition(
        SubGraph(graph, sum(1 << idx[n] for n in names)), t), Cost(1e-5), 0.0)
        for t, names in parts)
    result = SearchResult(planned, 1e-5 * len(parts), 0, 0, 0, 0, 0.0)
    plan = make_plan(graph, result, [NPU, HOST], estimator="test")
    plan.extra["source"] = str(src)
    write_plan(plan, graph, result, tmp_path / "plan")
    return PlanExecutor(tmp_path / "plan")


@pytest.mark.parametrize("split", [False, True])
def test_an_identity_after_an_int8_softmax_has_the_pinned_step(tmp_path: Path,
                                                               split: bool) -> None:
    parts = ([(NPU, ("fc", "softmax", "relu")), (HOST, ("out", "out2"))] if split
             else [(NPU, ("fc", "softmax", "out", "relu", "out2"))])
    ex = _executor(tmp_path, 8, parts)
    ex.check(ex.check_feeds())  # the int8 plan verifies, and its partitions ran int8
    assert all(rt.precision == "int8" for rt in ex.partitions)
    lo, hi = ex.tensor_ranges["y"]
    assert (hi - lo) / 255 < 1 / 256  # the range's step is finer than the pin
    assert ex.int8_steps["y"] == PINNED_SCALES["Softmax"]
    assert ex.int8_steps["z"] == int8_step(*ex.tensor_ranges["z"])


def test_an_identity_after_an_fp32_softmax_keeps_its_range_step(tmp_path: Path) -> None:
    ex = _executor(tmp_path, 512, [(NPU, ("fc", "softmax", "relu")), (HOST, ("out", "out2"))])
    ex.run(ex.check_feeds())  # the Softmax's 512-entry rows: its partition runs fp32
    assert [rt.precision for rt in ex.partitions] == ["fp32", "int8"]
    assert ex.int8_steps["y"] == int8_step(*ex.tensor_ranges["y"])
