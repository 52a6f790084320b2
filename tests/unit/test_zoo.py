"""The model zoo: every model is valid ONNX, loads, runs with sane numbers, and is reproducible.

Models are built at small sizes (image_size 32, two-layer width-64 transformers): the
structure is the same code path as full size, and the whole file stays fast. Repeated layers
must be structurally identical, which is checked through Collage's own structural hash.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collage_farm import zoo
from collage_farm.core.graph import DataflowGraph, load_graph, random_inputs
from collage_farm.core.subgraph import SubGraph
from collage_farm.zoo.random_dag import random_dag
from collage_farm.zoo.realclasses import CLASSES

TINY_TF = {"layers": 2, "width": 64, "heads": 2, "vocab": 100, "seq_len": 16}

# name -> (build options, node count, output shapes)
SMALL: dict[str, tuple[dict, int, list[tuple[int, ...]]]] = {
    "mnist": ({}, 11, [(1, 10)]),
    "resnet18": ({"image_size": 32, "num_classes": 10}, 49, [(1, 10)]),
    "resnet50": ({"image_size": 32, "num_classes": 10}, 122, [(1, 10)]),
    "mobilenet_v2": ({"image_size": 32, "width_mult": 0.5, "num_classes": 10}, 100, [(1, 10)]),
    "gpt2": (TINY_TF, 31 * 2 + 5, [(1, 16, 100)]),
    "bert": (TINY_TF, 33 * 2 + 9, [(1, 16, 64), (1, 64)]),
    "random_dag": ({"n_nodes": 30}, 30, []),
}


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _run(model: onnx.ModelProto, seed: int = 0) -> list[np.ndarray]:
    return _session(model).run(None, random_inputs(model, seed))


def _all_tensors(g: DataflowGraph, seed: int = 0) -> dict[str, np.ndarray]:
    """Every node output of a loaded model, by name (one ORT run, optimisations off)."""
    m = onnx.ModelProto()
    m.CopyFrom(g.model)
    del m.graph.output[:]
    names = [o for n in g.nodes for o in n.outputs if o]
    for t in names:
        info = g.tensors[t]
        m.graph.output.append(
            onnx.helper.make_tensor_value_info(t, info.elem_type, list(info.shape)))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return dict(zip(names, s.run(names, random_inputs(g.model, seed))))


@pytest.fixture(scope="module")
def small_models() -> dict[str, onnx.ModelProto]:
    return {name: zoo.build(name, **kw) for name, (kw, _, _) in SMALL.items()}


# --- the registry API --------------------------------------------------------------------


def test_names_and_describe():
    # the seeded topologies, and the classes of real exports (tests/unit/test_realclasses.py)
    assert zoo.names() == sorted([*SMALL, *CLASSES])
    for name in zoo.names():
        text = zoo.describe(name)
        assert text.startswith(f"{name}: ") and "Options:" in text
    assert "layers = number of decoder layers" in zoo.describe("gpt2")
    assert "seq_len=64" in zoo.describe("gpt2")


def test_unknown_model_names_the_known_ones():
    with pytest.raises(zoo.UnknownModelError) as e:
        zoo.build("resnet9000")
    assert isinstance(e.value, KeyError)
    msg = str(e.value)
    assert "resnet9000" in msg and all(n in msg for n in zoo.names())
    with pytest.raises(KeyError):
        zoo.describe("nope")


def test_bad_options_are_reported():
    with pytest.raises(ValueError, match="fixed depth"):
        zoo.build("mnist", layers=3)
    with pytest.raises(TypeError, match="image_size"):
        zoo.build("gpt2", image_size=32)
    with pytest.raises(ValueError, match="depth"):
        zoo.build("resnet50", layers=18, image_size=32)
    with pytest.raises(ValueError, match="divisible"):
        zoo.build("gpt2", layers=1, width=10, heads=3, vocab=10, seq_len=4)


# --- every model -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SMALL))
def test_model_is_valid_loads_and_runs(name, small_models):
    _, n_nodes, shapes = SMALL[name]
    model = small_models[name]
    onnx.checker.check_model(model, full_check=True)
    assert model.ir_version == 10
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert len(model.graph.node) == n_nodes
    node_names = [n.name for n in model.graph.node]
    assert all(node_names) and len(set(node_names)) == len(node_names)
    used = {t for n in model.graph.node for t in n.input}
    assert all(t.name in used for t in model.graph.initializer), "unused initializer"

    g = load_graph(model)
    assert len(g) == n_nodes
    assert all(n.is_external or n.succs for n in g.nodes), "dead node"

    outs = _run(model)
    if shapes:
        assert [o.shape for o in outs] == shapes
    for o in outs:
        assert o.dtype == np.float32 and np.isfinite(o).all()
        assert 0.01 < float(o.std()) < 100, f"{name}: degenerate output (std {o.std()})"


@pytest.mark.parametrize("name", sorted(SMALL))
def test_deterministic_per_seed(name):
    kw = SMALL[name][0]
    a = zoo.build(name, seed=3, **kw).SerializeToString()
    assert zoo.build(name, seed=3, **kw).SerializeToString() == a
    assert zoo.build(name, seed=4, **kw).SerializeToString() != a


def test_seed_changes_weights_not_structure():
    a, b = zoo.build("resnet18", seed=0, image_size=32), zoo.build("resnet18", seed=1,
                                                                  image_size=32)
    assert [n.SerializeToString() for n in a.graph.node] == [
        n.SerializeToString() for n in b.graph.node]
    wa = onnx.numpy_helper.to_array(a.graph.initializer[0])
    wb = onnx.numpy_helper.to_array(b.graph.initializer[0])
    assert wa.shape == wb.shape and not np.array_equal(wa, wb)


def test_activations_stay_meaningful_through_depth():
    """ReLUs neither die nor saturate, softmax is neither uniform nor one-hot."""
    for name, kw in (("resnet50", {"image_size": 64}),
                     ("mobilenet_v2", {"image_size": 64}),
                     ("gpt2", {**TINY_TF, "layers": 4})):
        g = load_graph(zoo.build(name, **kw))
        vals = _all_tensors(g)
        for n in g.nodes:
            v = vals[n.outputs[0]]
            assert np.isfinite(v).all(), n.name
            if n.op_type in ("Relu", "Clip"):
                active = float(np.mean(v > 0))
                assert 0.2 < active < 0.99, (n.name, active)
            if n.op_type == "Clip":
                assert float(np.mean(v >= 6.0)) < 0.1, n.name
            if n.op_type == "Softmax":
                top = float(v.max(axis=-1)[..., 1:].mean())  # row 0 of a causal mask is 1.0
                assert 0.1 < top < 0.95, (n.name, top)
            if n.op_type in ("Add", "Conv") and v.dtype == np.float32 and "mask" not in n.name:
                assert 0.05 < float(v.std()) < 20, (n.name, float(v.std()))


# --- depth and repeated layers -----------------------------------------------------------


def _layer_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.name.startswith("layer")]


@pytest.mark.parametrize("name, per_layer", [("gpt2", 31), ("bert", 33)])
def test_layers_scale_node_count(name, per_layer):
    two = zoo.build(name, **TINY_TF)
    four = zoo.build(name, **{**TINY_TF, "layers": 4})
    assert len(_layer_nodes(two)) == 2 * per_layer
    assert len(_layer_nodes(four)) == 2 * len(_layer_nodes(two))
    assert len(four.graph.node) - len(two.graph.node) == 2 * per_layer
    assert zoo.build(name, layers=3, **{k: v for k, v in TINY_TF.items() if k != "layers"})


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_repeated_layers_share_one_fingerprint(name):
    g = load_graph(zoo.build(name, **{**TINY_TF, "layers": 3}))
    hashes, sigs = [], []
    for i in range(3):
        idx = [n.index for n in g.nodes if n.name.startswith(f"layer{i}/")]
        sg = SubGraph.of(g, idx)
        hashes.append(sg.structural_hash)
        sigs.append([(n.op_type, sorted(n.attrs.items())) for n in sg.nodes])
    assert sigs[0] == sigs[1] == sigs[2]
    assert len(set(hashes)) == 1, "layers differ structurally"


def test_resnet_blocks_share_one_fingerprint():
    g = load_graph(zoo.build("resnet50", image_size=32))
    hashes = {
        SubGraph.of(g, [n.index for n in g.nodes if n.name.startswith(f"layer3.{j}/")])
        .structural_hash
        for j in range(1, 6)
    }
    assert len(hashes) == 1


def test_resnet_depth_option():
    assert len(zoo.build("resnet18", layers=34, image_size=32).graph.node) == 16 * 5 + 3 + 6
    assert zoo.build("resnet18", layers=34, image_size=32).graph.name == "resnet34"


# --- export ------------------------------------------------------------------------------


def test_export_roundtrip(tmp_path):
    path = zoo.export("mnist", tmp_path / "m" / "mnist.onnx", seed=5)
    assert path.exists()
    assert onnx.load(str(path)).SerializeToString() == zoo.build(
        "mnist", seed=5).SerializeToString()
    assert len(load_graph(path)) == 11


def test_export_large_models_use_external_data(tmp_path, monkeypatch):
    monkeypatch.setattr(zoo, "EXTERNAL_DATA_THRESHOLD", 0)
    path = zoo.export("gpt2", tmp_path / "gpt2.onnx", **TINY_TF)
    data = tmp_path / "gpt2.onnx.data"
    assert data.exists() and data.stat().st_size > path.stat().st_size
    g = load_graph(path)
    assert len(g) == 31 * 2 + 5
    reloaded = onnx.load(str(path))
    np.testing.assert_array_equal(_run(reloaded)[0], _run(zoo.build("gpt2", **TINY_TF))[0])


# --- random DAGs -------------------------------------------------------------------------


def _check_dag(model: onnx.ModelProto, n_nodes: int) -> DataflowGraph:
    onnx.checker.check_model(model, full_check=True)
    assert len(model.graph.node) == n_nodes
    g = load_graph(model)
    consumed = {t for n in g.nodes for t in n.inputs}
    assert all(x in consumed for x in g.graph_inputs), "unused graph input"
    assert all(n.is_external or n.succs for n in g.nodes), "dead node"
    assert all(any(t in g.graph_inputs or t in g.producer for t in n.inputs) for n in g.nodes)
    for o in _run(model, seed=n_nodes):
        assert o.shape == (1, 8) and np.isfinite(o).all()
    return g


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_nodes=st.integers(1, 60),
       max_inputs=st.sampled_from([1, 2, 2, 3]))
def test_random_dag_properties(seed, n_nodes, max_inputs):
    model = random_dag(seed, n_nodes, max_inputs=max_inputs)
    g = _check_dag(model, n_nodes)
    assert 1 <= len(g.graph_outputs) <= 3 and 1 <= len(g.graph_inputs) <= 3
    if max_inputs == 1:
        assert all(len(n.preds) <= 1 for n in g.nodes)
    assert random_dag(seed, n_nodes, max_inputs=max_inputs).SerializeToString() == (
        model.SerializeToString())


def test_random_dags_have_the_shapes_that_stress_convexity():
    """Over many seeds: fan-out, reconvergent paths (diamonds), taps and multi-output nodes."""
    counts = {"fanout": 0, "diamond": 0, "multi_output_graph": 0, "tap": 0, "split": 0}
    n_seeds = 60
    for seed in range(n_seeds):
        g = _check_dag(random_dag(seed, 24), 24)
        uses: dict[str, int] = {}
        for n in g.nodes:
            for t in set(n.inputs) - set(g.initializers):
                uses[t] = uses.get(t, 0) + 1
        counts["fanout"] += any(u > 1 for u in uses.values())
        anc: dict[int, int] = {}
        diamond = False
        for n in g.nodes:  # post-DFS order: predecessors come first
            sets = [anc[p] | (1 << p) for p in n.preds]
            diamond |= any(a & b for i, a in enumerate(sets) for b in sets[i + 1:])
            anc[n.index] = 0
            for s in sets:
                anc[n.index] |= s
        counts["diamond"] += diamond
        counts["multi_output_graph"] += len(g.graph_outputs) > 1
        counts["tap"] += any(n.is_external and n.succs for n in g.nodes)
        counts["split"] += any(n.op_type == "Split" for n in g.nodes)
    assert counts["fanout"] > 0.6 * n_seeds, counts
    assert counts["diamond"] > 0.4 * n_seeds, counts
    assert counts["multi_output_graph"] > 0.4 * n_seeds, counts
    assert counts["tap"] > 0.1 * n_seeds, counts
    assert counts["split"] > 0.3 * n_seeds, counts


def test_random_dag_explicit_counts_and_zoo_entry():
    m = random_dag(7, 40, n_graph_inputs=3, n_outputs=3)
    assert len(m.graph.input) == 3 and len(m.graph.output) == 3
    assert zoo.build("random_dag", seed=7, layers=40, n_graph_inputs=3,
                     n_outputs=3).SerializeToString() == m.SerializeToString()
    with pytest.raises(ValueError):
        random_dag(0, 0)
