"""Benchmark the simulated Ethos-U toolchain: estimates per NPU configuration, side by side.

Why: the Vela runner's numbers are estimates, not timings, so what needs a baseline is (1) what
it says for whole zoo models on every accelerator configuration the targets offer (the Ethos-U
column of the toolchain comparison: more MACs per cycle should help compute-bound models and
barely help memory-bound ones), (2) how much of each model it takes (capability coverage:
nodes on the NPU / nodes), and (3) what a build costs on a farm node (int8 conversion + Vela
compile, wall time), which bounds how many candidates per second an ``ethosu_sim`` slot serves.
With ``--plans``, (4) a Collage campaign per model on each built-in Ethos-U board (NPU, its
``-size`` variant where the board has one, and the Cortex-M host; no Ray: the campaign's
``local`` estimator) against Vela whole (Vela's own NPU / host split): both simulated
latencies, whether the plan is not slower, where it differs (op types moved to NPU / host, the
Vela options of its NPU partitions), the campaign's wall time and build count, and whether a
second campaign on a fresh cost table gives identical costs and plan (``--once`` skips it).
With ``--measure``, (5) instead of (4): each campaign in ``profile`` mode (profile builds of
Vela's own split, estimates, exact confirmation) beside ``exhaustive`` mode (every candidate
built): builds, wall time, the profile estimate of the first Dijkstra plan, each mode's final
exact simulated latency, Vela whole, and whether both modes wrote the same plan.

    python bench/ethos_u.py [--out bench/results] [--quick] [--plans [--systems A,B]
                            [--plan-models M,N] [--once]] [--no-estimates]
                            [--measure profile|exhaustive|both]

Results go to bench/results/ethosu-<host>.md with the machine description and load average
(other jobs may share the machine; build times are wall times).
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_farm import zoo
from collage_farm.core.graph import load_graph
from collage_farm.core.target import BUILTIN_TARGETS, ETHOS_U_CONFIGS
from runners.base import BuildInput, DeviceDescription, MeasureConfig, MeasureInput
from runners.calibration import calibrate
from runners.ethosu import VelaCapabilities, VelaToolchain

#: zoo models at sizes a 2-core VM compiles in seconds (transformers: coverage only)
MODELS: dict[str, dict[str, object]] = {
    "mnist": {},
    "mobilenet_v2": {"image_size": 96},
    "resnet18": {"image_size": 64},
    "resnet50": {"image_size": 64},
}
COVERAGE_ONLY: dict[str, dict[str, object]] = {
    "gpt2": {"layers": 2, "width": 256, "heads": 4, "vocab": 1000, "seq_len": 32},
    "bert": {"layers": 2, "width": 256, "heads": 4, "vocab": 1000, "seq_len": 64},
}


def machine() -> list[str]:
    dev = DeviceDescription.host_cpu()
    return [
        f"- date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}",
        f"- host: {socket.gethostname()}, {dev.name}, {dev.cores} cores",
        f"- python {platform.python_version()}, {VelaToolchain().version()}",
        "- load average at start (1/5/15 min): "
        + " / ".join(f"{x:.2f}" for x in os.getloadavg()),
    ]


#: models of the plan comparison (bench sizes); ``pkg:`` names are the packaged real models
PLAN_MODELS: dict[str, dict[str, object]] = {
    "gpt2": COVERAGE_ONLY["gpt2"], "gpt2-12l": {**COVERAGE_ONLY["gpt2"], "layers": 12},
    "bert": COVERAGE_ONLY["bert"],
    "mobilenet_v2": MODELS["mobilenet_v2"], "resnet50": MODELS["resnet50"],
    "pkg:magika": {}, "pkg:ppocr-cls": {}, "pkg:ppocr-det": {}, "pkg:ppocr-rec": {},
}


def _source(name: str, kw: dict[str, object], tmp: Path) -> str:
    """The model spec a campaign reads: a ``pkg:`` name as is, a zoo model saved as ONNX."""
    import onnx

    if name.startswith("pkg:"):
        return name
    path = tmp / f"{name}.onnx"
    onnx.save(zoo.build(name.split("-")[0], **kw), path)
    return str(path)


def _magika_bytes(tmp: Path) -> Path:
    """Calibration samples for pkg:magika, whose input is a file's bytes (its first and last
    1024, padded with 256 as magika's config says): eight files of the pinned magika package
    itself (Python sources, JSON, Markdown, the ONNX model), so every machine with the
    package calibrates on the same bytes. The seeded random default gives integers 0..3 to an
    input that indexes nothing: ranges of real bytes are what a deployment calibrates on."""
    import importlib.util

    import numpy as np

    spec = importlib.util.find_spec("magika")
    assert spec is not None and spec.submodule_search_locations, "pip install magika"
    pkg = Path(next(iter(spec.submodule_search_locations)))
    names = ("__init__.py", "magika.py", "colors.py", "cli/magika_client.py",
             "config/content_types_kb.min.json", "models/standard_v3_3/README.md",
             "models/standard_v3_3/metadata.json", "models/standard_v3_3/model.onnx")
    rows = []
    for name in names:
        b = list((pkg / name).read_bytes())
        beg, end = b[:1024], (b[-1024:] if len(b) > 1024 else [])
        rows.append(beg + [256] * (1024 - len(beg)) + [256] * (1024 - len(end)) + end)
    path = tmp / "magika-bytes.npz"
    np.savez(path, bytes=np.array(rows, np.int32)[:, None, :])
    return path


#: real calibration data per plan model (others: the seeded random default)
CALIBRATION = {"pkg:magika": _magika_bytes}


def _campaign(model: str, system: str, work: Path, measure: str = "",
              calibration: Path | None = None) -> tuple[dict, dict, dict, float]:
    """One campaign on a built-in board: (summary, plan.json, costs by fingerprint, wall s);
    ``measure``: the campaign's ``--measure`` (default: the board's default); ``calibration``:
    an int8 calibration file (default: the seeded random samples)."""
    import json

    from collage_farm.campaign import TuneOptions, run_tune
    from collage_farm.config import load_config
    from collage_farm.core.calibration_data import CalibrationData
    from collage_farm.costtable import CostTable

    cfg = load_config(builtin_system=system)
    t0 = time.perf_counter()
    s = run_tune(TuneOptions(model=model, targets=tuple(cfg.selected_targets),
                             out=work / "out", estimator="local", transition=cfg.transition,
                             report=False, measure=measure,
                             calibration=calibration and CalibrationData.load(calibration)))
    wall = time.perf_counter() - t0
    plan = json.loads((work / "out" / "plan.json").read_text())
    costs = {r.fingerprint: r.median for r in CostTable(work / "out" / "costs").rows()}
    return s, plan, costs, wall


def _moved(s: dict, plan: dict) -> str:
    """Where the plan differs from Vela's split: op types moved to NPU / host, NPU variants."""
    op_of = {n: o for p in plan["partitions"] for n, o in zip(p["nodes"], p["op_types"])}
    moved = s.get("moved_from_vela_whole") or {}

    def ops(nodes: list[str]) -> str:
        count: dict[str, int] = {}
        for n in nodes:
            count[op_of.get(n, "?")] = count.get(op_of.get(n, "?"), 0) + 1
        return ", ".join(f"{k} {v}" for k, v in sorted(count.items())) or "-"

    variants: dict[str, int] = {}
    for t in (moved.get("npu_options") or {}).values():
        variants[t] = variants.get(t, 0) + 1
    return (f"to NPU: {ops(moved.get('to_npu', []))}; to host: {ops(moved.get('to_host', []))}"
            + "".join(f"; {v} nodes as {t}" for t, v in sorted(variants.items())))


def _options(plan: dict) -> str:
    """Vela options of the plan's NPU partitions: partitions per ``optimise``."""
    count: dict[str, int] = {}
    for p in plan["partitions"]:
        if p.get("toolchain") == "vela":
            o = str((p.get("options") or {}).get("optimise", "Performance"))
            count[o] = count.get(o, 0) + 1
    return ", ".join(f"{k} {v}" for k, v in sorted(count.items())) or "-"


def _run_check(plan_dir: Path) -> str:
    """What ``collage-farm run`` checks: the plan run (NPU partitions through the int8 TFLite
    reference kernels Vela's input is, host partitions likewise) against the fp32 model in
    ONNX Runtime, on the feeds ``run`` uses; "ok (max abs E, tol: T)" or why it failed."""
    from collage_farm.execute import PlanExecutor

    try:
        ex = PlanExecutor(plan_dir)
        err = ex.check(ex.check_feeds())
        return f"ok ({max(err.values()):.3g}; {ex.tolerance})"
    except Exception as e:  # the row says why; the table goes on
        return f"FAILED: {type(e).__name__}: {' '.join(str(e).split())[:80]}"


def plan_row(name: str, system: str, model: str, tmp: Path, again: bool,
             calibration: Path | None = None) -> str:
    """One campaign (two with ``again``) and its table row."""
    s, plan, costs, wall = _campaign(model, system, tmp / system / "a",
                                     calibration=calibration)
    checked = _run_check(tmp / system / "a" / "out")
    same = "-"
    if again:
        s2, plan2, costs2, _ = _campaign(model, system, tmp / system / "b",
                                         calibration=calibration)
        parts = [(p["target"], p["nodes"]) for p in plan["partitions"]]
        same = "identical" if (costs2 == costs and s2["estimated_total_s"] ==
                               s["estimated_total_s"] and parts ==
                               [(p["target"], p["nodes"]) for p in plan2["partitions"]]) \
            else "DIFFERENT"
    vw, total = s.get("vela_whole_estimated_s"), s["estimated_total_s"]
    per = s["partitions_per_target"]
    vs = (f"{vw * 1e3:.3f} | {vw / total:.3f}x | {'yes' if total <= vw else 'NO'}" if vw
          else f"- | {str(s.get('never_worse', ''))[:60]} | -")
    return (f"| {system} | {name} | {total * 1e3:.3f} | {vs} | {s['partitions']} ("
            + " + ".join(f"{k} {v}" for k, v in per.items()) + f") | {_moved(s, plan)} | "
            f"{_options(plan)} | {s['measured']} | {s['failed']} | {wall:.1f} | {same} | "
            f"{checked} |")


def plans_section(models: dict[str, dict[str, object]], systems: list[str],
                  again: bool = True) -> list[str]:
    """Collage plan vs Vela whole per model and board (module docstring, (4))."""

    lines = ["", "Collage plan vs Vela whole per board (simulated: Vela cycles for the NPU, the "
             "analytic Cortex-M cycle model for the host; ms). `moved`: op types the plan puts "
             "elsewhere than Vela's own split; `Vela options`: the plan's NPU partitions per "
             "--optimise; `builds`: candidates built and costed; `again`: a second campaign "
             "on a fresh cost table gave identical costs and plan; `run`: the plan run and checked "
             "against the fp32 model as `collage-farm run` does (max abs error; tolerance).", "",
             "| board | model | plan (ms) | Vela whole (ms) | Vela whole / plan | plan <= Vela "
             "whole | partitions | moved from Vela's split | Vela options | builds | failed "
             "| wall (s) | again | run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    return lines + _rows(models, systems,
                         lambda name, system, model, tmp, cal: plan_row(name, system, model,
                                                                        tmp, again, cal))


def _rows(models: dict[str, dict[str, object]], systems: list[str],
          row: Callable[[str, str, str, Path, Path | None], str]) -> list[str]:
    """``row(name, system, model, tmp, calibration)`` per model and board (``calibration``:
    the model's real int8 samples in `CALIBRATION`, else None), printed as they come; a failed
    one is a FAILED row (one model's failure must not lose the table)."""
    import tempfile

    lines: list[str] = []
    for name, kw in models.items():
        with tempfile.TemporaryDirectory() as tmp:
            model = _source(name, kw, Path(tmp))
            cal = CALIBRATION[name](Path(tmp)) if name in CALIBRATION else None
            for system in systems:
                try:
                    lines.append(row(name, system, model, Path(tmp), cal))
                except Exception as e:  # one model's failure must not lose the table
                    lines.append(f"| {system} | {name} | FAILED: {type(e).__name__}: "
                                 f"{str(e)[:120]} |")
                print(lines[-1], flush=True)
    return lines


#: the columns of (5), and what they mean
PROFILE_COLUMNS = ("board", "model", "profile builds", "profile wall (s)",
                   "first estimate (ms)", "profile final (ms)", "exhaustive builds",
                   "exhaustive wall (s)", "exhaustive final (ms)", "Vela whole (ms)",
                   "<= Vela whole", "plans")
PROFILE_LEGEND = (
    "Profile mode beside exhaustive mode (simulated figures, ms). `builds`: profile: profile "
    "builds + exact builds (candidates a profile does not account for, and the plan's "
    "candidates built to confirm); exhaustive: every candidate built. `first estimate`: the "
    "profile estimate of the first Dijkstra plan (rounds of the exact confirmation, candidates "
    "built there). `final`: the written plan's exact simulated latency (Vela cycles + host "
    "cycle model + transitions). `<= Vela whole`: per mode run (profile first), exact "
    "comparison. `plans`: whether both modes wrote the same partitions.")


def _mode_cells(runs: dict[str, tuple[dict, dict, dict, float]], mode: str) -> list[str]:
    """One measure mode's cells: builds, wall, (profile: first estimate), final."""
    if mode not in runs:
        return ["-"] * (4 if mode == "profile" else 3)
    s, wall = runs[mode][0], runs[mode][3]
    final = f"{s['estimated_total_s'] * 1e3:.4f}"
    if mode != "profile":
        return [str(s["measured"]), f"{wall:.1f}", final]
    conf = s.get("confirm") or {}
    return [f"{s['profiled']} + {s['measured']}", f"{wall:.1f}",
            f"{s['first_search_estimated_s'] * 1e3:.4f} ({conf.get('rounds')} rounds, "
            f"{conf.get('built')} built)", final]


def profile_row(name: str, system: str, model: str, tmp: Path, measures: list[str],
                calibration: Path | None = None) -> str:
    """Profile mode beside exhaustive mode on one board and model (module docstring, (5))."""
    runs = {m: _campaign(model, system, tmp / system / m, measure=m, calibration=calibration)
            for m in measures}
    s = next(iter(runs.values()))[0]
    vw = s.get("vela_whole_estimated_s")
    same = "-"
    if len(runs) == 2:
        p, e = (tuple((q["target"], tuple(q["nodes"])) for q in runs[m][1]["partitions"])
                for m in ("profile", "exhaustive"))
        same = "identical" if p == e else "DIFFERENT"
    never = " ".join("yes" if r[0]["estimated_total_s"] <= (vw or 0) else "NO"
                     for r in runs.values())
    cells = [system, name, *_mode_cells(runs, "profile"), *_mode_cells(runs, "exhaustive"),
             f"{vw * 1e3:.4f}" if vw else "-", never, same]
    return "| " + " | ".join(cells) + " |"


def profile_section(models: dict[str, dict[str, object]], systems: list[str],
                    measures: list[str]) -> list[str]:
    """Profile mode beside exhaustive mode per model and board (module docstring, (5))."""
    lines = ["", PROFILE_LEGEND, "", "| " + " | ".join(PROFILE_COLUMNS) + " |",
             "|" + "---|" * len(PROFILE_COLUMNS)]
    return lines + _rows(models, systems,
                         lambda name, system, model, tmp, cal: profile_row(
                             name, system, model, tmp, measures, cal))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--quick", action="store_true", help="mnist and mobilenet_v2 only")
    ap.add_argument("--plans", action="store_true",
                    help="also: Collage plan vs Vela whole on each built-in Ethos-U board")
    ap.add_argument("--systems", default="ethos-u55-128,ethos-u55-256,ethos-u65-256,"
                    "ethos-u85-256", help="boards of --plans")
    ap.add_argument("--plan-models", default=",".join(PLAN_MODELS), help="models of --plans")
    ap.add_argument("--no-estimates", action="store_true",
                    help="skip the whole-model estimates per accelerator and the coverage")
    ap.add_argument("--once", action="store_true",
                    help="--plans: one campaign per model and board (no determinism re-run)")
    ap.add_argument("--measure", choices=["profile", "exhaustive", "both"], default=None,
                    help="profile mode beside exhaustive mode on --systems x --plan-models "
                    "(instead of --plans; results in ethosu-profile-<host>.md)")
    args = ap.parse_args()
    lines = ["# Simulated Ethos-U (Vela) estimates, whole zoo models", "", *machine()]
    if not args.no_estimates:
        lines += estimates_section(args.quick)
    if args.measure:
        measures = ["profile", "exhaustive"] if args.measure == "both" else [args.measure]
        lines += profile_section({m: PLAN_MODELS[m] for m in args.plan_models.split(",")},
                                 args.systems.split(","), measures)
    elif args.plans:
        lines += plans_section({m: PLAN_MODELS[m] for m in args.plan_models.split(",")},
                               args.systems.split(","), again=not args.once)
    lines += ["", "- load average at end (1/5/15 min): "
              + " / ".join(f"{x:.2f}" for x in os.getloadavg())]
    args.out.mkdir(parents=True, exist_ok=True)
    kind = ("ethosu-profile" if args.measure else
            "ethosu-plans" if args.no_estimates else "ethosu")
    path = args.out / f"{kind}-{socket.gethostname()}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


def estimates_section(quick: bool) -> list[str]:
    """(1)-(3) of the module docstring."""
    models = {k: v for k, v in MODELS.items() if not quick or k in ("mnist", "mobilenet_v2")}
    tc = VelaToolchain()
    caps = VelaCapabilities()
    lines = [""]
    head = "| model | nodes on NPU | " + " | ".join(ETHOS_U_CONFIGS) + " |"
    lines += ["Estimate per accelerator configuration (ms; Vela defaults: U55 "
              "Ethos_U55_High_End_Embedded/Shared_Sram 500 MHz, U65 Ethos_U65_Client_Server/"
              "Dedicated_Sram_384KB 1 GHz), then build wall time (s) in brackets.", "",
              head, "|" + "---|" * (2 + len(ETHOS_U_CONFIGS))]
    for name, kw in models.items():
        g = load_graph(zoo.build(name, **kw), name=name)
        taken = sum(caps.supports(n, g) for n in g.nodes)
        ranges = tuple((k, lo, hi) for k, (lo, hi) in calibrate(g).items())
        data = g.model.SerializeToString()
        cells = []
        for acc in ETHOS_U_CONFIGS:
            t0 = time.perf_counter()
            b = tc.build(BuildInput(f"{name}-{acc}", BUILTIN_TARGETS[acc], data, ranges))
            dt = time.perf_counter() - t0
            if not b.ok:
                cells.append(f"{b.status.value}: {b.error[:60]}")
                continue
            m = tc.measure(MeasureInput(b, MeasureConfig()))
            est = b.detail("vela")
            cpu = f", {est['cpu_ops']} on CPU" if est["cpu_ops"] else ""
            cells.append(f"{m.seconds * 1e3:.3f} ({dt:.2f} s{cpu})")
        size = ", ".join(f"{k}={v}" for k, v in kw.items())
        row = f"| {name}{f' ({size})' if size else ''} | {taken}/{len(g.nodes)} | "
        lines.append(row + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    lines += ["", "Capability coverage of the transformers (nodes Vela takes / nodes; the rest "
              "are not converted: LayerNorm pieces, Gather, attention Softmax over a non-channel "
              "axis, ...):", ""]
    for name, kw in COVERAGE_ONLY.items():
        g = load_graph(zoo.build(name, **kw), name=name)
        refused: dict[str, int] = {}
        for n in g.nodes:
            if not caps.supports(n, g):
                refused[n.op_type] = refused.get(n.op_type, 0) + 1
        taken = len(g.nodes) - sum(refused.values())
        lines.append(f"- {name}: {taken}/{len(g.nodes)} taken; refused by op type: "
                     + ", ".join(f"{k} {v}" for k, v in sorted(refused.items())))
        print(lines[-1], flush=True)
    return lines


if __name__ == "__main__":
    main()
