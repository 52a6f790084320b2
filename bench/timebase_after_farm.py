"""Does a campaign's own process time plans slower once the farm has served profile requests?

One process: mnist's (``MODEL``'s) three whole models (ort-cpu, openvino-cpu, litert-cpu) timed
interleaved (5 rounds, the never-worse run's round length) before Ray starts, with Ray and its
runners up and idle, right after the three profile requests a profile-mode campaign sends, 5 and
25 s later, and after the farm closed. Prints each target's median (measured, us) and the load.

    PYTHONPATH=. RAY_AUTH_MODE=disabled python3 bench/timebase_after_farm.py [MODEL]
"""
import os
import sys
import tempfile
import time

from collage_farm.campaign import load_source
from collage_farm.core.target import parse_targets
from collage_farm.costtable import TableStore
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.execute.interleaved import measure_interleaved_rounds
from collage_farm.farm import Farm
from collage_farm.probes.profiles import collect_profiles
from runners.base import MeasureConfig

model = sys.argv[1] if len(sys.argv) > 1 else "zoo:mnist"
graph = load_source(model)
targets = parse_targets("ort-cpu,openvino-cpu,litert-cpu")
b = PlanBuilder(graph)
fns = {t.id: b.executor([Part(graph.all_mask, t)]).timed_callable() for t in targets}
cfg = MeasureConfig(rounds=5, min_round_s=0.05, warmup_runs=1)


def med(label: str) -> None:
    r = measure_interleaved_rounds(fns, cfg)
    load = os.getloadavg()[0]
    print(f"{label:28s}", {k: round(v.median * 1e6, 1) for k, v in r.summaries.items()},
          f"load {load:.2f}", flush=True)


med("before Ray")
farm = Farm.start(None, num_cpus=2, toolchains=["ort-cpu", "openvino", "litert"],
                  progress=False)
med("Ray up, runners idle")
time.sleep(5)
med("Ray up, 5 s later")
with tempfile.TemporaryDirectory() as d:
    store = TableStore(os.path.join(d, "costs"), campaign_id="x")
    t0 = time.perf_counter()
    collect_profiles(graph, targets, table=None, farm=farm, store=store)
    print(f"profiles {time.perf_counter() - t0:.1f} s", flush=True)
    med("right after profiles")
    med("again")
    time.sleep(5)
    med("5 s after profiles")
    time.sleep(20)
    med("25 s after profiles")
    store.close()
farm.close()
med("farm closed")
time.sleep(5)
med("farm closed, 5 s later")
