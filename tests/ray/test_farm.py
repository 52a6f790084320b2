"""The farm on the shared local Ray cluster: measuring, dedupe, cache hits, runner death, resume.

Costs come from the ``null`` toolchain (deterministic, microseconds, fault injection through
target options) and, where real timing matters, from ONNX Runtime (``ort-cpu``). Runner actor
processes die on demand in farms started with `tests.ray.fault_drill.FaultDrillRunner`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import load_graph
from collage_farm.core.rules import RuleOptions, all_candidates, default_spec
from collage_farm.core.target import BUILTIN_TARGETS, CPU0, Target
from runners.base import BuildInput, MeasureConfig, Status
from tests.ray.fault_drill import FaultDrillRunner

REPO = Path(__file__).resolve().parents[2]
FAST = MeasureConfig(warmup_runs=1, rounds=3, min_round_runs=3, min_round_s=0.002, timeout_s=60)


def null_target(**options: Any) -> Target:
    return Target.make("null-cpu", "null", CPU0, options)


def candidates(model: str = "resnet18", depth: int = 1, target: Target | None = None,
               segments: bool = False, **kw: Any) -> list[CandidatePartition]:
    """Candidates of a zoo model for one target (deterministic: used by the subprocess too).

    Segments (whole runs of the model, weights included: up to 44 MB each for resnet18) are
    off unless a test is about them: the farm tests are about dispatch, not payload size."""
    from collage_farm import zoo
    from runners.registry import capabilities_for

    if model == "resnet18":
        kw.setdefault("image_size", 32)
    g = load_graph(zoo.build(model, **kw), name=model)
    t = target or null_target()
    caps = capabilities_for(t.toolchain)
    spec = default_spec(t, caps.supports, caps.style,
                        RuleOptions(max_depth=depth, segments=segments))
    return all_candidates(g, [spec])


def requests_for(cands: list[CandidatePartition], config: MeasureConfig = FAST) -> list[Any]:
    from runners.base import MeasureRequest

    out = []
    seen: set[str] = set()
    for c in cands:
        if c.fingerprint in seen:
            continue
        seen.add(c.fingerprint)
        out.append(MeasureRequest(BuildInput(c.fingerprint, c.target,
                                             c.sub_graph.extract().SerializeToString(),
                                             label=c.label()), config))
    return out


def table_rows(path: Path) -> list[Any]:
    from collage_farm.costtable import CostTable

    return CostTable(path).rows() if path.exists() else []


# ------------------------------------------------------------------------------------------


def estimate_once(farm: Any, table: Path, cands: list[CandidatePartition], campaign_id: str,
                  model: str) -> tuple[Any, list[Any]]:
    """One campaign's costs for ``cands`` through a `FarmEstimator` that is closed after."""
    from collage_farm.costtable import TableStore
    from estimators.measured import FarmEstimator

    est = FarmEstimator(farm, TableStore(table, campaign_id=campaign_id),
                        model=model, close_farm=False,
                        measure_config=FAST)
    costs = est.estimate(cands)
    est.close()
    return est, costs


def test_measure_batch_null_and_ort(make_farm: Any) -> None:
    farm = make_farm(slots=2)  # two runners in one LLC domain: parallel dispatch is tested
    assert len(farm.runners) == 2
    assert all(set(r.toolchains) == {"null", "ort-cpu"} for r in farm.runners)
    assert {r.cores for r in farm.runners} == {(0,), (1,)}  # pinned, one core each
    cands = candidates("mnist") + candidates("mnist", target=BUILTIN_TARGETS["ort-cpu"])
    reqs = requests_for(cands)
    results = list(farm.measure(reqs))
    assert sorted(r.fingerprint for r in results) == sorted(q.fingerprint for q in reqs)
    assert all(r.status is Status.OK for r in results), [r.error for r in results if not r.ok]
    by_tc = Counter(r.target.toolchain for r in results)
    assert by_tc == Counter(q.build.target.toolchain for q in reqs)
    assert by_tc == {"null": 11, "ort-cpu": 11}  # one per node (depth 1)
    for r in results:
        d = dict(r.details)
        assert d["runner"].startswith("cpu-") and r.device is not None
        assert r.toolchain_version and r.seconds > 0
    # the real ORT measurements are real: a Conv costs more than a Relu
    ort = {r.fingerprint: r for r in results if r.target.toolchain == "ort-cpu"}
    by_op = {c.op_types[0]: ort[c.fingerprint].seconds for c in cands
             if c.fingerprint in ort}
    assert by_op["Conv"] > by_op["Relu"]
    assert len({dict(r.details)["runner"] for r in results}) == 2  # both runners worked
    st = farm.stats()
    assert st.results == len(reqs) and st.retried == 0 and st.runner_failures == 0


def test_dedupe_and_table_first(make_farm: Any, tmp_path: Path) -> None:
    from collage_farm.costtable import TableStore
    from estimators.measured import FarmEstimator

    farm = make_farm(toolchains=["null"])
    cands = candidates("resnet18")  # repeated layers: 49 candidates, 24 fingerprints
    distinct = {c.fingerprint for c in cands}
    assert len(distinct) < len(cands)
    table = tmp_path / "costs"
    est, costs = estimate_once(farm, table, cands, "one", "resnet18")
    st = est.stats()
    assert st.requested == len(cands) and st.distinct == len(distinct)
    assert st.measured == len(distinct) and st.cache_hits == 0 and st.failed == 0
    by_fp: dict[str, float] = {}
    for c, cost in zip(cands, costs):
        assert cost.is_known
        assert by_fp.setdefault(c.fingerprint, cost.seconds) == cost.seconds
    rows = table_rows(table)
    assert len(rows) == len(distinct) and {r.fingerprint for r in rows} == distinct
    assert all(r.campaign_id == "one" and r.model == "resnet18" and r.nodes for r in rows)

    # second campaign, same table: everything is a cache hit, nothing is measured
    est2 = FarmEstimator(farm, TableStore(table, campaign_id="two"),
                         model="resnet18", close_farm=False,
                         measure_config=FAST)
    again = est2.estimate(cands)
    est2.estimate(cands)  # memo: asking twice measures nothing either
    est2.close()
    st2 = est2.stats()
    assert st2.cache_hits == len(distinct) and st2.measured == 0
    assert [c.seconds for c in again] == [c.seconds for c in costs]
    assert len(table_rows(table)) == len(distinct)
    assert farm.stats().results == len(distinct)


def test_runner_killed_mid_campaign(make_farm: Any, tmp_path: Path) -> None:
    """A runner actor is killed while measuring: its work is retried, no row is lost."""
    import ray

    from collage_farm.costtable import TableStore
    from estimators.measured import FarmEstimator

    farm = make_farm(toolchains=["null"], slots=2)  # one is killed, the other goes on
    cands = candidates("random_dag", depth=2, target=null_target(sleep_s=0.08))
    distinct = {c.fingerprint for c in cands}
    victim = farm._runners[0]

    def kill() -> None:
        ray.kill(victim.actor, no_restart=False)  # the process dies; Ray restarts it

    timer = threading.Timer(0.6, kill)
    table = tmp_path / "costs"
    est = FarmEstimator(farm, TableStore(table, campaign_id="kill"),
                        model="random_dag", close_farm=False,
                        measure_config=FAST)
    timer.start()
    try:
        costs = est.estimate(cands)
    finally:
        timer.cancel()
        est.close()
    assert all(c.is_known for c in costs)
    st = farm.stats()
    assert st.runner_failures >= 1 and st.retried >= 1 and st.crashed == 0
    rows = table_rows(table)
    assert sorted(r.fingerprint for r in rows) == sorted(distinct)  # each once, none lost
    assert all(r.status == "ok" for r in rows)
    # the killed runner came back after its restart and is serving again
    assert farm.alive_runners() == 2


def test_candidate_crashing_its_runner_twice_is_recorded_crashed(make_farm: Any,
                                                                 tmp_path: Path) -> None:

    farm = make_farm(toolchains=["null"], actor=FaultDrillRunner, slots=2)
    # the runner *actor process* exits whenever it is handed this one candidate
    cands = candidates("mnist", target=null_target(farm_exit_on=":conv2/relu", sleep_s=0.02))
    culprits = {c.fingerprint for c in cands if c.label().endswith(":conv2/relu")}
    assert len(culprits) == 1
    table = tmp_path / "costs"
    est, costs = estimate_once(farm, table, cands, "crash", "mnist")
    for c, cost in zip(cands, costs):
        if c.fingerprint in culprits:
            assert cost.is_invalid
        else:
            assert cost.is_known, c.label()
    rows = {r.fingerprint: r for r in table_rows(table)}
    assert set(rows) == {c.fingerprint for c in cands}
    for fp in culprits:
        assert rows[fp].status == "crashed" and "died 2 times" in rows[fp].error
    st = est.stats()
    assert dict(st.failed_by_status) == {"crashed": len(culprits)}
    assert farm.stats().crashed == len(culprits)
    assert farm.alive_runners() == 2  # runners restarted; the campaign went on


def test_call_whose_reply_died_with_its_runner_is_not_struck(make_farm: Any) -> None:
    """A call that finished is never charged with its runner's death, even if its reply is lost.

    The race behind the flaky crash test, made deterministic: ``farm_exit_after`` makes the
    runner actor exit right after it finished the call, before the reply leaves (first
    incarnation only). The farm sees the call fail with the same error as a call that killed
    the runner; it used to strike it, send it to the other runner (dying the same way) and
    record it ``crashed`` after two strikes. The restarted runner's call journal says the call
    had finished, so it is re-queued without a strike and measured by a restarted runner.
    """
    farm = make_farm(toolchains=["null"], actor=FaultDrillRunner, slots=2)
    cands = candidates("mnist", target=null_target(farm_exit_after=":conv1/relu"))
    reqs = [q for q in requests_for(cands) if q.label.endswith(":conv1/relu")]
    assert len(reqs) == 1
    results = list(farm.measure(reqs))
    assert [(r.fingerprint, r.status) for r in results] == [(reqs[0].fingerprint, Status.OK)]
    st = farm.stats()
    assert 1 <= st.runner_failures <= 2 and st.crashed == 0
    assert farm.alive_runners() == 2


def test_crashed_reply_of_a_runner_being_killed_is_not_a_crashed_row(make_farm: Any,
                                                                     tmp_path: Path) -> None:
    """``ray.kill`` kills a runner's worker before the runner: its call says ``crashed``.

    The race behind the flaky kill test, made deterministic: ``farm_killed_on`` answers
    ``crashed`` (as the call whose worker Ray killed first does) and the actor then exits
    without answering anything else, as a killed actor does. The farm used to write that
    ``crashed`` row for an innocent candidate; now the result waits for a ping from the same
    actor process, which never comes, so the call counts as the one the killed runner was
    running (one strike) and is measured after the restart. One runner, so the restarted one
    (which no longer fires) measures it.
    """

    farm = make_farm(toolchains=["null"], max_runners=1, actor=FaultDrillRunner)
    cands = [c for c in candidates("mnist", target=null_target(farm_killed_on=":conv1/relu"))
             if c.label().endswith(":conv1/relu")]
    assert len(cands) == 1
    table = tmp_path / "costs"
    _, costs = estimate_once(farm, table, cands, "killed", "mnist")
    assert costs[0].is_known
    assert [r.status for r in table_rows(table)] == ["ok"]  # no crashed row, ever
    st = farm.stats()
    assert st.runner_failures == 1 and st.crashed == 0 and st.retried == 1


KILL9_SCRIPT = textwrap.dedent("""
    import sys, logging
    sys.path.insert(0, {repo!r})
    from collage_farm.farm import Farm
    from collage_farm.costtable import TableStore
    from estimators.measured import FarmEstimator
    from runners.base import MeasureConfig
    from tests.ray.test_farm import FAST, kill9_candidates

    address, table = sys.argv[1], sys.argv[2]
    farm = Farm.start(address, toolchains=["null"], progress=False)
    est = FarmEstimator(farm, TableStore(table, campaign_id="killed"), model="random_dag",
                        measure_config=FAST)
    print("STARTED", flush=True)
    est.estimate(kill9_candidates())
    print("FINISHED", flush=True)
    est.close()
""")


def kill9_candidates() -> list[CandidatePartition]:
    return candidates("random_dag", depth=2, target=null_target(sleep_s=0.12))


def test_kill9_then_resume_measures_nothing_twice(ray_cluster: Any, make_farm: Any,
                                                  tmp_path: Path) -> None:

    table = tmp_path / "costs"
    script = tmp_path / "campaign.py"
    script.write_text(KILL9_SCRIPT.format(repo=str(REPO)))
    env = dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, str(script), ray_cluster.address, str(table)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                break
            if len(table_rows(table)) >= 6:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    before = table_rows(table)
    cands = kill9_candidates()
    distinct = {c.fingerprint for c in cands}
    assert 6 <= len(before) < len(distinct)  # stopped part-way; what it flushed is there

    farm = make_farm(toolchains=["null"])
    est, costs = estimate_once(farm, table, cands, "resumed", "random_dag")
    assert all(c.is_known for c in costs)
    st = est.stats()
    assert st.cache_hits == len({r.fingerprint for r in before})
    assert st.measured == len(distinct) - st.cache_hits  # nothing measured twice
    after = table_rows(table)
    counts = Counter(r.fingerprint for r in after)
    assert set(counts) == distinct and max(counts.values()) == 1
    assert {r.campaign_id for r in after} == {"killed", "resumed"}
