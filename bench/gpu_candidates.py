"""Benchmark: how a CUDA candidate is timed between runs, side by side on the same candidates.

Why: Collage's costs are per candidate, and a campaign's GPU runner measures its candidates one
after another, so what the runner does between two timed runs sets both the cost (which cache
the candidate starts from) and the campaign's wall time. Three ways, interleaved per candidate:

- ``gpu-l2``: the runner's ``network`` mode on CUDA: evict the GPU's L2 by the rest of the
  network's bytes (clamped to 2 x L2) with a device memset (`runners.cuda.DeviceL2Flusher`);
- ``host``: what the runner did before: evict the *host's* caches (`runners.measure.flush_for`)
  and re-read the host copies of the inputs, which a device-resident candidate never reads;
- ``warm``: nothing between runs.

The three run one after another per candidate, in an order rotated from one candidate to the
next, so no variant always goes first.

Printed and written to bench/results/gpu-candidates-<host>.md: per model the median wall time a
measurement takes (what the campaign waits for) and the median latency ratio to ``gpu-l2``.

``--algo-search EXHAUSTIVE,HEURISTIC`` adds a second table: each candidate built once per cuDNN
convolution algorithm search (ORT's ``cudnn_conv_algo_search``) and timed with the GPU-L2
eviction, build time and latency side by side. Why: a campaign's CUDA candidates are large
(mobilenet_v2-96's median 28 nodes, ~14 convolutions), EXHAUSTIVE searches every convolution
again in every new session, and on an H100 the one CUDA runner then got through ~0.4
candidates a second; whether HEURISTIC picks equally fast algorithms decides the default.
``--window N`` adds N-node windows (campaign-sized candidates) to the 1- and 3-node ones.
Needs onnxruntime-gpu and a GPU; exits with a message otherwise.

    python bench/gpu_candidates.py [--models resnet18,mobilenet_v2] [--per-model 12]
        [--algo-search EXHAUSTIVE,HEURISTIC] [--window 28]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import platform
import socket
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_farm import zoo
from collage_farm.core.target import CUDA0, Target
from runners.base import BuildInput, MeasureConfig
from runners.cuda import OrtCudaToolchain
from runners.measure import flush_for, time_callable
from runners.registry import get_toolchain

SIZES = {"resnet18": {"image_size": 64}, "mobilenet_v2": {"image_size": 96},
         "bert": {"layers": 2}}


def _fp(*parts: str) -> str:
    """A fingerprint stable across runs (it seeds the candidate's input data)."""
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _bench_runners():  # bench/runners.py's candidate extraction (it shadows the runners package)
    spec = importlib.util.spec_from_file_location(
        "bench_runners", Path(__file__).resolve().parent / "runners.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="resnet18,mobilenet_v2,bert")
    ap.add_argument("--per-model", type=int, default=12)
    ap.add_argument("--network-bytes", type=int, default=16 << 20,
                    help="bytes the rest of the network touches (the campaign sets it per "
                    "candidate; this bench uses one value)")
    ap.add_argument("--algo-search", default="",
                    help="comma-separated cudnn_conv_algo_search values to compare")
    ap.add_argument("--window", type=int, default=0,
                    help="also N-node convex windows (campaign-sized candidates)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = ap.parse_args(argv)
    tc = get_toolchain("ort-cuda")
    why = tc.available()
    if why:
        print(f"ort-cuda not available: {why}")
        return 2
    target = Target.make("ort-cuda", "ort-cuda", CUDA0)
    br = _bench_runners()
    models = [(n, zoo.build(n, **SIZES.get(n, {})), "") for n in args.models.split(",")]
    cands = br.candidates(models, args.per_model)
    if args.window > 1:
        cands += windows(models, args.window, max(1, args.per_model // 2))
    base = MeasureConfig(mode="network", network_bytes=args.network_bytes)
    variants = ("gpu-l2", "host", "warm")
    rows: dict[str, dict[str, list[tuple[float, float]]]] = {}
    builds: dict[str, list[float]] = {}
    for turn, (label, data) in enumerate(cands):
        b = tc.build(BuildInput(_fp(label), target, data))
        if not b.ok:
            print(f"{label}: build failed: {b.error}")
            continue
        prepared = tc.prepare(b, base)
        per: dict[str, tuple[float, float]] = {}
        for v in variants[turn % 3:] + variants[:turn % 3]:
            if v == "gpu-l2":
                flush = prepared.flush
            elif v == "host":
                flush = flush_for(base, prepared.inputs) or (lambda: None)
            else:
                flush = lambda: None  # noqa: E731
            t0 = time.perf_counter()
            samples, _ = time_callable(prepared.fn, base, sync=prepared.sync, flush=flush)
            per[v] = (time.perf_counter() - t0, statistics.median(samples))
        model = label.split(":")[0]
        builds.setdefault(model, []).append(b.build_s)
        for v, x in per.items():
            rows.setdefault(model, {}).setdefault(v, []).append(x)
        print(f"{label}: " + ", ".join(f"{v} {per[v][0] * 1e3:.0f} ms wall, "
                                       f"{per[v][1] * 1e6:.1f} us" for v in variants), flush=True)
    dev = tc.device_description(target)
    lines = [f"# bench/gpu_candidates.py on {socket.gethostname()}", "",
             f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; device: {dev.name} "
             f"({dev.driver}); {platform.platform()}",
             f"- ort-cuda candidates ({args.per_model} per model: heaviest single nodes and "
             f"convex 3-node windows), default MeasureConfig in network mode, "
             f"network_bytes={args.network_bytes}; variants timed one after another per "
             "candidate, order rotated", "",
             "| model | candidates | build (ms) | wall per measurement gpu-l2 / host / warm (ms) | "
             "latency host / gpu-l2 | latency warm / gpu-l2 |", "|---|---|---|---|---|---|"]
    for model, per in rows.items():
        walls = [statistics.median(w for w, _ in per[v]) * 1e3 for v in variants]
        r_host = statistics.median(h[1] / g[1] for h, g in zip(per["host"], per["gpu-l2"]))
        r_warm = statistics.median(w[1] / g[1] for w, g in zip(per["warm"], per["gpu-l2"]))
        lines.append(f"| {model} | {len(per['gpu-l2'])} | "
                     f"{statistics.median(builds[model]) * 1e3:.0f} | "
                     f"{' / '.join(f'{w:.0f}' for w in walls)} | {r_host:.3f} | {r_warm:.3f} |")
    if args.algo_search:
        lines += ["", *algo_search_table(tc, cands, args.algo_search.split(","), base)]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"gpu-candidates-{socket.gethostname()}.md").write_text(text)
    return 0


def windows(models: list, size: int, per_model: int) -> list[tuple[str, bytes]]:
    """Convex windows of ``size`` consecutive nodes (topological order), evenly spread."""
    from collage_farm.core.graph import load_graph
    from collage_farm.core.subgraph import SubGraph

    out = []
    for mname, model, _ in models:
        g = load_graph(model, name=mname)
        if len(g.nodes) <= size:
            continue
        step = max(1, (len(g.nodes) - size) // per_model)
        for start in range(0, len(g.nodes) - size, step)[:per_model]:
            sg = SubGraph.of(g, range(start, start + size))
            if sg.is_valid():
                out.append((f"{mname}:window{size}@{start}", sg.extract().SerializeToString()))
    return out


def algo_search_table(tc: OrtCudaToolchain, cands: list[tuple[str, bytes]], algos: list[str],
                      base: MeasureConfig) -> list[str]:
    """Per model: median build ms per algorithm search, latency ratio to the first one."""
    per: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for label, data in cands:
        got = {}
        for algo in algos:
            t = Target.make(f"ort-cuda-{algo.lower()}", "ort-cuda", CUDA0,
                            {"cudnn_conv_algo_search": algo})
            tc.clear_cache()  # a fresh session: what a runner's next candidate pays
            b = tc.build(BuildInput(_fp(label, algo), t, data))
            if not b.ok:
                break
            prepared = tc.prepare(b, base)
            samples, _ = time_callable(prepared.fn, base, sync=prepared.sync,
                                       flush=prepared.flush)
            got[algo] = (b.build_s, statistics.median(samples))
        if len(got) == len(algos):
            for algo, x in got.items():
                per.setdefault(label.split(":")[0], {}).setdefault(algo, []).append(x)
            print(f"{label}: " + ", ".join(f"{a} build {bs * 1e3:.0f} ms, {lat * 1e6:.1f} us"
                                           for a, (bs, lat) in got.items()), flush=True)
    ref = algos[0]
    lines = [f"cuDNN algorithm search (`cudnn_conv_algo_search`), each candidate built in a fresh "
             f"session per value, timed with the GPU-L2 eviction; ratios to {ref}:", "",
             "| model | candidates | " + " | ".join(f"build {a} (ms)" for a in algos) + " | "
             + " | ".join(f"latency {a} / {ref}" for a in algos[1:]) + " |",
             "|---|---|" + "---|" * (2 * len(algos) - 1)]
    for model, by in per.items():
        builds = [f"{statistics.median(b for b, _ in by[a]) * 1e3:.0f}" for a in algos]
        ratios = [f"{statistics.median(x[1] / r[1] for x, r in zip(by[a], by[ref])):.3f}"
                  for a in algos[1:]]
        lines.append(f"| {model} | {len(by[ref])} | " + " | ".join(builds) + " | "
                     + " | ".join(ratios) + " |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
