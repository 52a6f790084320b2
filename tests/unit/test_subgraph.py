"""SubGraph laws: convexity against a path-search definition, boundary sets, extraction."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from hypothesis import given, settings
from hypothesis import strategies as st

from collage_farm.core.graph import DataflowGraph, load_graph, random_inputs
from collage_farm.core.subgraph import SubGraph, SubGraphConfig
from tests.helpers import all_tensors
from tests.strategies import dags


def _convex_by_paths(g: DataflowGraph, inside: set[int]) -> bool:
    """Definition: no path inside -> outside -> ... -> inside."""
    for i in inside:
        stack = [s for s in g.nodes[i].succs if s not in inside]
        seen = set(stack)
        while stack:
            x = stack.pop()
            for s in g.nodes[x].succs:
                if s in inside:
                    return False
                if s not in seen:
                    seen.add(s)
                    stack.append(s)
    return True


@settings(max_examples=80, deadline=None)
@given(dags(min_nodes=2, max_nodes=10), st.data())
def test_convexity_and_boundaries(model, data):
    g = load_graph(model)
    idx = data.draw(st.sets(st.integers(0, len(g) - 1), min_size=1))
    sg = SubGraph.of(g, idx)
    assert sg.is_convex == _convex_by_paths(g, idx)
    for i in range(len(g)):
        n = g.nodes[i]
        inside = i in idx
        assert (sg.input_mask >> i & 1) == (not inside and any(s in idx for s in n.succs))
        assert (sg.output_mask >> i & 1) == (not inside and any(p in idx for p in n.preds))
        if inside:
            ext = n.is_external or any(s not in idx for s in n.succs)
            assert bool(sg.exit_mask >> i & 1) == ext
    assert sg.is_valid(SubGraphConfig(max_depth=1)) == (sg.is_convex and sg.depth <= 1)


def check_extraction(g: DataflowGraph, sg: SubGraph, ref: dict[str, np.ndarray], feeds) -> None:
    sub = sg.extract()
    assert sub.ir_version <= 10
    s = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"])
    sfeeds = {t: (feeds[t] if t in feeds else ref[t]) for t in sg.input_tensors}
    outs = s.run(list(sg.output_tensors), sfeeds)
    for name, val in zip(sg.output_tensors, outs):
        np.testing.assert_allclose(val, ref[name], rtol=1e-4, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(dags(min_nodes=2, max_nodes=10), st.data())
def test_extraction_reproduces_intermediates(model, data):
    g = load_graph(model)
    feeds = random_inputs(g)
    ref = all_tensors(g, feeds)
    idx = data.draw(st.sets(st.integers(0, len(g) - 1), min_size=1))
    sg = SubGraph.of(g, idx)
    if sg.is_convex:
        check_extraction(g, sg, ref, feeds)


def test_extraction_never_reruns_shape_inference(monkeypatch):
    # thousands of candidates per model: shape inference runs once per model, at load
    g = load_graph(_chain(200))

    def boom(*a, **k):
        raise AssertionError("shape inference called during extraction")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", boom)
    sub = SubGraph.of(g, range(50, 80)).extract()
    assert len(sub.graph.node) == 30 and sub.graph.output[0].type.tensor_type.shape.dim


def _chain(n: int) -> onnx.ModelProto:
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu" if i % 2 else "Sigmoid", [f"t{i}"], [f"t{i + 1}"],
                              name=f"n{i}") for i in range(n)]
    g = helper.make_graph(nodes, "chain",
                          [helper.make_tensor_value_info("t0", TensorProto.FLOAT, [1, 8])],
                          [helper.make_tensor_value_info(f"t{n}", TensorProto.FLOAT, [1, 8])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


ZOO_SMALL = {
    "mnist": {},
    "resnet18": {"image_size": 32},
    "resnet50": {"image_size": 32},
    "mobilenet_v2": {"image_size": 32, "width_mult": 0.5},
    "gpt2": {"layers": 2, "width": 32, "heads": 2, "vocab": 50, "seq_len": 8},
    "bert": {"layers": 2, "width": 32, "heads": 2, "vocab": 50, "seq_len": 8},
}


def test_extraction_equivalence_on_zoo_models():
    import random

    from collage_farm import zoo
    from collage_farm.core.rules import RuleOptions, all_candidates, default_spec
    from collage_farm.core.target import BUILTIN_TARGETS

    rng = random.Random(0)
    for name, kw in ZOO_SMALL.items():
        model = zoo.build(name, **kw)
        g = load_graph(model, name=name)
        feeds = random_inputs(g)
        ref = all_tensors(g, feeds)
        spec = default_spec(BUILTIN_TARGETS["ort-cpu"], lambda n, gr: True, "graph",
                            RuleOptions(max_depth=5, max_exits=3, allow_taps=True))
        cands = all_candidates(g, [spec])
        for c in rng.sample(cands, min(25, len(cands))):
            check_extraction(g, c.sub_graph, ref, feeds)
