"""DataflowGraph loading: ordering laws, shapes, kinds, and clear errors for bad models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from onnx import TensorProto, helper, numpy_helper

from collage_farm.graph import ModelError, OpKind, load_graph, parse_shape, random_inputs
from tests.strategies import dags


def _model(nodes, inputs, outputs, inits=(), opset=17):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    return m


def _vi(name, shape, t=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


@settings(max_examples=60, deadline=None)
@given(dags())
def test_post_dfs_order_and_links(model):
    g = load_graph(model)
    for n in g.nodes:
        assert all(p < n.index for p in n.preds)
        assert all(s > n.index for s in n.succs)
        for s in n.succs:
            assert n.index in g.nodes[s].preds
        # descendants: strict, transitive
        d = g.descendants[n.index]
        assert not d >> n.index & 1
        for s in n.succs:
            assert d >> s & 1
            assert g.descendants[s] & ~d == 0
    assert all(t in g.tensors for n in g.nodes for t in n.outputs)


def test_shapes_constant_folding_and_kinds():
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["a"]),
        helper.make_node("Constant", [], ["s"],
                         value=numpy_helper.from_array(np.array([2, 2], np.int64))),
        helper.make_node("Reshape", ["a", "s"], ["r"]),
        helper.make_node("Softmax", ["r"], ["y"]),
    ]
    g = load_graph(_model(nodes, [_vi("x", [1, 4])], [_vi("y", None)], [w]))
    assert [n.op_type for n in g.nodes] == ["MatMul", "Reshape", "Softmax"]  # Constant folded
    assert "s" in g.initializers
    assert g.tensors["y"].shape == (2, 2)
    assert [n.kind for n in g.nodes] == [OpKind.OUT_ELEMWISE_FUSABLE, OpKind.INJECTIVE,
                                         OpKind.COMM_REDUCE]
    assert all(n.name for n in g.nodes)  # unnamed nodes get stable names


def test_unknown_and_custom_domain_ops_are_opaque_not_errors():
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("FancyOp", ["a"], ["y"], domain="com.example")]
    m = _model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4])])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    g = load_graph(m)
    assert g.nodes[1].kind is OpKind.OPAQUE


def test_dynamic_dims_need_binding():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    m = _model(nodes, [_vi("x", ["batch", 3, 8, 8])], [_vi("y", None)])
    with pytest.raises(ModelError, match=r"'x'.*dynamic dimension 0.*'batch'.*--shape x=Nx3x8x8"):
        load_graph(m)
    g = load_graph(m, {"x": (2, 3, 8, 8)})
    assert g.tensors["y"].shape == (2, 3, 8, 8)
    with pytest.raises(ModelError, match="not a model input"):
        load_graph(m, {"nope": (1,)})
    with pytest.raises(ModelError, match="rank"):
        load_graph(m, {"x": (1, 3)})
    assert parse_shape("x=1x3x224x224") == ("x", (1, 3, 224, 224))
    with pytest.raises(ModelError):
        parse_shape("x=1xAx3")


def test_cyclic_graph_is_an_error():
    nodes = [helper.make_node("Add", ["x", "b"], ["a"], name="first"),
             helper.make_node("Relu", ["a"], ["b"], name="second")]
    m = _model(nodes, [_vi("x", [1, 4])], [_vi("b", [1, 4])])
    with pytest.raises(ModelError, match="cycle"):
        load_graph(m)


def test_missing_initializer_and_duplicate_outputs():
    nodes = [helper.make_node("MatMul", ["x", "w_missing"], ["y"], name="mm")]
    with pytest.raises(ModelError, match=r"w_missing.*missing initializer"):
        load_graph(_model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4])]))
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    with pytest.raises(ModelError, match="duplicate graph output"):
        load_graph(_model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4]), _vi("y", [1, 4])]))


def test_truncated_and_random_files(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    good = _model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4])]).SerializeToString()
    p = tmp_path / "trunc.onnx"
    p.write_bytes(good[: len(good) // 2])
    with pytest.raises(ModelError, match=r"trunc\.onnx"):
        load_graph(p)
    r = tmp_path / "random.onnx"
    r.write_bytes(np.random.default_rng(0).bytes(300))
    with pytest.raises(ModelError, match=r"random\.onnx"):
        load_graph(r)
    with pytest.raises(ModelError, match="no such file"):
        load_graph(tmp_path / "absent.onnx")


def test_newer_opset_rejected():
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    m = _model(nodes, [_vi("x", [1, 4])], [_vi("y", [1, 4])])
    m.opset_import[0].version = onnx.defs.onnx_opset_version() + 5
    with pytest.raises(ModelError, match="opset"):
        load_graph(m)


def test_shape_probe_fills_data_dependent_shapes():
    # NonZero's output shape is data dependent: static inference cannot give it
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["y"])]
    g = load_graph(_model(nodes, [_vi("x", [2, 3])], [_vi("y", None, TensorProto.INT64)]))
    feeds = random_inputs(g)
    assert feeds["x"].shape == (2, 3)
    assert len(g.tensors["nz"].shape) == 2 and g.tensors["nz"].shape[0] == 2
