"""Benchmark phases 2 and 3 (candidates and Dijkstra search) on the zoo with mock costs.

Prints, per model: nodes, candidates, distinct fingerprints, phase-2 and phase-3 seconds, and
for gpt2 at 2/4/8/12 layers the growth of search time with depth. The ``digest`` column hashes
every candidate fingerprint, the states expanded and the plan (partitions' node sets, targets
and total cost): a refactoring that keeps it for every model kept phases 2 and 3 unchanged.
Costs come from the mock estimator (labelled), so this measures the search machinery alone.
Results are written to bench/results/search-<host>.md with the machine they ran on.

    python bench/search.py [--targets ort-cpu,openvino-cpu] [--out bench/results]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import socket
import sys
import time
from pathlib import Path

# run as a script, bench/ is sys.path[0] and bench/runners.py would shadow the package
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_farm import zoo
from collage_farm.campaign import build_specs
from collage_farm.core.graph import load_graph
from collage_farm.core.rules import RuleOptions, all_candidates
from collage_farm.core.search import search
from collage_farm.core.target import parse_targets
from estimators.mock import MockEstimator

CASES = [
    ("mnist", {}),
    ("resnet18", {}),
    ("resnet50", {}),
    ("mobilenet_v2", {}),
    ("bert", {"layers": 12}),
    ("gpt2", {"layers": 2}),
    ("gpt2", {"layers": 4}),
    ("gpt2", {"layers": 8}),
    ("gpt2", {"layers": 12}),
]


def cpu_model() -> str:
    from runners.base import DeviceDescription

    return DeviceDescription.host_cpu().name


def digest(fingerprints: list[str], result: object) -> str:
    """A short hash of the candidates' fingerprints, the search's states and its plan."""
    plan = [(p.candidate.mask, p.candidate.target.id) for p in result.partitions]
    data = [sorted(fingerprints), plan, repr(result.total_s), result.states_expanded]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()[:12]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="ort-cpu,openvino-cpu")
    ap.add_argument("--max-depth", type=int, default=4)
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--only", help="comma-separated model names")
    args = ap.parse_args()
    targets = parse_targets(args.targets)
    specs = build_specs(targets, RuleOptions(max_depth=args.max_depth))
    only = set(args.only.split(",")) if args.only else None
    rows = []
    header = ("model", "nodes", "candidates", "fingerprints", "phase2_s", "phase3_s",
              "phase2+3_s", "states", "partitions", "digest")
    print(" | ".join(header))
    for name, kw in CASES:
        if only and name not in only:
            continue
        model = zoo.build(name, **kw)
        g = load_graph(model, name=name)
        t0 = time.perf_counter()
        cands = all_candidates(g, specs)
        t1 = time.perf_counter()
        fps = len({c.fingerprint for c in cands})
        r = search(g, cands, MockEstimator(), lazy=False)
        t2 = time.perf_counter()
        label = name + (f"-{kw['layers']}L" if "layers" in kw else "")
        row = (label, len(g), len(cands), fps, f"{t1 - t0:.2f}", f"{t2 - t1:.2f}",
               f"{t2 - t0:.2f}", r.states_expanded, len(r.partitions),
               digest([c.fingerprint for c in cands], r))
        rows.append(row)
        print(" | ".join(str(x) for x in row), flush=True)
    host = socket.gethostname()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [
        f"# bench/search.py on {host}",
        "",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        f"Targets: {args.targets}; max_depth {args.max_depth}; costs: mock estimator "
        "(not measurements); phase 3 fetches every candidate's cost in one batch.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
    (out / f"search-{host}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
