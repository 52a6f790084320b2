"""LLC domains from a sysfs tree, their Ray resources, and the CPU slot decision (no Ray)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collage_farm.farm.resources import local_resources, plan_runners, plan_slots
from collage_farm.farm.slots import (
    BiasRecord,
    SlotReason,
    host_slots,
    load_bias_records,
    per_domain_counts,
    records_for_nodes,
    save_bias_record,
    split_domain,
)
from collage_farm.farm.topology import (
    domain_resource,
    llc_domains,
    node_domains,
    parse_cpulist,
    parse_domain_resource,
)


def fake_sys(root: Path, caches: dict[int, dict[int, str]]) -> Path:
    """``root``/devices/system/cpu/cpu<N>/cache/index<K>/{level,shared_cpu_list}: per core,
    level -> shared list (level 1 and 2 entries private, as on real machines)."""
    for cpu, levels in caches.items():
        for k, (level, shared) in enumerate(sorted(levels.items())):
            d = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "cache" / f"index{k}"
            d.mkdir(parents=True)
            (d / "level").write_text(f"{level}\n")
            (d / "shared_cpu_list").write_text(f"{shared}\n")
    return root


def two_ccx(root: Path) -> Path:
    """8 cores in two L3 domains (0-3, 4-7), private L1/L2."""
    return fake_sys(root, {c: {1: str(c), 2: str(c), 3: "0-3" if c < 4 else "4-7"}
                           for c in range(8)})


def rec(bias: float, slots: int = 2, host: str = "h1", cpu: str = "EPYC") -> BiasRecord:
    return BiasRecord(host, cpu, bias, slots, 100, "resnet18", "network", "2026-11-26T10:00:00")


def node(nid: str, resources: dict[str, float], host: str = "h1") -> dict:
    return {"NodeID": nid, "Alive": True, "NodeManagerHostname": host, "Resources": resources}


# --- topology ------------------------------------------------------------------------------

def test_llc_domains_from_fake_sys_tree(tmp_path: Path) -> None:
    root = two_ccx(tmp_path)
    assert llc_domains(range(8), root) == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert llc_domains([1, 2, 5], root) == ((1, 2), (5,))  # restricted to the usable cores
    # SMT siblings in the shared list (cores 0-1 with their threads 8-9) stay in one domain
    smt = fake_sys(tmp_path / "smt", {c: {3: "0-1,8-9"} for c in (0, 1, 8, 9)})
    assert llc_domains([0, 1, 8, 9], smt) == ((0, 1, 8, 9),)


def test_llc_domains_fall_back_to_one_per_host(tmp_path: Path) -> None:
    # no level-3 entry (a VM that shows only private L1/L2): one domain, never one per core
    l2_only = fake_sys(tmp_path / "l2", {c: {1: str(c), 2: str(c)} for c in range(4)})
    assert llc_domains(range(4), l2_only) == ((0, 1, 2, 3),)
    assert llc_domains(range(4), tmp_path / "absent") == ((0, 1, 2, 3),)
    # a damaged entry counts as undescribed; the described cores keep their domain
    part = fake_sys(tmp_path / "part", {0: {3: "0-1"}, 1: {3: "0-1"}, 2: {3: "garbage"}})
    assert llc_domains(range(4), part) == ((0, 1), (2, 3))


def test_cpulist_and_resource_names() -> None:
    assert parse_cpulist("0-3,8,10-11\n") == (0, 1, 2, 3, 8, 10, 11)
    for bad in ("0-", "a", "3-1"):
        with pytest.raises(ValueError):
            parse_cpulist(bad)
    assert domain_resource((0, 1, 2, 3, 8, 10, 11)) == "cpu_llc_0to3_8_10to11"
    assert parse_domain_resource("cpu_llc_0to7") == tuple(range(8))
    for other in ("cpu_slot_0", "cpu_llc_", "cpu_llc_7to0", "cpu_llc_0-7", "CPU"):
        assert parse_domain_resource(other) is None


@given(st.sets(st.integers(0, 300), min_size=1, max_size=40))
def test_domain_resource_round_trips(cores: set[int]) -> None:
    name = domain_resource(cores)
    assert name.replace("_", "").isalnum()  # Ray accepts it (no '-' or ',')
    assert parse_domain_resource(name) == tuple(sorted(cores))


def test_node_domains_declared_and_not() -> None:
    res = {"CPU": 8, "cpu_llc_0to3": 1, "cpu_llc_4to7": 1,
           **{f"cpu_slot_{c}": 1 for c in range(6)}}
    assert node_domains(res, range(6)) == (((0, 1, 2, 3), "cpu_llc_0to3"),
                                           ((4, 5), "cpu_llc_4to7"))
    # nothing declared: one domain per host; slot cores outside any declaration: one more
    assert node_domains({"cpu_slot_0": 1}, [0, 1]) == (((0, 1), None),)
    assert node_domains({"cpu_llc_0to1": 1}, [0, 1, 2]) == (((0, 1), "cpu_llc_0to1"),
                                                           ((2,), None))


def test_local_resources_declare_llc_domains(tmp_path: Path) -> None:
    root = two_ccx(tmp_path)
    local = local_resources(None, 0, 0, ["cpu"], sys_root=str(root))
    res = local.resources
    slots = sorted(k for k in res if k.startswith("cpu_slot_"))
    assert len(slots) == local.num_cpus
    llc = {k for k in res if k.startswith("cpu_llc_")}
    assert llc and all(res[k] == 1.0 for k in llc)
    cores = [int(k.rsplit("_", 1)[1]) for k in slots]
    assert {c for k in llc for c in parse_domain_resource(k) or ()} == set(cores)


# --- the slot decision -----------------------------------------------------------------------

def test_per_domain_counts() -> None:
    doms = [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert per_domain_counts(doms, None, None) == ((1, 1), SlotReason.LLC_DOMAINS)
    assert per_domain_counts(doms, None, rec(0.24)) == ((1, 1), SlotReason.LLC_DOMAINS)
    assert per_domain_counts(doms, None, rec(0.015)) == ((2, 2), SlotReason.MEASURED_BIAS)
    assert per_domain_counts(doms, None, rec(0.02, slots=8)) == ((4, 4),
                                                                  SlotReason.MEASURED_BIAS)
    assert per_domain_counts(doms, 1, None) == ((1, 0), SlotReason.FORCED)
    assert per_domain_counts(doms, 3, rec(0.24)) == ((2, 1), SlotReason.FORCED)
    assert per_domain_counts(doms, 99, None) == ((4, 4), SlotReason.FORCED)  # capped
    assert per_domain_counts([(0,), (1, 2, 3)], 3, None) == ((1, 2), SlotReason.FORCED)


def test_split_domain_and_shares() -> None:
    assert split_domain((0, 1, 2, 3, 4), 2) == [(0, 1), (2, 3, 4)]
    assert split_domain((0, 1), 1) == [(0, 1)]
    h = host_slots("n" * 16, "h1", [((0, 1, 2), "cpu_llc_0to2")], forced=3)
    assert [r.cores for r in h.runners] == [(0,), (1,), (2,)]
    assert sum(r.llc_share for r in h.runners) <= 1.0  # three of them fit in one domain
    assert all(r.llc == "cpu_llc_0to2" for r in h.runners)


def test_plan_runners_one_per_domain_by_default(tmp_path: Path) -> None:
    res = {"CPU": 8, "cpu_llc_0to3": 1, "cpu_llc_4to7": 1,
           **{f"cpu_slot_{c}": 1 for c in range(8)}}
    nodes = [node("a" * 16, res), node("b" * 16, {"CPU": 2, "cpu_slot_0": 1, "cpu_slot_1": 1},
                                         host="h2")]
    specs = plan_runners(nodes, {"ort-cpu": "cpu"})
    assert [(s.node_id[0], s.cores) for s in specs] == [("a", (0,)), ("a", (4,)), ("b", (0,))]
    first = dict(specs[0].resources)
    assert first == {"cpu_slot_0": 1, "cpu_slot_1": 1, "cpu_slot_2": 1, "cpu_slot_3": 1,
                     "cpu_llc_0to3": 1.0}  # the runner owns its domain
    assert dict(specs[2].resources) == {"cpu_slot_0": 1, "cpu_slot_1": 1}
    plan = plan_slots(nodes, forced=2)
    assert plan.to_json()["used"] == 4 and plan.why is SlotReason.FORCED
    assert [len(h.runners) for h in plan.hosts] == [2, 2]
    forced = plan_runners(nodes, {"ort-cpu": "cpu"}, slots=plan)
    assert dict(forced[0].resources)["cpu_llc_0to3"] == 1.0  # 2 on 2 domains: one each
    assert dict(forced[2].resources) == {"cpu_slot_0": 1}


def test_plan_slots_plain_cluster_and_records(caplog: pytest.LogCaptureFixture) -> None:
    nodes = [node("a" * 16, {"CPU": 4}), node("b" * 16, {"CPU": 2}, host="h2")]
    specs = plan_runners(nodes, {"null": "cpu"})
    assert [(s.name[-2:], s.cores, s.resources) for s in specs] == [("u0", (), ())] * 2
    plan = plan_slots(nodes, records={"a" * 16: rec(0.01)})
    assert [len(h.runners) for h in plan.hosts] == [2, 1]
    assert plan.why is SlotReason.MEASURED_BIAS
    out = plan.to_json()
    assert out["per_host"][0]["why"] == "measured-bias <= 2%" and out["per_host"][0]["bias"]
    with caplog.at_level(logging.INFO, logger="collage_farm.farm.slots"):
        plan.log()
    assert "+1.0%" in caplog.text and "measured on h1" in caplog.text


def test_bias_records_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "sub" / "slot-bias.json"
    assert load_bias_records(path) == {}
    save_bias_record(rec(0.24), path)
    save_bias_record(rec(0.01, host="h2"), path)
    save_bias_record(rec(0.013), path)  # the same host and CPU: replaced
    got = load_bias_records(path)
    assert sorted(got) == ["h1|EPYC", "h2|EPYC"] and got["h1|EPYC"].bias == 0.013
    nodes = [node("a" * 16, {}), node("b" * 16, {}, host="h2"), node("c" * 16, {}, host="h3")]
    asked: list[str] = []

    def cpu_of(n: dict) -> str:
        asked.append(n["NodeManagerHostname"])
        return "EPYC" if n["NodeID"][0] == "a" else "Xeon"

    assert records_for_nodes(nodes, got, cpu_of) == {"a" * 16: got["h1|EPYC"]}
    assert asked == ["h1", "h2"]  # h3 has no record: its CPU is not asked for
    path.write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert load_bias_records(path) == {}
    assert "ignoring the slot bias records" in caplog.text
    path.write_text(json.dumps({"records": {"h1|EPYC": {"host": "h1"}}}))
    assert load_bias_records(path) == {}


def test_summary_line_says_how_many_and_why() -> None:
    from collage_farm.cli.tune import _slots_line

    plan = plan_slots([node("a" * 16, {"CPU": 2, "cpu_slot_0": 1, "cpu_slot_1": 1,
                                       "cpu_llc_0to1": 1})], forced=2,
                      records={"a" * 16: rec(0.24)})
    line = _slots_line(plan.to_json())
    assert line == ("measured with 2 CPU slot(s) (forced: --slots 2 per host; measured "
                    "concurrency bias h1 +24.0% at 2 per domain)")
    assert _slots_line(plan_slots([node("b" * 16, {"CPU": 1})]).to_json()) == (
        "measured with 1 CPU slot(s) (llc-domains)")
