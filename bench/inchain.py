"""Benchmark: which measurement mode predicts a partition's time *inside* a running model?

A Collage estimate is a sum of candidate costs, each timed alone. The truth is each partition's
time inside the model run again and again. This script isolates that question from search,
transitions and executors: it cuts a zoo model into N contiguous chunks (topological order),
compiles each chunk in ONNX Runtime CPU (1 thread), and times

* **chain**: every chunk's own call while the chain of all chunks runs (the truth; measured
  before and after the rest, averaged, to cancel drift);
* **warm**: each chunk alone, run again and again (`MeasureConfig(mode="warm")`);
* **network-l2**: each chunk alone after a fixed eviction of 2 x L2 and an input re-read;
* **network**: each chunk alone after evicting what the *rest of the model* touches
  (`SubGraph.rest_of_network_bytes`, through `runners.measure.network_eviction_bytes`, the
  sizing campaigns use), then the input re-read;
* **flush**: each chunk alone after evicting 2 x LLC.

and prints the error of each mode's sum against the chain's sum. The loop is
`runners.measure.time_callable` with each mode's own between-runs action.

    python3 bench/inchain.py [--only resnet18,bert] [--chunks 8]

Writes bench/results/inchain-<host>.md (machine, date, load average).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnxruntime as ort

from collage_farm import zoo
from collage_farm.core.graph import load_graph, random_inputs
from collage_farm.core.subgraph import SubGraph
from runners.base import MeasureConfig
from runners.measure import flush_for, private_cache_bytes, time_callable

CASES = [
    ("mnist", {}),
    ("resnet18-64", {"image_size": 64}),
    ("mobilenet_v2-96", {"image_size": 96}),
    ("resnet50-64", {"image_size": 64}),
    ("bert-2L", {"layers": 2}),
    ("gpt2-2L", {"layers": 2}),
]
MODES = ("warm", "network-l2", "network", "flush")


def _session(data: bytes) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def run_case(label: str, kw: dict, chunks: int, chain_runs: int) -> dict:
    name = label.split("-")[0]
    model = zoo.build(name, **kw)
    g = load_graph(model, name=label)
    n = len(g.nodes)
    k = max(1, min(chunks, n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    subs = [SubGraph.of(g, range(bounds[i], bounds[i + 1])) for i in range(k)]
    sessions = [_session(s.extract().SerializeToString()) for s in subs]
    ins = [[i.name for i in s.get_inputs()] for s in sessions]
    outs = [[o.name for o in s.get_outputs()] for s in sessions]
    feeds = random_inputs(g)
    env: dict[str, np.ndarray] = dict(feeds)
    for s, i, o in zip(sessions, ins, outs):
        env.update(zip(o, s.run(o, {x: env[x] for x in i})))

    def chain() -> list[float]:
        per: list[list[int]] = [[] for _ in subs]
        for r in range(chain_runs + 5):
            e = dict(feeds)
            for j, (s, i, o) in enumerate(zip(sessions, ins, outs)):
                t0 = time.perf_counter_ns()
                e.update(zip(o, s.run(o, {x: e[x] for x in i})))
                if r >= 5:
                    per[j].append(time.perf_counter_ns() - t0)
        return [statistics.median(p) * 1e-9 for p in per]

    def alone(mode: str) -> list[float]:
        out = []
        for j, (s, i, o) in enumerate(zip(sessions, ins, outs)):
            fd = {x: env[x] for x in i}
            if mode == "network-l2":
                cfg = MeasureConfig(mode="network", flush_bytes=2 * private_cache_bytes())
            elif mode == "network":
                cfg = MeasureConfig(mode="network",
                                    network_bytes=max(1, subs[j].rest_of_network_bytes()))
            else:
                cfg = MeasureConfig(mode=mode)
            cfg = dataclasses.replace(cfg, rounds=3, min_round_runs=5, min_round_s=0.01,
                                      warmup_runs=2)
            samples, _ = time_callable(lambda s=s, o=o, fd=fd: s.run(o, fd), cfg,
                                       flush=flush_for(cfg, list(fd.values())))
            out.append(statistics.median(samples))
        return out

    before = chain()
    got = {m: alone(m) for m in MODES}
    after = chain()
    truth = [(a + b) / 2 for a, b in zip(before, after)]
    total = sum(truth)
    row = {"model": label, "nodes": n, "chunks": k,
           "bytes_mb": sum(t.nbytes for t in g.tensors.values()) / 1e6,
           "chain_ms": total * 1e3, "drift": (sum(after) - sum(before)) / total}
    for m in MODES:
        row[m] = (sum(got[m]) - total) / total
    print(f"{label:16s} n={n:4d} k={k} {row['bytes_mb']:6.1f} MB chain={row['chain_ms']:8.3f} ms "
          f"(drift {row['drift']:+.1%}) " + " ".join(f"{m}={row[m]:+.1%}" for m in MODES),
          flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="comma-separated labels or zoo names")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--chain-runs", type=int, default=30)
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    rows = [run_case(label, kw, args.chunks, args.chain_runs) for label, kw in CASES
            if not only or label in only or label.split("-")[0] in only]
    load_after = os.getloadavg()
    from runners.base import DeviceDescription

    dev = DeviceDescription.host_cpu()
    host = socket.gethostname().split(".")[0]
    host = "vm" if host.startswith(("vm", "ip-", "localhost")) or len(host) > 20 else host
    lines = [
        "# bench/inchain.py: each mode's sum of chunk costs vs the chunks timed in a running "
        "chain", "",
        f"Machine: {dev.name}, {dev.cores} cores, Python {platform.python_version()}, "
        f"onnxruntime {ort.__version__}; {started:%Y-%m-%d %H:%M} UTC; load average before "
        f"{load_before[0]:.2f}, after {load_after[0]:.2f}. ORT CPU, 1 thread; "
        f"{args.chunks} contiguous chunks per model; error = (sum of alone - chain) / chain.", "",
        "| model | nodes | MB (weights + activations) | chain ms | chain drift | "
        + " | ".join(MODES) + " |",
        "|---|---|---|---|---|" + "---|" * len(MODES),
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['nodes']} | {r['bytes_mb']:.1f} | {r['chain_ms']:.3f} "
                     f"| {r['drift']:+.1%} | " + " | ".join(f"{r[m]:+.1%}" for m in MODES) + " |")
    lines += ["", "| mode | median abs error | worst |", "|---|---|---|"]
    for m in MODES:
        errs = [abs(r[m]) for r in rows]
        if errs:
            lines.append(f"| {m} | {statistics.median(errs):.1%} | {max(errs):.1%} |")
    out = Path(args.out) / f"inchain-{host}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
