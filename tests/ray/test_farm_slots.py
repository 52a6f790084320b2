"""A measurement owns its device: one CPU runner per last-level-cache domain unless forced.

The session cluster's head has two cores in one LLC domain (``cpu_llc_0to1``, conftest). A
default farm there measures with one runner, which holds the whole domain (so no other farm's
runner can time beside it); ``slots=2`` forces two, sharing the domain resource; a concurrency
bias <= 2% recorded for this host and CPU gives two without forcing; a bias above it does not.
"""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any

import pytest
import ray

from collage_farm.farm import BiasRecord, save_bias_record
from runners.base import DeviceDescription
from tests.ray.test_farm import candidates, null_target, requests_for


def _measure_all(farm: Any) -> set[str]:
    reqs = requests_for(candidates("mnist", target=null_target(sleep_s=0.01)))
    results = list(farm.measure(reqs))
    assert len(results) == len(reqs) and all(r.ok for r in results)
    return {dict(r.details)["runner"] for r in results}


def test_default_farm_measures_with_one_slot_unless_forced(make_farm: Any) -> None:
    farm = make_farm(toolchains=["null"])
    assert [r.cores for r in farm.runners] == [(0,)]
    assert farm.slots() == {
        "used": 1, "why": "llc-domains", "forced": None,
        "per_host": [{**farm.slots()["per_host"][0], "slots": 1, "why": "llc-domains",
                      "llc_domains": [[0, 1]], "bias": None}]}
    free = ray.available_resources()
    assert free.get("cpu_llc_0to1", 0) == 0 and free.get("cpu_slot_1", 0) == 0  # owned
    assert len(_measure_all(farm)) == 1
    farm.close()

    forced = make_farm(toolchains=["null"], slots=2)
    assert sorted(r.cores for r in forced.runners) == [(0,), (1,)]
    assert forced.slots()["used"] == 2 and forced.slots()["why"] == "forced"
    assert len(_measure_all(forced)) == 2


@pytest.mark.parametrize("bias,expect", [(0.012, (2, "measured-bias <= 2%")),
                                         (0.24, (1, "llc-domains"))])
def test_measured_bias_record_decides_more_slots(
        make_farm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bias: float,
        expect: tuple[int, str]) -> None:
    path = tmp_path / "slot-bias.json"
    monkeypatch.setenv("COLLAGE_SLOT_BIAS", str(path))
    host = next(n["NodeManagerHostname"] for n in ray.nodes() if n["Alive"])
    save_bias_record(BiasRecord(host, DeviceDescription.host_cpu().name, bias, 2, 50, "mnist",
                                "network", datetime.datetime.now().isoformat()), path)
    farm = make_farm(toolchains=["null"])
    got = farm.slots()
    assert (got["used"], got["why"]) == expect
    assert got["per_host"][0]["bias"] == bias  # the figure behind the decision is reported
    assert len(farm.runners) == expect[0]
