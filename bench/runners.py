"""Benchmark the runners: whole-model latency per toolchain, per-run floors, noise, isolation cost.

Why: every Collage cost comes out of these runners, so the numbers the search trusts need a
baseline on each machine: how fast each toolchain runs real models side by side (timed
interleaved, A B A B ..., because drift between steps of one process reached ~10% in the field
notes), what a call costs when it does nothing (the floor that every candidate, however small,
pays; it sets how finely partitioning can pay off), how repeatable a measurement is (CV of the
medians of 5 repeated measurements of the same candidates), and what the worker-process
isolation adds per request.

Sections:

1. per-run floor on a one-Relu model: ORT ``run()``, ORT ``run_with_iobinding``, OpenVINO
   pre-bound ``infer()`` and OpenVINO ``infer({...})`` with arguments;
2. isolation: worker start-up, ping round trip, and build/measure requests through a
   `LocalRunner` vs the same calls in process;
3. whole-model latency of zoo models (small sizes) per available toolchain, interleaved;
4. CV of medians over 5 repeated full measurements (`Toolchain.measure`, default
   `MeasureConfig`) of the same extracted candidates.

Results go to bench/results/runners-<host>.md with the machine description.

    python bench/runners.py [--reps 5] [--out bench/results] [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import onnx
from onnx import TensorProto, helper

from collage_farm.core.target import CPU0, Target
from runners.base import BuildInput, DeviceDescription, MeasureConfig, MeasureInput
from runners.cpu import OnnxToolchainBase, seed_of
from runners.local import LocalRunner
from runners.measure import llc_bytes, pin_to_cores, time_callable
from runners.registry import available_toolchains, get_toolchain

#: zoo models at sizes a 2-core VM measures in seconds
ZOO_SIZES: dict[str, dict[str, object]] = {
    "mnist": {},
    "resnet18": {"image_size": 64},
    "resnet50": {"image_size": 64},
    "mobilenet_v2": {"image_size": 96},
    "bert": {"layers": 2, "width": 256, "heads": 4, "vocab": 1000, "seq_len": 64},
    "gpt2": {"layers": 2, "width": 256, "heads": 4, "vocab": 1000, "seq_len": 32},
    "random_dag": {},
}
QUICK = ("mnist", "resnet18", "bert")

FLOOR_CFG = MeasureConfig(warmup_runs=50, rounds=5, min_round_runs=200, min_round_s=0.02,
                          max_samples=5000)
MODEL_CFG = MeasureConfig()  # the default every campaign uses


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def cv(xs: list[float]) -> float:
    if len(xs) < 2:
        return float("nan")
    m = statistics.fmean(xs)
    return statistics.pstdev(xs) / m if m > 0 else float("nan")


def us(x: float) -> str:
    return f"{x * 1e6:,.1f}"


def ms(x: float) -> str:
    return f"{x * 1e3:,.3f}"


def pct(x: float) -> str:
    return "n/a" if x != x else f"{x * 100:.1f}%"


def target_for(name: str, **options: object) -> Target:
    return Target.make(name, name, CPU0, options)


def tiny_relu() -> bytes:
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "floor",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    return m.SerializeToString()


# ----------------------------------------------------------------------------------------
# 1. per-run floors


def floors(reps: int) -> list[tuple[str, float, float, float]]:
    """(method, median of rep medians, min, CV of rep medians)."""
    data = tiny_relu()
    x = np.ones((1, 4), np.float32)
    fns: dict[str, Callable[[], Any]] = {}
    avail = available_toolchains()
    if avail.get("ort-cpu") is None:
        ort_tc = get_toolchain("ort-cpu")
        assert isinstance(ort_tc, OnnxToolchainBase)
        for label, opts in (("ort-cpu run()", {"iobinding": False}),
                            ("ort-cpu run_with_iobinding", {})):
            b = ort_tc.build(BuildInput("f100r000", target_for("ort-cpu", **opts), data))
            fns[label] = ort_tc.prepare(b, FLOOR_CFG, {"x": x}).fn
        sess, _ = ort_tc.handle_for("f100r000", data, target_for("ort-cpu"), 1)
        import onnxruntime as ort

        io = sess.io_binding()
        io.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x))
        io.bind_ortvalue_output("y", ort.OrtValue.ortvalue_from_shape_and_type((1, 4),
                                                                               np.float32))
        ro = ort.RunOptions()
        fns["ort-cpu run_with_iobinding(io, RunOptions())"] = (
            lambda: sess.run_with_iobinding(io, ro))
    if avail.get("openvino") is None:
        ov_tc = get_toolchain("openvino")
        assert isinstance(ov_tc, OnnxToolchainBase)
        b = ov_tc.build(BuildInput("f100r001", target_for("openvino"), data))
        fns["openvino infer() pre-bound"] = ov_tc.prepare(b, FLOOR_CFG, {"x": x}).fn
        handle, _ = ov_tc.handle_for("f100r001", data, target_for("openvino"), 1)
        req = handle.compiled.create_infer_request()
        fns["openvino infer({x})"] = lambda: req.infer({"x": x})
    per: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():  # interleaved
            _, medians = time_callable(fn, FLOOR_CFG)
            per[k].append(med(medians))
    return [(k, med(v), min(v), cv(v)) for k, v in per.items()]


# ----------------------------------------------------------------------------------------
# 2. isolation overhead


def isolation(core: int | None) -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    cores = [core] if core is not None else None
    t0 = time.perf_counter()
    r = LocalRunner(["null"], cores=cores)
    r.available()
    rows.append(("worker start-up to ready (null)", ms(time.perf_counter() - t0), "ms"))
    try:
        pings = []
        for _ in range(300):
            reply = r.worker.ping()
            pings.append(reply.elapsed_s)
        rows.append(("ping round trip (median of 300)", us(med(pings)), "us"))
        data = tiny_relu()
        t = target_for("null")
        cfg = MeasureConfig(warmup_runs=0, rounds=1, min_round_runs=1, min_round_s=0.0)
        tc = get_toolchain("null")
        times: dict[str, list[float]] = {k: [] for k in ("rb", "rm", "lb", "lm")}
        for block in range(3):  # blocks, not alternation: switching processes on one core
            for i in range(100):  # evicts both interpreters' caches and hides the overhead
                inp = BuildInput(f"{block:02x}{i:06x}", t, data)
                s = time.perf_counter()
                b = r.build(inp)
                times["rb"].append(time.perf_counter() - s)
                s = time.perf_counter()
                r.measure(MeasureInput(b, cfg))
                times["rm"].append(time.perf_counter() - s)
            for i in range(100):
                inp = BuildInput(f"{block:02x}{i:06x}", t, data)
                s = time.perf_counter()
                b = tc.build(inp)
                times["lb"].append(time.perf_counter() - s)
                s = time.perf_counter()
                tc.measure(MeasureInput(b, cfg))
                times["lm"].append(time.perf_counter() - s)
        for what, rk, lk in (("build", "rb", "lb"), ("measure", "rm", "lm")):
            rows.append((f"null {what} request via worker (median of 300)",
                         us(med(times[rk])), "us"))
            rows.append((f"null {what} in process", us(med(times[lk])), "us"))
            rows.append((f"isolation overhead per {what} request",
                         us(med(times[rk]) - med(times[lk])), "us"))
    finally:
        r.close()
    avail = available_toolchains()
    cpu_tcs = [n for n in ("ort-cpu", "openvino") if avail.get(n) is None]
    if cpu_tcs:
        t0 = time.perf_counter()
        r = LocalRunner(cpu_tcs, cores=cores)
        r.available()
        rows.append((f"worker start-up to ready ({', '.join(cpu_tcs)})",
                     ms(time.perf_counter() - t0), "ms"))
        try:
            data = tiny_relu()
            for name in cpu_tcs:
                tc = get_toolchain(name)
                remote, local = [], []
                for i in range(30):
                    inp = BuildInput(f"{i:04x}b00d", target_for(name), data)
                    s = time.perf_counter()
                    r.measure(MeasureInput(r.build(inp), MODEL_CFG))
                    remote.append(time.perf_counter() - s)
                    s = time.perf_counter()
                    tc.measure(MeasureInput(tc.build(inp), MODEL_CFG))
                    local.append(time.perf_counter() - s)
                rows.append((f"{name} tiny build+measure (default config) via worker",
                             ms(med(remote)), "ms"))
                rows.append((f"{name} tiny build+measure in process", ms(med(local)), "ms"))
        finally:
            r.close()
    return rows


# ----------------------------------------------------------------------------------------
# 3. whole models, 4. candidate CV


def zoo_models(names: tuple[str, ...]) -> list[tuple[str, onnx.ModelProto, str]]:
    try:
        from collage_farm import zoo
    except ImportError as e:
        print(f"collage_farm.zoo missing ({e}); whole-model section skipped", file=sys.stderr)
        return []
    out = []
    for n in names:
        if n not in zoo.names():
            continue
        kw = dict(ZOO_SIZES.get(n, {}))
        out.append((n, zoo.build(n, **kw), ", ".join(f"{k}={v}" for k, v in kw.items())))
    return out


def measured_toolchains() -> list[str]:
    avail = available_toolchains()
    return [n for n, why in avail.items()
            if why is None and n != "null" and get_toolchain(n).device_kind == "cpu"]


def interleaved(builds: dict[str, Any], reps: int, cfg: MeasureConfig
                ) -> dict[str, list[float]]:
    """Median per rep per toolchain, toolchains interleaved within each rep."""
    prepared: dict[str, Callable[[], Any]] = {}
    for name, b in builds.items():
        tc = get_toolchain(name)
        if isinstance(tc, OnnxToolchainBase):
            prepared[name] = tc.prepare(b, cfg).fn
    out: dict[str, list[float]] = {n: [] for n in builds}
    for _ in range(reps):
        for name, b in builds.items():
            if name in prepared:
                _, medians = time_callable(prepared[name], cfg)
                out[name].append(med(medians))
            else:
                res = get_toolchain(name).measure(MeasureInput(b, cfg))
                if res.ok:
                    out[name].append(res.seconds)
    return out


def whole_models(models: list, tcs: list[str], reps: int) -> list[list[str]]:
    rows = []
    for mname, model, size in models:
        data = model.SerializeToString()
        builds, errors = {}, {}
        for name in tcs:
            b = get_toolchain(name).build(BuildInput(f"whole-{mname}", target_for(name), data))
            if b.ok:
                builds[name] = b
            else:
                errors[name] = f"{b.status.value}"
        per = interleaved(builds, reps, MODEL_CFG)
        best = min((med(v) for v in per.values() if v), default=float("nan"))
        row = [mname, size or "default", str(len(model.graph.node))]
        for name in tcs:
            if per.get(name):
                m = med(per[name])
                row.append(f"{ms(m)} ({pct(cv(per[name]))}){' *' if m == best else ''}")
            else:
                row.append(errors.get(name, "n/a"))
        rows.append(row)
        print("  ", " | ".join(row), flush=True)
    return rows


def candidates(models: list, per_model: int) -> list[tuple[str, bytes]]:
    """Extracted sub-graphs: the heaviest single nodes and a few convex 3-node windows."""
    from collage_farm.core.graph import load_graph
    from collage_farm.core.subgraph import SubGraph

    out = []
    for mname, model, _ in models:
        g = load_graph(model, name=mname)
        heavy = [n for n in g.nodes if n.op_type in ("Conv", "MatMul", "Gemm")]
        step = max(1, len(heavy) // max(1, per_model // 2))
        for n in heavy[::step][: per_model // 2]:
            out.append((f"{mname}:{n.name}", SubGraph.of(g, [n.index]).extract()
                        .SerializeToString()))
        added = 0
        for start in range(0, len(g.nodes) - 3, max(1, len(g.nodes) // per_model)):
            sg = SubGraph.of(g, range(start, start + 3))
            if sg.is_valid() and added < per_model - per_model // 2:
                names = [g.nodes[i].op_type for i in range(start, start + 3)]
                out.append((f"{mname}:{'+'.join(names)}@{start}",
                            sg.extract().SerializeToString()))
                added += 1
    return out


def candidate_cv(cands: list[tuple[str, bytes]], tcs: list[str], reps: int
                 ) -> list[list[str]]:
    """CV of the medians of ``reps`` full measurements (default config) per candidate."""
    per: dict[str, list[float]] = {n: [] for n in tcs}
    medians_all: dict[str, list[float]] = {n: [] for n in tcs}
    for label, data in cands:
        builds = {}
        for name in tcs:
            b = get_toolchain(name).build(BuildInput(f"{seed_of(label):08x}", target_for(name),
                                                     data))
            if b.ok:
                builds[name] = b
        vals: dict[str, list[float]] = {n: [] for n in builds}
        for _ in range(reps):
            for name, b in builds.items():  # full protocol, interleaved across toolchains
                res = get_toolchain(name).measure(MeasureInput(b, MODEL_CFG))
                if res.ok:
                    vals[name].append(res.seconds)
        for name, v in vals.items():
            if len(v) == reps:
                per[name].append(cv(v))
                medians_all[name].append(med(v))
    rows = []
    for name in tcs:
        c = per[name]
        if not c:
            continue
        rows.append([name, str(len(c)), pct(med(c)), pct(float(np.percentile(c, 90))),
                     pct(max(c)), f"{us(min(medians_all[name]))}-{us(max(medians_all[name]))}"])
    return rows


# ----------------------------------------------------------------------------------------


def machine() -> dict[str, str]:
    import psutil

    dev = DeviceDescription.host_cpu()
    info = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cpu": dev.name,
        "cores": str(dev.cores),
        "LLC": f"{llc_bytes(0) // 1024} KiB",
        "memory": f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        "python": platform.python_version(),
        "load average at start (1/5/15 min)": " / ".join(f"{x:.2f}" for x in os.getloadavg()),
        "os": platform.platform(),
    }
    for name, why in available_toolchains().items():
        if why is None:
            info[name] = get_toolchain(name).version()
    return info


def table(header: list[str], rows: list[list[str]], align: str = "") -> list[str]:
    align = align or "l" + "r" * (len(header) - 1)
    sep = ["---:" if a == "r" else "---" for a in align]
    return ["| " + " | ".join(header) + " |", "| " + " | ".join(sep) + " |",
            *("| " + " | ".join(r) + " |" for r in rows)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--quick", action="store_true", help="three zoo models only")
    ap.add_argument("--per-model", type=int, default=4, help="candidates per zoo model")
    args = ap.parse_args(argv)

    core = max(os.sched_getaffinity(0))
    pin_to_cores([core])  # one core for timing; the worker tests use their own pinning
    m = machine()
    print(f"machine: {m}", flush=True)
    tcs = measured_toolchains()
    print(f"toolchains: {tcs}", flush=True)

    t_start = time.perf_counter()
    # isolation first: once OpenVINO has run in this process its idle worker threads share
    # the pinned core with the worker and inflate the round trips several-fold
    print("2. isolation", flush=True)
    iso = isolation(core)
    print("1. floors", flush=True)
    fl = floors(args.reps)
    print("3. whole models", flush=True)
    names = QUICK if args.quick else tuple(ZOO_SIZES)
    models = zoo_models(names)
    whole = whole_models(models, tcs, args.reps)
    print("4. candidate CV", flush=True)
    cv_models = [x for x in models if x[0] in ("resnet18", "bert", "mobilenet_v2")]
    cands = candidates(cv_models, args.per_model)
    cvs = candidate_cv(cands, tcs, args.reps)
    total = time.perf_counter() - t_start

    lines = [f"# Runner benchmark on {m['host']}", ""]
    lines += [f"- {k}: {v}" for k, v in m.items()]
    lines += [f"- command: `python bench/runners.py {' '.join(argv or sys.argv[1:])}`",
              f"- load average at end: {' / '.join(f'{x:.2f}' for x in os.getloadavg())} "
              "(other jobs on this machine inflate times and CVs; compare runs with similar "
              "load)",
              f"- bench process pinned to core {core}; 1 compute thread everywhere; "
              f"total bench time {total:.0f} s", ""]
    lines += ["## 1. Per-run floor (one Relu on [1, 4])", "",
              f"Median of {args.reps} interleaved repeats of a round-robin measurement "
              f"({FLOOR_CFG.rounds} rounds x >= {FLOOR_CFG.min_round_runs} runs); "
              "CV is over the repeat medians.", ""]
    lines += table(["method", "median us", "min us", "CV"],
                   [[k, us(a), us(b), pct(c)] for k, a, b, c in fl])
    lines += ["", "## 2. Isolation (worker process) overhead", "",
              f"Worker pinned to the bench's core {core} (as a Ray actor and its worker "
              "share a core slot); measured before anything else runs in this process.", ""]
    lines += table(["what", "value", "unit"], [list(r) for r in iso])
    lines += ["", "## 3. Whole-model latency, toolchains interleaved", "",
              f"Median ms of {args.reps} repeats (each: default MeasureConfig, median of "
              "round medians), CV of the repeat medians in brackets; * = fastest.", ""]
    lines += table(["model", "size", "nodes", *tcs], whole)
    lines += ["", "## 4. Repeatability: CV of medians of repeated measurements", "",
              f"{len(cands)} extracted candidates (heaviest single nodes and convex 3-node "
              f"windows of {', '.join(x[0] for x in cv_models)}), each measured {args.reps} "
              "times with the full protocol (`Toolchain.measure`, default MeasureConfig), "
              "toolchains interleaved.", ""]
    lines += table(["toolchain", "candidates", "median CV", "p90 CV", "max CV",
                    "median range us"], cvs)
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"runners-{m['host']}.md"
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
