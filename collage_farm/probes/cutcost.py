"""Measured cut costs: what entering a toolchain from another one costs, for *this* model.

Why: with candidates timed inside their network (`runners.measure`, ``network`` mode) the sum
of a chain's chunk costs matches the chain run end to end within a few percent *when every
chunk runs on one toolchain* (bench/results/inchain-vm.md). Mixed plans still ran 17-37% slower
than their estimates on the CNNs (bench/results/collage-vm-network.md): in a hand-built chain
a chunk of resnet18-64 on OpenVINO ran 0.3-0.6 ms slower when its neighbours ran on ONNX Runtime
than inside an all-OpenVINO chain (ORT chunks: 0.07-0.2 ms;
bench/results/cut-diagnostics-vm.md), and the transformer cuts cost almost nothing. Such a cost
belongs to the cut, not to either candidate, and it depends on the model (layouts, tensor
sizes, what the neighbour leaves in the caches), so it is measured per model:

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

Like every measurement, the result lands in the cost table (`cached_cut_costs`): one row per
target, fingerprint ``cutcost:<whole-model structural hash>:<chunks>``, on this host's device
description, appended to the writer the caller passes (the campaign's single
`CostTableWriter`; this module never opens one). A later campaign on the same model and machine
reuses the rows instead of probing again, so its transition penalties, and with them the
candidates the lazy search asks for, do not change from run to run with the machine's noise.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from collage_farm.core.graph import DataflowGraph
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import Target
from collage_farm.costtable import CostTable, CostTableWriter, row_from_result
from collage_farm.execute.builder import Part, PlanBuilder
from runners.base import DeviceDescription, Kind, MeasureConfig, MeasureResult, Status, Summary
from runners.registry import get_toolchain

log = logging.getLogger(__name__)

__all__ = ["CUT_PREFIX", "CutCosts", "cached_cut_costs", "chunk_masks", "cut_fingerprint",
           "measure_cut_costs"]

CUT_PREFIX = "cutcost:"


@dataclass(frozen=True)
class CutCosts:
    """Per-target cut costs of one model and how they were obtained."""

    cuts: dict[str, float]  # target id -> seconds per cut into it (>= 0)
    chunks: int
    rounds: int
    skipped: tuple[str, ...] = ()  # chains that could not be built, with why
    chain_s: dict[str, float] = field(default_factory=dict)  # chain label -> median seconds
    wall_s: float = 0.0
    cached: bool = False  # read back from the cost table, not measured now

    def to_json(self) -> dict[str, Any]:
        return {"cuts_s": dict(self.cuts), "chunks": self.chunks, "rounds": self.rounds,
                "skipped": list(self.skipped), "chain_s": dict(self.chain_s),
                "wall_s": self.wall_s, "cached": self.cached}


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
    ids = {label: [rt.id for rt in ex.partitions] for label, ex in chains.items()}
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
    # median seconds of chunk j inside each chain, by position
    med = {label: [statistics.median(samples[label][pid]) for pid in ids[label]]
           for label in chains}
    extra: dict[str, list[float]] = {t.id: [] for t in targets}
    for label, ts in layouts.items():
        if "/" not in label or label not in med:
            continue  # single-target chains are the reference; skipped chains have nothing
        for j in range(1, len(masks)):  # chunk j entered from chunk j-1's other toolchain
            extra[ts[j].id].append(med[label][j] - med[ts[j].id][j])
    cuts = {t: max(0.0, statistics.median(xs)) if xs else 0.0 for t, xs in extra.items()}
    chain_s = {label: statistics.median(xs) for label, xs in totals.items() if xs}
    out = CutCosts(cuts, len(masks), done, tuple(skipped), chain_s, time.perf_counter() - t0)
    log.info("cut costs for %s: %s (%d chunks, %d rounds, %.1f s)", graph.name,
             {k: f"{v * 1e6:.0f} us" for k, v in cuts.items()}, len(masks), done, out.wall_s)
    return out


def cut_fingerprint(graph: DataflowGraph, chunks: int) -> str:
    """The cost-table fingerprint of a model's cut costs (structure, weights' shapes, chunks)."""
    whole = SubGraph(graph, graph.all_mask)
    return f"{CUT_PREFIX}{whole.structural_hash[:24]}:{max(1, min(chunks, len(graph.nodes)))}"


def cached_cut_costs(table: CostTable | None, graph: DataflowGraph, targets: Sequence[Target],
                     *, writer: CostTableWriter | None = None, chunks: int = 6,
                     measure: bool = True, campaign_id: str = "", **probe: Any
                     ) -> CutCosts | None:
    """This model's cut costs from ``table`` (this host's rows; None: no table to read), else
    measured (``measure``) and appended to ``writer`` (None: not written); None when neither.
    ``probe``: `measure_cut_costs` options.
    """
    targets = list(dict.fromkeys(targets))
    fp = cut_fingerprint(graph, chunks)
    host = DeviceDescription.host_cpu()
    if table is not None:
        hits = table.lookup([(fp, t.measure_key) for t in targets], device=host.describe(),
                            strictness="device")
        if all((fp, t.measure_key) in hits and hits[fp, t.measure_key].ok for t in targets):
            cuts = {t.id: hits[fp, t.measure_key].seconds for t in targets}
            return CutCosts(cuts, int(fp.rsplit(":", 1)[1]), 0, cached=True)
    if not measure:
        return None
    cc = measure_cut_costs(graph, targets, chunks=chunks, **probe)
    if (cc.skipped and not cc.chain_s) or writer is None:
        return cc  # nothing ran (nothing to keep), or nowhere to keep it
    for t in targets:
        if any(s.startswith(f"{t.id}:") for s in cc.skipped):
            continue  # the target's own chain failed: no measurement to keep
        v = cc.cuts.get(t.id, 0.0)
        res = MeasureResult(fp, t, Status.OK, MeasureConfig(mode="warm"), samples=(v,),
                            summary=Summary.of((v,)), kind=Kind.MEASURED, device=host,
                            toolchain_version=get_toolchain(t.toolchain).version(),
                            measure_s=cc.wall_s,
                            details=(("chunks", cc.chunks), ("rounds", cc.rounds)))
        writer.append(row_from_result(res, campaign_id=campaign_id, model=graph.name,
                                      nodes=[], op_types=["cut"]))
    return cc
