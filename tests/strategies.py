"""Hypothesis strategies shared by the graph and search property tests.

`dags()` draws the *structure* of a random dataflow graph (which earlier tensors each node
reads, which op it applies) and builds a real ONNX model from it, so failures shrink to small
graphs. All tensors are float32 [1, 4]; ops mix elementwise, broadcast and matmul kinds.
"""

from __future__ import annotations

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

UNARY = ("Relu", "Sigmoid", "Tanh", "Neg")
BINARY = ("Add", "Mul", "Sub")


@st.composite
def dags(draw: st.DrawFn, min_nodes: int = 1, max_nodes: int = 10) -> onnx.ModelProto:
    n = draw(st.integers(min_nodes, max_nodes))
    n_inputs = draw(st.integers(1, 2))
    tensors = [f"in{i}" for i in range(n_inputs)]
    nodes = []
    inits = []
    used: set[str] = set()
    for i in range(n):
        kind = draw(st.sampled_from(("unary", "binary", "matmul")))
        a = draw(st.sampled_from(tensors))
        out = f"t{i}"
        if kind == "unary":
            nodes.append(helper.make_node(draw(st.sampled_from(UNARY)), [a], [out], name=f"n{i}"))
            used.add(a)
        elif kind == "binary":
            b = draw(st.sampled_from(tensors))
            nodes.append(helper.make_node(draw(st.sampled_from(BINARY)), [a, b], [out],
                                          name=f"n{i}"))
            used |= {a, b}
        else:
            w = f"w{i}"
            rng = np.random.default_rng(i)
            inits.append(numpy_helper.from_array(
                (rng.standard_normal((4, 4)) * 0.5).astype(np.float32), w))
            nodes.append(helper.make_node("MatMul", [a, w], [out], name=f"n{i}"))
            used.add(a)
        tensors.append(out)
    produced = [f"t{i}" for i in range(n)]
    outs = [t for t in produced if t not in used]
    extra = draw(st.lists(st.sampled_from(produced), max_size=2, unique=True))
    outs += [t for t in extra if t not in outs]
    g = helper.make_graph(
        nodes, "dag",
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 4]) for t in tensors[:n_inputs]],
        [helper.make_tensor_value_info(t, TensorProto.FLOAT, [1, 4]) for t in outs],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


def unary_chain(ops: list[str], width: int = 8) -> onnx.ModelProto:
    """A chain of unary ops ``t0 -> op0 -> t1 -> ... -> tN`` on a [1, width] float tensor."""
    nodes = [helper.make_node(op, [f"t{i}"], [f"t{i + 1}"], name=f"n{i}")
             for i, op in enumerate(ops)]
    m = helper.make_model(helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(f"t{len(ops)}", TensorProto.FLOAT, [1, width])]),
        opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m
