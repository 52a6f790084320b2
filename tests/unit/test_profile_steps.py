"""What a profile run costs on the worker: the prefix profiler readies each prefix once (no
compile per round), a prefix-profiled toolchain (LiteRT) times no separate whole model, the
unprofiled whole model is timed between the profiled runs, artifact digests are remembered,
and the steps' seconds reach the campaign's outcome."""

from __future__ import annotations

import json
import statistics

import pytest

from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import parse_targets
from collage_farm.costtable import TableStore
from collage_farm.execute.builder import PlanBuilder
from collage_farm.probes.profiles import (
    ProfileOutcome,
    _steps,
    collect_profiles,
    profile_fingerprint,
)
from collage_farm.zoo.source import load_source
from estimators.sources import MeasurementService
from runners.base import (
    BuildInput,
    Kind,
    MeasureConfig,
    MeasureInput,
    MeasureRequest,
    MeasureResult,
    Status,
)
from runners.onnx_base import DigestMemo
from runners.ort import OrtCpuToolchain
from runners.profile import (
    MIN_PROFILE_RUNS,
    PROFILE_DETAIL,
    PROFILE_RUNS_BUDGET_S,
    PROFILE_STEPS,
    OperatorProfile,
    PrefixProfiler,
    ProfileMethod,
    paired_segments,
    profile_config,
    profile_measure,
    profiled_runs,
    thin_cuts,
)
from runners.profilers import OrtTraceProfiler
from runners.registry import get_toolchain
from runners.topology import OnnxTopology

ORT, LITERT = parse_targets("ort-cpu,litert-cpu")


@pytest.fixture(scope="module")
def mnist():  # type: ignore[no-untyped-def]
    graph = load_source("zoo:mnist")
    data = SubGraph(graph, graph.all_mask).extract("mnist_whole").SerializeToString()
    return graph, data


class _CountingOrt(OrtCpuToolchain):
    """ONNX Runtime counting its session compiles and measure calls."""

    def __init__(self) -> None:
        super().__init__()
        self.compiles = 0
        self.configs: list[MeasureConfig] = []

    def _compile(self, onnx_bytes, target, threads):  # type: ignore[no-untyped-def]
        self.compiles += 1
        return super()._compile(onnx_bytes, target, threads)

    def measure(self, inp: MeasureInput) -> MeasureResult:
        self.configs.append(inp.config)
        return super().measure(inp)


def test_prefix_profiler_compiles_each_prefix_once(mnist) -> None:  # type: ignore[no-untyped-def]
    """ONNX Runtime caches one session: the rounds time the readied prefixes (before, every
    round compiled every prefix again), and the steps say what was built and timed."""
    graph, data = mnist
    tc = _CountingOrt()
    b = tc.build(BuildInput(profile_fingerprint(graph), ORT, data))
    tc.compiles = 0
    cfg = MeasureConfig(mode="warm", rounds=4, min_round_runs=2)
    pp = PrefixProfiler(tc)
    prof = pp.profile(b, data, cfg, 10)
    cuts = thin_cuts(OnnxTopology.of(data), pp.segments)
    assert len(cuts) >= 2 and prof.method is ProfileMethod.PREFIXES
    # each prefix once, the whole model once more (the prefixes evicted it from the cache)
    assert tc.compiles == len(cuts) + 1
    assert tc.configs == []  # timed through `timer`, not one `measure` per round
    assert len(pp.whole_samples) == cfg.rounds and all(x > 0 for x in pp.whole_samples)
    assert pp.steps["prefix_builds"] == len(cuts)
    assert 0 < pp.steps["prefix_build_s"] <= pp.steps["prefixes_s"]
    assert 0 < pp.steps["prefix_timing_s"] <= pp.steps["prefixes_s"]
    assert prof.profiled_total_s == pytest.approx(statistics.median(pp.whole_samples))


def test_prefix_segments_are_paired_differences_within_rounds() -> None:
    """A segment is the median over rounds of consecutive prefixes' difference in the same
    round: here the whole model's noisy round 2 and prefix's noisy round 3 put the two
    medians in different rounds, and their difference says 0.4 where every round but one
    says 0.2. The segments add up to the whole model's median; noise below zero is 0."""
    p = [10.0, 11.5, 11.0]
    whole = [10.2, 11.4, 11.5]  # rounds' differences 0.2, -0.1, 0.5
    seg, clipped = paired_segments([p, whole])
    assert clipped == 0
    assert sum(seg) == pytest.approx(statistics.median(whole))
    assert seg[1] == pytest.approx(0.2 * 11.4 / 11.2)  # scaled with the first to the whole
    assert statistics.median(whole) - statistics.median(p) == pytest.approx(0.4)
    seg, clipped = paired_segments([[5.0, 5.0, 5.0], [4.9, 4.8, 5.0]])  # a segment of noise
    assert clipped == 1 and seg[1] == 0.0 and seg[0] == pytest.approx(4.9)


def test_unprofiled_rounds_interleave_with_the_profiled_runs(mnist) -> None:  # type: ignore[no-untyped-def]
    """One unprofiled round before each profiled run (after the warm-ups), readied once (no
    `measure` call, no compile), and they are the result's samples; the steps land in the
    result's details."""
    graph, data = mnist
    tc = _CountingOrt()
    b = tc.build(BuildInput(profile_fingerprint(graph), ORT, data))
    order: list[str] = []
    real = OrtTraceProfiler(tc)

    class Spy(OrtTraceProfiler):
        def profile(self, build, onnx_bytes, config, runs, between=None):  # type: ignore[no-untyped-def]
            def spied() -> None:
                order.append("unprofiled")
                assert between is not None
                between()
            return real.profile(build, onnx_bytes, config, runs, spied)

    tc.profiler = lambda: Spy(tc)  # type: ignore[method-assign]
    res = profile_measure(tc, MeasureInput(b, profile_config(rounds=2, runs=7)), data)
    assert res.ok and res.kind is Kind.PROFILED, res.error
    assert order == ["unprofiled"] * 7 and len(res.samples) == 7
    assert tc.configs == []  # nothing through `measure`
    steps = json.loads(str(dict(res.details)[PROFILE_STEPS]))
    assert 0 < steps["unprofiled_s"] < steps["profiler_s"]
    prof = OperatorProfile.from_json(dict(res.details)[PROFILE_DETAIL])
    if prof.method is ProfileMethod.ORT_TRACE:
        assert prof.whole_s == pytest.approx(res.seconds)
    else:  # the trace was not trusted (a loaded host): prefixes, built once each
        assert steps["prefix_builds"] >= 1
    got = _steps(res)
    assert got["unprofiled_s"] == steps["unprofiled_s"] and got["measure_s"] > 0


def test_profiled_runs_fill_a_budget_between_a_floor_and_what_was_asked() -> None:
    """A long model takes as many profiled runs as fill the budget, never fewer than the
    floor, never more than asked; an unknown run time takes what was asked."""
    assert profiled_runs(20, 0.1) == max(MIN_PROFILE_RUNS, round(PROFILE_RUNS_BUDGET_S / 0.1))
    assert profiled_runs(20, 0.5) == MIN_PROFILE_RUNS
    assert profiled_runs(20, 40e-6) == 20 and profiled_runs(5, 2.0) == 5
    assert profiled_runs(20, 0.0) == 20 and profiled_runs(0, 1.0) == 1


def test_a_request_takes_the_profiled_runs_its_model_needs(mnist, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The worker sizes the profiled runs (and the unprofiled rounds between them) by the
    warm-up's run: with a budget a mnist run overfills, it takes the floor, and says so."""
    graph, data = mnist
    monkeypatch.setattr("runners.profile.PROFILE_RUNS_BUDGET_S", 1e-9)
    monkeypatch.setattr("runners.profile.MIN_PROFILE_RUNS", 3)
    tc = _CountingOrt()
    b = tc.build(BuildInput(profile_fingerprint(graph), ORT, data))
    res = profile_measure(tc, MeasureInput(b, profile_config(rounds=2, runs=7)), data)
    assert res.ok, res.error
    steps = json.loads(str(dict(res.details)[PROFILE_STEPS]))
    assert steps["profiled_runs"] == 3
    prof = OperatorProfile.from_json(dict(res.details)[PROFILE_DETAIL])
    if prof.method is ProfileMethod.ORT_TRACE:  # else a loaded host rejected the trace
        assert prof.runs == 3 and len(res.samples) == 3


def test_litert_profile_times_no_separate_whole_model(mnist) -> None:  # type: ignore[no-untyped-def]
    """LiteRT's profiler is the prefix profiler: the whole model is its last prefix, timed in
    the same rounds, and those samples are the result's; no separate whole-model timing."""
    graph, data = mnist
    tc = get_toolchain("litert")
    if tc.available() is not None:
        pytest.skip(f"litert unavailable: {tc.available()}")
    b = tc.build(BuildInput(profile_fingerprint(graph), LITERT, data))
    calls: list[MeasureConfig] = []
    measure = tc.measure

    def counting(inp: MeasureInput) -> MeasureResult:
        calls.append(inp.config)
        return measure(inp)
    tc.measure = counting  # type: ignore[method-assign]
    try:
        res = profile_measure(tc, MeasureInput(b, profile_config(rounds=3, runs=10)), data)
    finally:
        del tc.measure
    assert res.ok and res.kind is Kind.PROFILED, res.error
    assert calls == []  # every timing through `timer`: readied once per prefix
    assert len(res.samples) == 3  # one per interleaved round
    prof = OperatorProfile.from_json(dict(res.details)[PROFILE_DETAIL])
    assert prof.method is ProfileMethod.PREFIXES and not prof.rejected
    assert prof.whole_s == pytest.approx(prof.profiled_total_s)
    steps = json.loads(str(dict(res.details)[PROFILE_STEPS]))
    assert "unprofiled_s" not in steps and steps["prefix_builds"] >= 1


def test_digest_memo_hashes_each_bytes_object_once() -> None:
    memo = DigestMemo(limit=2, max_bytes=10)
    a, b, c = b"aaaa", b"bbbb", b"cccccccc"
    assert memo(a) == memo(a) and len(memo) == 1
    assert memo(b) != memo(a) and len(memo) == 2
    assert memo(c) and len(memo) == 1  # past the bytes bound: forgotten, then remembered
    assert memo(bytes(a)) == memo(a)  # equal bytes, another object: the same digest


def test_outcome_json_carries_the_steps_of_a_run() -> None:
    prof = OperatorProfile(ProfileMethod.PREFIXES, ((("a",), 1e-3),), whole_s=1e-3)
    ran = ProfileOutcome("ort-cpu", prof, ran=True, steps_s={"profiler_s": 0.5}, wall_s=2.0)
    assert ran.to_json()["steps_s"] == {"profiler_s": 0.5} and ran.to_json()["wall_s"] == 2.0
    assert "steps_s" not in ProfileOutcome("ort-cpu", prof, cached=True).to_json()
    failed = MeasureResult.failed(BuildInput("f", ORT, b""), Status.RUNTIME_ERROR, "x",
                                  MeasureConfig(), build_s=1.5)
    assert _steps(failed) == {"build_s": 1.5, "measure_s": 0.0}


def test_a_profiler_that_fails_at_once_still_gets_an_unprofiled_timing(mnist) -> None:  # type: ignore[no-untyped-def]
    """No profiled run, so no interleaved round: the whole model is timed on its own (the
    request's rounds) and the prefix profile stands in, saying why."""
    graph, data = mnist
    tc = _CountingOrt()
    b = tc.build(BuildInput(profile_fingerprint(graph), ORT, data))

    class Failing(OrtTraceProfiler):
        def profile(self, build, onnx_bytes, config, runs, between=None):  # type: ignore[no-untyped-def]
            raise RuntimeError("no trace")

    tc.profiler = lambda: Failing(tc)  # type: ignore[method-assign]
    res = profile_measure(tc, MeasureInput(b, profile_config(rounds=3, runs=5)), data)
    assert res.ok and len(res.samples) >= 3
    prof = OperatorProfile.from_json(dict(res.details)[PROFILE_DETAIL])
    assert prof.method is ProfileMethod.PREFIXES
    assert prof.rejected == "profiler ort-trace failed: RuntimeError: no trace"


class _InProcessFarm(MeasurementService):
    """The worker's answer to each request, given in this process (`profile_measure`), and
    the requests it saw."""

    def __init__(self) -> None:
        self.tc = OrtCpuToolchain()
        self.requests: list[MeasureRequest] = []

    def measure(self, requests):  # type: ignore[no-untyped-def]
        for r in requests:
            self.requests.append(r)
            b = self.tc.build(r.build)
            yield profile_measure(self.tc, MeasureInput(b, r.config), r.build.onnx_bytes)

    def describe(self, target):  # type: ignore[no-untyped-def]
        return None

    def close(self) -> None:
        pass


def test_profile_requests_send_the_whole_model_the_campaign_gave(mnist, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The campaign's plan builder has the whole model extracted already (the cut-cost probe
    built it): the profile request sends those bytes, and the outcome carries the steps."""
    graph, _ = mnist
    builder = PlanBuilder(graph)
    asked: list[int] = []

    def whole() -> bytes:
        asked.append(1)
        return builder.model_bytes(graph.all_mask)
    farm = _InProcessFarm()
    store = TableStore(tmp_path / "costs", campaign_id="c")
    try:
        out = collect_profiles(graph, [ORT], table=None, farm=farm, store=store,
                               whole_model=whole)
    finally:
        store.close()
    assert asked == [1] and len(farm.requests) == 1
    assert farm.requests[0].build.onnx_bytes is builder.model_bytes(graph.all_mask)
    o = out[ORT.id]
    assert o.ran and o.profile is not None, o.error
    assert o.wall_s > 0 and o.steps_s["profiler_s"] > 0 and "build_s" in o.steps_s
