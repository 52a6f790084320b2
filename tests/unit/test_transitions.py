"""Measured transition costs: rows written and read back, the fit, offline reuse, plans.

The boundary excess (two chained identity partitions minus twice one alone) is measured for
real on ORT-CPU with a short `MeasureConfig`; fitting and reuse are checked on rows with known
numbers; the plan-level laws (raising the copy cost coarsens the plan; two GPUs pay the copy
read from the table) run the real search with mock costs.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta, timezone

import pytest

from collage_farm import zoo
from collage_farm.campaign import TuneOptions, build_specs, choose_transition
from collage_farm.config import load_config
from collage_farm.core.cost import Cost
from collage_farm.core.graph import load_graph
from collage_farm.core.rules import RuleOptions, all_candidates
from collage_farm.core.search import search
from collage_farm.core.target import CPU0, CUDA0, VirtualDevice, get_target
from collage_farm.core.transition import (
    AnalyticTransitionModel,
    CallsIncluded,
    MeasuredTransitionModel,
    TransitionSample,
    WithCutCosts,
    rebased,
    scale_transitions,
)
from collage_farm.costtable import CostTable, CostTableWriter, row_from_result
from collage_farm.probes.transitions import measured_transition_model, transition_samples
from estimators.base import CostEstimator
from estimators.mock import MockEstimator
from runners.base import DeviceDescription, MeasureConfig, MeasureResult, Status
from runners.transitions import (
    copy_fingerprint,
    copy_target,
    identity_model,
    parse_fingerprint,
    transition_fingerprint,
)

FAST = MeasureConfig(warmup_runs=2, rounds=3, min_round_runs=20, min_round_s=0.002)
CUDA1 = VirtualDevice("cuda", 1)
ORT = get_target("ort-cpu")


def _result(fp: str, target, seconds: float, config: MeasureConfig = FAST,
            device: str = "test-cpu") -> MeasureResult:
    return MeasureResult(fp, target, Status.OK, config, samples=(seconds,) * 3,
                         device=DeviceDescription("cpu", device, 2))


def _write(table, results, start: datetime | None = None) -> None:
    t0 = start or datetime.now(timezone.utc)
    with CostTableWriter(table) as w:
        for i, r in enumerate(results):
            w.append(row_from_result(r, campaign_id="t", model="transitions", nodes=[],
                                     op_types=["Identity"],
                                     created_at=t0 + timedelta(microseconds=i)))


def test_fingerprints_round_trip() -> None:
    fp = transition_fingerprint("pipe", "openvino", "cpu:0", 4096)
    assert fp == "transition:pipe:openvino:cpu:0:4096"
    assert parse_fingerprint(fp) == {"kind": "pipe", "toolchain": "openvino",
                                     "device": "cpu:0", "nbytes": 4096}
    assert parse_fingerprint(transition_fingerprint("launch", "ort-cpu", "cpu:0"))["nbytes"] == 4
    assert parse_fingerprint(copy_fingerprint("cuda:0", "cuda:1", 10)) == {
        "kind": "copy", "src": "cuda:0", "dst": "cuda:1", "nbytes": 10}
    assert parse_fingerprint("0123abcd") is None


def test_measured_rows_written_read_back_fitted_and_reused_offline(tmp_path) -> None:
    table = tmp_path / "costs"
    sizes = (4096, 1 << 20)
    with CostTableWriter(table) as w:
        m = measured_transition_model(CostTable(table), [ORT], writer=w, measure=True,
                                      config=FAST, sizes=sizes)
    rows = CostTable(table).rows()
    kinds = sorted(parse_fingerprint(r.fingerprint)["kind"] for r in rows)
    assert kinds == ["iso", "iso", "launch", "pipe", "pipe"]
    assert all(r.ok and r.kind == "measured" and r.n > 0 for r in rows)
    iso = [r for r in rows if ":iso:" in r.fingerprint]
    pipe = [r for r in rows if ":pipe:" in r.fingerprint]
    assert {r.config.measure_mode for r in iso} == {FAST.measure_mode}
    assert {r.config.measure_mode for r in pipe} == {"warm"}  # plans run warm, end to end
    # every row is a real measurement: a chain of two copies of 1 MiB is not free
    assert max(r.seconds for r in pipe) > 1e-6
    assert isinstance(m, MeasuredTransitionModel)
    fixed, per_byte = m.handoffs[("ort-cpu", "cpu")]
    samples = transition_samples(rows, FAST.mode)
    by_size = {s.nbytes: s.seconds for s in samples}
    assert set(by_size) == set(sizes)
    slope = (by_size[1 << 20] - by_size[4096]) / ((1 << 20) - 4096)
    assert per_byte == pytest.approx(slope)
    assert m.launch_s(ORT) == pytest.approx(max(0.0, fixed))
    assert m.handoff_s(ORT, 1 << 20) == pytest.approx(max(0.0, per_byte) * (1 << 20) / 2)
    # a toolchain without rows: the fallback answers
    ov = get_target("openvino-cpu")
    assert m.handoff_s(ov, 1000) == AnalyticTransitionModel().handoff_s(ov, 1000)

    # a second campaign measures nothing more; offline reuse reads the same model
    n_files = len(CostTable(table).files())
    with CostTableWriter(table) as w:
        again = measured_transition_model(CostTable(table), [ORT], writer=w, measure=True,
                                          config=FAST, sizes=sizes)
    assert len(CostTable(table).files()) == n_files and again.handoffs == m.handoffs
    off = measured_transition_model(CostTable(table), [ORT], measure=False, config=FAST)
    assert isinstance(off, MeasuredTransitionModel) and off.handoffs == m.handoffs
    # an offline campaign reads the rows of the mode its options name (by default the mode a
    # farm campaign times candidates in), as the campaign that measured them did
    opts = TuneOptions(model="zoo:mnist", targets=(ORT,), out=tmp_path / "out",
                       estimator="offline", cost_table=table, measure_mode=FAST.mode)
    chosen = choose_transition(opts, MockEstimator(), measure=True)
    assert isinstance(chosen, MeasuredTransitionModel)
    assert chosen.handoffs == m.handoffs
    # another measurement mode's isolated rows are not this mode's: fallback
    other = measured_transition_model(CostTable(table), [ORT],
                                      config=MeasureConfig(mode="flush"))
    assert isinstance(other, AnalyticTransitionModel)
    # mock campaigns keep the given model
    mock = TuneOptions(model="zoo:mnist", targets=(ORT,), out=tmp_path / "o2",
                       estimator="mock", cost_table=table)
    assert isinstance(choose_transition(mock, MockEstimator(), measure=True),
                      AnalyticTransitionModel)


def test_fit_from_rows_with_known_numbers(tmp_path) -> None:
    fixed, per_byte = 3e-6, 2e-10  # excess = fixed + per_byte * n per boundary
    res = []
    for nb in (1_000, 100_000, 1_000_000):
        iso = 5e-6 + nb * 1e-10
        res.append(_result(transition_fingerprint("iso", "openvino", "cpu:0", nb),
                           get_target("openvino-cpu"), iso))
        res.append(_result(transition_fingerprint("pipe", "openvino", "cpu:0", nb),
                           get_target("openvino-cpu"), 2 * iso + fixed + per_byte * nb,
                           config=MeasureConfig(mode="warm", rounds=3)))
    res.append(_result(transition_fingerprint("launch", "openvino", "cpu:0"),
                       get_target("openvino-cpu"), 12e-6))
    # an older, different measurement of one size: the newest row wins
    _write(tmp_path / "c", [_result(transition_fingerprint("pipe", "openvino", "cpu:0", 1000),
                                    get_target("openvino-cpu"), 1.0)],
           start=datetime.now(timezone.utc) - timedelta(days=1))
    _write(tmp_path / "c", res)
    m = measured_transition_model(CostTable(tmp_path / "c"), [get_target("openvino-cpu")],
                                  config=FAST)
    assert isinstance(m, MeasuredTransitionModel)
    ov = get_target("openvino-cpu")
    assert m.launch_s(ov) == pytest.approx(fixed, rel=1e-6)  # not the 12 us call floor
    assert m.handoff_s(ov, 10_000) == pytest.approx(per_byte * 10_000 / 2, rel=1e-6)
    # a negative excess (pessimistic isolated runs) is charged as zero, never negative
    neg = MeasuredTransitionModel.from_samples(
        [TransitionSample("handoff", -1e-6 - n * 1e-10, nbytes=n, toolchain="ort-cpu",
                          device_kind="cpu") for n in (10, 1000)], AnalyticTransitionModel())
    assert neg.launch_s(ORT) == 0.0 and neg.handoff_s(ORT, 10**6) == 0.0


def test_identity_model_is_valid_onnx() -> None:
    import onnx

    m = onnx.load_from_string(identity_model(4096, stages=2))
    assert [n.op_type for n in m.graph.node] == ["Identity", "Identity"]
    assert m.graph.input[0].type.tensor_type.shape.dim[1].dim_value == 1024


class PreferenceEstimator(CostEstimator):
    """Mock costs with a reason to mix: convolutions and matmuls are 4x cheaper on the GPU
    target, everything else 4x cheaper on the CPU; 1 us per candidate on top."""

    label = "mock-preference"

    def estimate(self, cands):
        out = []
        for c in cands:
            gpu = c.target.device.kind == "cuda"
            s = 1e-6
            for op in c.op_types:
                heavy = op in ("Conv", "MatMul", "Gemm")
                s += 10e-6 * (1.0 if heavy == gpu else 4.0)
            out.append(Cost(s))
        return out


def _partitions_at(scale: float, graph, cands) -> int:
    res = search(graph, cands, PreferenceEstimator(),
                 scale_transitions(AnalyticTransitionModel(), scale))
    return len(res.partitions)


def test_plan_coarsens_when_the_copy_cost_is_raised() -> None:
    graph = load_graph(zoo.build("mnist"), name="mnist")
    targets = [get_target("ort-cpu"), get_target("ort-cuda")]
    cands = all_candidates(graph, build_specs(targets, RuleOptions(max_depth=3)))
    counts = [_partitions_at(s, graph, cands) for s in (0.0, 1.0, 10.0, 1e4)]
    assert counts[0] > 2  # free transitions: every op on its cheaper target
    assert all(a >= b for a, b in itertools.pairwise(counts)), counts  # fewer, larger
    assert counts[-1] == 1, counts  # copies dearer than any saving: one partition


def test_two_gpus_pay_the_copy_cost_from_the_table(tmp_path) -> None:
    cfg = load_config(builtin_system="gpu2")
    lat, bw = 7e-6, 20e9
    res = [MeasureResult(copy_fingerprint("cuda:0", "cuda:1", nb), copy_target(CUDA0),
                         Status.OK, MeasureConfig(mode="warm"),
                         samples=(lat + nb / bw,) * 3, device=DeviceDescription("cuda", "h100"))
           for nb in (1 << 12, 1 << 20, 1 << 24)]
    _write(tmp_path / "c", res)
    targets = list(cfg.targets.values())
    m = measured_transition_model(CostTable(tmp_path / "c"), targets, fallback=cfg.transition,
                                  host=cfg.host)
    assert isinstance(m, MeasuredTransitionModel)
    n = 8 << 20
    assert m.transfer_s(CUDA0, CUDA1, n) == pytest.approx(lat + n / bw, rel=1e-6)
    configured = cfg.transition.transfer_s(CUDA0, CUDA1, n)
    assert m.transfer_s(CUDA0, CUDA1, n) != pytest.approx(configured)
    # the reverse pair and host links were not measured: the system file answers
    assert m.transfer_s(CUDA1, CUDA0, n) == cfg.transition.transfer_s(CUDA1, CUDA0, n)
    assert m.transfer_s(CPU0, CUDA0, n) == cfg.transition.transfer_s(CPU0, CUDA0, n)
    assert m.transfer_s(CPU0, CPU0, n) == 0.0  # one memory: no copy
    # a what-if scale on the configured model applies to the measured costs too
    doubled = measured_transition_model(CostTable(tmp_path / "c"), targets,
                                        fallback=scale_transitions(cfg.transition, 2.0),
                                        host=cfg.host)
    assert doubled.transfer_s(CUDA0, CUDA1, n) == pytest.approx(2 * (lat + n / bw), rel=1e-6)


def test_rebased_keeps_the_layers_over_the_later_measured_base() -> None:
    """Profile mode measures hand-offs after the profiles, for targets without one: the cut
    costs and the calls-included layer laid over the first model stay, in order, over it."""
    ort, ov = get_target("ort-cpu"), get_target("openvino-cpu")
    first = AnalyticTransitionModel()
    later = MeasuredTransitionModel(first, launches={("openvino", "cpu"): 7e-6})
    stack = CallsIncluded(WithCutCosts(first, {ov.id: 2e-6}), frozenset({ort.id}))
    got = rebased(stack, later)
    assert isinstance(got, CallsIncluded) and got.targets == stack.targets
    assert isinstance(got.base, WithCutCosts) and got.base.base is later
    assert got.launch_s(ov) == later.launch_s(ov) != first.launch_s(ov)
    assert got.launch_s(ort) == 0.0 and got.handoff_s(ort, 1 << 20) == 0.0
    assert got.cut_s(ov) == pytest.approx(2e-6 + later.cut_s(ov))
    assert rebased(first, later) is later  # nothing layered: the new base alone
