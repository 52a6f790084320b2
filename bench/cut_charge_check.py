"""Do cut charges by bytes price profile-mode plans better than one figure per cut? Same plans.

For each model: one ``tune --measure profile`` campaign on a fresh cost table (`bench.plan_error`:
no refine, no verify); then, offline on that table (its profiles, its cut-cost probe), three
searches: cuts charged nothing (the plans with many partitions), one figure per cut and target
(the probe's constants: what campaigns charged before), and by bytes (the probe's lines,
`collage_farm.core.cutcharge`). Every distinct plan they find is priced under both charges
(``const``, ``bytes``) and timed end to end beside each target's whole model, interleaved
(rotated order, ``--rounds`` rounds of ``--runs`` runs, `PlanExecutor.measure_in_chain`).

Printed per plan: where it came from, its partitions and cuts, the bytes crossing them, both
estimates, the measured median, and the *calibrated* additive error of each estimate (each
partition scaled by its target's whole model measured in the same rounds over the probe's
whole-model time the profiles are scaled to, as the campaign's
``dijkstra_calibrated_additive_error``), so the machine's drift since the campaign is out.

    PYTHONPATH=. RAY_AUTH_MODE=disabled \\
        python3 -m bench.cut_charge_check --models pkg:ppocr-rec --num-cpus 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.cut_fit import rotated_medians
from bench.plan_error import campaign, model_source, timing_parser
from bench.profile_mode import load
from collage_farm.campaign import (
    TuneOptions,
    build_specs,
    choose_transition,
    make_estimator,
    profiled_estimator,
    with_cut_costs,
)
from collage_farm.campaign.options import CostSource
from collage_farm.core.cutcharge import CutCharge, entering_bytes
from collage_farm.core.rules import all_candidates
from collage_farm.core.search import search, static_penalty_s
from collage_farm.core.target import parse_targets
from collage_farm.core.transition import WithCutCosts
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.zoo.source import load_source


def variants(opts: TuneOptions, graph: Any, est: Any) -> dict[str, tuple[Any, Any]]:
    """Charge name -> (estimator, transition model) over the campaign's table."""
    base = choose_transition(opts, est, measure=False)
    _, info = with_cut_costs(graph, opts.targets, base, opts.cost_table, measure=False,
                             wholes=True)
    info = info or {}
    lines = {k: CutCharge(v["fixed_s"], v["per_byte_s"])
             for k, v in (info.get("cut_charges") or {}).items()}
    const_info = {k: v for k, v in info.items() if k not in ("chunk_s", "chunk_bytes")}
    none_info = {**const_info, "same_cuts_s": {}}
    out = {}
    for name, ci, tr in (("none", none_info, base),
                         ("const", const_info, WithCutCosts(base, info.get("cuts_s") or {})),
                         ("bytes", info, WithCutCosts(base, info.get("cuts_s") or {}, lines))):
        pe, _ = profiled_estimator(opts, graph, est, ci)
        out[name] = (pe, tr)
    return out


def price(graph: Any, parts: list[Any], est: Any, tr: Any) -> list[float]:
    """Each partition's estimate plus the search's penalty for it under ``est``, ``tr``."""
    costs = est.estimate(parts)
    return [c.seconds + static_penalty_s(graph, p, tr) for p, c in zip(parts, costs)]


def timed(graph: Any, plans: dict[str, list[Any]], targets: list[Any], rounds: int,
          runs: int) -> dict[str, float]:
    """Median end-to-end seconds of each plan and each target's whole model, interleaved."""
    builder = PlanBuilder(graph, threads=1)
    chains = {k: builder.executor([Part(c.mask, c.target) for c in parts])
              for k, parts in plans.items()}
    chains.update({t.id: builder.executor([Part(graph.all_mask, t)]) for t in targets})
    return {k: statistics.median(v) for k, v in rotated_medians(chains, rounds, runs).items()}


def check(label: str, work: Path, targets: str, args: argparse.Namespace) -> list[str]:
    """One campaign, the offline searches, the timing; the table rows."""
    source = model_source(label, work)
    before = load()
    s = campaign(source, targets, work, args.num_cpus)
    graph = load_source(source)
    opts = TuneOptions(model=source, targets=tuple(parse_targets(targets)),
                       out=work / "offline", cost_table=work / "costs",
                       estimator=CostSource.OFFLINE, measure="profile", report=False)
    est, _ = make_estimator(opts, graph)
    cands = all_candidates(graph, build_specs(opts.targets, opts.rule_options))
    models = variants(opts, graph, est)
    found: dict[tuple, tuple[list[str], list[Any]]] = {}  # plan -> (searches, partitions)
    for name, (pe, tr) in models.items():
        parts = [p.candidate for p in search(graph, cands, pe, tr).partitions]
        key = tuple((p.mask, p.target.id) for p in parts)
        found.setdefault(key, ([], parts))[0].append(name)
    plans = {"searched with cuts " + "/".join(names): parts for names, parts in found.values()}
    measured = timed(graph, plans, list(opts.targets), args.rounds, args.runs)
    base = ((s.get("profile") or {}).get("wholes_s")) or {}
    cal = {t: measured[t] / base[t] for t in base if t in measured and base[t] > 0}
    rows = []
    for key, parts in plans.items():
        m = measured[key]
        cuts = sum(1 for p in parts if entering_bytes(p.sub_graph))
        kib = sum(entering_bytes(p.sub_graph) for p in parts) / 1024
        cells = []
        for charge in ("const", "bytes"):
            pe, tr = models[charge]
            est_s = price(graph, parts, pe, tr)
            scaled = sum(e * cal.get(p.target.id, float("nan")) for p, e in zip(parts, est_s))
            cells += [f"{sum(est_s) * 1e3:.3f}", f"{(m - scaled) / m:+.1%}"]
        per = ", ".join(f"{t} {sum(p.target.id == t for p in parts)}"
                        for t in dict.fromkeys(p.target.id for p in parts))
        rows.append(f"| {label} | {key} | {len(parts)} ({per}) | {cuts} | {kib:.0f} | "
                    f"{cells[0]} | {cells[2]} | {m * 1e3:.3f} | {cells[1]} | {cells[3]} |")
    est.close()
    rows.append(f"  {label}: whole models now / probe time base: "
                + ", ".join(f"{t} {v:.3f}" for t, v in cal.items())
                + f"; load before {before}, after {load()}")
    return rows


def main() -> None:
    args = timing_parser(__doc__, "mobilenet_v2-96,pkg:ppocr-rec", None, 7, 10).parse_args()
    print("| model | plan | partitions | cuts | KiB crossing cuts | estimated ms, cuts const "
          "| estimated ms, cuts by bytes | measured ms | calibrated error, const | "
          "calibrated error, bytes |\n" + "|---" * 10 + "|", flush=True)
    root = Path(tempfile.mkdtemp(prefix="bench-cut-charge"))
    for label in args.models.split(","):
        work = root / label.replace(":", "-")
        work.mkdir(parents=True, exist_ok=True)
        print("\n".join(check(label, work, args.targets, args)), flush=True)


if __name__ == "__main__":
    main()
