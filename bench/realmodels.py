"""Table: every ``pkg:`` model and every class of real exports, tuned, run and verified.

Why: "ONNX Runtime's CPU EP runs it" is the bar for "collage-farm tunes, runs and verifies it,
or refuses it with one line naming the operator or the reason". Per model, in a child process
with a time limit (a crash or a hang is a row, not a lost table):

1. load it (nodes, opsets, IR version);
2. tune it on ``ort-cpu,openvino-cpu,litert-cpu``: with **local** measured costs (the
   toolchains' own runners, no Ray, a short measurement config: ``QUICK``) for the class models,
   with **mock** costs for the larger ``pkg:`` models unless ``--pkg-costs local``; the row
   says which. Post-search steps are off: the table is about what runs, not how fast;
3. run the written plan on the real runtimes and check it against the whole model
   (`PlanExecutor.check`: the tolerance it used and the largest error);
4. run the whole model on each toolchain against ONNX Runtime's output (does each toolchain
   take the model as a whole, and compute it right?);
5. a refusal is its one line (``collage-farm tune``'s error); a crash or a timeout says so.

Results go to bench/results/realmodels-<host>.md with the machine, date and load average.

    flock /tmp/bench.lock python3 bench/realmodels.py [--pkg-costs mock|local] [--timeout 600]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_farm import zoo
from collage_farm.campaign import TuneOptions, load_source, run_tune
from collage_farm.cli.errors import USER_ERRORS
from collage_farm.core.graph import random_inputs
from collage_farm.core.target import parse_targets
from collage_farm.costtable import TableStore
from collage_farm.execute import PlanExecutor, single_executor
from collage_farm.execute.numerics import compare_outputs, quantized, reference_outputs
from collage_farm.zoo import packaged
from collage_farm.zoo.realclasses import CLASSES
from estimators.local import LocalService
from estimators.measured import FarmEstimator
from runners.base import MeasureConfig

TARGETS = "ort-cpu,openvino-cpu,litert-cpu"
TOOLCHAINS = ("ort-cpu", "openvino", "litert")
QUICK = MeasureConfig(warmup_runs=1, rounds=1, min_round_runs=2, min_round_s=0.0, mode="warm")


def rows(pkg_costs: str) -> list[dict[str, Any]]:
    """What the table covers: every class model (two more detector opsets), every ``pkg:``
    model, and one refusal (QLinear operators on the toolchains that lack QLinearAdd)."""
    out = [{"spec": f"zoo:{n}", "klass": c.klass, "shapes": dict(c.shapes), "costs": "local",
            "note": c.note} for n, c in CLASSES.items()]
    for opset in (13, 17):
        out.append({"spec": f"zoo:detector_fpn@{opset}", "klass": "detector",
                    "shapes": dict(CLASSES["detector_fpn"].shapes), "costs": "local",
                    "note": f"opset {opset}"})
    out.append({"spec": "zoo:qlinear_mnist", "klass": "quantized", "shapes": {},
                "costs": "mock", "targets": "openvino-cpu,litert-cpu",
                "note": "no ORT target: QLinearAdd has no taker"})
    for name in packaged.names():
        out.append({"spec": f"pkg:{name}", "klass": "pkg", "shapes": {}, "costs": pkg_costs,
                    "note": packaged.get(name).requirement})
    return out


def _model_arg(spec: str, tmp: Path) -> str:
    """A spec ``tune`` takes: ``zoo:NAME@OPSET`` (detector opsets) is exported to a file."""
    if "@" not in spec:
        return spec
    name, opset = spec[4:].split("@")
    return str(zoo.export(name, tmp / f"{name}_opset{opset}.onnx", opset=int(opset)))


def _wholes(model: Any, shapes: dict) -> dict[str, str]:
    """Each toolchain's whole-model run against ONNX Runtime's: ok, mismatch or the failure."""
    out: dict[str, str] = {}
    feeds = random_inputs(model)
    ref = reference_outputs(model, [o.name for o in model.graph.output], feeds)
    for tc in TOOLCHAINS:
        try:
            got = single_executor(model, tc, shapes=shapes).run(feeds)
            compare_outputs(got, ref, precision="int8" if quantized(model) else "fp32")
            out[tc] = "ok"
        except Exception as e:  # the row records the toolchain's words
            out[tc] = f"{type(e).__name__}: {' '.join(str(e).split())[:90]}"
    return out


def one_row(row: dict[str, Any]) -> dict[str, Any]:
    """Load, tune, verify one model; every figure says which plan and which costs."""
    res: dict[str, Any] = {"spec": row["spec"], "costs": row["costs"]}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="realmodels-") as d:
        tmp = Path(d)
        model = _model_arg(row["spec"], tmp)
        targets = tuple(parse_targets(row.get("targets", TARGETS)))
        try:
            g = load_source(model, row["shapes"])
            res["loaded"] = (f"{len(g.nodes)} nodes, IR {g.model.ir_version}, " + ", ".join(
                f"{o.domain or 'ai.onnx'} {o.version}" for o in g.model.opset_import))
            est = None
            if row["costs"] == "local":
                svc = LocalService(sorted({t.toolchain for t in targets}))
                est = FarmEstimator(svc, TableStore(tmp / "costs"), model=g.name,
                                    measure_config=QUICK)
            try:
                s = run_tune(TuneOptions(model=model, targets=targets, out=tmp / "out",
                                         shapes=row["shapes"], estimator="mock", report=False,
                                         verify=False, refine_trials=0, confirm_rounds=0,
                                         cut_costs=False), estimator=est)
            finally:
                if est is not None:
                    est.close()
            res.update(candidates=s["candidates"], measured=s["measured"],
                       failed=s["failed_by_status"], plan=s["partitions_per_target"],
                       campaign_s=s["wall_s"])
            ex = PlanExecutor(tmp / "out", shapes=row["shapes"])
            errors = ex.check()
            res["verified"] = f"{ex.precision}, max abs err {max(errors.values()):.3g}"
            res["wholes"] = _wholes(g.model, {})
        except USER_ERRORS as e:
            res["refused"] = " ".join(str(e).split())
        except Exception as e:  # a crash is a row: the table must show it
            res["crashed"] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
            res["traceback"] = traceback.format_exc()[-800:]
    res["wall_s"] = time.perf_counter() - t0
    return res


def run_child(row: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """``one_row`` in a child process: a crash or a hang is reported, not fatal."""
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, "--row", json.dumps(row)],
                           capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"spec": row["spec"], "costs": row["costs"],
                "crashed": f"timed out after {timeout_s:.0f} s", "wall_s": timeout_s}
    lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"spec": row["spec"], "costs": row["costs"], "wall_s": time.perf_counter() - t0,
                "crashed": f"child exit {p.returncode}: {p.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])


def _outcome(r: dict[str, Any]) -> str:
    if "verified" in r:
        return f"verified ({r['verified']})"
    if "refused" in r:
        return f"refused: {r['refused']}"
    return f"CRASHED: {r.get('crashed')}"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def table(results: list[tuple[dict[str, Any], dict[str, Any]]], meta: list[str]) -> str:
    lines = ["# Real models and classes of real exports: tuned, run, verified (or refused)", "",
             *meta, "",
             "Costs: `local` = measured by the toolchains' own runners (no Ray) with a short "
             "config (warm, 1 round of 2 runs: enough to rank, not to report speed); `mock` = "
             "deterministic fake costs (the plan is still run and checked on the real "
             "runtimes). Targets ort-cpu, openvino-cpu, litert-cpu unless the row says. "
             "campaign s = `tune`'s wall time; row s = the whole row (load, tune, check, "
             "whole-model runs). wholes: each toolchain's whole model against ONNX Runtime's "
             "outputs on the same feeds.", "",
             "| model | class | loaded | costs | candidates | measured | failed rows | plan "
             "(partitions per target) | outcome | campaign s | row s | whole ort / ov / "
             "litert |",
             "| --- | --- | --- | --- | ---: | ---: | --- | --- | --- | ---: | ---: | --- |"]
    for r, row in results:
        fails = ", ".join(f"{k} {v}" for k, v in sorted((r.get("failed") or {}).items()))
        plan = ", ".join(f"{k} {v}" for k, v in sorted((r.get("plan") or {}).items()))
        wholes = " / ".join(v if v == "ok" else f"FAIL ({v})"
                            for v in (r.get("wholes") or {}).values())
        camp = f"{r['campaign_s']:.1f}" if "campaign_s" in r else ""
        lines.append(
            f"| {r['spec']}{' on ' + row['targets'] if 'targets' in row else ''} | "
            f"{row['klass']} | {r.get('loaded', '')} | {r['costs']} | "
            f"{r.get('candidates', '')} | {r.get('measured', '')} | {fails or '-'} | "
            f"{plan} | {_outcome(r)} | {camp} | {r['wall_s']:.1f} | {wholes} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--row", help=argparse.SUPPRESS)  # the child's one row, as JSON
    ap.add_argument("--pkg-costs", choices=["mock", "local"], default="mock")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per row")
    ap.add_argument("--only", help="comma-separated specs (default: every row)")
    ap.add_argument("--out", default=None, help="results file (default bench/results/...)")
    args = ap.parse_args()
    if args.row:
        print(json.dumps(one_row(json.loads(args.row)), default=str))
        return 0
    load0, t0 = os.getloadavg(), time.perf_counter()
    wanted = [r for r in rows(args.pkg_costs)
              if not args.only or r["spec"] in args.only.split(",")]
    results = []
    for row in wanted:
        r = run_child(row, args.timeout)
        print(f"{row['spec']}: {_outcome(r)} [{r['wall_s']:.1f} s]", flush=True)
        results.append((r, row))
    host = socket.gethostname().split(".")[0]
    meta = [f"- date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}",
            f"- host: {host}; cpu: {cpu_name()}; cores: "
            f"{os.cpu_count()}; python {platform.python_version()}",
            f"- load average before / after: {' '.join(f'{x:.2f}' for x in load0)} / "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}",
            f"- measure config (local costs): {QUICK.to_json()}",
            f"- command: `python3 bench/realmodels.py {' '.join(sys.argv[1:])}`",
            f"- total bench time: {time.perf_counter() - t0:.0f} s"]
    out = Path(args.out or Path(__file__).parent / "results" / f"realmodels-{host}.md")
    out.write_text(table(results, meta))
    print(f"wrote {out}")
    bad = [r["spec"] for r, _ in results if "crashed" in r]
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
