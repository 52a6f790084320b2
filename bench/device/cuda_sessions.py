"""Is an ONNX Runtime CUDA session's latency a property of the session? Several sessions of
one model, timed interleaved.

Why: on an H200, two campaigns wrote byte-identical ort-cuda plans of bert-2L that timed 0.441
and 0.582 ms interleaved (`bench/results/gpu-profile-mode-h200.md`). This builds ``--sessions``
sessions of the same model bytes (the zoo model, seeded), binds each one's inputs once, and
times them in rounds (each round: every session in turn, ``--runs`` calls, synchronised), so
drift hits all alike. Printed per session: median per-call microseconds over rounds, and the
spread (max / min of the session medians). ``--provider CPUExecutionProvider`` runs it here.

    python3 bench/device/cuda_sessions.py --models bert-2L,resnet18-64 --sessions 6
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort

from collage_farm import zoo
from collage_farm.core.graph import load_graph, random_inputs

MODELS = {"bert-2L": ("bert", {"layers": 2}), "resnet18-64": ("resnet18", {"image_size": 64})}


def session(data: bytes, provider: str) -> tuple[ort.InferenceSession, ort.IOBinding]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    s = ort.InferenceSession(data, so, providers=[provider])
    return s, s.io_binding()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="bert-2L,resnet18-64")
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--provider", default="CUDAExecutionProvider")
    args = ap.parse_args()
    print(f"onnxruntime {ort.__version__}, provider {args.provider}")
    for label in args.models.split(","):
        name, kw = MODELS[label]
        model = zoo.build(name, **kw)
        data = model.SerializeToString()
        feeds = random_inputs(load_graph(model), seed=0)
        made = []
        for _ in range(args.sessions):
            s, b = session(data, args.provider)
            for k, v in feeds.items():
                b.bind_cpu_input(k, np.ascontiguousarray(v))
            for o in s.get_outputs():
                b.bind_output(o.name, "cuda" if "CUDA" in args.provider else "cpu")
            for _ in range(5):
                s.run_with_iobinding(b)
            made.append((s, b))
        per: list[list[float]] = [[] for _ in made]
        for r in range(args.rounds):
            order = list(range(len(made)))
            order = order[r % len(order):] + order[:r % len(order)]  # rotate who goes first
            for i in order:
                s, b = made[i]
                b.synchronize_inputs()
                t0 = time.perf_counter()
                for _ in range(args.runs):
                    s.run_with_iobinding(b)
                b.synchronize_outputs()
                per[i].append((time.perf_counter() - t0) / args.runs)
        meds = [statistics.median(x) * 1e6 for x in per]
        print(f"{label}: {len(made)} sessions of one model, {args.rounds} rounds x {args.runs} "
              f"calls; per-session median us: {', '.join(f'{m:.1f}' for m in meds)}; "
              f"spread max/min {max(meds) / min(meds):.3f}")


if __name__ == "__main__":
    main()
