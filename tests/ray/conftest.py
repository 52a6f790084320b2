"""One local Ray cluster for the whole test session, shared by every Ray test.

Why a `ray.cluster_utils.Cluster` and not a plain ``ray.init``: the multi-node test needs to add
a second node to a running cluster and take it away again, and only a `Cluster` can; starting a
second Ray in the same process is impossible (Ray is a per-process singleton) and in another
process costs seconds. So the session cluster *is* a Cluster: a head node with fixed resources
(``num_cpus=2``, one ``cpu_slot_<i>`` per CPU, both cores in one last-level-cache domain
``cpu_llc_0to1``, as this 2-core machine's embedded Ray declares them; no dashboard), which the
multi-node test grows and shrinks. A farm on it measures with one CPU runner by default (one
per LLC domain); tests of parallel runners ask for two with ``make_farm(slots=2)``.
``RAY_AUTH_MODE=disabled`` is set for tests only (token auth stays on elsewhere); it must be in
the environment before Ray starts. ``COLLAGE_SLOT_BIAS`` points at a file that does not exist,
so a concurrency-bias record on the machine running the tests never changes their slots.

`make_farm` starts farms on that cluster and closes them after the test, so every test starts
from free slots. Farms take ~1.5 s to start (actors + LocalRunner worker processes).
"""

from __future__ import annotations

import os

os.environ["RAY_AUTH_MODE"] = "disabled"  # tests only; before ray is imported anywhere
os.environ["COLLAGE_SLOT_BIAS"] = os.path.join(  # no bias record: one runner per LLC domain
    os.path.dirname(os.path.abspath(__file__)), "no-slot-bias-records.json")

from collections.abc import Callable, Iterator
from typing import Any

import pytest

ray = pytest.importorskip("ray")

HEAD_RESOURCES = {"cpu_slot_0": 1.0, "cpu_slot_1": 1.0, "cpu_llc_0to1": 1.0}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True,
        connect=True,
        head_node_args={
            "num_cpus": 2,
            "resources": dict(HEAD_RESOURCES),
            "include_dashboard": False,
        },
    )
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture
def make_farm(ray_cluster: Any) -> Iterator[Callable[..., Any]]:
    from collage_farm.farm import Farm

    farms: list[Any] = []

    def make(**kw: Any) -> Any:
        kw.setdefault("toolchains", ["null", "ort-cpu"])
        kw.setdefault("progress", False)
        kw.setdefault("startup_timeout_s", 120.0)
        farm = Farm.start(**kw)
        farms.append(farm)
        return farm

    yield make
    for f in farms:
        f.close()
