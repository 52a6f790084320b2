"""Prefixes cut from one conversion (`runners.tflite.prefix`): the whole model's bytes are
`convert`'s, each prefix runs the whole model's own kernels up to its cut and gives the same
values as ONNX Runtime on the extracted ONNX prefix, and LiteRT's profile cuts its prefixes
from the lowering its build made (no second lowering, no conversion per prefix)."""

from __future__ import annotations

import contextlib
import itertools
import json

import numpy as np
import onnx
import onnx.shape_inference
import onnx.utils
import onnxruntime as ort
import pytest

from collage_farm import zoo
from collage_farm.core.graph import load_graph
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import parse_targets
from collage_farm.probes.cutcost import chunk_masks
from collage_farm.zoo.transformer import gpt2
from runners.base import BuildInput, MeasureInput
from runners.litert import _run_handle
from runners.profile import (
    PROFILE_DETAIL,
    PROFILE_STEPS,
    OperatorProfile,
    ProfileMethod,
    profile_config,
    profile_measure,
    thin_cuts,
)
from runners.registry import get_toolchain
from runners.tflite import ConversionError, convert
from runners.tflite.prefix import Lowered
from runners.topology import OnnxTopology

(LITERT,) = parse_targets("litert-cpu")


@pytest.fixture(scope="module")
def tiny_gpt2() -> onnx.ModelProto:
    return onnx.shape_inference.infer_shapes(gpt2(layers=1, width=64, heads=2, vocab=100,
                                                  seq_len=8))


def _interpreter(data: bytes):  # type: ignore[no-untyped-def]
    interp = pytest.importorskip("ai_edge_litert.interpreter")
    it = interp.Interpreter(model_content=data, num_threads=1)
    it.allocate_tensors()
    return it


def test_whole_is_what_convert_writes(tiny_gpt2: onnx.ModelProto) -> None:
    for m in (tiny_gpt2, zoo.build("mnist")):
        data = m.SerializeToString()
        assert Lowered.of(data).whole().tflite == convert(data, "fp32").tflite


def test_prefixes_give_the_onnx_prefix_values(tiny_gpt2: onnx.ModelProto) -> None:
    data = tiny_gpt2.SerializeToString()
    low = Lowered.of(data)
    topo = OnnxTopology.of(data)
    cuts = thin_cuts(topo, 6)
    assert len(cuts) >= 3
    ids = np.random.default_rng(0).integers(0, 100, (1, 8)).astype(np.int64)
    sizes, counts = [], []
    for p in cuts:
        ops = low.prefix_ops(topo.names[:p])
        assert all(low.ir.ops[i].nodes[0] in topo.names[:p] for i in ops)
        counts.append(len(ops))
        blob = low.prefix(topo.names[:p])
        sizes.append(len(blob))
        it = _interpreter(blob)
        (inp,) = it.get_input_details()
        it.set_tensor(inp["index"], ids.astype(inp["dtype"]))
        it.invoke()
        got = {d["name"]: it.get_tensor(d["index"]) for d in it.get_output_details()}
        sub = onnx.utils.Extractor(tiny_gpt2).extract_model(["input_ids"], sorted(got))
        want = ort.InferenceSession(sub.SerializeToString()).run(None, {"input_ids": ids})
        for out, w in zip(sub.graph.output, want):
            np.testing.assert_allclose(got[out.name], w, rtol=1e-4, atol=1e-5)
    assert counts == sorted(counts) and counts[-1] < len(low.ir.ops)
    assert sizes == sorted(sizes)  # later weights are left out of earlier prefixes
    with pytest.raises(Exception, match="no converted operator"):
        low.prefix([])


def test_litert_profile_cuts_prefixes_from_its_builds_lowering(
        tiny_gpt2: onnx.ModelProto, monkeypatch: pytest.MonkeyPatch) -> None:
    tc = get_toolchain("litert")
    if tc.available() is not None:
        pytest.skip(f"litert unavailable: {tc.available()}")
    lowerings: list[int] = []
    real = Lowered.of

    def counting(model):  # type: ignore[no-untyped-def]
        lowerings.append(1)
        return real(model)
    monkeypatch.setattr(Lowered, "of", staticmethod(counting))
    data = tiny_gpt2.SerializeToString()
    b = tc.build(BuildInput("profile:tiny-gpt2", LITERT, data))
    assert b.ok, b.error
    res = profile_measure(tc, MeasureInput(b, profile_config(rounds=3, runs=5)), data)
    assert res.ok, res.error
    assert len(lowerings) == 1  # the build's lowering, reused for every prefix
    prof = OperatorProfile.from_json(dict(res.details)[PROFILE_DETAIL])
    assert prof.method is ProfileMethod.PREFIXES and len(prof.groups) >= 4
    steps = json.loads(str(dict(res.details)[PROFILE_STEPS]))
    assert steps["prefix_builds"] == len(prof.groups) - 1
    assert 0 <= steps["prefix_lowering_s"] <= steps["prefix_build_s"]
    res = profile_measure(tc, MeasureInput(b, profile_config(rounds=3, runs=5)), bytes(data))
    assert res.ok and len(lowerings) == 2  # other bytes: lowered again, never guessed


def _onnx_chunk(model: onnx.ModelProto, graph, mask: int):  # type: ignore[no-untyped-def]
    """The chunk ``mask`` extracted on its own, its ONNX Runtime session and seeded feeds."""
    sg = SubGraph(graph, mask)
    sess = ort.InferenceSession(sg.extract(name="chunk").SerializeToString())
    rng = np.random.default_rng(mask % 1000)
    feeds = {i.name: (rng.integers(0, 100, i.shape).astype(np.int64) if "int" in i.type
                      else rng.standard_normal(i.shape).astype(np.float32))
             for i in sess.get_inputs()}
    return sg, feeds, dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("which", ["tiny-gpt2", "mnist", "resnet18"])
def test_slices_between_cuts_give_the_extracted_chunks_values(
        which: str, tiny_gpt2: onnx.ModelProto) -> None:
    """Every chunk between two of `Lowered.cuts` (the cut-cost probe's LiteRT chunks) is
    cut from the whole model's lowering and gives what ONNX Runtime gives on the chunk
    extracted as a model of its own; a chunk that starts where the lowering cannot be cut
    is refused."""
    pytest.importorskip("ai_edge_litert.interpreter")
    model = {"tiny-gpt2": tiny_gpt2, "mnist": zoo.build("mnist"),
             "resnet18": zoo.build("resnet18", image_size=32)}[which]
    graph = load_graph(model)
    low = Lowered.of(graph)
    cuts = sorted(low.cuts())
    assert cuts and set(cuts) < set(range(1, len(graph.nodes)))  # some positions, not all
    masks = chunk_masks(graph, 4, cuts)
    bounds = [0, *itertools.accumulate(m.bit_count() for m in masks)]
    assert set(bounds[1:-1]) <= set(cuts)
    tc = get_toolchain("litert")
    for mask in masks:
        sg, feeds, want = _onnx_chunk(model, graph, mask)
        blob = low.slice([n.name for n in sg.nodes], sg.input_tensors, sg.output_tensors)
        got = _run_handle(tc._make(blob, 1), feeds)
        assert set(got) == set(sg.output_tensors)
        for name, w in want.items():
            np.testing.assert_allclose(got[name], w, rtol=1e-4, atol=1e-5)
    bad = min(set(range(1, len(graph.nodes))) - set(cuts))  # a position it cannot cut at
    refused = 0
    for mask in (graph.all_mask & ((1 << bad) - 1), graph.all_mask >> bad << bad):
        sg = SubGraph(graph, mask)
        with contextlib.suppress(ConversionError):
            low.slice([n.name for n in sg.nodes], sg.input_tensors, sg.output_tensors)
            continue
        refused += 1
    assert refused >= 1  # the chunk before it or the one after it cannot be cut
