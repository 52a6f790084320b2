"""Vela whole read back from one real Vela compile of the whole model (and its fallback)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm.config import load_config
from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.postsearch.vela_split import Board, SplitSource, vela_split
from collage_farm.postsearch.vela_whole import ethos_u_board, split_info, vela_whole_parts
from collage_farm.report.summary import story
from runners.calibration import calibrate
from runners.ethosu import vela_config
from runners.vela_placement import PlacementError, PlacementSource, vela_placement

pytest.importorskip("ethosu.vela")


def _w(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)


def _model() -> DataflowGraph:
    """conv1 -> relu1 -> conv2 (stride 4, SAME: Vela's U55 refuses it) -> relu2 -> sqrt (the
    int8 converter writes it in float32 only) -> conv3."""
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"], name="relu1"),
        helper.make_node("Conv", ["b", "w2"], ["c"], name="conv2", strides=[4, 4],
                         pads=[0, 0, 1, 1]),
        helper.make_node("Relu", ["c"], ["d"], name="relu2"),
        helper.make_node("Sqrt", ["d"], ["e"], name="sqrt"),
        helper.make_node("Conv", ["e", "w3"], ["y"], name="conv3"),
    ]
    g = helper.make_graph(
        nodes, "vw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 30, 30])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [_w("w1", (8, 4, 3, 3), 1), _w("w2", (8, 8, 3, 3), 2), _w("w3", (4, 8, 1, 1), 3)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return load_graph(m, name="vw")


def _board(system: str) -> Board:
    board = ethos_u_board(load_config(builtin_system=system).selected_targets)
    assert board is not None
    return board


def _names(graph: DataflowGraph, mask: int) -> list[str]:
    return [n.name for n in graph.nodes if mask >> n.index & 1]


def test_the_split_is_read_back_from_one_vela_compile() -> None:
    g = _model()
    board = _board("ethos-u55-128")
    split = vela_split(g, board)
    assert split.source is SplitSource.VELA_COMPILE, split.note
    assert "its int8 part (5 of 6 nodes" in split.note
    assert [(p.target, _names(g, p.mask)) for p in split.parts] == [
        (board.npu, ["conv1", "relu1"]), (board.host, ["conv2", "relu2", "sqrt"]),
        (board.npu, ["conv3"])]
    host = {h.node: h for h in split.on_host}
    assert host["conv2"].source is PlacementSource.VELA and "stride" in host["conv2"].reason.lower()
    # relu2 is fused into conv2's CONV_2D: where Vela put it
    assert host["relu2"].source is PlacementSource.VELA
    assert host["sqrt"].source is PlacementSource.CONVERTER and "Sqrt" in host["sqrt"].reason
    # node by node the capability check takes relu2 (a RELU alone is Vela's), but the
    # converter fuses it into conv2's CONV_2D, which Vela leaves on the CPU: the compile is
    # right, and the disagreement is recorded
    assert split.disagreements == (
        "Relu 'relu2': Vela compile CPU (CONV_2D: Unsupported kernel stride: 4, 4); "
        "capability check NPU",)
    assert vela_split(g, board) is split  # one compile per graph and board
    assert vela_whole_parts(g, board) == list(split.parts)
    info = split_info(g, board)
    assert info["vela_whole_source"].startswith("vela-compile: one Vela compile")
    assert info["vela_whole_split"]["on_host"]["conv2"]["source"] == "vela"


def test_the_u85_takes_the_stride_4_convolution() -> None:
    g = _model()
    board = _board("ethos-u85-256")
    split = vela_split(g, board)
    assert split.source is SplitSource.VELA_COMPILE
    assert [(p.target, _names(g, p.mask)) for p in split.parts] == [
        (board.npu, ["conv1", "relu1", "conv2", "relu2"]), (board.host, ["sqrt"]),
        (board.npu, ["conv3"])]
    assert split.disagreements == ()


def test_without_a_whole_compile_the_capability_check_gives_the_split() -> None:
    nodes = [helper.make_node("Sqrt", ["x"], ["y"], name="sqrt")]
    g0 = helper.make_graph(
        nodes, "fp32only", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    m = helper.make_model(g0, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    g = load_graph(m, name="fp32only")
    board = _board("ethos-u55-128")
    split = vela_split(g, board)
    assert split.source is SplitSource.CAPABILITY
    assert "could not be made" in split.note and "writes none" in split.note
    assert [(p.target, _names(g, p.mask)) for p in split.parts] == [(board.host, ["sqrt"])]
    assert split.on_host[0].source is PlacementSource.CAPABILITY
    assert split_info(g, board)["vela_whole_source"].startswith("capability: ")


def test_the_campaign_story_says_where_the_split_came_from() -> None:
    s = {"written_plan": "p", "dijkstra_plan": "p", "verify": "exact", "baseline": "vela_whole",
         "estimated_total_s": 1e-3, "vela_whole_source": "vela-compile: one Vela compile"}
    lines = [t.text for t in story(s)]
    assert "Vela whole's split: vela-compile: one Vela compile" in lines
    assert not any("Vela whole's split" in t.text
                   for t in story({**s, "vela_whole_source": None}))


def test_a_compile_that_overruns_its_deadline_costs_the_child_not_the_caller() -> None:
    """The whole compile runs in a worker child: past its deadline the child is killed and
    the placement fails in one line, which `vela_split`'s callers turn into the fallback."""
    g = _model()
    board = _board("ethos-u55-128")
    with pytest.raises(PlacementError, match=r"Vela compile of the model \(timeout\)"):
        vela_placement(g, calibrate(g), vela_config(board.npu), timeout_s=0.0)


def test_a_16x8_board_leaves_a_long_softmax_row_to_the_host() -> None:
    """The whole-model compile is int8, whose Softmax Vela takes at any row length; the 16x8
    target's int16 kernel does not resolve rows over 86 entries, so its Vela whole puts that
    Softmax on the host (else no Vela-whole cover exists for a 16x8 campaign to compare with)."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="fc"),
             helper.make_node("Softmax", ["h"], ["y"], name="soft", axis=-1)]
    g = helper.make_graph(
        nodes, "ls", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 200])], [_w("w", (32, 200), 4)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    graph = load_graph(m, name="ls")
    int8 = _board("ethos-u65-256")
    a16 = load_config(builtin_system="ethos-u65-256").variant_of("ethos-u65-256-a16")
    assert a16 is not None
    wide = Board(a16, int8.host)
    assert wide.npu.option("activations") == "int16"
    narrow = vela_split(graph, int8)
    assert narrow.source is SplitSource.VELA_COMPILE and not narrow.on_host
    split = vela_split(graph, wide)
    assert split.source is SplitSource.VELA_COMPILE and not split.disagreements
    assert [(p.node, p.source) for p in split.on_host] == [("soft", PlacementSource.CAPABILITY)]
    assert "rows of 200 entries" in split.on_host[0].reason
    assert "1 Softmax node(s)" in split.note and "16x8" in split.note
    assert [_names(graph, p.mask) for p in split.parts] == [["fc"], ["soft"]]
