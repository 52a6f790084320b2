"""Where a campaign times its plans against its runners' devices (`campaign.timing_host`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from collage_farm.campaign import TuneOptions, load_source, profiled_estimator
from collage_farm.campaign.timing_host import HostMatch, device_here, plan_timing_host
from collage_farm.cli.tune import print_summary
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import Target, parse_targets
from collage_farm.costtable import CostTableWriter, TableStore, row_from_result
from collage_farm.probes.profiles import profile_fingerprint
from estimators.sources import MeasurementService
from estimators.table import TableEstimator
from runners.base import BuildInput, DeviceDescription, MeasureInput
from runners.ort import OrtCpuToolchain
from runners.profile import PROFILE_DETAIL, OperatorProfile, profile_config, profile_measure

ORT, OV, VELA = parse_targets("ort-cpu,openvino-cpu,ethos-u55-128")
HEAD = DeviceDescription("cpu", "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", 4)


class _Runners(MeasurementService):
    """A service whose runners report the devices given, by target id (None: no runner)."""

    def __init__(self, devices: dict[str, DeviceDescription | None]) -> None:
        self.devices = devices
        self.asked: list[str] = []

    def measure(self, requests):  # type: ignore[no-untyped-def]
        raise AssertionError("nothing is measured here")

    def describe(self, target: Target) -> tuple[DeviceDescription | None, str] | None:
        self.asked.append(target.id)
        d = self.devices.get(target.id)
        return None if d is None else (d, "v1")

    def close(self) -> None:
        pass


def test_runners_on_this_host_are_the_same_device() -> None:
    """An embedded Ray's runners describe this host's CPU as this process does: no warning;
    simulated targets are not compared (no timing), and each target is asked once."""
    here = device_here(ORT)
    assert here.kind == "cpu" and here == DeviceDescription.host_cpu()
    svc = _Runners({"ort-cpu": here, "openvino-cpu": here})
    got = plan_timing_host([ORT, OV, VELA, ORT], svc)
    assert [t.target for t in got.targets] == ["ort-cpu", "openvino-cpu"]
    assert svc.asked == ["ort-cpu", "openvino-cpu"]
    assert all(t.match is HostMatch.SAME for t in got.targets)
    assert got.different == () and got.warning() is None
    assert got.to_json()["warning"] is None


def test_a_coordinator_on_another_machine_is_said_and_named() -> None:
    """A campaign run on a cluster's head (another CPU, or another core count) times its
    plans on another device than the runners: one warning line names each target and both
    devices; a target no runner serves is unknown, not different."""
    here = DeviceDescription.host_cpu()
    svc = _Runners({"ort-cpu": HEAD, "openvino-cpu": None})
    got = plan_timing_host([ORT, OV], svc, here=lambda t: here)
    assert got.targets[0].match is HostMatch.DIFFERENT
    assert got.targets[1].match is HostMatch.UNKNOWN and got.targets[1].runner is None
    assert got.different == ("ort-cpu",)
    line = got.warning()
    assert line is not None and line.startswith("warning: this campaign's own end-to-end")
    assert f"ort-cpu: here {here.describe()}, runner {HEAD.describe()}" in line
    assert "openvino-cpu" not in line
    same_model_more_cores = DeviceDescription(here.kind, here.name, here.cores + 2)
    got = plan_timing_host([ORT], _Runners({"ort-cpu": same_model_more_cores}),
                           here=lambda t: here)
    assert got.different == ("ort-cpu",)  # a 4-vCPU head is not a 2-core measurement node


def test_a_gpu_shown_under_another_visibility_is_the_same_gpu() -> None:
    """A Ray GPU worker sees its GPU as ``CUDA_VISIBLE_DEVICES=0``, the campaign's process on
    the same machine sees every GPU: the same device, not a warning on every one-machine GPU
    campaign; another GPU model, or none here, is different."""
    (cuda,) = parse_targets("ort-cuda")
    h100 = DeviceDescription("cuda", "NVIDIA H100 80GB HBM3", driver="580.1", config="visible=")
    on_worker = DeviceDescription("cuda", "NVIDIA H100 80GB HBM3", driver="580.1",
                                  config="visible=0")
    got = plan_timing_host([cuda], _Runners({"ort-cuda": on_worker}), here=lambda t: h100)
    assert got.targets[0].match is HostMatch.SAME and got.warning() is None
    assert got.targets[0].runner == on_worker.describe()  # shown as the runner said it
    none_here = DeviceDescription("cuda", "unavailable", config="no CUDA device")
    a10g = DeviceDescription("cuda", "NVIDIA A10G", driver="580.1", config="visible=0")
    for here in (none_here, a10g):
        got = plan_timing_host([cuda], _Runners({"ort-cuda": on_worker}),
                               here=lambda t, d=here: d)  # type: ignore[misc]
        assert got.different == ("ort-cuda",)


def test_the_warning_is_printed_in_the_summary(capsys: pytest.CaptureFixture[str]) -> None:
    here = DeviceDescription.host_cpu()
    got = plan_timing_host([ORT], _Runners({"ort-cpu": HEAD}), here=lambda t: here)
    summary = {"estimator": "farm", "model": "m", "nodes": 1, "candidates": 1,
               "distinct_fingerprints": 1, "measured": 0, "cache_hits": 0, "pruned": 0,
               "failed": 0, "search_s": 0.0, "wall_s": 0.0, "plan": "out/plan.json",
               "plan_timing_host": got.to_json()}
    print_summary(summary)
    assert got.warning() in capsys.readouterr().out.splitlines()


def test_a_foreign_target_keeps_its_runners_time_base(tmp_path: Path) -> None:
    """Profile mode scales each target's shares to the cut-cost probe's whole-model time,
    taken in this process; for a target this process times on another device, the profile's
    own whole-model time (the runner's) stays the time base."""
    graph = load_source("zoo:mnist")
    data = SubGraph(graph, graph.all_mask).extract("mnist_whole").SerializeToString()
    tc = OrtCpuToolchain()
    b = tc.build(BuildInput(profile_fingerprint(graph), ORT, data))
    res = profile_measure(tc, MeasureInput(b, profile_config(rounds=2, runs=10)), data)
    assert res.ok, res.error
    prof = OperatorProfile.from_json(dict(res.details)[PROFILE_DETAIL])
    with CostTableWriter(tmp_path / "costs", background=False) as w:
        w.append(row_from_result(res, campaign_id="c", model=graph.name, nodes=(),
                                 op_types=("profile",)))
    opts = TuneOptions(model="zoo:mnist", targets=(ORT,), out=tmp_path / "out",
                       estimator="offline", cost_table=tmp_path / "costs", strictness="any")
    iso = TableEstimator(TableStore.existing(tmp_path / "costs"), strictness="any")
    probe = {"wholes_s": {"ort-cpu": 3.0 * prof.whole_s}}  # this process's time base
    whole = CandidatePartition(SubGraph(graph, graph.all_mask), ORT, rule="whole")
    here_est, _ = profiled_estimator(opts, graph, iso, probe)
    assert here_est.estimate([whole])[0].seconds == pytest.approx(3.0 * prof.whole_s)
    away_est, _ = profiled_estimator(opts, graph, iso, probe, foreign=("ort-cpu",))
    assert away_est.estimate([whole])[0].seconds == pytest.approx(prof.whole_s)
