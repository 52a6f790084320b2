"""DataflowGraph loading: ordering laws, shapes, kinds, and clear errors for bad models."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from onnx import TensorProto, helper, numpy_helper

from collage_farm.core.graph import ModelError, OpKind, load_graph, parse_shape, random_inputs
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


def _paddle_style_model() -> onnx.ModelProto:
    """A model as paddle2onnx writes it: batch as dim_value -1, '?' spatial dims, -1 in the
    output's declared shape, a reshape target of -1 and an unnamed Constant."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("GlobalAveragePool", ["c"], ["p"]),
             helper.make_node("Constant", [], ["s"],
                              value=numpy_helper.from_array(np.array([-1, 4], np.int64))),
             helper.make_node("Reshape", ["p", "s"], ["y"])]
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3))
                                .astype(np.float32), "w")
    m = _model(nodes, [_vi("x", [-1, 3, "?", "?"])], [_vi("y", [-1, 4])], [w], opset=11)
    m.ir_version = 7
    return m


def test_negative_dim_value_is_dynamic():
    m = _paddle_style_model()
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == -1
    # bound: -1 is not a size the given shape must match ("dim 0 is fixed to -1" before)
    g = load_graph(m, {"x": (1, 3, 48, 192)})
    assert g.tensors["x"].shape == (1, 3, 48, 192)
    assert g.tensors["y"].shape == (1, 4)
    assert [n.op_type for n in g.nodes] == ["Conv", "GlobalAveragePool", "Reshape"]
    # no -1 left anywhere in the loaded model (inputs, outputs, value_info)
    g_ = g.model.graph
    dims = [d for vi in [*g_.input, *g_.output, *g_.value_info]
            for d in vi.type.tensor_type.shape.dim]
    assert dims and all(not d.HasField("dim_value") or d.dim_value >= 0 for d in dims)
    feeds = random_inputs(g)
    assert feeds["x"].shape == (1, 3, 48, 192)
    # a fixed dim still has to match
    with pytest.raises(ModelError, match="dim 1 is fixed to 3"):
        load_graph(m, {"x": (1, 4, 48, 192)})
    # unbound: the usual "bind it" error, naming the dim as dynamic, N in the hint
    with pytest.raises(ModelError, match=r"'x'.*dynamic dimension 0.*--shape x=Nx3xNxN"):
        load_graph(m)
    # the caller's model is not modified
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == -1


def test_bind_input_shapes_on_the_original_model():
    from collage_farm.core.graph import bind_input_shapes

    m = _paddle_style_model()
    bind_input_shapes(m, {"x": (2, 3, 8, 8)})
    assert [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim] == [2, 3, 8, 8]
    assert not m.graph.output[0].type.tensor_type.shape.dim[0].HasField("dim_value")
    assert len(m.graph.node) == 4  # nothing else changed: Constant kept
    with pytest.raises(ModelError, match="not a model input"):
        bind_input_shapes(_paddle_style_model(), {"nope": (1,)})


def test_zero_sized_value_info_is_probed_not_trusted():
    # some exporters write 0 for an unknown size in value_info: it must not become a shape
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])]
    m = _model(nodes, [_vi("x", [2, 4])], [_vi("y", [2, 4])])
    m.graph.value_info.append(_vi("a", [0, 4]))
    g = load_graph(m)
    assert g.tensors["a"].shape == (2, 4)


def _runtime_shape_model() -> onnx.ModelProto:
    """jax2tf/paddle2onnx style: a Reshape target computed at run time from Shape."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Shape", ["r"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
             helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
             helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["r", "target"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array([0], np.int64), "ax0"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    m = _model(nodes, [_vi("x", ["N", 3, 4])], [_vi("y", ["N", -1])], inits, opset=13)
    assert m.graph.output[0].type.tensor_type.shape.dim[1].dim_value == -1
    return m


def test_shape_computations_fold_once_inputs_are_bound():
    m = _runtime_shape_model()
    g = load_graph(m, {"x": (2, 3, 4)})
    # Shape/Gather/Unsqueeze/Concat became one initializer the Reshape reads
    assert [n.op_type for n in g.nodes] == ["Relu", "Reshape"]
    reshape = g.nodes[1]
    assert reshape.inputs[1] in g.initializers
    assert numpy_helper.to_array(g.initializers[reshape.inputs[1]]).tolist() == [2, -1]
    assert g.tensors["y"].shape == (2, 12)
    # numerics: the folded graph computes what the original does
    import onnxruntime as ort

    feeds = random_inputs(g)
    ref = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(g.model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(ref.run(None, feeds)[0], got.run(None, feeds)[0])


def test_data_dependent_shapes_and_float_constants_are_not_folded():
    # Shape of NonZero's output depends on the data: the probe's answer is one run's, not a
    # constant, so the Shape node must stay
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Shape", ["nz"], ["s"]),
             helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["sf", "one"], ["y"]),
             # a float computation on initializers only (an embedding lookup): real work
             helper.make_node("Gather", ["table", "idx"], ["e"], axis=0)]
    inits = [numpy_helper.from_array(np.ones(1, np.float32), "one"),
             numpy_helper.from_array(np.ones((4, 2), np.float32), "table"),
             numpy_helper.from_array(np.array([0, 1], np.int64), "idx")]
    m = _model(nodes, [_vi("x", [2, 3])], [_vi("y", None), _vi("e", None)], inits)
    g = load_graph(m)
    assert [n.op_type for n in g.nodes if n.op_type in ("Shape", "Gather")] == ["Shape", "Gather"]


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


def test_a_crash_of_the_shape_probe_is_a_model_error(monkeypatch):
    """The probe runs the user's model in ONNX Runtime, which a malformed model can crash
    natively (a hypothesis-mutated model once took the test process down with SIGSEGV): the
    child's crash is the user's clear error, and this process goes on."""
    from collage_farm.core import shapes

    monkeypatch.setattr(shapes, "_PROBE_CHILD",
                        "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    nodes = [helper.make_node("NonZero", ["x"], ["nz"]),
             helper.make_node("Transpose", ["nz"], ["y"])]
    with pytest.raises(ModelError, match=r"could not determine shapes.*crashed \(SIGSEGV\)"):
        load_graph(_model(nodes, [_vi("x", [2, 3])], [_vi("y", None, TensorProto.INT64)]))
