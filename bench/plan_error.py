"""Where does a profile-mode Dijkstra plan's additive error sit, partition by partition?

For each model, ``--campaigns`` times: one ``tune --measure profile`` campaign (targets
``ort-cpu,openvino-cpu,litert-cpu``, 1 thread, a fresh cost table, no refine and no
never-worse step, so the plan it writes *is* its Dijkstra plan), then, right after, in one
process and interleaved (rotated order each round):

* the Dijkstra plan end to end, with each partition's call timed **inside** the running chain
  (`PlanExecutor.measure_in_chain`);
* each target's whole model as a one-partition plan (the same executor), to compare with the
  whole-model time the estimator scaled every profile share to (the cut-cost probe's
  ``wholes_s``, taken at the start of the campaign).

Printed per partition: target, nodes, how its target's costs were obtained (the profiler's
method, or ``prefix`` when the profiler was rejected and prefix differences at thin cuts stand
in), the estimate split into its profile share and its cut charge (the target's measured
same-toolchain cut cost per cut, charged when a partition feeds it; where the campaign charged
that cut by its bytes, the split is the per-cut figure's, the total the campaign's) plus the
transition penalty, the in-chain median, and the error ``(in chain - estimate) / in chain``,
raw and with the target's drift taken out (the estimate times the target's whole model
measured now / its time base).
With ``--fresh-base``, the cut-cost probe's whole-model times are re-taken right before the
timing and the plan's estimate re-based on them (what the estimate would be with a time base
seconds old instead of a campaign's minute).
Per plan: the chain's end-to-end median against the sum of in-chain calls (the loop between
partitions) and the additive error raw and drift-corrected, as the campaign reports them.

    PYTHONPATH=. RAY_AUTH_MODE=disabled \\
        python3 -m bench.plan_error --num-cpus 2 --models resnet18-64 --campaigns 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import onnx

from bench.profile_mode import MODELS, load
from collage_farm import zoo
from collage_farm.campaign import TuneOptions, run_tune
from collage_farm.core.target import get_target, parse_targets
from collage_farm.execute import PlanExecutor
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.probes.cutcost import measure_cut_costs
from collage_farm.zoo.source import load_source
from runners.base import DeviceDescription


def campaign(source: str, targets: str, work: Path, num_cpus: int | None) -> dict[str, Any]:
    """One profile-mode campaign whose written plan is its Dijkstra plan; its summary."""
    opts = TuneOptions(model=source, targets=tuple(parse_targets(targets)), out=work / "out",
                       cost_table=work / "costs", num_cpus=num_cpus, measure="profile",
                       refine_trials=0, verify=False, report=False)
    return run_tune(opts)


def time_plans(plan_dir: Path, source: str, targets: list[str], rounds: int, runs: int
               ) -> tuple[dict[str, float], dict[str, float], float]:
    """(each partition's in-chain median s, each target's whole model e2e median s, the
    plan's e2e median s), interleaved over ``rounds`` rounds of ``runs`` chain runs."""
    g = load_source(source)
    builder = PlanBuilder(g)
    chains: dict[str, PlanExecutor] = {"plan": PlanExecutor(plan_dir)}
    for t in targets:
        chains[t] = builder.executor([Part(g.all_mask, get_target(t))])
    names = list(chains)
    totals: dict[str, list[float]] = {k: [] for k in names}
    per: dict[str, list[float]] = {}
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            tot, parts = chains[k].measure_in_chain(runs, warmup=2)
            totals[k].append(statistics.median(tot))
            if k == "plan":
                for pid, xs in parts.items():
                    per.setdefault(pid, []).append(statistics.median(xs))
    med = {k: statistics.median(v) for k, v in totals.items()}
    return ({pid: statistics.median(v) for pid, v in per.items()},
            {t: med[t] for t in targets}, med["plan"])


def method_of(s: dict[str, Any], tid: str) -> str:
    """How ``tid``'s costs were obtained in the campaign of summary ``s``."""
    prof = s.get("profile") or {}
    if tid not in prof.get("profiled_targets", []):
        return "isolated"
    o = (prof.get("targets") or {}).get(tid) or {}
    return "prefix" if o.get("rejected") else str(o.get("method") or "profile")


def fresh_base(source: str, targets: list[str]) -> dict[str, float]:
    """Each target's whole-model seconds from a cut-cost probe run now (the estimator's time
    base as a campaign takes it, re-taken right before the plan is timed)."""
    g = load_source(source)
    cc = measure_cut_costs(g, [get_target(t) for t in targets], builder=PlanBuilder(g),
                           wholes=True)
    return dict(cc.wholes_s)


def report(label: str, s: dict[str, Any], plan: dict[str, Any], in_chain: dict[str, float],
           wholes_now: dict[str, float], e2e: float,
           fresh: dict[str, float] | None = None) -> list[str]:
    """Table rows per partition and one line for the plan (with ``fresh``, each target's
    whole-model time from a probe re-taken just before the timing, also the plan's error with
    the estimate re-based on it)."""
    prof = s.get("profile") or {}
    base = prof.get("wholes_s") or {}
    cuts = prof.get("same_cuts_s") or {}
    drift = {t: wholes_now[t] / base[t] for t in wholes_now if base.get(t)}
    inputs = set(plan["graph_inputs"])
    lines = []
    est_sum = cal_sum = 0.0
    for p in plan["partitions"]:
        t, est, pen = p["target"], p["estimated_s"], p["penalty_s"]
        cut = cuts.get(t, 0.0) if any(i not in inputs for i in p["inputs"]) else 0.0
        got = in_chain.get(p["id"], float("nan"))
        d = drift.get(t, float("nan"))
        est_sum += est + pen
        cal_sum += (est + pen) * d
        lines.append(
            f"| {label} | {p['id']} | {t} | {len(p['nodes'])} | {method_of(s, t)} | "
            f"{(est - cut) * 1e3:.3f} | {cut * 1e3:.3f} | {pen * 1e3:.3f} | {got * 1e3:.3f} | "
            f"{(got - est - pen) / got:+.1%} | {d:.3f} | {(got - (est + pen) * d) / got:+.1%} |")
    loop = e2e - sum(in_chain.values())
    wh = ", ".join(f"{t} {wholes_now[t] * 1e3:.3f} now / {base.get(t, 0) * 1e3:.3f} base"
                   for t in wholes_now)
    lines.append(
        f"  {label}: plan estimated {est_sum * 1e3:.3f} ms (campaign: "
        f"{(s.get('dijkstra_estimated_s') or 0) * 1e3:.3f}), measured e2e {e2e * 1e3:.3f} ms "
        f"(sum in chain {sum(in_chain.values()) * 1e3:.3f}, loop {loop * 1e3:+.3f}); additive "
        f"error {(e2e - est_sum) / e2e:+.1%} raw, {(e2e - cal_sum) / e2e:+.1%} drift-corrected;"
        f" whole models ms (measured now / campaign time base): {wh}")
    if fresh:
        rebased = sum((p["estimated_s"] + p["penalty_s"]) * fresh[p["target"]]
                      / base[p["target"]] for p in plan["partitions"])
        lines.append(f"  {label}: estimate re-based on a probe taken just before the timing "
                     f"{rebased * 1e3:.3f} ms, additive error {(e2e - rebased) / e2e:+.1%}; "
                     "fresh whole ms (probe): " + ", ".join(
                         f"{t} {v * 1e3:.3f}" for t, v in fresh.items()))
    for w in prof.get("warnings", []):
        lines.append(f"  {label}: {w}")
    return lines


def model_source(label: str, work: Path) -> str:
    """A model argument as a campaign's source: a zoo model of `MODELS` saved under ``work``,
    anything else (``pkg:ppocr-rec``, a path) as given."""
    if label not in MODELS:
        return label
    name, kw = MODELS[label]
    source = str(work / f"{label}.onnx")
    onnx.save(zoo.build(name, **kw), source)
    return source


def timing_parser(doc: str, models: str, num_cpus: int | None, rounds: int, runs: int
                  ) -> argparse.ArgumentParser:
    """The options these campaign-then-timing benches share."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--models", default=models,
                    help=f"of {', '.join(MODELS)}, or a source such as pkg:ppocr-rec")
    ap.add_argument("--targets", default="ort-cpu,openvino-cpu,litert-cpu")
    ap.add_argument("--num-cpus", type=int, default=num_cpus)
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--runs", type=int, default=runs, help="chain runs per round")
    return ap


def main() -> None:
    ap = timing_parser(__doc__, "resnet18-64,mobilenet_v2-96,gpt2-2L", 2, 9, 20)
    ap.add_argument("--campaigns", type=int, default=2)
    ap.add_argument("--fresh-base", action="store_true",
                    help="re-take the probe's whole-model times right before the timing")
    ap.add_argument("--keep", type=Path, default=None, help="keep campaign dirs under DIR")
    args = ap.parse_args()
    targets = args.targets.split(",")
    head = [f"# profile-mode Dijkstra plans per partition ({time.strftime('%Y-%m-%d %H:%M')})",
            f"machine: {DeviceDescription.host_cpu().describe()}; targets {args.targets}",
            "", "| campaign | partition | target | nodes | costs from | profile share ms "
            "(estimated) | cut charge ms (estimated) | transition ms (estimated) | in chain "
            "ms (measured) | error | target drift (whole now / base) | error, drift out |",
            "|---" * 12 + "|"]
    print("\n".join(head), flush=True)
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-plan-error"))
    for label in args.models.split(","):
        for i in range(args.campaigns):
            work = root / f"{label.replace(':', '-')}-{i}"
            work.mkdir(parents=True, exist_ok=True)
            source = model_source(label, work)
            before = load()
            s = campaign(source, args.targets, work, args.num_cpus)
            (work / "summary.json").write_text(json.dumps(s, indent=1, default=str))
            plan = json.loads((work / "out" / "plan.json").read_text())
            fresh = fresh_base(source, targets) if args.fresh_base else None
            per, wholes, e2e = time_plans(work / "out", source, targets, args.rounds,
                                          args.runs)
            lines = report(f"{label}#{i}", s, plan, per, wholes, e2e, fresh)
            lines.append(f"  {label}#{i}: load before {before}, after {load()}")
            print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
