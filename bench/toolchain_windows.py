"""Do this machine's slow windows slow every toolchain alike? Whole models, interleaved, in time.

`bench/speed_windows.py` showed one ONNX Runtime session running back to back at 1.0x or
~1.6x in windows of seconds. Profile mode compares toolchains on one time base (the cut-cost
probe's interleaved whole models) and checks the plan tens of seconds later; the
never-worse run's paired rounds take drift out *if* a slow window slows every toolchain by
the same factor. This script asks: each target's whole model (the executor plans run in,
one thread) timed in interleaved rounds of `PLAN_ROUND_S` (A B C, B C A, ...) for
``--seconds``; per ``--window`` seconds, each target's median round (measured) and the ratio
of each target to the last one; then the windows split at the median speed of the last
target into fast and slow, each target's median in each, its slow/fast factor, and the
ratios between targets in fast and in slow windows.

    PYTHONPATH=. python3 -m bench.toolchain_windows [--model pkg:ppocr-cls] [--seconds 60]
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import time

from collage_farm.campaign import load_source
from collage_farm.core.target import parse_targets
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.execute.interleaved import PLAN_ROUND_S
from runners.base import MeasureConfig
from runners.measure import time_callable


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="pkg:ppocr-cls")
    ap.add_argument("--targets", default="ort-cpu,openvino-cpu,litert-cpu")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--window", type=float, default=1.0)
    args = ap.parse_args()
    g = load_source(args.model)
    builder = PlanBuilder(g, threads=1)
    targets = parse_targets(args.targets)
    fns = {}
    for t in targets:
        ex = builder.executor([Part(g.all_mask, t)])
        fns[t.id] = ex.timed_callable(builder.feeds(ex))
        for _ in range(20):
            fns[t.id]()
    cfg = MeasureConfig(rounds=1, min_round_s=PLAN_ROUND_S, min_round_runs=1, warmup_runs=0,
                        outlier_ratio=0.0)
    names = list(fns)
    ref = names[-1]
    t0 = time.time()
    windows: dict[int, list[dict[str, float]]] = collections.defaultdict(list)
    r = 0
    while time.time() - t0 < args.seconds:
        meds = {}
        for n in names[r % len(names):] + names[:r % len(names)]:
            samples, _ = time_callable(fns[n], cfg)
            meds[n] = statistics.median(samples)
        windows[int((time.time() - t0) / args.window)].append(meds)
        r += 1
    print(f"# {args.model}, whole models interleaved in {PLAN_ROUND_S * 1e3:.0f} ms rounds, "
          f"{args.seconds:.0f} s, windows of {args.window:g} s; load average "
          f"{os.getloadavg()[0]:.2f}; ms per run (measured)\n")
    print("| window s | " + " | ".join(names) + " | " +
          " | ".join(f"{n} / {ref}" for n in names[:-1]) + " |")
    print("|---" * (2 * len(names)) + "|")
    per: list[dict[str, float]] = []
    for k in sorted(windows):
        med = {n: statistics.median(x[n] for x in windows[k]) for n in names}
        per.append(med)
        print(f"| {k * args.window:g} | " + " | ".join(f"{med[n] * 1e3:.3f}" for n in names)
              + " | " + " | ".join(f"{med[n] / med[ref]:.2f}" for n in names[:-1]) + " |")
    best = min(m[ref] for m in per)
    fast = [m for m in per if m[ref] <= best * 1.15]
    slow = [m for m in per if m[ref] > best * 1.3]
    print(f"\nwindows: {len(per)}; fast ({ref} within 1.15x of its fastest window): "
          f"{len(fast)}; slow (above 1.3x): {len(slow)}")
    if fast and slow:
        for n in names:
            f = statistics.median(m[n] for m in fast)
            s = statistics.median(m[n] for m in slow)
            print(f"  {n}: fast {f * 1e3:.3f} ms, slow {s * 1e3:.3f} ms, slow/fast {s / f:.2f}")
        for n in names[:-1]:
            f = statistics.median(m[n] / m[ref] for m in fast)
            s = statistics.median(m[n] / m[ref] for m in slow)
            print(f"  {n} / {ref}: {f:.2f} in fast windows, {s:.2f} in slow ones")


if __name__ == "__main__":
    main()
