"""Pins: node/op selection, device/target matching, candidate filtering, early errors, search."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm.config import ConfigError, load_config
from collage_farm.core.graph import load_graph
from collage_farm.core.pins import Pin, PinSet, check_pins, device_matches, filter_candidates
from collage_farm.core.rules import RuleOptions, all_candidates, default_spec
from collage_farm.core.target import BUILTIN_TARGETS as T
from collage_farm.core.target import VirtualDevice

CPU, CUDA = T["ort-cpu"], T["ort-cuda"]


def tiny_model(width: int = 64):
    """x -> mm0 -> act0 -> mm1 -> add -> sm -> y, with a side branch act0 -> neg -> add."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((width, width)).astype(np.float32), w)
             for w in ("w0", "w1")]
    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["t0"], name="mm0"),
        helper.make_node("Relu", ["t0"], ["t1"], name="act0"),
        helper.make_node("MatMul", ["t1", "w1"], ["t2"], name="mm1"),
        helper.make_node("Neg", ["t1"], ["t3"], name="neg"),
        helper.make_node("Add", ["t2", "t3"], ["t4"], name="add"),
        helper.make_node("Softmax", ["t4"], ["y"], name="sm", axis=-1),
    ]
    g = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, width])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m


@pytest.fixture(scope="module")
def graph():
    return load_graph(tiny_model(), name="tiny")


def candidates(graph, targets=(CPU, CUDA), supports=None, depth=3):
    specs = [default_spec(t, (supports or {}).get(t.name, lambda n, g: True), "graph",
                          RuleOptions(max_depth=depth)) for t in targets]
    return all_candidates(graph, specs)


# ------------------------------------------------------------------------------------------
# pins alone


def test_pin_needs_a_selector_and_exactly_one_destination():
    with pytest.raises(ValueError):
        Pin(device="cpu")
    with pytest.raises(ValueError):
        Pin(node="a")
    with pytest.raises(ValueError):
        Pin(node="a", device="cpu", target="ort-cpu")


def test_device_specs():
    mcu = VirtualDevice("cpu", 0, "mcu")
    assert device_matches("cpu", mcu) and device_matches("cpu:0", mcu)
    assert device_matches("cpu:0/mcu", mcu) and not device_matches("cpu:0/mcu", VirtualDevice(
        "cpu", 0))
    assert device_matches("cpu:0/global", VirtualDevice("cpu", 0))
    assert device_matches("cuda:1", VirtualDevice("cuda", 1))
    assert not device_matches("cuda:0", VirtualDevice("cuda", 1))
    assert not device_matches("cuda", VirtualDevice("cpu", 0))


def test_matching_and_allowed(graph):
    by = {n.name: n for n in graph.nodes}
    p_name = Pin(node="mm*", device="cuda:0")
    p_op = Pin(op="Softmax", target="ort-cpu")
    p_both = Pin(node="mm*", op="Relu", device="cpu")
    assert p_name.matches(by["mm0"]) and p_name.matches(by["mm1"])
    assert not p_name.matches(by["act0"])
    assert not p_name.matches(type("N", (), {"name": "MM0", "op_type": "MatMul"})())  # case
    assert p_op.matches(by["sm"]) and not p_op.matches(by["add"])
    assert not any(p_both.matches(n) for n in graph.nodes)  # node AND op
    ps = PinSet((p_name, p_op))
    assert ps.allowed(by["mm0"], CUDA) and not ps.allowed(by["mm0"], CPU)
    assert ps.allowed(by["sm"], CPU) and not ps.allowed(by["sm"], T["openvino-cpu"])
    assert ps.allowed(by["add"], CPU) and ps.allowed(by["add"], CUDA)  # unpinned
    assert "mm*" in p_name.describe() and "cuda:0" in p_name.describe()


# ------------------------------------------------------------------------------------------
# filtering candidates


def test_filter_keeps_only_candidates_satisfying_every_pin(graph):
    cands = candidates(graph)
    pins = [Pin(node="mm1", device="cuda:0"), Pin(op="Softmax", target="ort-cpu")]
    kept = filter_candidates(cands, pins)
    assert 0 < len(kept) < len(cands)
    ps = PinSet(tuple(pins))
    by = {n.name: n.index for n in graph.nodes}
    for c in cands:
        ok = all(ps.allowed(n, c.target) for n in c.sub_graph.nodes)
        assert (c in kept) == ok
    for c in kept:
        if by["mm1"] in c.sub_graph:
            assert c.target is CUDA
        if by["sm"] in c.sub_graph:
            assert c.target is CPU
    # candidates that cover no pinned node are untouched
    free = [c for c in cands if by["mm1"] not in c.sub_graph and by["sm"] not in c.sub_graph]
    assert all(c in kept for c in free)
    assert filter_candidates(cands, None) == cands
    assert filter_candidates(cands, PinSet()) == cands


def test_pin_to_a_device_kind_allows_every_target_on_it(graph):
    cands = candidates(graph, (CPU, T["openvino-cpu"], CUDA))
    kept = filter_candidates(cands, [Pin(node="add", device="cpu")])
    idx = next(n.index for n in graph.nodes if n.name == "add")
    assert {c.target.name for c in kept if idx in c.sub_graph} == {"ort-cpu", "openvino-cpu"}


def test_unmatched_pin_is_an_error_unless_optional(graph):
    cands = candidates(graph)
    with pytest.raises(ConfigError) as ei:
        filter_candidates(cands, [Pin(node="attn_*", device="cpu", origin="app.yaml: pins[0]")])
    msg = str(ei.value)
    assert "attn_*" in msg and "app.yaml: pins[0]" in msg and "mm0" in msg
    with pytest.raises(ConfigError, match="op types: Add, MatMul"):
        check_pins(graph, [CPU], [Pin(op="Conv", device="cpu")])
    kept = filter_candidates(cands, [Pin(node="attn_*", device="cpu", optional=True)])
    assert kept == cands


def test_check_pins_conflicting_pins_name_node_and_pins(graph):
    pins = [Pin(node="mm1", device="cuda:0", origin="a.yaml: pins[0]"),
            Pin(op="MatMul", device="cpu", origin="a.yaml: pins[1]")]
    with pytest.raises(ConfigError) as ei:
        check_pins(graph, [CPU, CUDA], pins)
    msg = str(ei.value)
    assert "'mm1'" in msg and "a.yaml: pins[0]" in msg and "a.yaml: pins[1]" in msg
    assert "ort-cpu@cpu:0" in msg and "ort-cuda@cuda:0" in msg  # the allowed (searched) targets
    # consistent pins: returns the pinned nodes
    got = check_pins(graph, [CPU, CUDA], [Pin(op="MatMul", device="cuda")])
    assert set(got) == {"mm0", "mm1"}


def test_check_pins_target_not_searched(graph):
    with pytest.raises(ConfigError) as ei:
        check_pins(graph, [CPU, CUDA], [Pin(node="sm", target="ort-tensorrt")])
    assert "ort-tensorrt" in str(ei.value) and "ort-cuda" in str(ei.value)
    with pytest.raises(ConfigError, match="'sm'"):
        check_pins(graph, [CPU], [Pin(node="sm", device="cuda:0")])


def test_filter_fails_before_measurement_when_no_allowed_toolchain_runs_the_node(graph):
    # the CUDA toolchain does not support Softmax here; Softmax is pinned to the GPU
    cands = candidates(graph, supports={"ort-cuda": lambda n, g: n.op_type != "Softmax"})
    check_pins(graph, [CPU, CUDA], [Pin(op="Softmax", device="cuda:0")])  # targets could...
    with pytest.raises(ConfigError) as ei:  # ...but no candidate can: fail at phase 2
        filter_candidates(cands, [Pin(op="Softmax", device="cuda:0")])
    msg = str(ei.value)
    assert "'sm'" in msg and "Softmax" in msg and "ort-cpu@cpu:0" in msg


def test_pins_from_config(tmp_path):
    app = tmp_path / "a.yaml"
    app.write_text("system: gpu2\n"
                   "pins:\n"
                   "  - {node: 'mm*', device: gpu1}\n"
                   "  - {op: Softmax, device: cuda}\n"
                   "  - {node: 'head*', target: ort-cuda-0, optional: true}\n")
    cfg = load_config(app=app)
    p0, p1, p2 = cfg.pins
    assert (p0.node, p0.device) == ("mm*", "cuda:1")  # device name resolved to its label
    assert (p1.op, p1.device) == ("Softmax", "cuda")  # a kind stays a kind: any GPU
    assert p2.target == "ort-cuda-0" and p2.optional
    assert str(app) in p0.origin and "pins[0]" in p0.origin
    assert isinstance(cfg.pin_set, PinSet) and len(cfg.pin_set) == 3


# ------------------------------------------------------------------------------------------
# end to end with the search: pins are honoured and cost what they cost


def test_pinned_plan_is_honoured_and_never_cheaper(graph):
    from collage_farm.core.search import search
    from estimators.mock import MockEstimator

    cfg = load_config(builtin_system="gpu")
    targets = cfg.resolve_targets("ort-cpu,ort-cuda")
    cands = candidates(graph, targets)
    free = search(graph, cands, MockEstimator(), cfg.transition)
    chosen = {n: p.candidate.target.name for p in free.partitions
              for n in p.candidate.node_names}
    assert set(chosen) == {n.name for n in graph.nodes}

    # pin every node to the target the unpinned plan did NOT pick for it
    other = {"ort-cpu": "ort-cuda", "ort-cuda": "ort-cpu"}
    for node, tname in sorted(chosen.items()):
        pins = (Pin(node=node, target=other[tname]),)
        check_pins(graph, targets, pins)
        kept = filter_candidates(cands, pins)
        res = search(graph, kept, MockEstimator(), cfg.transition)
        placed = {n: p.candidate.target.name for p in res.partitions
                  for n in p.candidate.node_names}
        assert placed[node] == other[tname]  # honoured
        assert res.cost.seconds >= free.cost.seconds - 1e-15  # a constraint never helps
        print(f"pin {node}->{other[tname]}: {free.cost.seconds * 1e6:.2f} us -> "
              f"{res.cost.seconds * 1e6:.2f} us (constraint costs "
              f"{(res.cost.seconds - free.cost.seconds) * 1e6:.2f} us)")

    # a pin that agrees with the unpinned plan costs nothing
    node, tname = sorted(chosen.items())[0]
    same = search(graph, filter_candidates(cands, [Pin(node=node, target=tname)]),
                  MockEstimator(), cfg.transition)
    assert same.cost.seconds == pytest.approx(free.cost.seconds)


def test_split_across_two_gpus_pays_the_configured_peer_link(graph, tmp_path):
    """Pins force a plan across cuda:0 and cuda:1; the peer link in the system file is paid."""
    from collage_farm.config import builtin_system_path
    from collage_farm.core.search import search
    from estimators.mock import MockEstimator

    text = builtin_system_path("gpu2").read_text()
    assert "latency_us: 12, gb_per_s: 20" in text
    slow = tmp_path / "gpu2-slow.yaml"
    slow.write_text(text.replace("latency_us: 12, gb_per_s: 20", "latency_us: 1012, gb_per_s: 20"))
    pins = [Pin(node="mm0", device="cuda:0"), Pin(node="act0", device="cuda:0"),
            Pin(node="sm", device="cuda:1")]
    costs = []
    for cfg in (load_config(builtin_system="gpu2"), load_config(slow)):
        targets = cfg.resolve_targets("ort-cuda-0,ort-cuda-1")
        check_pins(graph, targets, pins)
        cands = candidates(graph, targets)
        free = search(graph, cands, MockEstimator(), cfg.transition)
        assert len({p.candidate.target.device for p in free.partitions}) == 1  # no reason to split
        res = search(graph, filter_candidates(cands, pins), MockEstimator(), cfg.transition)
        devs = {n: p.candidate.target.device.label for p in res.partitions
                for n in p.candidate.node_names}
        assert devs["mm0"] == devs["act0"] == "cuda:0" and devs["sm"] == "cuda:1"
        assert res.cost.seconds > free.cost.seconds
        costs.append(res.cost.seconds)
    # 1000 us more per peer copy: the slow system's pinned plan pays k >= 1 whole copies more
    k = (costs[1] - costs[0]) / 1000e-6
    assert k >= 1 - 1e-9 and abs(k - round(k)) < 1e-6
