"""Search laws on random DAGs: valid candidates, exact covers, optimality vs brute force."""

from __future__ import annotations

import hashlib
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collage_farm.core.cost import Cost
from collage_farm.core.cutcharge import CutCharge
from collage_farm.core.graph import load_graph
from collage_farm.core.rules import (
    ANY,
    PartitionSpec,
    PatternPartitionRule,
    RuleOptions,
    all_candidates,
    default_spec,
    op,
)
from collage_farm.core.search import HOST, NoCoverError, search, static_penalty_s
from collage_farm.core.subgraph import SubGraphConfig
from collage_farm.core.target import BUILTIN_TARGETS as T
from collage_farm.core.transition import (
    AnalyticTransitionModel,
    Requantise,
    WithCutCosts,
    WithRequantise,
    ZeroTransitionModel,
)
from estimators.base import CostEstimator
from tests.strategies import dags, unary_chain


class HashEstimator(CostEstimator):
    """Deterministic pseudo-random costs from the fingerprint; some candidates fail."""

    label = "test-hash"

    def __init__(self, fail_ratio: float = 0.0, bound: bool = False) -> None:
        self.fail_ratio = fail_ratio
        self.has_lower_bound = bound
        self.asked: list[str] = []

    def cost(self, c) -> Cost:
        h = int(hashlib.sha256(c.fingerprint.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        if h < self.fail_ratio:
            return Cost.invalid()
        return Cost(1e-5 * (0.3 + h) * len(c.sub_graph) ** 0.7)

    def estimate(self, cands):
        self.asked += [c.fingerprint for c in cands]
        return [self.cost(c) for c in cands]

    def lower_bound(self, c) -> Cost:
        return Cost(0.3e-5 * len(c.sub_graph) ** 0.7 * 0.99)


TARGET_SETS = {
    "cpu": ("ort-cpu", "openvino-cpu"),
    "mixed": ("ort-cpu", "ort-cuda"),
    "three": ("ort-cpu", "openvino-cpu", "ort-cuda"),
}


def _cands(g, names, depth=3, style="graph"):
    specs = [default_spec(T[n], lambda nd, gr: True, style, RuleOptions(max_depth=depth))
             for n in names]
    return all_candidates(g, specs)


def brute_force(g, cands, est, transition):
    """Exhaustive enumeration under the search's edge rules, costs computed per path."""
    full = g.all_mask
    by_first = {}
    for c in cands:
        by_first.setdefault(c.sub_graph.first, []).append(c)
    outs = set(g.graph_outputs)
    best = math.inf

    def penalty(c, devmap):
        sg = c.sub_graph
        pen = transition.launch_s(c.target)
        for t in sg.input_tensors:
            nb = g.tensors[t].nbytes
            pen += transition.handoff_s(c.target, nb)
            p = g.producer.get(t)
            src = HOST if p is None else devmap[p]
            pen += transition.transfer_s(src, c.target.device, nb)
        for t in sg.output_tensors:
            nb = g.tensors[t].nbytes
            pen += transition.handoff_s(c.target, nb)
            if t in outs:
                pen += transition.transfer_s(c.target.device, HOST, nb)
        fed = [g.tensors[t].nbytes for t in sg.input_tensors if g.producer.get(t) is not None]
        if fed:  # fed by another partition: charged by the bytes entering it
            pen += transition.cut_s(c.target, sum(fed))
        # a requantisation per tensor crossing from or to another partition
        crossing = [t for t in sg.input_tensors if g.producer.get(t) is not None]
        crossing += [t for t in sg.output_tensors
                     if any(not c.mask >> i & 1 for i in g.consumers.get(t, ()))]
        pen += sum(transition.requantise_s(c.target, g.tensors[t].size) for t in crossing)
        return pen

    def rec(covered, devmap, total):
        nonlocal best
        if total >= best:
            return
        if covered == full:
            best = total
            return
        low = ~covered & full
        f = (low & -low).bit_length() - 1
        for c in by_first.get(f, []):
            if c.mask & covered or c.sub_graph.input_mask & ~covered:
                continue
            cost = est.cost(c)
            if not cost.is_known:
                continue
            dm = dict(devmap)
            for i in c.sub_graph.indices:
                dm[i] = c.target.device
            rec(covered | c.mask, dm, total + cost.seconds + penalty(c, devmap))

    rec(0, {}, 0.0)
    return best


@settings(max_examples=60, deadline=None)
@given(dags(max_nodes=8), st.sampled_from(sorted(TARGET_SETS)), st.booleans(),
       st.sampled_from(["graph", "fuseops", "library"]),
       st.sampled_from([0.0, 2e-6, 3e-5]), st.booleans(), st.sampled_from([0.0, 1e-6]))
def test_dijkstra_equals_brute_force(model, tset, zero, style, cut, by_bytes, requant):
    g = load_graph(model)
    cands = _cands(g, TARGET_SETS[tset], style=style)
    transition = ZeroTransitionModel() if zero else AnalyticTransitionModel(scale=3.0)
    first = TARGET_SETS[tset][0]
    if cut:  # a measured cut cost into the first target of the set only
        # by bytes: 0 below 16 bytes, then cut / 16 per byte (a 32-byte tensor pays ``cut``)
        charges = {first: CutCharge(-cut, cut / 16)} if by_bytes else {}
        transition = WithCutCosts(transition, {first: cut}, charges)
    if requant:  # the first target requantises every tensor it exchanges with a partition
        transition = WithRequantise(transition, {first: Requantise(requant, requant / 8)})
    est = HashEstimator(fail_ratio=0.1)
    expected = brute_force(g, cands, est, transition)
    if math.isinf(expected):
        with pytest.raises(NoCoverError):
            search(g, cands, est, transition)
        return
    r = search(g, cands, est, transition)
    assert r.total_s == pytest.approx(expected, rel=1e-9, abs=1e-15)
    # lazy evaluation with lower bounds gives the same optimum
    lazy = search(g, cands, HashEstimator(fail_ratio=0.1, bound=True), transition)
    assert lazy.total_s == pytest.approx(expected, rel=1e-9, abs=1e-15)
    assert lazy.lazy and lazy.distinct_estimated <= r.distinct_estimated


@settings(max_examples=60, deadline=None)
@given(dags(max_nodes=10), st.sampled_from(sorted(TARGET_SETS)))
def test_candidates_valid_and_plan_covers_once(model, tset):
    g = load_graph(model)
    cfg = SubGraphConfig(max_depth=3, max_exits=2, allow_taps=False)
    cands = _cands(g, TARGET_SETS[tset])
    for c in cands:
        # segments are convex by construction and exempt from the region limits
        assert c.sub_graph.is_valid(SubGraphConfig() if "segment" in c.rule else cfg), c
    r = search(g, cands, HashEstimator())
    seen = 0
    executed = set(g.graph_inputs) | set(g.initializers)
    for p in r.partitions:
        assert not seen & p.candidate.mask
        seen |= p.candidate.mask
        # partitions come in execution order: inputs already computed
        assert set(p.candidate.sub_graph.input_tensors) <= executed
        executed |= {o for n in p.candidate.sub_graph.nodes for o in n.outputs}
    assert seen == g.all_mask


@settings(max_examples=40, deadline=None)
@given(dags(max_nodes=10), st.sampled_from(sorted(TARGET_SETS)))
def test_plan_never_costlier_than_single_target_covers(model, tset):
    g = load_graph(model)
    cands = _cands(g, TARGET_SETS[tset])
    est = HashEstimator(fail_ratio=0.05)
    tr = AnalyticTransitionModel()
    try:
        best = search(g, cands, est, tr).total_s
    except NoCoverError:
        return
    for name in TARGET_SETS[tset]:
        only = [c for c in cands if c.target.name == name]
        try:
            single = search(g, only, est, tr).total_s
        except NoCoverError:
            continue
        assert best <= single + 1e-15


def test_uncoverable_node_is_named():
    import numpy as np
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("Sigmoid", ["a"], ["y"], name="lonely")]
    g_ = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, [1, 4])],
                           [helper.make_tensor_value_info("y", 1, [1, 4])])
    m = helper.make_model(g_, opset_imports=[helper.make_opsetid("", 17)])
    g = load_graph(m)
    cands = all_candidates(g, [default_spec(T["ort-cpu"], lambda n, gr: n.op_type == "Relu")])
    with pytest.raises(NoCoverError, match="lonely") as ei:
        search(g, cands, HashEstimator())
    assert ei.value.node == "lonely"
    del np, TensorProto


def test_patterns_match_conv_add_relu():
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.ones((2, 2, 1, 1), np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
             helper.make_node("Add", ["x", "c"], ["a"], name="add"),  # conv on the right
             helper.make_node("Relu", ["a"], ["y"], name="relu")]
    g_ = helper.make_graph(nodes, "g",
                           [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
                           [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 4, 4])],
                           [w])
    g = load_graph(helper.make_model(g_, opset_imports=[helper.make_opsetid("", 17)]))
    rule = PatternPartitionRule(op("Relu", op("Add", op("Conv"), ANY, commutative=True)))
    cands = rule.candidates(g, PartitionSpec(rule, T["ort-cpu"]))
    assert [sorted(c.node_names) for c in cands] == [["add", "conv", "relu"]]


def test_cut_costs_steer_the_search_away_from_mixing() -> None:
    """A chain where each target is cheaper on half the nodes: free cuts mix, a measured cut
    cost larger than the gain keeps one toolchain (and is charged once per entered partition)."""
    g = load_graph(unary_chain(["Sigmoid", "Relu"] * 3))
    cands = _cands(g, ("ort-cpu", "openvino-cpu"), depth=1)

    class Split(CostEstimator):
        label = "split"

        def estimate(self, cs):  # per node: ORT is fast on Relu, OpenVINO on Sigmoid
            return [Cost(sum(1e-6 if (c.target.id == "ort-cpu") == (op == "Relu") else 5e-6
                             for op in c.op_types)) for c in cs]

    free = search(g, cands, Split(), ZeroTransitionModel())
    assert len({p.candidate.target.id for p in free.partitions}) == 2
    assert free.total_s == pytest.approx(6e-6)  # every node on its fast toolchain
    cut = WithCutCosts(ZeroTransitionModel(), {"ort-cpu": 1e-5, "openvino-cpu": 1e-5})
    assert cut.label == "zero+cuts" and cut.cut_s(T["ort-cpu"]) == 1e-5
    kept = search(g, cands, Split(), cut)
    # the whole chain as one segment on one toolchain: no cut, 3 fast and 3 slow nodes
    assert len(kept.partitions) == 1 and kept.total_s == pytest.approx(3e-6 + 3 * 5e-6)
    half = WithCutCosts(ZeroTransitionModel(), {"ort-cpu": 1e-6, "openvino-cpu": 1e-6})
    mixed = search(g, cands, Split(), half)  # cheap cuts: mixing pays, each cut charged once
    n_cuts = len(mixed.partitions) - 1
    assert n_cuts >= 1 and mixed.total_s == pytest.approx(6e-6 + n_cuts * 1e-6)


def test_a_cut_is_charged_by_the_bytes_entering_the_partition():
    """A partition fed by another one pays its target's cut charge at the bytes of the
    tensors it reads from other partitions (graph inputs are not cuts); a caller without bytes
    gets the target's constant, and targets without a fitted line keep the constant too."""
    g = load_graph(unary_chain(["Relu", "Sigmoid", "Relu"], width=8))  # 32-byte tensors
    cands = _cands(g, ["ort-cpu", "openvino-cpu"], depth=1)
    fed = next(c for c in cands if c.target.id == "openvino-cpu" and c.sub_graph.first == 1)
    first = next(c for c in cands if c.target.id == "openvino-cpu" and c.sub_graph.first == 0)
    cut = WithCutCosts(ZeroTransitionModel(), {"openvino-cpu": 7e-6, "ort-cpu": 5e-6},
                       {"openvino-cpu": CutCharge(2e-6, 1e-7)})
    assert static_penalty_s(g, fed, cut) == pytest.approx(2e-6 + 32 * 1e-7)  # 5.2 us
    assert static_penalty_s(g, first, cut) == 0.0  # reads the graph input only: no cut
    assert cut.cut_s(T["openvino-cpu"]) == 7e-6  # no bytes: the constant
    assert cut.cut_s(T["ort-cpu"], 32) == 5e-6  # no line for ORT: the constant
    floor = WithCutCosts(ZeroTransitionModel(), {}, {"openvino-cpu": CutCharge(-1e-5, 1e-7)})
    assert floor.cut_s(T["openvino-cpu"], 32) == 0.0  # -6.8 us floored at 0


def test_a_16x8_partition_pays_a_requantise_per_tensor_it_exchanges_with_a_partition():
    """`WithRequantise`: each tensor crossing between a charged target's partition and another
    partition costs fixed + per element, on the charged side; graph inputs and outputs are no
    crossings, and other targets pay nothing."""
    g = load_graph(unary_chain(["Relu", "Sigmoid", "Relu"], width=8))  # 8-element tensors
    cands = _cands(g, ["ort-cpu", "openvino-cpu"], depth=1)

    def one(target: str, first: int):
        return next(c for c in cands if c.target.id == target and c.sub_graph.first == first)

    rq = WithRequantise(ZeroTransitionModel(), {"openvino-cpu": Requantise(1e-6, 1e-7)})
    assert rq.label == "zero+requantise"
    each = 1e-6 + 8 * 1e-7
    assert static_penalty_s(g, one("openvino-cpu", 1), rq) == pytest.approx(2 * each)
    assert static_penalty_s(g, one("openvino-cpu", 0), rq) == pytest.approx(each)  # out only
    assert static_penalty_s(g, one("openvino-cpu", 2), rq) == pytest.approx(each)  # in only
    assert static_penalty_s(g, one("ort-cpu", 1), rq) == 0.0
    # the wrappers pass it on
    cut = WithCutCosts(rq, {"openvino-cpu": 0.0})
    assert cut.requantise_s(T["openvino-cpu"], 8) == pytest.approx(each)
