"""Benchmark LiteRT + XNNPACK (``litert-cpu``) against ONNX Runtime and OpenVINO on zoo CNNs.

Why: a third CPU toolchain only helps Collage if it wins somewhere; the issue asks whether
LiteRT/XNNPACK (fp32 TFLite from the in-repo converter, 1 thread) is ever faster than the two
existing CPU toolchains per model, and what crossing its NHWC boundary costs. Per model:

1. whole-model latency of ``ort-cpu``, ``openvino`` and ``litert`` measured **interleaved in one
   run** (`collage_farm.execute.compare_interleaved`: A B C, B C A, ... rounds), each through
   the partitioned executor exactly as a one-partition plan would run: LiteRT's figure there
   includes the NCHW<->NHWC transposes and copies at the model boundary (``run_outputs``);
2. LiteRT's own measurement (`LiteRTToolchain.measure`: inputs bound once, only ``invoke()``
   timed, the cost a candidate gets in the cost table), the boundary cost it records
   (``layout_boundary_s``), build time, and how XNNPACK delegated the model;
3. numerics: max |LiteRT - ORT| over the outputs on the same feeds.

Ratios are to the fastest toolchain of the same interleaved run. Results go to
bench/results/litert-<host>.md with the machine, date and load average (the machine is shared).

    flock /tmp/bench.lock python3 bench/litert.py [--rounds 7] [--image-size N] [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from collage_farm import zoo
from collage_farm.core.graph import load_graph, random_inputs
from collage_farm.core.target import BUILTIN_TARGETS
from collage_farm.execute import compare_interleaved, measure_interleaved, single_executor
from runners.base import BuildInput, DeviceDescription, MeasureConfig, MeasureInput
from runners.measure import pin_to_cores
from runners.registry import available_toolchains, get_toolchain

TOOLCHAINS = ("ort-cpu", "openvino", "litert")
#: model -> zoo options (image_size is replaced by --image-size for the ImageNet CNNs)
MODELS: dict[str, dict[str, Any]] = {
    "mnist": {},
    "mobilenet_v2": {"image_size": 224},
    "resnet18": {"image_size": 224},
    "resnet50": {"image_size": 224},
}
QUICK_SIZE = 96


def load_avg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def bench_model(name: str, kw: dict[str, Any], cfg: MeasureConfig) -> dict[str, Any]:
    model = zoo.build(name, **kw)
    g = load_graph(model)
    row: dict[str, Any] = {"model": name, "input": "x".join(
        str(d) for d in g.tensors[g.graph_inputs[0]].shape), "nodes": len(g.nodes)}

    # 2. LiteRT alone: build, invoke-only cost, boundary, delegation
    lt = get_toolchain("litert")
    t0 = time.perf_counter()
    build = lt.build(BuildInput(f"bench-{name}-{kw}", BUILTIN_TARGETS["litert-cpu"],
                                model.SerializeToString(), label=name))
    row["litert_build_s"] = time.perf_counter() - t0
    if not build.ok:
        row["litert_error"] = build.error
    else:
        bd = dict(build.details)
        row["xnnpack_partitions"] = bd.get("xnnpack_partitions")
        row["undelegated"] = ",".join(bd.get("undelegated_ops") or []) or "-"
        res = lt.measure(MeasureInput(build, cfg))
        if res.ok and res.summary is not None:
            rd = dict(res.details)
            row["litert_invoke_s"] = res.summary.median
            row["litert_invoke_cv"] = res.summary.cv
            row["boundary_s"] = rd.get("layout_boundary_s")
        else:
            row["litert_error"] = res.error
        # the executor path vs invoke() alone, interleaved in one run: the boundary's real cost
        ex = single_executor(model, "litert")
        interp = lt.handle_for(build.fingerprint, build.artifact, build.target, 1)[0].interp
        pair = measure_interleaved({"executor": ex.timed_callable(), "invoke": interp.invoke},
                                   cfg)
        row["pair_executor_s"] = pair["executor"].median
        row["pair_invoke_s"] = pair["invoke"].median
        del ex, interp
        # 3. numerics against ORT
        ort_tc = get_toolchain("ort-cpu")
        ob = ort_tc.build(BuildInput(f"bench-{name}", BUILTIN_TARGETS["ort-cpu"],
                                     model.SerializeToString()))
        feeds = random_inputs(model, 0)
        ref = ort_tc.run_outputs(ob, feeds)  # type: ignore[attr-defined]
        got = lt.run_outputs(build, feeds)  # type: ignore[attr-defined]
        row["max_abs_err"] = max(float(np.max(np.abs(got[k] - ref[k]))) for k in ref)
        row["max_abs_ref"] = max(float(np.max(np.abs(ref[k]))) for k in ref)
        lt.clear_cache()  # type: ignore[attr-defined]
        ort_tc.clear_cache()  # type: ignore[attr-defined]

    # 1. whole models, interleaved, through the executor
    t0 = time.perf_counter()
    cmp = compare_interleaved(model, TOOLCHAINS, cfg, multi_ep=False)
    row["compare_s"] = time.perf_counter() - t0
    row["singles"] = dict(cmp.singles)
    row["single_errors"] = dict(cmp.single_errors)
    return row


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def render(rows: list[dict[str, Any]], meta: dict[str, str]) -> str:
    out = [f"# LiteRT (XNNPACK, fp32) vs ONNX Runtime vs OpenVINO on {meta['host']}", ""]
    out += [f"- {k}: {v}" for k, v in meta.items()]
    out += ["", "## Whole-model latency, one interleaved run per model (1 thread)", "",
            "Executor path (what a one-partition plan pays; LiteRT includes its NCHW<->NHWC "
            "boundary). ms = median; x = ratio to the fastest of the row.", "",
            "| model | input | nodes | ort-cpu ms | openvino ms | litert ms | ort x | "
            "openvino x | litert x | fastest |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        s = r["singles"]
        best = min(s.values()) if s else None
        cells = [ms(s.get(t)) for t in TOOLCHAINS]
        ratios = [f"{s[t] / best:.2f}" if t in s and best else "-" for t in TOOLCHAINS]
        fastest = min(s, key=s.get) if s else "-"
        out.append(f"| {r['model']} | {r['input']} | {r['nodes']} | " + " | ".join(cells)
                   + " | " + " | ".join(ratios) + f" | {fastest} |")
    out += ["", "## LiteRT alone", "",
            "invoke ms: `LiteRTToolchain.measure` (inputs bound once, only `invoke()` timed: the "
            "cost-table figure). boundary ms: transposes + copies in and out, measured apart. "
            "executor - invoke: the executor path (transpose, copy in, invoke, copy out, "
            "transpose) minus `invoke()` alone, timed interleaved in a second run.", "",
            "| model | invoke ms | CV | boundary ms | executor - invoke ms | build s | "
            "XNNPACK partitions | ops left on builtin kernels | max abs err vs ORT "
            "(max abs ref) |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        if "litert_error" in r:
            out.append(f"| {r['model']} | failed: {r['litert_error'][:120]} |||||||| ")
            continue
        ex, inv2 = r.get("pair_executor_s"), r.get("pair_invoke_s")
        inv = r.get("litert_invoke_s")
        diff = ms(ex - inv2) if ex is not None and inv2 is not None else "-"
        out.append(
            f"| {r['model']} | {ms(inv)} | {r.get('litert_invoke_cv', float('nan')):.1%} | "
            f"{ms(r.get('boundary_s'))} | {diff} | {r['litert_build_s']:.2f} | "
            f"{r.get('xnnpack_partitions')} | {r.get('undelegated')} | "
            f"{r['max_abs_err']:.2e} ({r['max_abs_ref']:.2f}) |")
    errs = [(r["model"], t, e) for r in rows for t, e in r["single_errors"].items()]
    if errs:
        out += ["", "## Failures", ""] + [f"- {m} {t}: {e}" for m, t, e in errs]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    ap.add_argument("--min-round-s", type=float, default=0.1)
    ap.add_argument("--image-size", type=int, default=None,
                    help="image size of the ImageNet CNNs (default 224; --quick: 96)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--quick", action="store_true", help=f"image size {QUICK_SIZE}, 3 rounds")
    ap.add_argument("--core", type=int, default=1, help="pin to this core (-1: no pinning)")
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--tag", default="vm", help="result file suffix (litert-<tag>.md)")
    args = ap.parse_args()

    avail = available_toolchains()
    missing = {t: avail.get(t) for t in TOOLCHAINS if avail.get(t) is not None}
    if missing:
        print(f"unavailable: {missing}", file=sys.stderr)
        return 2
    size = args.image_size or (QUICK_SIZE if args.quick else None)
    rounds = 3 if args.quick else args.rounds
    cfg = MeasureConfig(rounds=rounds, min_round_s=args.min_round_s)
    if args.core >= 0 and args.core in os.sched_getaffinity(0):
        pin_to_cores([args.core])
    dev = DeviceDescription.host_cpu()
    t_start = time.perf_counter()
    load_before = load_avg()
    rows = []
    for name in args.models.split(","):
        kw = dict(MODELS[name])
        if size and "image_size" in kw:
            kw["image_size"] = size
        print(f"{name} {kw} ...", file=sys.stderr, flush=True)
        rows.append(bench_model(name, kw, cfg))
        s = rows[-1]["singles"]
        print("  " + "  ".join(f"{k} {ms(v)} ms" for k, v in s.items()), file=sys.stderr)
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cpu": dev.name,
        "cores": str(os.cpu_count()),
        "pinned to core": str(args.core) if args.core >= 0 else "no",
        "load average before / after (1, 5, 15 min)": f"{load_before} / {load_avg()}",
        "python": platform.python_version(),
        "versions": "; ".join(get_toolchain(t).version() for t in TOOLCHAINS),
        "measure config": cfg.to_json(),
        "command": "`flock /tmp/bench.lock python3 bench/litert.py " + " ".join(sys.argv[1:])
                   + "`",
        "total bench time": f"{time.perf_counter() - t_start:.0f} s",
    }
    text = render(rows, meta)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"litert-{args.tag}.md"
    path.write_text(text)
    print(text)
    print(f"written {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
