"""Additive error per measurement mode and transition model on the zoo (issue 6, issue 5).

For each model and each measurement mode (warm, flush, network) this tunes the model for real
(ort-cpu + openvino-cpu; candidates measured in this process by the toolchains' own
``measure`` with ``MeasureConfig(mode=...)``, pruned lazily by the analytic bound), once with
the analytic transition model and once with the measured one (`runners.transitions` rows
through `collage_farm.probes.transitions.measured_transition_model`), runs each plan end to end
interleaved with the whole model on each toolchain (`executor.compare_interleaved`, warm
steady-state runs: the truth is a model served in a loop), and prints the additive error
(measured - sum of estimates) / measured. Also prints, per mode, the isolated cost of a
memory-bound candidate (a 2048x2048 MatMul) to show what the mode does to one measurement.

    flock /tmp/bench.lock python3 bench/additive.py [--only mnist,gpt2] [--modes warm,network]

Real exported models (``pkg:NAME``: ppocr-det, ppocr-rec, ppocr-cls, magika; default shapes)
join the zoo cases when their pip package is installed (``pip install -e '.[real]'``);
otherwise "skipped: not installed" is printed with the install command.

Writes bench/results/additive-<host>.md (machine, date, load average).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_farm import zoo
from collage_farm.campaign import build_specs
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import load_graph
from collage_farm.core.plan import make_plan, write_plan
from collage_farm.core.rules import RuleOptions, all_candidates
from collage_farm.core.search import search
from collage_farm.core.target import parse_targets
from collage_farm.core.transition import AnalyticTransitionModel, TransitionModel
from collage_farm.costtable import CostTable, CostTableWriter
from collage_farm.execute import PlanExecutor, compare_interleaved
from collage_farm.probes.transitions import measured_transition_model
from collage_farm.zoo import packaged
from estimators.analytic import AnalyticEstimator
from estimators.base import CostEstimator
from estimators.measured import candidate_config
from runners.base import BuildInput, MeasureConfig, MeasureInput
from runners.measure import llc_bytes, private_cache_bytes
from runners.registry import get_toolchain

CASES = [
    ("mnist", {}),
    ("resnet18", {"image_size": 64}),
    ("mobilenet_v2", {"image_size": 96}),
    ("gpt2", {"layers": 2}),
    ("bert", {"layers": 2}),
]
PACKAGED = ["ppocr-det", "ppocr-rec", "ppocr-cls", "magika"]  # as pkg:NAME, when installed


def packaged_cases() -> list[tuple[str, dict]]:
    out = []
    for name in PACKAGED:
        if packaged.installed(name):
            out.append((packaged.PREFIX + name, {}))
        else:
            print(f"{name}: skipped: not installed ({packaged.get(name).install_command})",
                  flush=True)
    return out


class InProcessEstimator(CostEstimator):
    """Candidates built and measured in this process by the toolchains themselves."""

    label = "in-process"
    has_lower_bound = True

    def __init__(self, config: MeasureConfig, model: str) -> None:
        self.config = config
        self.model = model
        self.bound = AnalyticEstimator(threads=config.threads)
        self.memo: dict[str, Cost] = {}
        self.measured = 0

    def lower_bound(self, candidate: CandidatePartition) -> Cost:
        return self.bound.lower_bound(candidate)

    def estimate(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        for c in candidates:
            if c.fingerprint in self.memo:
                continue
            tc = get_toolchain(c.target.toolchain)
            data = c.sub_graph.extract(f"{self.model}_{c.fingerprint[:12]}").SerializeToString()
            b = tc.build(BuildInput(c.fingerprint, c.target, data))
            # network mode: each candidate in its own network, as campaigns measure it
            r = tc.measure(MeasureInput(b, candidate_config(self.config, c)))
            self.memo[c.fingerprint] = Cost(r.seconds) if r.ok else Cost.invalid()
            self.measured += 1
            if hasattr(tc, "clear_cache"):
                tc.clear_cache()
        return [self.memo[c.fingerprint] for c in candidates]


def memory_bound_probe(modes: Sequence[str]) -> dict[str, dict[str, float]]:
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    k = 2048
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((k, k)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, k])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 10
    out: dict[str, dict[str, float]] = {}
    for t in parse_targets("ort-cpu,openvino-cpu"):
        tc = get_toolchain(t.toolchain)
        b = tc.build(BuildInput("ab0002048", t, m.SerializeToString()))
        sizes = {"network-model": 2 * llc_bytes(), "network-l2": 2 * private_cache_bytes()}
        out[t.id] = {mode: tc.measure(MeasureInput(b, MeasureConfig(
            mode=mode.split("-")[0], flush_bytes=sizes.get(mode, 0))
        )).seconds for mode in modes}
    return out


def run_case(name: str, kw: dict, modes: Sequence[str], targets: list, work: Path,
             transitions: Sequence[str] = ("analytic", "measured")) -> list[dict]:
    if name.startswith(packaged.PREFIX):  # the file, inputs bound to the default shapes
        source, name = name, name[len(packaged.PREFIX):]
        model = packaged.reference_model(name)
    else:
        source, model = f"zoo:{name}", zoo.build(name, **kw)
    graph = load_graph(model, name=name)
    specs = build_specs(targets, RuleOptions(max_depth=4))
    cands = all_candidates(graph, specs)
    rows = []
    label = name + (f"-{kw['layers']}L" if "layers" in kw else
                    f"-{kw['image_size']}px" if "image_size" in kw else "")
    working_set = graph.total_bytes
    for mode in modes:
        if mode == "network-model":  # network mode, eviction sized by the whole model's bytes
            config = MeasureConfig(mode="network", network_bytes=working_set)
        elif mode == "network-l2":  # network mode, a fixed eviction of the core's own caches
            config = MeasureConfig(mode="network", flush_bytes=2 * private_cache_bytes())
        else:  # "network": per candidate, what the rest of the model touches (campaigns)
            config = MeasureConfig(mode=mode)
        est = InProcessEstimator(config, name)
        table = work / f"costs-{mode}"
        with CostTableWriter(table) as writer:
            measured = measured_transition_model(CostTable(table), targets, writer=writer,
                                                 measure=True, config=config)
        models: list[tuple[str, TransitionModel]] = [("analytic", AnalyticTransitionModel()),
                                                     ("measured", measured)]
        for tname, tm in [(n, m) for n, m in models if n in transitions]:
            t0 = time.perf_counter()
            res = search(graph, cands, est, tm, lazy=True)
            plan = make_plan(graph, res, targets, estimator=est.label, transition=tm.label)
            plan.extra["source"] = source
            pdir = work / f"{label}-{mode}-{tname}"
            write_plan(plan, graph, res, pdir)
            ex = PlanExecutor(pdir, model=model)
            ex.check()
            cmp = compare_interleaved(model, [t.toolchain for t in targets],
                                      MeasureConfig(mode="warm", rounds=7), plan=ex,
                                      multi_ep=False)
            per = {}
            for p in plan.partitions:
                per[p.target] = per.get(p.target, 0) + 1
            row = {
                "model": label, "mode": mode, "transitions": tname,
                "partitions": len(plan.partitions),
                "per_target": ",".join(f"{k}:{v}" for k, v in sorted(per.items())),
                "estimated_ms": res.total_s * 1e3,
                "penalty_ms": sum(p.penalty_s for p in res.partitions) * 1e3,
                "measured_ms": cmp.plan.total_s * 1e3 if cmp.plan else float("nan"),
                "additive_error": cmp.additive_error,
                "best_single": cmp.best_single[0] if cmp.best_single else "",
                "apparent_loss": cmp.apparent_loss,
                "measured_candidates": est.measured,
                "wall_s": time.perf_counter() - t0,
            }
            rows.append(row)
            print(f"{label:16s} {mode:8s} {tname:9s} parts={row['partitions']:3d} "
                  f"est={row['estimated_ms']:.3f} meas={row['measured_ms']:.3f} ms "
                  f"err={row['additive_error']:+.3f} loss={row['apparent_loss']:+.3f} "
                  f"({row['per_target']}) cands={est.measured}", flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="comma-separated zoo or packaged model names "
                    "(mnist, ppocr-rec, ...)")
    ap.add_argument("--modes", default="warm,flush,network",
                    help="warm, flush, network (eviction = the rest of the model, per "
                    "candidate: what campaigns use), network-l2 (fixed 2 x L2 eviction), "
                    "network-model (eviction = the whole model's bytes)")
    ap.add_argument("--targets", default="ort-cpu,openvino-cpu")
    ap.add_argument("--transitions", default="analytic,measured",
                    help="transition models to search with (analytic,measured)")
    ap.add_argument("--tag", default="", help="results file suffix: additive-<host><tag>.md")
    ap.add_argument("--out", default="bench/results")
    args = ap.parse_args()
    modes = args.modes.split(",")
    only = set(args.only.split(",")) if args.only else None
    targets = parse_targets(args.targets)
    transitions = tuple(args.transitions.split(","))
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = os.getloadavg()
    probe = memory_bound_probe(modes)
    for t, by in probe.items():
        print("memory-bound MatMul 2048x2048 (16 MiB weights)", t,
              {m: f"{s * 1e6:.0f} us" for m, s in by.items()}, flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="additive-") as tmp:
        for name, kw in CASES + packaged_cases():
            if only and name not in only and name.removeprefix(packaged.PREFIX) not in only:
                continue
            rows += run_case(name, kw, modes, targets, Path(tmp), transitions)
            write_report(args.out, modes, probe, rows, started, load_before,
                         targets=args.targets, tag=args.tag)
    return 0


def write_report(out_dir: str, modes: Sequence[str], probe: dict, rows: list[dict],
                 started: datetime.datetime, load_before: tuple[float, float, float], *,
                 targets: str = "ort-cpu,openvino-cpu", tag: str = "") -> None:
    load_after = os.getloadavg()
    host = socket.gethostname().split(".")[0]
    host = "vm" if host.startswith(("vm", "ip-", "localhost")) or len(host) > 20 else host
    from runners.base import DeviceDescription

    dev = DeviceDescription.host_cpu()
    lines = [
        "# bench/additive.py: additive error per measurement mode and transition model", "",
        f"Machine: {dev.name}, {dev.cores} cores, Python {platform.python_version()}; "
        f"{started:%Y-%m-%d %H:%M} UTC; load average before {load_before[0]:.2f}/"
        f"{load_before[1]:.2f}/{load_before[2]:.2f}, after {load_after[0]:.2f}/"
        f"{load_after[1]:.2f}/{load_after[2]:.2f} (machine shared with other jobs).",
        f"Targets {targets}; candidates measured in process with the default "
        "MeasureConfig in each mode (network: eviction per candidate = the rest of the "
        "model's bytes, at most 2 x LLC); plans run end to end interleaved "
        "with the whole models (warm, 7 rounds). "
        "additive error = (measured - estimated) / measured.", "",
        "Memory-bound candidate (MatMul 1x2048 by 2048x2048, 16 MiB weights), median us:", "",
        "| target | " + " | ".join(modes) + " |", "|---|" + "---|" * len(modes),
    ]
    for t, by in probe.items():
        lines.append(f"| {t} | " + " | ".join(f"{by[m] * 1e6:.0f}" for m in modes) + " |")
    lines += ["", "| model | mode | transitions | partitions | estimated ms | of which "
              "penalty ms | measured ms | additive error | apparent loss vs best single |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['mode']} | {r['transitions']} | {r['partitions']} "
                     f"({r['per_target']}) | {r['estimated_ms']:.3f} | {r['penalty_ms']:.3f} | "
                     f"{r['measured_ms']:.3f} | {r['additive_error']:+.1%} | "
                     f"{r['apparent_loss']:+.1%} |")
    lines += ["", "Summary (|additive error| over models):", "",
              "| mode | transitions | median | worst |", "|---|---|---|---|"]
    summary = []
    for mode in modes:
        for tname in ("analytic", "measured"):
            errs = [abs(r["additive_error"]) for r in rows
                    if r["mode"] == mode and r["transitions"] == tname
                    and r["additive_error"] is not None]
            if errs:
                med, worst = statistics.median(errs), max(errs)
                summary.append((mode, tname, med, worst))
                lines.append(f"| {mode} | {tname} | {med:.1%} | {worst:.1%} |")
    text = "\n".join(lines) + "\n"
    out = Path(out_dir) / f"additive-{host}{tag}.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print("wrote", out, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
