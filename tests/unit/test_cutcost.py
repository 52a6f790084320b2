"""Measured cut costs (`collage_farm.probes.cutcost`): chunking laws and a real ORT/OpenVINO
probe."""

from __future__ import annotations

import itertools
from unittest import mock

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collage_farm import zoo
from collage_farm.campaign import with_cut_costs
from collage_farm.core.cutcharge import entering_bytes
from collage_farm.core.graph import load_graph
from collage_farm.core.subgraph import SubGraph, iter_bits
from collage_farm.core.target import BUILTIN_TARGETS as T
from collage_farm.core.target import parse_targets
from collage_farm.core.transition import AnalyticTransitionModel, WithCutCosts
from collage_farm.costtable import CostTable, CostTableWriter, row_from_result
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.execute.executor import PlanExecutor
from collage_farm.probes import cutcost
from collage_farm.probes.cutcost import (
    build_probe_sessions,
    cached_cut_costs,
    chunk_masks,
    cut_fingerprint,
    measure_cut_costs,
)
from collage_farm.zoo.source import load_source
from runners.base import DeviceDescription, Kind, MeasureConfig, MeasureResult, Status, Summary
from runners.registry import get_toolchain
from runners.tflite.prefix import Lowered
from tests.strategies import unary_chain


def _chain(n: int):
    return load_graph(unary_chain(["Relu"] * n))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.integers(1, 40))
def test_chunks_are_contiguous_disjoint_and_cover(n: int, k: int) -> None:
    g = _chain(n)
    masks = chunk_masks(g, k)
    assert len(masks) == min(k, n) and all(masks)
    assert sum(masks) == g.all_mask  # disjoint and covering: the bitsets add up exactly
    order = [list(iter_bits(m)) for m in masks]
    flat = [i for chunk in order for i in chunk]
    assert flat == list(range(n))  # contiguous runs of the topological order, in order
    assert max(map(len, order)) - min(map(len, order)) <= 1  # balanced


def test_real_probe_ort_and_openvino_on_mnist() -> None:
    g = load_graph(zoo.build("mnist"), name="mnist")
    targets = [T["ort-cpu"], T["openvino-cpu"]]
    cc = measure_cut_costs(g, targets, chunks=3, rounds=2, runs_per_round=3)
    assert set(cc.cuts) == {"ort-cpu", "openvino-cpu"}
    assert cc.chunks == 3 and cc.rounds == 2 and not cc.skipped
    assert set(cc.chain_s) == {"ort-cpu", "openvino-cpu", "ort-cpu/openvino-cpu",
                               "openvino-cpu/ort-cpu"}
    assert all(0 < s < 1.0 for s in cc.chain_s.values())
    js = cc.to_json()
    assert js["cuts_s"] == cc.cuts and js["chunks"] == 3
    # the fit by bytes: one line per target, each chunk's entering bytes, each chain's chunks
    assert set(cc.charges) == {"ort-cpu", "openvino-cpu"}
    assert all(c.per_byte_s >= 0 for c in cc.charges.values())
    masks = chunk_masks(g, 3)
    assert cc.chunk_bytes == tuple(entering_bytes(SubGraph(g, m)) for m in masks)
    assert cc.chunk_bytes[0] == 0 and all(b > 0 for b in cc.chunk_bytes[1:])
    assert set(cc.chunk_s) == set(cc.chain_s) and all(len(v) == 3 for v in cc.chunk_s.values())
    assert js["cut_charges"]["ort-cpu"] == cc.charges["ort-cpu"].to_json()


def test_a_wholes_probe_fills_each_round_like_the_verify_run() -> None:
    """Profile mode's probe (``wholes``) runs each chain for about `WHOLES_MIN_ROUND_S`
    a round, so a ~50 us model's whole-model times are warm like the verify run's, not four
    runs after other chains evicted the caches."""
    g = load_graph(zoo.build("mnist"), name="mnist")
    targets = [T["ort-cpu"], T["openvino-cpu"]]
    cc = measure_cut_costs(g, targets, chunks=3, rounds=2, runs_per_round=3, wholes=True)
    assert set(cc.wholes_s) == {"ort-cpu", "openvino-cpu"} and not cc.skipped
    assert set(cc.runs) == set(cc.chain_s)
    for n in cc.runs.values():
        # tens of microseconds a run: sized to the round, far more than runs_per_round (how
        # close n runs come to a round is a timing, load-dependent: bench/, not asserted)
        assert n > 3
    assert cc.to_json()["runs_per_round"] == cc.runs
    plain = measure_cut_costs(g, targets, chunks=3, rounds=1, runs_per_round=3)
    assert set(plain.runs.values()) == {3}  # without wholes: as asked


@pytest.mark.parametrize("workers", [1, 2])
def test_sessions_built_ahead_are_the_ones_the_probe_times(workers: int) -> None:
    """`build_probe_sessions` builds each target's chunks and whole model into the builder
    (on one thread, or one per target at once); the probe on the same builder then builds
    nothing of those chains again (its builds are the mixed chains, whose chunks are all
    cached), and its chunks are the same bounds."""
    g = load_graph(zoo.build("mnist"), name="mnist")
    targets = [T["ort-cpu"], T["openvino-cpu"]]
    builder = PlanBuilder(g)
    made: list[tuple[int, str]] = []
    real = cutcost.PlanBuilder.runtime

    def counting(self, k, part, estimated_s=0.0, *, sliced=False):  # type: ignore[no-untyped-def]
        key = (part.mask, part.target.id, sliced and part.mask != self.graph.all_mask)
        if key not in self._cache:
            made.append((part.mask, part.target.id))
        return real(self, k, part, estimated_s, sliced=sliced)

    with mock.patch.object(cutcost.PlanBuilder, "runtime", counting):
        ahead = build_probe_sessions(g, targets, builder, chunks=3, wholes=True,
                                     workers=workers)
        assert ahead["built"] == 4 and ahead["failed"] == [] and ahead["seconds"] > 0
        assert ahead["workers"] == workers
        assert len(made) == 2 * (3 + 1)  # each target's 3 chunks and its whole model
        made.clear()
        cc = measure_cut_costs(g, targets, chunks=3, rounds=1, builder=builder, wholes=True)
    assert made == [] and not cc.skipped
    assert [sum(1 << j for j in range(a, b)) for a, b in itertools.pairwise(cc.bounds)] \
        == chunk_masks(g, 3)


def test_a_target_that_cannot_run_a_chunk_is_skipped_not_fatal() -> None:
    # Hardmax has no TFLite mapping: every chain with LiteRT is skipped, ORT/OV still measured
    g = load_graph(unary_chain(["Relu", "Hardmax", "Relu"]))
    litert = T.get("litert-cpu")
    if litert is None:
        pytest.skip("no litert-cpu target")
    cc = measure_cut_costs(g, [T["ort-cpu"], litert], chunks=3, rounds=1, runs_per_round=2)
    assert any(s.startswith("litert-cpu:") for s in cc.skipped), cc.skipped
    assert "ort-cpu" in cc.chain_s and cc.cuts["litert-cpu"] == 0.0


def test_campaign_wraps_transitions_only_when_toolchains_mix() -> None:
    g = load_graph(zoo.build("mnist"), name="mnist")
    base = AnalyticTransitionModel()
    same, info = with_cut_costs(g, [T["ort-cpu"]], base)
    assert same is base and info is None
    sim, info = with_cut_costs(g, [T["ort-cpu"], T["ethos-u55-128"]], base)
    assert sim is base and info is None  # a simulated device has no cut to time here
    mixed, info = with_cut_costs(g, [T["ort-cpu"], T["openvino-cpu"]], base)
    assert isinstance(mixed, WithCutCosts) and mixed.base is base
    assert info is not None and set(info["cuts_s"]) == {"ort-cpu", "openvino-cpu"}
    assert mixed.cut_s(T["openvino-cpu"]) == pytest.approx(info["cuts_s"]["openvino-cpu"])


def test_cut_costs_land_in_the_cost_table_and_are_reused(tmp_path) -> None:
    """A second campaign on the same model and host reads the probe back: same penalties, so
    the lazy search asks for the same candidates; offline campaigns reuse, never measure."""
    g = load_graph(zoo.build("mnist"), name="mnist")
    targets = [T["ort-cpu"], T["openvino-cpu"]]
    table = tmp_path / "costs"
    assert cached_cut_costs(CostTable(table), g, targets, chunks=3, measure=False) is None
    with CostTableWriter(table) as w:
        first = cached_cut_costs(CostTable(table), g, targets, writer=w, chunks=3, rounds=1,
                                 runs_per_round=2)
    assert first is not None and not first.cached
    rows = CostTable(table).rows()
    fp = cut_fingerprint(g, 3)
    assert sorted(r.target for r in rows) == ["openvino-cpu", "ort-cpu"]
    assert all(r.fingerprint == fp and r.ok and r.kind == "measured" for r in rows)
    again = cached_cut_costs(CostTable(table), g, targets, chunks=3, measure=False)
    assert again is not None and again.cached and again.rounds == 0
    assert again.cuts == pytest.approx(first.cuts)
    assert again.charges == first.charges and set(again.charges) == set(first.cuts)
    # the line rides in the rows' JSON details: the schema is unchanged, DuckDB reads it
    got = duckdb.connect().sql(
        "select target, cast(json_extract(details, '$.cut_per_byte_s') as double) from "
        f"read_parquet('{table}/**/*.parquet') order by target").fetchall()
    assert got == [(t, pytest.approx(first.charges[t].per_byte_s))
                   for t in ("openvino-cpu", "ort-cpu")]
    assert len(CostTable(table).rows()) == 2  # nothing measured or written again
    base = AnalyticTransitionModel()
    offline, info = with_cut_costs(g, targets, base, table, measure=False)
    assert offline is base and info is None  # 6 chunks by default: the table holds 3
    cached3, info3 = with_cut_costs(g, targets, base, None, measure=False)
    assert cached3 is base and info3 is None  # no table, no measuring: unchanged


def test_plan_builder_extracts_a_node_set_once_for_every_target() -> None:
    """The probe builds each chunk on every target: the node set is extracted once and its
    bytes reused (same model, whichever target asks first)."""
    graph = load_source("zoo:mnist")
    calls: list[int] = []
    extract = SubGraph.extract

    def counting(self, *a, **k):  # type: ignore[no-untyped-def]
        calls.append(self.mask)
        return extract(self, *a, **k)
    SubGraph.extract = counting  # type: ignore[method-assign]
    try:
        b = PlanBuilder(graph)
        ort, ov = parse_targets("ort-cpu,openvino-cpu")
        half = (1 << (len(graph.nodes) // 2)) - 1
        rest = graph.all_mask ^ half
        b.executor([Part(half, ort), Part(rest, ort)])
        b.executor([Part(half, ov), Part(rest, ov)])
        b.executor([Part(graph.all_mask, ov)])
    finally:
        SubGraph.extract = extract  # type: ignore[method-assign]
    assert sorted(calls) == sorted([half, rest, graph.all_mask])


def test_a_chain_longer_than_a_round_is_warmed_once_before_its_rounds(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """One warm-up and one proving run per chain when the proving run fills a round (it
    sizes nothing then); the rounds follow."""
    graph = load_source("zoo:mnist")
    runs: list[int] = []
    real = PlanExecutor.measure_in_chain

    def counting(self, n, *, warmup=0, feeds=None):  # type: ignore[no-untyped-def]
        runs.append(n + warmup)
        return real(self, n, warmup=warmup, feeds=feeds)
    monkeypatch.setattr(PlanExecutor, "measure_in_chain", counting)
    monkeypatch.setattr(cutcost, "WHOLES_MIN_ROUND_S", 0.0)  # every chain fills a round
    ort, ov = parse_targets("ort-cpu,openvino-cpu")
    cc = cutcost.measure_cut_costs(graph, [ort, ov], chunks=2, rounds=1, wholes=True)
    chains = len(cc.chain_s)
    assert chains == 6 and not cc.skipped  # 2 single-target, 2 wholes, 2 pairs
    assert sum(runs) == chains * (2 + 1)  # warm-up + proving run, then one round of one


def test_entering_bytes_counts_tensors_from_other_nodes_once() -> None:
    # t0 -> n0 -> t1 -> n1 -> t2 -> n2 -> t3, [1, 8] float32: 32 bytes a tensor
    g = _chain(3)
    def entering(mask: int) -> int:
        return entering_bytes(SubGraph(g, mask))
    assert entering(0b001) == 0  # reads the graph input: no cut
    assert entering(0b010) == 32 and entering(0b110) == 32
    assert entering(0b111) == 0


def test_rows_written_before_the_fit_charge_their_constant(tmp_path) -> None:
    """A cut-cost row without the fitted line (written by an earlier version) reads back as a
    constant charge, whatever the bytes."""
    g = load_graph(zoo.build("mnist"), name="mnist")
    targets = [T["ort-cpu"], T["openvino-cpu"]]
    fp, host = cut_fingerprint(g, 3), DeviceDescription.host_cpu()
    table = tmp_path / "costs"
    with CostTableWriter(table) as w:
        for t, v in zip(targets, (40e-6, 90e-6)):
            res = MeasureResult(fp, t, Status.OK, MeasureConfig(mode="warm"), samples=(v,),
                                summary=Summary.of((v,)), kind=Kind.MEASURED, device=host,
                                details=(("chunks", 3), ("rounds", 5)))
            w.append(row_from_result(res, campaign_id="old", model=g.name, nodes=[],
                                     op_types=["cut"]))
    old = cached_cut_costs(CostTable(table), g, targets, chunks=3, measure=False)
    assert old is not None and old.cached and old.charges == {}
    assert old.cuts == pytest.approx({"ort-cpu": 40e-6, "openvino-cpu": 90e-6})
    tm = WithCutCosts(AnalyticTransitionModel(), old.cuts, old.charges)
    base = AnalyticTransitionModel()
    for nbytes in (None, 64, 10**6):
        assert tm.cut_s(T["openvino-cpu"], nbytes) == pytest.approx(
            90e-6 + base.cut_s(T["openvino-cpu"], nbytes))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 12), st.sets(st.integers(1, 39)))
def test_chunk_bounds_move_to_the_nearest_cut_and_still_cover(n: int, k: int,
                                                              cuts: set[int]) -> None:
    g = _chain(n)
    cuts = {p for p in cuts if p < n}
    masks = chunk_masks(g, k, cuts)
    assert len(masks) == min(k, n) and all(masks) and sum(masks) == g.all_mask
    flat = [i for m in masks for i in iter_bits(m)]
    assert flat == list(range(n))  # still contiguous runs in order
    plain = [0, *itertools.accumulate(m.bit_count() for m in chunk_masks(g, k))]
    bounds = [0, *itertools.accumulate(m.bit_count() for m in masks)]
    for i in range(1, len(bounds) - 1):  # a cut between the moved bound before and the next
        near = [p for p in cuts if bounds[i - 1] < p < plain[i + 1]]
        assert (bounds[i] in cuts and all(abs(p - plain[i]) >= abs(bounds[i] - plain[i])
                                          for p in near)) if near else bounds[i] == plain[i]


def test_probe_cuts_litert_chunks_from_one_lowering(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """With LiteRT among the targets, the chunk bounds lie where LiteRT's whole lowering can
    be cut and its chunks and whole model come from that one lowering: no conversion of its
    own per chunk (`PlanBuilder.executor`, ``sliced``)."""
    litert = T["litert-cpu"]
    if get_toolchain("litert").available() is not None:
        pytest.skip("litert unavailable")
    graph = load_source("zoo:mnist")
    lowerings = mock.Mock(side_effect=Lowered.of)
    monkeypatch.setattr(Lowered, "of", lowerings)
    builder = PlanBuilder(graph)
    cc = measure_cut_costs(graph, [T["ort-cpu"], litert], chunks=4, rounds=1,
                           runs_per_round=2, builder=builder, wholes=True)
    assert not cc.skipped and "litert-cpu" in cc.chain_s and "litert-cpu@whole" in cc.chain_s
    assert lowerings.call_count == 1  # the whole model's, for its cuts, every chunk and itself
    assert set(cc.steps_s) == {"cuts_s", "build_s", "warm_s", "rounds_s"}
    assert 0 < sum(cc.steps_s.values()) <= cc.wall_s + 0.01
    assert cc.to_json()["steps_s"] == cc.steps_s
    cuts = Lowered.of_whole(builder.whole).cuts()
    masks = chunk_masks(graph, 4, cuts)
    assert masks != chunk_masks(graph, 4)  # mnist's even bounds fall inside a fusion
    assert all(b in cuts for b in itertools.accumulate(m.bit_count() for m in masks[:-1]))
