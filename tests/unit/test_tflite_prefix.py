"""Prefixes cut from one conversion (`runners.tflite.prefix`): the whole model's bytes are
`convert`'s, each prefix runs the whole model's own kernels up to its cut and gives the same
values as ONNX Runtime on the extracted ONNX prefix, and LiteRT's profile cuts its prefixes
from the lowering its build made (no second lowering, no conversion per prefix)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx.shape_inference
import onnx.utils
import onnxruntime as ort
import pytest

from collage_farm import zoo
from collage_farm.core.target import parse_targets
from collage_farm.zoo.transformer import gpt2
from runners.base import BuildInput, MeasureInput
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
from runners.tflite import convert
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
