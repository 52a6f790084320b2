"""Measured cut costs: what entering a toolchain from another one costs, for *this* model.

Why: with candidates timed inside their network (`runners.measure`, ``network`` mode) the sum
of a chain's chunk costs matches the chain run end to end within a few percent *when every
chunk runs on one toolchain* (bench/results/inchain-vm.md). Mixed plans still ran 17-37% slower
than their estimates on the CNNs (bench/results/collage-vm-network.md): a chunk of resnet18-64
on OpenVINO ran 0.3-0.6 ms slower inside a chain whose other chunks ran on ONNX Runtime than
inside an all-OpenVINO chain (ORT chunks: 0.07-0.2 ms), and the transformer cuts cost almost
nothing. Such a cost belongs to the cut, not to either candidate, and it depends on the model
(layouts, tensor sizes, what the neighbour leaves in the caches), so it is measured per model:

1. cut the model into ``chunks`` contiguous runs of its topological order;
2. build, per target, the chain with every chunk on that target, and, per ordered pair of
   targets (A, B), the chain alternating A, B, A, ...; chains a target cannot run are skipped;
3. run all chains interleaved (rounds of a few runs each, so the machine's drift hits every
   chain alike), timing every chunk inside its running chain (`PlanExecutor.measure_in_chain`);
4. a chunk on B entered from another toolchain costs ``median(t in the mixed chain) -
   median(t in the all-B chain)`` more; B's cut cost is the median of these over chunks and
   partners, floored at 0.

The search charges it once per partition fed by another partition (`TransitionModel.cut_s`,
`WithCutCosts`). Same-toolchain cuts cost nothing here: their lost fusion and reorders are
already in the candidates' own measurements.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from collage_farm.graph import DataflowGraph
from collage_farm.target import Target

log = logging.getLogger(__name__)

__all__ = ["CutCosts", "chunk_masks", "measure_cut_costs"]


@dataclass(frozen=True)
class CutCosts:
    """Per-target cut costs of one model and how they were obtained."""

    cuts: dict[str, float]  # target id -> seconds per cut into it (>= 0)
    chunks: int
    rounds: int
    skipped: tuple[str, ...] = ()  # chains that could not be built, with why
    chain_s: dict[str, float] = field(default_factory=dict)  # chain label -> median seconds
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"cuts_s": dict(self.cuts), "chunks": self.chunks, "rounds": self.rounds,
                "skipped": list(self.skipped), "chain_s": dict(self.chain_s),
                "wall_s": self.wall_s}


def chunk_masks(graph: DataflowGraph, chunks: int) -> list[int]:
    """``chunks`` contiguous runs of the topological order (node bitsets), none empty."""
    n = len(graph.nodes)
    k = max(1, min(int(chunks), n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [sum(1 << j for j in range(bounds[i], bounds[i + 1])) for i in range(k)]


def measure_cut_costs(graph: DataflowGraph, targets: Sequence[Target], *, chunks: int = 6,
                      rounds: int = 5, runs_per_round: int = 4, builder: Any = None,
                      time_budget_s: float = 120.0) -> CutCosts:
    """Measure each target's cut cost for ``graph`` (module docstring). Never raises for a
    chain that cannot be built or run: it is skipped and named in ``skipped``."""
    from collage_farm.refine import Part, PlanBuilder

    t0 = time.perf_counter()
    masks = chunk_masks(graph, chunks)
    targets = list(dict.fromkeys(targets))
    if len(masks) < 2 or len(targets) < 2:
        return CutCosts({t.id: 0.0 for t in targets}, len(masks), 0)
    builder = builder or PlanBuilder(graph, threads=1)
    layouts: dict[str, list[Target]] = {t.id: [t] * len(masks) for t in targets}
    for a in targets:
        for b in targets:
            if a.id != b.id:
                layouts[f"{a.id}/{b.id}"] = [a if j % 2 == 0 else b for j in range(len(masks))]
    chains: dict[str, Any] = {}
    skipped: list[str] = []
    for label, ts in layouts.items():
        if "/" in label and not all(t.id in chains for t in ts):
            skipped.append(f"{label}: a single-target chain failed")
            continue
        try:
            ex = builder.executor([Part(m, t) for m, t in zip(masks, ts)])
            ex.measure_in_chain(1, warmup=2)  # binds, warms, proves it runs
            chains[label] = ex
        except Exception as e:  # an op a target cannot run in some chunk, a build error
            skipped.append(f"{label}: {type(e).__name__}: {str(e)[:160]}")
    samples: dict[str, dict[str, list[float]]] = {k: {} for k in chains}
    totals: dict[str, list[float]] = {k: [] for k in chains}
    done = 0
    for _ in range(max(1, rounds)):
        for label, ex in chains.items():
            tot, per = ex.measure_in_chain(runs_per_round)
            totals[label] += tot
            for pid, xs in per.items():
                samples[label].setdefault(pid, []).extend(xs)
        done += 1
        if time.perf_counter() - t0 > time_budget_s:
            break
    med = {label: {pid: statistics.median(xs) for pid, xs in per.items() if xs}
           for label, per in samples.items()}
    extra: dict[str, list[float]] = {t.id: [] for t in targets}
    for label, ts in layouts.items():
        if "/" not in label or label not in med:
            continue
        for j in range(1, len(masks)):  # chunk j entered from chunk j-1's other toolchain
            own = med.get(ts[j].id, {})
            pid = f"p{j:03d}"
            if pid in own and pid in med[label]:
                extra[ts[j].id].append(med[label][pid] - own[pid])
    cuts = {t: max(0.0, statistics.median(xs)) if xs else 0.0 for t, xs in extra.items()}
    chain_s = {label: statistics.median(xs) for label, xs in totals.items() if xs}
    out = CutCosts(cuts, len(masks), done, tuple(skipped), chain_s, time.perf_counter() - t0)
    log.info("cut costs for %s: %s (%d chunks, %d rounds, %.1f s)", graph.name,
             {k: f"{v * 1e6:.0f} us" for k, v in cuts.items()}, len(masks), done, out.wall_s)
    return out
