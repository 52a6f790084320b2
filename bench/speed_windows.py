"""Does this machine run one thread at one speed? Windows of back-to-back runs of one model.

Profile mode prices every plan on a time base (each target's whole model timed by the cut-cost
probe) and checks it end to end tens of seconds later. On the 2-core VMs this project is
developed on, small models' plans ran 1.5-1.8x slower at that check than at the probe, all
targets at once, with nothing else running (mnist, ppocr-cls). This script asks the machine,
with no campaign, no Ray and no other process of ours: it runs one whole model (an ONNX
Runtime session, one thread) back to back for ``--seconds`` on each CPU in turn (the thread
pinned with ``sched_setaffinity``), and prints each ``--window`` second window's median
(measured), the fastest and slowest window, how many windows ran more than 1.25x the
fastest, the guest's steal ticks and major page faults over the run, and the load average.

    PYTHONPATH=. python3 -m bench.speed_windows [--model zoo:mnist] [--seconds 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from collage_farm.campaign import load_source
from collage_farm.core.target import parse_targets
from collage_farm.execute.builder import Part, PlanBuilder


def _steal_majflt() -> tuple[int, int]:
    stat = Path("/proc/stat").read_text().splitlines()
    cpu = next(line.split() for line in stat if line.startswith("cpu "))
    st = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return int(cpu[8]), int(st[9])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="zoo:mnist")
    ap.add_argument("--target", default="ort-cpu")
    ap.add_argument("--seconds", type=float, default=20.0, help="per CPU")
    ap.add_argument("--window", type=float, default=0.5)
    args = ap.parse_args()
    graph = load_source(args.model)
    target = parse_targets(args.target)[0]
    builder = PlanBuilder(graph)
    ex = builder.executor([Part(graph.all_mask, target)])
    fn = ex.timed_callable(builder.feeds(ex))
    for _ in range(50):
        fn()
    cpus = sorted(os.sched_getaffinity(0))
    print(f"# {args.model} on {target.id}, one thread, {args.window} s windows, "
          f"{args.seconds:.0f} s per CPU; CPUs {cpus}; load {os.getloadavg()}")
    clock = time.perf_counter_ns
    for c in cpus:
        os.sched_setaffinity(0, {c})
        s0, f0 = _steal_majflt()
        meds: list[float] = []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            xs: list[int] = []
            stop = clock() + int(args.window * 1e9)
            while clock() < stop:
                a = clock()
                fn()
                xs.append(clock() - a)
            meds.append(statistics.median(xs) / 1e3)
        s1, f1 = _steal_majflt()
        fast, slow = min(meds), max(meds)
        n_slow = sum(m > 1.25 * fast for m in meds)
        print(f"cpu {c}: window medians us (measured) {[round(m, 1) for m in meds]}")
        print(f"cpu {c}: fastest {fast:.1f} us, slowest {slow:.1f} us ({slow / fast:.2f}x), "
              f"{n_slow} of {len(meds)} windows > 1.25x the fastest; steal ticks {s1 - s0}, "
              f"major faults {f1 - f0}; load {os.getloadavg()[0]:.2f}")
    os.sched_setaffinity(0, set(cpus))


if __name__ == "__main__":
    main()
