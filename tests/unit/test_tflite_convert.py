"""The ONNX -> TFLite converter, checked against ONNX Runtime by running its output in LiteRT.

Why: Vela only estimates the cost of the TFLite it is given and never checks what it computes
(a wrong shape still "compiles"), so the only evidence that an Ethos-U cost belongs to the
candidate is that the converted model computes the same function. Every case converts a zoo
sub-graph (or a hand-built model covering the remaining operators) in fp32 mode, which must match
ONNX Runtime to float rounding, and in int8 mode with ranges from the whole-model calibration,
which must match within quantisation tolerance. Sub-graph inputs are the real intermediate
tensors of the whole model (seeded), not random data, so the calibrated ranges apply.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm import zoo
from collage_farm.core.graph import DataflowGraph, load_graph, random_inputs
from collage_farm.core.subgraph import SubGraph
from runners.calibration import calibrate, clear_memory_cache, model_key
from runners.tflite import (
    ConvertedModel,
    MissingRangeError,
    UnsupportedOp,
    act_qparams,
    convert,
    convertible,
)

Interpreter = pytest.importorskip("ai_edge_litert.interpreter").Interpreter


# --- helpers ------------------------------------------------------------------------------


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so,
                                providers=["CPUExecutionProvider"])


def _ort(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    s = _session(model)
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, dict(feeds))))


def _litert(conv: ConvertedModel, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    it = Interpreter(model_content=conv.tflite, num_threads=1)
    it.allocate_tensors()
    for s in conv.inputs:
        it.set_tensor(s.index, s.to_tflite(feeds[s.name]))
    it.invoke()
    return {s.name: s.from_tflite(it.get_tensor(s.index)) for s in conv.outputs}


def _inner_feeds(g: DataflowGraph, sub: DataflowGraph, seed: int) -> dict[str, np.ndarray]:
    """The sub-graph's inputs as the whole model computes them on seeded inputs."""
    whole = random_inputs(g, seed)
    wanted = [t for t in sub.graph_inputs if t not in whole]
    if not wanted:
        return {t: whole[t] for t in sub.graph_inputs}
    probe = onnx.ModelProto()
    probe.CopyFrom(g.model)
    for t in wanted:
        probe.graph.output.add().name = t
    s = _session(probe)
    vals = dict(zip(wanted, s.run(wanted, whole)))
    return {t: whole[t] if t in whole else vals[t] for t in sub.graph_inputs}


def _check(ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], mode: str,
           conv: ConvertedModel) -> None:
    assert set(got) == set(ref)
    specs = {s.name: s for s in conv.outputs}
    for name, r in ref.items():
        y = got[name]
        assert y.shape == r.shape, name
        if mode == "int8":  # saturation outside the calibrated range is the int8 model's truth
            s = specs[name]
            r = np.clip(r, (-128 - s.zero_point) * s.scale, (127 - s.zero_point) * s.scale)
        err = np.abs(y.astype(np.float64) - r)
        span = float(np.ptp(r)) or 1.0
        if mode == "fp32":
            assert err.max() <= 1e-4 * max(1.0, float(np.abs(r).max())), (name, err.max())
        else:
            # int8: a few output steps plus what input / weight rounding carries through
            assert err.max() <= 0.06 * span + 2 * specs[name].scale, (name, err.max(), span)
            assert err.mean() <= 0.012 * span + specs[name].scale, (name, err.mean(), span)
            if r.size > 8:
                assert np.corrcoef(y.ravel(), r.ravel())[0, 1] > 0.99, name


# --- zoo cases ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graphs() -> dict[str, DataflowGraph]:
    return {
        "mnist": load_graph(zoo.build("mnist"), name="mnist"),
        "resnet18": load_graph(zoo.build("resnet18", image_size=32, num_classes=10),
                               name="resnet18"),
        "mobilenet_v2": load_graph(zoo.build("mobilenet_v2", image_size=32, width_mult=0.5,
                                             num_classes=10), name="mobilenet_v2"),
    }


# case -> (model, node-name prefix or None for the whole model)
CASES = {
    "mnist": ("mnist", None),
    "resnet18_basic_block": ("resnet18", "layer2.0/"),  # strided conv, downsample, residual
    "mobilenet_v2_inverted_residual": ("mobilenet_v2", "features.3/"),  # expand, dw, project
    "mobilenet_v2_strided_block": ("mobilenet_v2", "features.4/"),  # dw stride 2, no residual
}


def zoo_case(graphs: dict[str, DataflowGraph], case: str) -> tuple[DataflowGraph, onnx.ModelProto]:
    model, prefix = CASES[case]
    g = graphs[model]
    if prefix is None:
        return g, g.model
    idx = [n.index for n in g.nodes if n.name.startswith(prefix)]
    assert idx, prefix
    return g, SubGraph.of(g, idx).extract()


@pytest.mark.parametrize("mode", ["fp32", "int8"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_zoo_subgraphs_match_onnxruntime(graphs: dict[str, DataflowGraph], case: str,
                                         mode: str) -> None:
    g, model = zoo_case(graphs, case)
    sub = load_graph(model)
    assert all(convertible(n, sub) is None for n in sub.nodes), case
    ranges = calibrate(g)
    conv = convert(model, mode, ranges if mode == "int8" else None)
    assert conv.mode == mode and conv.tflite[4:8] == b"TFL3"
    # every ONNX node is implemented by some TFLite operator, and the names say which
    covered = {name for o in conv.ops for name in o.nodes}
    assert covered == {n.name for n in sub.nodes}
    assert [s.name for s in conv.inputs] == list(sub.graph_inputs)
    assert [s.name for s in conv.outputs] == list(sub.graph_outputs)
    for seed in (0, 11):  # 0 is a calibration sample, 11 is not
        feeds = _inner_feeds(g, sub, seed)
        _check(_ort(model, feeds), _litert(conv, feeds), mode, conv)


def test_layouts_and_fusions(graphs: dict[str, DataflowGraph]) -> None:
    g, model = zoo_case(graphs, "mobilenet_v2_inverted_residual")
    conv = convert(model, "int8", calibrate(g))
    ops = [o.op for o in conv.ops]
    # expand conv + relu6, depthwise + relu6, project conv, residual add: nothing else
    assert ops == ["CONV_2D", "DEPTHWISE_CONV_2D", "CONV_2D", "ADD"], ops
    assert conv.ops[0].nodes == ("features.3/expand", "features.3/expand_relu6")
    # rank-4 boundaries are NHWC inside the TFLite model
    x = conv.inputs[0]
    assert x.tflite_shape == (x.onnx_shape[0], x.onnx_shape[2], x.onnx_shape[3], x.onnx_shape[1])
    # the depthwise weights carry per-channel scales on the last axis
    it = Interpreter(model_content=conv.tflite)
    dw = [d for d in it.get_tensor_details() if d["name"].endswith("depthwise/weights")]
    assert len(dw) == 1 and dw[0]["shape"][0] == 1
    qp = dw[0]["quantization_parameters"]
    assert qp["quantized_dimension"] == 3 and len(qp["scales"]) == dw[0]["shape"][3]
    # the mnist flatten is the one place a transpose back to NCHW is needed
    mg = graphs["mnist"]
    mops = [o.op for o in convert(mg.model, "int8", calibrate(mg)).ops]
    assert mops.count("TRANSPOSE") == 1 and "RESHAPE" in mops


# --- every other operator the converter maps ----------------------------------------------


def all_ops_model() -> onnx.ModelProto:
    """One model with every mapped op the zoo CNNs do not use (and a Sigmoid|Tanh concat)."""
    rng = np.random.default_rng(1)

    def init(name: str, shape: tuple[int, ...], s: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * s).astype(np.float32), name)

    inits = [
        init("w", (8, 4, 3, 3)), init("b", (8,), 0.1), init("gw", (10, 200), 0.1),
        init("gb", (10,), 0.1), init("cmul", (1, 8, 1, 1)),
        numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
        numpy_helper.from_array(np.array(0.7, np.float32), "hi"),
        numpy_helper.from_array((np.abs(rng.standard_normal((1, 8, 1, 1))) + 0.5)
                                .astype(np.float32), "cdiv"),
        numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
    ]
    n = helper.make_node
    nodes = [
        n("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        n("Sigmoid", ["c"], ["s"], name="sig"),
        n("Tanh", ["c"], ["t"], name="tanh"),
        n("Concat", ["s", "t"], ["st"], name="cat", axis=1),
        n("LeakyRelu", ["c"], ["lr"], name="lrelu", alpha=0.1),
        n("HardSwish", ["lr"], ["hs"], name="hswish"),
        n("Mul", ["hs", "cmul"], ["m"], name="mul"),
        n("Div", ["m", "cdiv"], ["d"], name="div"),
        n("Sub", ["d", "c"], ["sb"], name="sub"),
        n("Clip", ["sb", "lo", "hi"], ["cl"], name="clip"),
        n("Pad", ["cl", "pads"], ["pd"], name="pad"),
        n("AveragePool", ["pd"], ["ap"], name="avgpool", kernel_shape=[3, 3], strides=[2, 2]),
        n("MaxPool", ["ap"], ["mp"], name="maxpool", kernel_shape=[2, 2], pads=[0, 0, 1, 1]),
        n("Flatten", ["mp"], ["fl"], name="flatten", axis=1),
        n("Gemm", ["fl", "gw", "gb"], ["g"], name="gemm", transB=1),
        n("Softmax", ["g"], ["sm"], name="softmax", axis=-1),
        n("GlobalAveragePool", ["st"], ["gap"], name="gap"),
        n("Identity", ["c"], ["ci"], name="ident"),  # of a computed tensor: not folded
        n("GlobalMaxPool", ["ci"], ["gmp"], name="gmp"),
        n("Add", ["gap", "gap"], ["gap2"], name="addself"),
    ]
    outs = [helper.make_tensor_value_info(t, TensorProto.FLOAT, None)
            for t in ("sm", "gap2", "gmp", "st")]
    graph = helper.make_graph(
        nodes, "allops", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
        outs, inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


@pytest.mark.parametrize("mode", ["fp32", "int8"])
def test_every_mapped_operator_matches_onnxruntime(mode: str) -> None:
    g = load_graph(all_ops_model(), name="allops")
    ranges = calibrate(g)
    conv = convert(g, mode, ranges)
    ops = [o.op for o in conv.ops]
    for code in ("LOGISTIC", "TANH", "CONCATENATION", "LEAKY_RELU", "HARD_SWISH", "MUL", "SUB",
                 "MAXIMUM", "MINIMUM", "PAD", "AVERAGE_POOL_2D", "MAX_POOL_2D",
                 "FULLY_CONNECTED", "SOFTMAX", "MEAN", "REDUCE_MAX", "ADD", "RESHAPE"):
        assert code in ops, code
    if mode == "int8":
        # a Sigmoid (1/256, -128) and a Tanh (1/128, 0) cannot share the concat's parameters:
        # both are requantised into the concat output's calibrated range
        assert ops.count("QUANTIZE") == 2
    for seed in (0, 5):
        feeds = random_inputs(g, seed)
        _check(_ort(g.model, feeds), _litert(conv, feeds), mode, conv)


# --- what it refuses ----------------------------------------------------------------------


def _one_node_model(node: onnx.NodeProto, inputs: list[tuple[str, list[int]]],
                    out_shape: list[int], inits: list[onnx.TensorProto] = (),
                    domain: str = "") -> onnx.ModelProto:
    graph = helper.make_graph(
        [node], "one", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, out_shape)],
        list(inits))
    imports = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    m = helper.make_model(graph, opset_imports=imports)
    m.ir_version = 10
    return m


def _w(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ones(shape, np.float32), name)


UNSUPPORTED = {
    "no_mapping": (_one_node_model(helper.make_node("Hardmax", ["x"], ["y"], name="hardmax"),
                                   [("x", [1, 4])], [1, 4]), "no TFLite mapping for Hardmax"),
    "custom_domain": (_one_node_model(
        helper.make_node("Frob", ["x"], ["y"], name="frob", domain="example.custom"),
        [("x", [1, 4])], [1, 4], domain="example.custom"), "custom domain"),
    "dynamic_weights": (_one_node_model(
        helper.make_node("Conv", ["x", "w"], ["y"], name="conv"),
        [("x", [1, 4, 8, 8]), ("w", [4, 4, 1, 1])], [1, 4, 8, 8]), "weights must be a constant"),
    "grouped_conv": (_one_node_model(
        helper.make_node("Conv", ["x", "w"], ["y"], name="gconv", group=2),
        [("x", [1, 4, 8, 8])], [1, 4, 8, 8], [_w("w", (4, 2, 1, 1))]), "grouped convolution"),
    "conv3d": (_one_node_model(
        helper.make_node("Conv", ["x", "w"], ["y"], name="conv3d"),
        [("x", [1, 2, 4, 4, 4])], [1, 2, 4, 4, 4], [_w("w", (2, 2, 1, 1, 1))]), "2-D"),
    "reflect_pad": (_one_node_model(
        helper.make_node("Pad", ["x", "p"], ["y"], name="pad", mode="reflect"),
        [("x", [1, 2, 4, 4])], [1, 2, 6, 6],
        [numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "p")]),
        "only constant padding"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_unsupported_reason_is_convertibles(case: str) -> None:
    model, fragment = UNSUPPORTED[case]
    g = load_graph(model)
    node = g.nodes[0]
    for mode in ("int8", "fp32"):
        why = convertible(node, g, mode)
        assert why is not None and fragment in why, why
        with pytest.raises(UnsupportedOp) as ei:
            convert(model, mode, {t: (-1.0, 1.0) for t in g.tensors})
        assert ei.value.reason == why and ei.value.node_name == node.name
        assert ei.value.op_type == node.op_type


def test_int8_needs_ranges_fp32_does_not(graphs: dict[str, DataflowGraph]) -> None:
    g = graphs["mnist"]
    assert convert(g.model, "fp32").mode == "fp32"
    with pytest.raises(MissingRangeError):
        convert(g.model, "int8", {})
    # BuildInput-style triples are accepted as well as a mapping
    triples = tuple((k, lo, hi) for k, (lo, hi) in calibrate(g).items())
    assert convert(g.model, "int8", triples).tflite == convert(g.model, "int8",
                                                             calibrate(g)).tflite
    with pytest.raises(ValueError):
        convert(g.model, "int4", triples)


def test_act_qparams_cover_the_range_and_keep_zero_exact() -> None:
    for lo, hi in ((-1.0, 1.0), (0.0, 6.0), (0.5, 3.0), (-7.0, -2.0), (0.0, 0.0)):
        s, zp = act_qparams(lo, hi)
        assert s > 0 and isinstance(zp, int) and -128 <= zp <= 127
        # 0.0 is the integer zp exactly (zero padding and ReLU lose nothing); the int8 grid
        # covers [min(lo, 0), max(hi, 0)] up to half a step of zero-point rounding
        assert (-128 - zp) * s <= min(lo, 0.0) + s / 2
        assert (127 - zp) * s >= max(hi, 0.0) - s / 2
        assert s == pytest.approx(max(max(hi, 0.0) - min(lo, 0.0), 1e-6) / 255)


# --- calibration --------------------------------------------------------------------------


def test_calibration_is_whole_model_deterministic_and_cached(graphs: dict[str, DataflowGraph],
                                                            tmp_path) -> None:
    g = graphs["mnist"]
    clear_memory_cache()
    r1 = calibrate(g, cache_dir=tmp_path)
    files = list(tmp_path.glob("ranges-*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert data["key"] == model_key(g, 0, 8)
    # every float tensor: graph input and every node output
    assert set(r1) == set(g.graph_inputs) | {o for n in g.nodes for o in n.outputs}
    relu = g.node_by_name("conv1/relu").outputs[0]
    assert r1[relu][0] >= 0.0 and r1[relu][1] > 0.0
    clear_memory_cache()
    assert calibrate(g, cache_dir=tmp_path) == r1  # read back from the file
    files[0].write_text("{not json")
    clear_memory_cache()
    assert calibrate(g, cache_dir=tmp_path) == r1  # a damaged file is re-measured
    assert json.loads(files[0].read_text())["key"] == data["key"]
    assert calibrate(g, seed=1) != r1  # other seeds, other ranges
    # the ranges are the extremes of the whole model's tensors over the seeded samples
    x = g.graph_inputs[0]
    lo = min(float(random_inputs(g, s)[x].min()) for s in range(8))
    assert r1[x][0] == pytest.approx(lo)
