"""A toolchain with no per-operator timer (LiteRT) takes its profile from the cut-cost probe's
one-toolchain chain: one group per chunk, its in-chain seconds, the whole model's time from the
same rounds; the campaign hands such a profile to `collect_profiles`, which then sends no
request for that target. Hand-computed on mnist's node order."""

from __future__ import annotations

import pytest

from collage_farm.core.target import parse_targets
from collage_farm.costtable import TableStore
from collage_farm.probes.cutcost import CutCosts, chunk_bounds, masks_of
from collage_farm.probes.profiles import collect_profiles, prefix_profiled, profile_from_chain
from collage_farm.zoo.source import load_source
from estimators.profiled import TargetProfile
from runners.base import MeasureRequest, MeasureResult
from runners.profile import OperatorProfile, ProfileMethod

ORT, OV, LITERT = parse_targets("ort-cpu,openvino-cpu,litert-cpu")


@pytest.fixture(scope="module")
def graph():  # type: ignore[no-untyped-def]
    return load_source("zoo:mnist")


def _info(graph, bounds, chunk_s, whole):  # type: ignore[no-untyped-def]
    return CutCosts({LITERT.id: 0.0, ORT.id: 0.0}, len(bounds) - 1, 5,
                    chunk_s={LITERT.id: chunk_s}, wholes_s={LITERT.id: whole},
                    bounds=tuple(bounds)).to_json()


def test_the_chain_profile_is_the_chunks_in_chain_seconds(graph) -> None:  # type: ignore[no-untyped-def]
    n = len(graph.nodes)
    names = [x.name for x in graph.nodes]
    bounds = [0, 2, 5, n]
    prof = profile_from_chain(graph, _info(graph, bounds, [1e-5, 2e-5, 3e-5], 6.3e-5), LITERT.id)
    assert prof is not None and prof.method is ProfileMethod.CHAIN
    assert prof.groups == ((tuple(names[:2]), 1e-5), (tuple(names[2:5]), 2e-5),
                           (tuple(names[5:]), 3e-5))
    assert prof.whole_s == 6.3e-5 and prof.runs == 5 and prof.kernels == 3
    assert prof.problem() is None and prof.ratio == pytest.approx(6.0 / 6.3)
    # the estimator's shares add up to the whole model; a chunk costs its share of it
    tp = TargetProfile.of(prof, whole_s=6.3e-5)
    assert tp.cost_s(names[5:], False) == pytest.approx(3e-5 * 6.3 / 6.0)
    assert sum(tp.cost_s([m], False) for m in names) > 0
    assert not tp.uncertain(names[2:5]) and tp.uncertain(names[2:4])  # splits a chunk
    # it round-trips as JSON (a cost-table row never holds it, but the summary does)
    assert OperatorProfile.from_json(prof.to_json()) == prof


def test_bounds_read_back_from_the_probe_rows(graph) -> None:  # type: ignore[no-untyped-def]
    """The probe's rows carry the bounds, so a re-run or an offline search rebuilds the same
    chain profile from the table; rows without them (older versions) give none."""
    bounds = chunk_bounds(graph, 3)
    assert bounds[0] == 0 and bounds[-1] == len(graph.nodes) and len(bounds) == 4
    assert sum(masks_of(bounds)) == graph.all_mask
    cc = CutCosts({LITERT.id: 0.0}, 3, 5, chunk_s={LITERT.id: [1e-5, 1e-5, 1e-5]},
                  wholes_s={LITERT.id: 3e-5}, bounds=tuple(bounds), chunk_bytes=(0, 4, 4))
    details = {LITERT.id: dict(cc.row_details(LITERT.id))}
    back = CutCosts.from_rows({LITERT.id: 0.0}, details, 3)
    assert back.bounds == tuple(bounds)
    now, read = (profile_from_chain(graph, c.to_json(), LITERT.id) for c in (cc, back))
    assert now is not None and read is not None
    assert (read.groups, read.whole_s) == (now.groups, now.whole_s)
    assert read.runs == 0  # read back, not timed now (the probe's rounds are 0 then too)
    details[LITERT.id].pop("chunk_bounds")
    old = CutCosts.from_rows({LITERT.id: 0.0}, details, 3)
    assert old.bounds == () and profile_from_chain(graph, old.to_json(), LITERT.id) is None


def test_no_chain_profile_without_a_chain_that_covers_the_graph(graph) -> None:  # type: ignore[no-untyped-def]
    n = len(graph.nodes)
    ok = _info(graph, [0, 3, n], [1e-5, 1e-5], 2e-5)
    assert profile_from_chain(graph, ok, ORT.id) is None  # no chain of that target
    assert profile_from_chain(graph, None, LITERT.id) is None  # no probe
    assert profile_from_chain(graph, _info(graph, [0, 3, n - 1], [1e-5, 1e-5], 2e-5),
                              LITERT.id) is None  # another graph's bounds
    assert profile_from_chain(graph, _info(graph, [0, 3, n], [1e-5], 2e-5), LITERT.id) is None
    assert profile_from_chain(graph, _info(graph, [0, 3, n], [1e-5, 1e-5], 0.0),
                              LITERT.id) is None  # no whole-model time


def test_only_litert_lacks_an_operator_timer() -> None:
    assert prefix_profiled(LITERT) and not prefix_profiled(ORT) and not prefix_profiled(OV)


class _Refusing:
    """A farm that records what it is asked and answers nothing."""

    def __init__(self) -> None:
        self.requests: list[MeasureRequest] = []

    def measure(self, reqs: list[MeasureRequest]) -> list[MeasureResult]:
        self.requests += reqs
        return []

    def describe(self, target):  # type: ignore[no-untyped-def]
        return None


def test_a_given_profile_sends_no_request(graph, tmp_path) -> None:  # type: ignore[no-untyped-def]
    n = len(graph.nodes)
    given = profile_from_chain(graph, _info(graph, [0, 3, n], [1e-5, 1e-5], 2e-5), LITERT.id)
    assert given is not None
    farm = _Refusing()
    store = TableStore(tmp_path / "costs", campaign_id="c")
    try:
        out = collect_profiles(graph, [ORT, LITERT], table=None, farm=farm,  # type: ignore[arg-type]
                               store=store, given={LITERT.id: given})
    finally:
        store.close()
    assert [r.build.target.id for r in farm.requests] == [ORT.id]
    assert out[LITERT.id].profile == given and not out[LITERT.id].ran
    assert out[LITERT.id].to_json()["method"] == "probe-chain"
    assert out[ORT.id].profile is None and out[ORT.id].error  # the farm answered nothing
