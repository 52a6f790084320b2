"""Faults inside a real campaign on the shared Ray cluster, and token auth outside tests.

What tests/ray/test_farm.py and test_multinode.py already cover is not repeated: a runner
actor killed with ``ray.kill``, a candidate that kills its runner actor twice, the coordinator
SIGKILLed and resumed, a worker node removed mid-campaign. Added here:

* one campaign in which three candidates misbehave inside the toolchain's worker process, one
  each: a segfault (as Vela on bad input), a hang (killed at the build timeout) and a memory
  leak (killed at the worker's RSS cap, ``COLLAGE_WORKER_MAX_RSS_MB`` handed to the runner
  actors through the farm's ``runtime_env``). The campaign must finish, the three rows must
  say ``crashed`` / ``timeout`` / ``crashed`` with the reason, every other candidate must be
  measured once, and both runners must still be alive;
* an embedded Ray started by the farm, in a process where nobody set ``RAY_AUTH_MODE``, runs
  with token authentication (the farm leaves Ray's default alone).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

from runners.base import MeasureConfig
from tests.ray.test_farm import candidates, null_target, table_rows

REPO = Path(__file__).resolve().parents[2]
QUICK = MeasureConfig(warmup_runs=0, rounds=2, min_round_runs=2, min_round_s=0.0, timeout_s=5)


def test_segfault_hang_and_leak_each_cost_one_row(make_farm: Any, tmp_path: Path) -> None:
    from collage_farm.costtable import TableStore
    from estimators.measured import FarmEstimator

    # 6 s: the leak needs ~0.15 s to pass the cap, but a worker restarted after the hang may
    # need seconds to start on a loaded 2-core CI machine (it was timed out at 3 s once)
    farm = make_farm(toolchains=["null"], build_timeout_s=6.0, slots=2,
                     runtime_env={"env_vars": {"COLLAGE_WORKER_MAX_RSS_MB": "400"}})
    patterns = {"segv": ":conv1/relu", "hang": ":pool1", "leak": ":conv2/relu"}
    target = null_target(crash_on=patterns["segv"], crash_mode="segv", hang_on=patterns["hang"],
                         leak_on=patterns["leak"], fault_phase="build")
    cands = candidates("mnist", target=target)
    bad = {c.fingerprint: fault for c in cands for fault, pat in patterns.items()
           if pat in c.label()}
    assert Counter(bad.values()) == {"segv": 1, "hang": 1, "leak": 1}, bad
    table = tmp_path / "costs"
    est = FarmEstimator(farm, TableStore(table, campaign_id="faults"),
                        model="mnist", close_farm=False,
                        measure_config=QUICK)
    costs = est.estimate(cands)
    est.close()

    for c, cost in zip(cands, costs):
        assert cost.is_invalid if c.fingerprint in bad else cost.is_known, c.label()
    rows = table_rows(table)
    counts = Counter(r.fingerprint for r in rows)
    assert set(counts) == {c.fingerprint for c in cands} and max(counts.values()) == 1
    status = {r.fingerprint: (r.status, r.error) for r in rows}
    for fp, fault in bad.items():
        st, err = status[fp]
        if fault == "segv":
            assert st == "crashed" and "SIGSEGV" in err, err
        elif fault == "hang":
            assert st == "timeout" and "SIGKILL" in err, err
        else:
            assert st == "crashed" and "exceeded the memory limit" in err, err
    assert sum(st == "ok" for st, _ in status.values()) == len(status) - len(bad)
    assert farm.alive_runners() == 2 and farm.stats().runner_failures == 0


AUTH_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from collage_farm import farm
    started = farm.connect(num_cpus=1, toolchains=["null"])
    from ray._raylet import AuthenticationMode, get_authentication_mode
    mode = get_authentication_mode()
    farm.shutdown()
    print("STARTED" if started else "JOINED", mode == AuthenticationMode.TOKEN)
""")


def test_embedded_ray_keeps_token_auth_outside_tests(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS", "PYTEST_CURRENT_TEST")}
    env["PYTHONPATH"] = str(REPO)
    p = subprocess.run([sys.executable, "-c", AUTH_CHILD.format(repo=str(REPO))], env=env,
                       cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.split()[-2:] == ["STARTED", "True"], (p.stdout, p.stderr[-2000:])
