"""Benchmark: how a CUDA candidate is timed between runs, side by side on the same candidates.

Why: Collage's costs are per candidate, and a campaign's GPU runner measures its candidates one
after another, so what the runner does between two timed runs sets both the cost (which cache
the candidate starts from) and the campaign's wall time. Three ways, interleaved per candidate:

- ``gpu-l2``: the runner's ``network`` mode on CUDA: evict the GPU's L2 by the rest of the
  network's bytes (clamped to 2 x L2) with a device memset (`runners.cuda.DeviceL2Flusher`);
- ``host``: what the runner did before: evict the *host's* caches (`runners.measure.flush_for`)
  and re-read the host copies of the inputs, which a device-resident candidate never reads;
- ``warm``: nothing between runs.

Printed and written to bench/results/gpu-candidates-<host>.md: per model the median wall time a
measurement takes (what the campaign waits for) and the median latency ratio to ``gpu-l2``.
Needs onnxruntime-gpu and a GPU; exits with a message otherwise.

    python bench/gpu_candidates.py [--models resnet18,mobilenet_v2] [--per-model 12]
"""

from __future__ import annotations

import argparse
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
from collage_farm.target import CUDA0, Target
from runners.base import BuildInput, MeasureConfig
from runners.measure import flush_for, time_callable
from runners.registry import get_toolchain

SIZES = {"resnet18": {"image_size": 64}, "mobilenet_v2": {"image_size": 96},
         "bert": {"layers": 2}}


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
    base = MeasureConfig(mode="network", network_bytes=args.network_bytes)
    variants = ("gpu-l2", "host", "warm")
    rows: dict[str, dict[str, list[tuple[float, float]]]] = {}
    builds: dict[str, list[float]] = {}
    for label, data in cands:
        b = tc.build(BuildInput(f"gc{abs(hash(label)) % 10**8:08d}", target, data))
        if not b.ok:
            print(f"{label}: build failed: {b.error}")
            continue
        prepared = tc.prepare(b, base)
        per: dict[str, tuple[float, float]] = {}
        for v in variants:
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
        print(f"{label}: " + ", ".join(f"{v} {w * 1e3:.0f} ms wall, {lat * 1e6:.1f} us"
                                       for v, (w, lat) in per.items()), flush=True)
    dev = tc.device_description(target)
    lines = [f"# bench/gpu_candidates.py on {socket.gethostname()}", "",
             f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; device: {dev.name} "
             f"({dev.driver}); {platform.platform()}",
             f"- ort-cuda candidates ({args.per_model} per model: heaviest single nodes and "
             f"convex 3-node windows), default MeasureConfig in network mode, "
             f"network_bytes={args.network_bytes}; variants timed one after another per "
             "candidate", "",
             "| model | candidates | build (ms) | wall per measurement gpu-l2 / host / warm (ms) | "
             "latency host / gpu-l2 | latency warm / gpu-l2 |", "|---|---|---|---|---|---|"]
    for model, per in rows.items():
        walls = [statistics.median(w for w, _ in per[v]) * 1e3 for v in variants]
        r_host = statistics.median(h[1] / g[1] for h, g in zip(per["host"], per["gpu-l2"]))
        r_warm = statistics.median(w[1] / g[1] for w, g in zip(per["warm"], per["gpu-l2"]))
        lines.append(f"| {model} | {len(per['gpu-l2'])} | "
                     f"{statistics.median(builds[model]) * 1e3:.0f} | "
                     f"{' / '.join(f'{w:.0f}' for w in walls)} | {r_host:.3f} | {r_warm:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"gpu-candidates-{socket.gethostname()}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
