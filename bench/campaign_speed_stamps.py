"""Where in a profile-mode campaign does its own process time models slower? Stamps.

Runs a real ``tune MODEL --targets ort-cpu,openvino-cpu,litert-cpu`` campaign with hooks
(monkeypatched, nothing else changed) that time every target's whole model, with the
campaign's own cached sessions, interleaved (5 rounds of >= 50 ms, the never-worse run's
round length), at these points: before and after the profile requests, then once a second
for 6 s, before and after the search, before the never-worse run (and again after a full
garbage collection), the never-worse run's own medians, and after it. Each stamp prints the
medians (measured, us), the guest's steal and idle ticks and the CPU the thread ran on during
it, the load average, the process's thread count and the GC counters. ``PIN=N`` pins the
campaign's thread to CPU N from the cut-cost probe on.

    PIN=0 PYTHONPATH=. RAY_AUTH_MODE=disabled python3 -m bench.campaign_speed_stamps zoo:mnist OUT

Found with it (`bench/results/speed-windows-vm.md`): the same whole models run at 1.0x or
~1.6x in windows of seconds at any of these points, pinned or not.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path
from typing import Any

from collage_farm.campaign import tune as campaign
from collage_farm.cli import main
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.execute.interleaved import measure_interleaved_rounds
from collage_farm.postsearch import never_worse
from runners.base import MeasureConfig

CONFIG = MeasureConfig(rounds=5, min_round_s=0.05, warmup_runs=1)
_state: dict[str, Any] = {}


def _ticks() -> tuple[int, int, int]:
    """(steal ticks, idle ticks, the CPU this thread last ran on)."""
    cpu = next(line.split() for line in Path("/proc/stat").read_text().splitlines()
               if line.startswith("cpu "))
    me = Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()
    return int(cpu[8]), int(cpu[4]), int(me[36])


def stamp(label: str, builder: PlanBuilder, targets: list) -> None:
    g = builder.graph
    fns = {}
    for t in targets:
        ex = builder.executor([Part(g.all_mask, t)])
        fns[t.id] = ex.timed_callable(builder.feeds(ex))
    a = _ticks()
    r = measure_interleaved_rounds(fns, CONFIG)
    b = _ticks()
    print(f"STAMP {label:24s}", {k: round(v.median * 1e6, 1) for k, v in r.summaries.items()},
          "steal/idle ticks", [b[0] - a[0], b[1] - a[1]], f"cpu {b[2]}",
          f"load {os.getloadavg()[0]:.2f} threads {len(os.listdir('/proc/self/task'))} "
          f"gc {gc.get_count()}", flush=True)


_verify = never_worse.verify
_search = campaign.search
_profiled = campaign.profiled_estimator
_cut_costs = campaign.with_cut_costs


def verify(graph, plans, targets, *, builder=None, **kw):  # type: ignore[no-untyped-def]
    stamp("verify: before", builder, list(targets))
    gc.collect()
    stamp("verify: after gc", builder, list(targets))
    out = _verify(graph, plans, targets, builder=builder, **kw)
    print("STAMP verify medians", {k: round(v.median * 1e6, 1) for k, v in out.summaries.items()},
          flush=True)
    stamp("verify: after", builder, list(targets))
    return out


def search(graph, candidates, est, transition, **kw):  # type: ignore[no-untyped-def]
    b = _state.get("builder")
    first = b is not None and not _state.get("searched")
    if first:
        _state["searched"] = True
        stamp("before search", b, _state["targets"])
    r = _search(graph, candidates, est, transition, **kw)
    if first:
        stamp("after search", b, _state["targets"])
    return r


def profiled_estimator(opts, graph, est, cut_info, builder=None, **kw):  # type: ignore[no-untyped-def]
    _state.update(builder=builder, targets=list(opts.targets))
    stamp("before profiles", builder, _state["targets"])
    out = _profiled(opts, graph, est, cut_info, builder, **kw)
    stamp("after profiles", builder, _state["targets"])
    for i in range(6):
        time.sleep(1)
        stamp(f"after profiles +{i + 1}s", builder, _state["targets"])
    return out


def with_cut_costs(*a, **k):  # type: ignore[no-untyped-def]
    if os.environ.get("PIN"):
        os.sched_setaffinity(0, {int(os.environ["PIN"])})
    return _cut_costs(*a, **k)


if __name__ == "__main__":
    never_worse.verify = verify
    campaign.search = search
    campaign.profiled_estimator = profiled_estimator
    campaign.with_cut_costs = with_cut_costs
    sys.exit(main(["tune", sys.argv[1], "--targets", "ort-cpu,openvino-cpu,litert-cpu",
                   "--out", sys.argv[2], "--num-cpus", "2", "--no-report", "--json"]))
