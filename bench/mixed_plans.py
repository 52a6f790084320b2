"""Why do plans that mix CPU toolchains run slower end to end than the sum of their parts?

A Collage estimate adds each partition's cost, measured with the partition run again and again
on its own. This script cuts a zoo model into ``--chunks`` contiguous chunks (topological
order) and builds plans over the same cuts with the executor (`collage_farm.execute`:
`PlanBuilder`, real sessions, real bindings):

* ``same:<tc>``: every chunk on one toolchain (the cuts without any mixing);
* ``alt:<a>/<b>``: chunks alternating between two toolchains (the mix);
* ``whole:<tc>``: the whole model as one partition (the single-toolchain reference).

For every plan, in one process, interleaved (A B C, B C A, ...):

* **e2e**: the plan's timed callable (what `PlanExecutor.measure` times);
* **in chain**: each partition's own call while the chain runs (`measure_in_chain`);
* **alone**: each partition's call repeated on its own, warm (`measure_partitions`: same
  session and buffers), or with ``--alone-mode network`` in the cache state campaigns time
  candidates in (the rest of the model's bytes evicted, the inputs re-read, before each run).

Splits ``e2e - sum(alone)`` (the additive error) into the loop between partitions (e2e minus
the sum in chain), what each chunk loses inside a chain of its own toolchain (cuts and caches,
no mix) and what it loses more when its neighbours are another toolchain (the mix). Also
checks thread-pool interference directly: threads in the process and CPU seconds spent per
wall second, while the plan runs and while it sleeps right after a run (a spinning pool burns
CPU there). ``--ort-config KEY=VALUE`` adds an ONNX Runtime session config entry to every
session of the process (to compare configurations, run one process per configuration, in
turns: a spinning pool of one session would slow the others of the same process).

    PYTHONPATH=. python3 -m bench.mixed_plans --models resnet18-64 --chunks 3
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from collage_farm import zoo
from collage_farm.core.graph import load_graph
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import get_target
from collage_farm.execute import PlanExecutor
from collage_farm.execute.builder import Part, PlanBuilder
from runners.base import DeviceDescription, MeasureConfig
from runners.measure import time_callable

MODELS = {"resnet18-64": ("resnet18", {"image_size": 64}),
          "mobilenet_v2-96": ("mobilenet_v2", {"image_size": 96})}
SHORT = {"ort": "ort-cpu", "ov": "openvino-cpu", "lite": "litert-cpu"}


@dataclass
class Variant:
    """One plan over the model's chunks: its executor and per-partition toolchains."""

    name: str
    targets: tuple[str, ...]
    ex: PlanExecutor
    rest_bytes: tuple[int, ...]  # per partition: what the rest of the model touches


def spin_probe(fn: Callable[[], None], seconds: float = 0.3) -> tuple[int, float, float]:
    """(threads, CPU s per wall s while ``fn`` runs, CPU s per wall s sleeping right after)."""
    fn()
    c0, w0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - w0 < seconds:
        fn()
    busy = (time.process_time() - c0) / (time.perf_counter() - w0)
    idle = 0.0
    for _ in range(20):  # sleep 10 ms after each run: what other threads burn meanwhile
        fn()
        c1, w1 = time.process_time(), time.perf_counter()
        time.sleep(0.01)
        idle += (time.process_time() - c1) / (time.perf_counter() - w1)
    return len(os.listdir("/proc/self/task")), busy, idle / 20


def build(model: str, chunks: int, pairs: list[tuple[str, str]], ort_config: dict[str, str],
          threads: int) -> tuple[list[Variant], int]:
    name, kw = MODELS[model]
    g = load_graph(zoo.build(name, **kw), name=model)
    n = len(g.nodes)
    bounds = [round(i * n / chunks) for i in range(chunks + 1)]
    masks = [SubGraph.of(g, range(bounds[i], bounds[i + 1])).mask for i in range(chunks)]
    whole = SubGraph.of(g, range(n)).mask
    if ort_config:  # every ONNX Runtime session of this process, candidates' config plus these
        import runners.ort as ro

        plain = ro.session_options

        def configured(threads: int):  # type: ignore[no-untyped-def]
            so = plain(threads)
            for k, v in ort_config.items():
                so.add_session_config_entry(k, v)
            return so

        ro.session_options = configured
    builder = PlanBuilder(g, threads=threads)
    tcs = sorted({t for p in pairs for t in p})
    plans: dict[str, tuple[str, ...]] = {}
    for t in tcs:
        plans[f"whole:{t}"] = (t,)
        plans[f"same:{t}"] = (t,) * chunks
    for a, b in pairs:
        plans[f"alt:{a}/{b}"] = tuple(a if i % 2 == 0 else b for i in range(chunks))
    out = []
    for label, ts in plans.items():
        ms = [whole] if label.startswith("whole") else masks
        parts = [Part(m, get_target(SHORT[t])) for m, t in zip(ms, ts)]
        ex = builder.executor(parts)
        builder.check(ex)
        rest = tuple(SubGraph(g, m).rest_of_network_bytes() for m in ms)
        out.append(Variant(label, ts, ex, rest))
    return out, n


def alone_network(v: Variant, runs: int) -> list[float]:
    """Each partition alone in ``network`` mode, as campaigns time candidates: what the rest of
    the model touches evicted, then the partition's inputs re-read, before every run."""
    buffers = v.ex.timed_callable().buffers  # type: ignore[attr-defined]
    out = []
    for rt, rest in zip(v.ex.partitions, v.rest_bytes):
        cfg = MeasureConfig(warmup_runs=2, rounds=1, min_round_runs=runs, min_round_s=0.0,
                            max_samples=runs, outlier_ratio=0.0, mode="network",
                            network_bytes=max(1, rest))
        samples, _ = time_callable(rt.step, cfg, inputs=[buffers[n] for n in rt.inputs])
        out.append(statistics.median(samples))
    return out


def paired_rounds(variants: list[Variant], rounds: int, runs: int, mode: str = "warm"
                  ) -> dict[str, list[tuple[float, list[float], list[float]]]]:
    """Per variant and round: (chain s, each partition in chain s, each partition alone s).

    In each round every variant (rotated order) runs its chain ``runs`` times
    (`measure_in_chain`: chain total and each partition's call inside it), then each of its
    partitions ``runs`` times on its own right after (warm, as a candidate is timed); medians.
    Chain and alone are taken seconds apart, so their ratio is free of the machine's drift.
    """
    out: dict[str, list[tuple[float, list[float], list[float]]]] = {v.name: [] for v in variants}
    one = MeasureConfig(warmup_runs=2, rounds=1, min_round_runs=runs, min_round_s=0.0,
                        max_samples=runs, outlier_ratio=0.0)
    for r in range(rounds):
        order = variants[r % len(variants):] + variants[:r % len(variants)]
        for v in order:
            totals, parts = v.ex.measure_in_chain(runs, warmup=2)
            alone = (alone_network(v, runs) if mode == "network"
                     else list(v.ex.measure_partitions(one).values()))
            out[v.name].append((statistics.median(totals),
                                [statistics.median(x) for x in parts.values()], alone))
    return out


def mix_penalties(variants: list[Variant],
                  got: dict[str, list[tuple[float, list[float], list[float]]]]) -> str:
    """What each chunk of a mixed plan loses over the same chunk in a chain of its own
    toolchain (``same:<tc>``), in chain, summed over the plan's chunks (medians of rounds)."""
    med = statistics.median
    inchain = {v.name: [med(p[j] for _, p, _ in got[v.name]) for j in range(len(v.targets))]
               for v in variants}
    out = []
    for v in variants:
        if not v.name.startswith("alt:"):
            continue
        same = [inchain.get(f"same:{t}") for t in v.targets]
        if any(s is None for s in same):
            continue
        pen = sum(inchain[v.name][j] - same[j][j] for j in range(len(v.targets)))
        ref = sum(same[j][j] for j in range(len(v.targets)))
        out.append(f"{v.name} {pen * 1e3:+.3f} ms ({pen / ref:+.1%})")
    return "Mix penalty (in chain, mixed plan minus same chunks in same-toolchain chains): " + (
        "; ".join(out) or "n/a")


def run_model(model: str, args: argparse.Namespace) -> list[str]:
    pairs = [tuple(p.split("/")) for p in args.pairs.split(",")]
    cfg = dict(kv.split("=", 1) for kv in args.ort_config) if args.ort_config else {}
    variants, n = build(model, args.chunks, pairs, cfg, args.threads)  # type: ignore[arg-type]
    load0 = os.getloadavg()
    spin = {v.name: spin_probe(v.ex.timed_callable()) for v in variants}
    got = paired_rounds(variants, args.rounds, args.runs, args.alone_mode)
    load1 = os.getloadavg()
    lines = [f"### {model}: {n} nodes, {args.chunks} chunks, {args.threads} thread(s), "
             f"{args.rounds} paired rounds, alone in {args.alone_mode} mode "
             f"(load {load0[0]:.2f} -> {load1[0]:.2f})", "",
             "| plan | partitions | threads in process | CPU/wall running | CPU/wall 10 ms "
             "after | sum alone ms | sum in chain ms | e2e ms | additive error (median of "
             "rounds) | loop ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    med = statistics.median
    for v in variants:
        rows = got[v.name]
        e = med(t for t, _, _ in rows)
        c = med(sum(p) for _, p, _ in rows)
        a = med(sum(al) for _, _, al in rows)
        err = med((t - sum(al)) / t for t, _, al in rows)
        loop = med(t - sum(p) for t, p, _ in rows)
        th, busy, idle = spin[v.name]
        lines.append(f"| {v.name} | {'/'.join(v.targets)} | {th} | {busy:.2f} | {idle:.2f} | "
                     f"{a * 1e3:.3f} | {c * 1e3:.3f} | {e * 1e3:.3f} | {err:+.1%} | "
                     f"{loop * 1e3:+.3f} |")
    lines += ["", "Per chunk, ms (alone / in chain, medians of rounds):", "",
              "| plan | " + " | ".join(f"chunk {j}" for j in range(args.chunks)) + " |",
              "|---|" + "---|" * args.chunks]
    for v in variants:
        if v.name.startswith("whole"):
            continue
        rows = got[v.name]
        cells = [f"{med(al[j] for _, _, al in rows) * 1e3:.3f} / "
                 f"{med(p[j] for _, p, _ in rows) * 1e3:.3f}" for j in range(args.chunks)]
        lines.append(f"| {v.name} | " + " | ".join(cells) + " |")
    lines += ["", mix_penalties(variants, got)]
    print("\n".join(lines), flush=True)
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="resnet18-64")
    ap.add_argument("--chunks", type=int, default=3)
    ap.add_argument("--pairs", default="ov/ort", help="alternations, e.g. ov/ort,ort/ov,ov/lite")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--runs", type=int, default=10, help="chain runs per round")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads of every session")
    ap.add_argument("--alone-mode", choices=("warm", "network"), default="warm",
                    help="cache state of the partitions timed alone (network: as campaigns)")
    ap.add_argument("--ort-config", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    dev = DeviceDescription.host_cpu()
    print(f"machine: {dev.name}, {dev.cores} cores, {platform.platform()}; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; all figures measured")
    for m in args.models.split(","):
        run_model(m, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
