"""Profile measure mode beside exhaustive mode: measurements, wall time, final plans.

For each model (mnist, resnet18 at 64 px, gpt2 with 2 layers by default; ``--models`` chooses
from those, mobilenet_v2 at 96 px, bert with 2 layers, resnet50 at 64 px, or any source such as
``pkg:ppocr-cls``), targets
``ort-cpu,openvino-cpu,litert-cpu`` (``--targets``), one embedded Ray farm:

1. ``tune --measure exhaustive`` and ``tune --measure profile`` on fresh cost tables of their
   own (so neither reuses the other's measurements), in that order;
2. both final plans timed end to end in one interleaved run (A B A B ..., the executor's
   ``timed_callable``), so the machine's drift hits both alike.

Printed per model and mode: candidate measurements in isolation (``measured``), profile runs
(``profiled``), measurements in all, campaign wall time, the final plan (what it is and its
interleaved end-to-end latency), and the additive error of the campaign's Dijkstra estimate
against the Dijkstra plan measured end to end by the campaign itself (``(measured -
estimated) / measured``), raw and calibrated (each partition scaled by its target's measured /
estimated whole model in the same verify run: what is left once the machine's drift between
the campaign's costs and its verify run is taken out). Then per model the ratios of profile
mode to exhaustive mode (measurements, wall time, final plan latency) and the load average
(`uptime`) before and after. A Markdown table goes to ``--out`` (default: stdout only) with
the machine it ran on.

    PYTHONPATH=. RAY_AUTH_MODE=disabled python3 -m bench.profile_mode --num-cpus 2 \\
        --out bench/results/profile-mode-vm.md
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import onnx

from collage_farm import zoo
from collage_farm.campaign import TuneOptions, run_tune
from collage_farm.core.target import parse_targets
from collage_farm.execute import PlanExecutor
from collage_farm.execute.interleaved import measure_interleaved
from runners.base import DeviceDescription, MeasureConfig

MODELS = {"mnist": ("mnist", {}), "resnet18-64": ("resnet18", {"image_size": 64}),
          "gpt2-2L": ("gpt2", {"layers": 2}),
          "mobilenet_v2-96": ("mobilenet_v2", {"image_size": 96}),
          "bert-2L": ("bert", {"layers": 2}),
          "resnet50-64": ("resnet50", {"image_size": 64})}
DEFAULT_MODELS = ("mnist", "resnet18-64", "gpt2-2L")
MODES = ("exhaustive", "profile")


def campaign(model: str, targets: str, mode: str, work: Path, num_cpus: int | None,
             estimator: str = "farm") -> dict[str, Any]:
    """One campaign in ``mode`` on a fresh table; its summary. ``estimator``: ``farm`` (an
    embedded Ray) or ``local`` (the toolchains' isolated runners in this process, no Ray)."""
    opts = TuneOptions(model=model, targets=tuple(parse_targets(targets)), out=work / mode,
                       cost_table=work / f"{mode}-costs", num_cpus=num_cpus, measure=mode,
                       estimator=estimator,
                       refine_trials=2, refine_time_s=60, verify_extend_rounds=0,
                       report=False)
    t0 = time.perf_counter()
    s = run_tune(opts)
    s["campaign_s"] = time.perf_counter() - t0
    return s


def interleaved(plans: dict[str, Path], rounds: int) -> dict[str, float]:
    """Median end-to-end seconds of each plan directory, timed in one interleaved run."""
    fns = {k: PlanExecutor(p).timed_callable() for k, p in plans.items()}
    cfg = MeasureConfig(rounds=rounds, min_round_runs=5, min_round_s=0.05)
    return {k: v.median for k, v in measure_interleaved(fns, cfg).items()}


def _pct(x: float | None) -> str:
    return f"{x:+.1%}" if x is not None else "n/a"


def row(label: str, mode: str, s: dict[str, Any], e2e: float) -> str:
    measured = int(s.get("measured", 0))
    profiled = int(s.get("profiled", 0))
    warn = len((s.get("profile") or {}).get("warnings", []))
    d_est, d_s = s.get("dijkstra_estimated_s"), s.get("dijkstra_measured_s")
    return (f"| {label} | {mode} | {s['candidates']} | {measured} | {profiled} | "
            f"{measured + profiled} | {warn} | {s['campaign_s']:.0f} | {s.get('plan_is', '')} |"
            f" {e2e * 1e3:.3f} | {s.get('dijkstra_partitions')} | "
            f"{(d_est or 0) * 1e3:.3f} | {(d_s or 0) * 1e3:.3f} | "
            f"{_pct(s.get('dijkstra_additive_error'))} | "
            f"{_pct(s.get('dijkstra_calibrated_additive_error'))} |")


def phases(label: str, mode: str, s: dict[str, Any]) -> str:
    """One line: the campaign's wall seconds per phase (its summary's ``phases_s``), largest
    first, and what they add up to against the campaign's wall time."""
    ph = s.get("phases_s") or {}
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(ph.items(), key=lambda kv: -kv[1])
                      if v >= 0.05)
    ref = s.get("refine") or {}
    return (f"  {label} {mode} phases s (measured wall): {parts}; sum {sum(ph.values()):.1f} "
            f"of {s['campaign_s']:.1f}; refine {ref.get('trials', 0)} trials run, "
            f"{ref.get('skipped_by_estimate', 0)} skipped by the estimate, "
            f"{ref.get('skipped_timed_later', 0)} as whole models the never-worse run times; "
            f"never-worse "
            f"{s.get('verify_rounds')} of {s.get('verify_rounds_limit')} rounds{_probe(s)}")


def _probe(s: dict[str, Any]) -> str:
    """The cut-cost probe's own steps (its ``steps_s``: measured wall seconds), when it ran
    now."""
    cc = s.get("cut_costs") or {}
    steps = cc.get("steps_s") or {}
    if not steps:
        return ""
    parts = ", ".join(f"{k.removesuffix('_s')} {v:.1f}" for k, v in steps.items())
    return f"; cut-cost probe {cc.get('wall_s', 0.0):.1f} s measured wall ({parts})"


def ratios(label: str, res: dict[str, dict[str, Any]], e2e: dict[str, float]) -> str:
    """One line: profile mode against exhaustive mode on ``label``."""
    ex, pr = res["exhaustive"], res["profile"]
    n = {m: int(s.get("measured", 0)) + int(s.get("profiled", 0)) for m, s in res.items()}
    return (f"  {label}: profile/exhaustive measurements {n['profile']}/{n['exhaustive']} = "
            f"{n['profile'] / max(1, n['exhaustive']):.1%}; wall "
            f"{ex['campaign_s'] / max(1e-9, pr['campaign_s']):.1f}x shorter; final plan "
            f"{e2e['profile'] / e2e['exhaustive']:.3f}x exhaustive's (interleaved); best single "
            f"(profile campaign's verify run) {pr.get('best_single_target')} "
            f"{(pr.get('best_single_measured_s') or 0) * 1e3:.3f} ms")


def load() -> str:
    """The load averages, as `uptime` prints them."""
    out = subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout
    return out.strip().split("load average:")[-1].strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help=f"of {', '.join(MODELS)}, or a source such as pkg:ppocr-cls")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="measure modes to run, in order (both: ratios between them)")
    ap.add_argument("--targets", default="ort-cpu,openvino-cpu,litert-cpu")
    ap.add_argument("--num-cpus", type=int, default=None)
    ap.add_argument("--estimator", choices=("farm", "local"), default="farm",
                    help="farm: an embedded Ray (default); local: the toolchains' runners in "
                    "this process, no Ray (a machine without Ray)")
    ap.add_argument("--rounds", type=int, default=9, help="interleaved rounds of the plans")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--summaries", type=Path, default=None,
                    help="write each campaign's summary as DIR/<model>-<mode>.json")
    args = ap.parse_args()
    lines = [f"# profile vs exhaustive measure mode ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"machine: {DeviceDescription.host_cpu().describe()}, {platform.platform()}; "
             f"targets {args.targets}; "
             + (f"Ray num_cpus {args.num_cpus}" if args.estimator == "farm"
                else "no Ray (local runners)"), "",
             "| model | mode | candidates | measured (isolated) | profile runs | "
             "measurements | profile warnings | campaign s | final plan | final plan e2e ms "
             "(interleaved) | Dijkstra partitions | Dijkstra estimated ms | Dijkstra measured "
             "ms | additive error (Dijkstra) | calibrated additive error (Dijkstra) |",
             "|---" * 15 + "|"]
    print("\n".join(lines), flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-profile") as d:
        for label in args.models.split(","):
            work = Path(d) / label.replace(":", "_")
            work.mkdir(parents=True)
            before = load()
            source = label
            if label in MODELS:
                name, kw = MODELS[label]
                source = str(work / f"{label}.onnx")
                onnx.save(zoo.build(name, **kw), source)
            res = {m: campaign(source, args.targets, m, work, args.num_cpus, args.estimator)
                   for m in args.modes.split(",")}
            e2e = interleaved({m: work / m for m in res}, args.rounds)
            if args.summaries:
                args.summaries.mkdir(parents=True, exist_ok=True)
                for m, s in res.items():
                    (args.summaries / f"{work.name}-{m}.json").write_text(
                        json.dumps(s, indent=1, default=str))
            n0 = len(lines)
            for m, s in res.items():
                lines.append(row(label, m, s, e2e[m]))
                lines.append(phases(label, m, s))
                for w in (s.get("profile") or {}).get("warnings", []):
                    lines.append(f"  {label} {m}: {w}")
            if set(MODES) <= set(res):
                lines.append(ratios(label, res, e2e))
            lines.append(f"  {label}: load average before {before}, after {load()}")
            print("\n".join(lines[n0:]), flush=True)
            if args.out:  # what is done so far survives a run stopped for time
                args.out.write_text("\n".join(lines) + "\n")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
