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

1. cut the model into ``chunks`` contiguous runs of its topological order; where a target's
   toolchain builds partitions as slices of one compilation of the whole model (LiteRT:
   `Toolchain.slice_cuts`), each bound moves to the nearest position where that compilation
   can be cut, and the chunks of that target are built from it: one lowering of the whole
   model instead of a conversion per chunk (`PlanBuilder.executor`, ``sliced``);
2. build, per target, the chain with every chunk on that target, and, per ordered pair of
   targets (A, B), the chain alternating A, B, A, ...; chains a target cannot run are skipped;
3. run all chains interleaved (rounds of a few runs each, so the machine's drift hits every
   chain alike), timing every chunk inside its running chain (`PlanExecutor.measure_in_chain`;
   each chain is first run once to warm it and once to prove it runs, and once more where that
   run is shorter than a round, since it sizes the rounds);
   a probe with ``wholes`` (profile mode: its whole-model times are the time base every profile
   share is scaled to) gives each chain as many runs per round as fill ``min_round_s``, the
   round length of the never-worse run that times the plan (a 40 us model runs ~1,000 times,
   a 100 ms one once): the plan is priced on the time base it is verified on (four runs after
   eleven other chains left the caches cold timed mnist's whole models 35-48% slower than
   the verify run did);
4. a chunk on B entered from another toolchain costs ``median(t in the mixed chain) -
   median(t in the all-B chain)`` more; B's cut cost is the median of these over chunks and
   partners, floored at 0;
5. the same points, each with the bytes of the tensors entering its chunk from other chunks
   (the chunks cut the model at different depths, so at tensors of different sizes), give
   B's cut charge by bytes: a robust line ``fixed + per_byte x bytes`` floored at 0 and capped
   at the largest point (`collage_farm.core.cutcharge.fit_cut_charge`: Theil-Sen over every
   point of every partner).

The search charges it once per partition fed by another partition, by the bytes entering that
partition from other partitions (`TransitionModel.cut_s`, `WithCutCosts`); a caller that knows
no bytes gets the step-4 figure. Same-toolchain cuts cost nothing here: their lost fusion and
reorders are already in the candidates' own measurements.

Like every measurement, the result lands in the cost table (`cached_cut_costs`): one row per
target, fingerprint ``cutcost:<whole-model structural hash>:<chunks>``, on this host's device
description, appended to the writer the caller passes (the campaign's single
`CostTableWriter`; this module never opens one). A later campaign on the same model and machine
reuses the rows instead of probing again, so its transition penalties, and with them the
candidates the lazy search asks for, do not change from run to run with the machine's noise.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import time
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from collage_farm.core.cutcharge import CutCharge, entering_bytes, fit_cut_charge
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import Target
from collage_farm.costtable import CostTable, CostTableWriter, row_from_result
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.execute.interleaved import PLAN_ROUND_S, runs_to_fill
from runners.base import DeviceDescription, Kind, MeasureConfig, MeasureResult, Status, Summary
from runners.registry import get_toolchain

log = logging.getLogger(__name__)

__all__ = ["CUT_PREFIX", "WHOLES_MIN_ROUND_S", "CutCosts", "build_probe_sessions",
           "cached_cut_costs", "chunk_bounds",
           "chunk_masks", "cut_fingerprint", "masks_of", "measure_cut_costs", "slice_cuts"]

CUT_PREFIX = "cutcost:"
#: a ``wholes`` probe's shortest round per chain: the never-worse run's ``min_round_s``
WHOLES_MIN_ROUND_S = PLAN_ROUND_S


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
    #: target id -> seconds per cut between two partitions of that target (probed with
    #: ``wholes``: the all-target chain against the whole model in one partition; else empty)
    same_cuts: dict[str, float] = field(default_factory=dict)
    #: target id -> its whole model's median seconds in the same interleaved rounds (probed
    #: with ``wholes``; else empty): every target's whole model on one time base
    wholes_s: dict[str, float] = field(default_factory=dict)
    #: chain label -> runs per round (measured now; empty when read back)
    runs: dict[str, int] = field(default_factory=dict)
    #: target id -> cut charge by the bytes entering the partition (step 5; empty when read
    #: back from rows written before the fit: those charge ``cuts``)
    charges: dict[str, CutCharge] = field(default_factory=dict)
    #: per chunk, the bytes entering it from other chunks (measured now; else empty)
    chunk_bytes: tuple[int, ...] = ()
    #: chain label -> median seconds of each of its chunks inside it (read back from the
    #: table: the all-target chains only, by target id; empty for rows that predate them)
    chunk_s: dict[str, list[float]] = field(default_factory=dict)
    #: where the probe's wall seconds went (measured now; else empty): ``cuts_s`` (chunk
    #: bounds, a slicing toolchain's whole compilation included), ``build_s`` (the chains'
    #: sessions), ``warm_s`` (each chain's warm-up and proving runs), ``rounds_s``
    steps_s: dict[str, float] = field(default_factory=dict)
    #: the chunks' bounds in the graph's node order (``chunks + 1`` positions, `chunk_bounds`;
    #: empty when read back from rows that predate them): chunk ``j`` is nodes
    #: ``bounds[j]:bounds[j+1]``, the nodes ``chunk_s`` times
    bounds: tuple[int, ...] = ()

    def row_details(self, tid: str) -> tuple[tuple[str, Any], ...]:
        """Target ``tid``'s cost-table row details (`cached_cut_costs`; `from_rows` reads
        them back)."""
        out: list[tuple[str, Any]] = [("chunks", self.chunks), ("rounds", self.rounds)]
        if tid in self.same_cuts:
            out.append(("same_cut_s", self.same_cuts[tid]))
        if tid in self.wholes_s:
            out.append(("whole_s", self.wholes_s[tid]))
        if tid in self.charges:
            line = self.charges[tid]
            out += [("cut_fixed_s", line.fixed_s), ("cut_per_byte_s", line.per_byte_s),
                    *((("cut_cap_s", line.cap_s),) if math.isfinite(line.cap_s) else ())]
        if tid in self.chunk_s and self.chunk_bytes:
            out += [("chunk_s", list(self.chunk_s[tid])), ("chunk_bytes", list(self.chunk_bytes))]
        if self.bounds:
            out.append(("chunk_bounds", list(self.bounds)))
        return tuple(out)

    @staticmethod
    def from_rows(cuts: dict[str, float], details: dict[str, dict[str, Any]],
                  chunks: int) -> CutCosts:
        """Cut costs read back from each target's row (``cuts``: its seconds; ``details``:
        its `row_details`); what a row lacks (written by an earlier version) stays empty."""
        def each(key: str) -> dict[str, Any]:
            return {k: d[key] for k, d in details.items() if key in d}
        charges = {k: CutCharge(float(d["cut_fixed_s"]), float(d["cut_per_byte_s"]),
                                float(d.get("cut_cap_s", math.inf)))
                   for k, d in details.items() if "cut_fixed_s" in d and "cut_per_byte_s" in d}
        nbytes = next((tuple(int(b) for b in v) for v in each("chunk_bytes").values()), ())
        bounds = next((tuple(int(b) for b in v) for v in each("chunk_bounds").values()), ())
        return CutCosts(cuts, chunks, 0, cached=True,
                        same_cuts={k: float(v) for k, v in each("same_cut_s").items()},
                        wholes_s={k: float(v) for k, v in each("whole_s").items()},
                        charges=charges, chunk_bytes=nbytes,
                        chunk_s={k: [float(x) for x in v] for k, v in each("chunk_s").items()},
                        bounds=bounds)

    def to_json(self) -> dict[str, Any]:
        out = {"cuts_s": dict(self.cuts), "chunks": self.chunks, "rounds": self.rounds,
               "skipped": list(self.skipped), "chain_s": dict(self.chain_s),
               "wall_s": self.wall_s, "cached": self.cached}
        if self.same_cuts:
            out["same_cuts_s"] = dict(self.same_cuts)
        if self.wholes_s:
            out["wholes_s"] = dict(self.wholes_s)
        if self.runs:
            out["runs_per_round"] = dict(self.runs)
        if self.charges:
            out["cut_charges"] = {k: c.to_json() for k, c in self.charges.items()}
        if self.chunk_bytes:
            out["chunk_bytes"] = list(self.chunk_bytes)
        if self.chunk_s:
            out["chunk_s"] = {k: list(v) for k, v in self.chunk_s.items()}
        if self.bounds:
            out["chunk_bounds"] = list(self.bounds)
        if self.steps_s:
            out["steps_s"] = dict(self.steps_s)
        return out


def chunk_bounds(graph: DataflowGraph, chunks: int,
                 cuts: Collection[int] | None = None) -> list[int]:
    """The bounds (``chunks + 1`` positions in the topological order, first 0, last the node
    count) of ``chunks`` contiguous runs of it, none empty. With ``cuts`` (positions between
    nodes: `Toolchain.slice_cuts`), each inner bound, left to right, moves to the nearest
    position in ``cuts`` (the earlier of two as near) that lies after the bound before it and
    before the next bound, where there is one."""
    n = len(graph.nodes)
    k = max(1, min(int(chunks), n))
    bounds = [round(i * n / k) for i in range(k + 1)]
    for i in range(1, k):
        near = [p for p in cuts or () if bounds[i - 1] < p < bounds[i + 1]]
        if near:
            bounds[i] = min(near, key=lambda p: (abs(p - bounds[i]), p))
    return bounds


def masks_of(bounds: Sequence[int]) -> list[int]:
    """The node bitsets of the chunks between consecutive ``bounds`` (`chunk_bounds`)."""
    return [sum(1 << j for j in range(a, b)) for a, b in itertools.pairwise(bounds)]


def chunk_masks(graph: DataflowGraph, chunks: int,
                cuts: Collection[int] | None = None) -> list[int]:
    """``chunks`` contiguous runs of the topological order (node bitsets), none empty: the
    runs between `chunk_bounds`."""
    return masks_of(chunk_bounds(graph, chunks, cuts))


def slice_cuts(builder: PlanBuilder, targets: Sequence[Target]) -> frozenset[int] | None:
    """Where every target whose toolchain builds slices of one whole compilation can cut
    ``builder``'s graph (`Toolchain.slice_cuts` on the builder's `WholeGraph`); None when no
    target's toolchain does."""
    found = [get_toolchain(tc).slice_cuts(builder.whole)
             for tc in dict.fromkeys(t.toolchain for t in targets)]
    sets = [c for c in found if c is not None]
    return frozenset.intersection(*sets) if sets else None


def build_probe_sessions(graph: DataflowGraph, targets: Sequence[Target], builder: PlanBuilder,
                         *, chunks: int = 6, wholes: bool = False,
                         workers: int = 1) -> dict[str, Any]:
    """Build into ``builder`` the sessions `measure_cut_costs` on the same arguments starts
    from (each target's chunks and, with ``wholes``, its whole model), timing nothing, so a
    campaign can build them while something else that times nothing (Ray starting) runs.
    ``workers`` > 1: the node sets are extracted first, then that many targets build at once,
    each target's sessions in one thread (no toolchain compiles in two threads at once; the
    compilers release the interpreter while they work: gpt2-2L's builds took 8.3 s on two
    threads against 10.5 s on one). Never raises: a chain that fails to build is left for the
    probe, which builds it again and names it in ``skipped``. What it did: ``built``
    (chains), ``failed``, ``seconds``, ``workers``."""
    t0 = time.perf_counter()
    built, failed = 0, []
    k = max(1, min(int(chunks), len(graph.nodes)))
    targets = list(dict.fromkeys(targets))
    workers = max(1, min(int(workers), len(targets)))
    if k >= 2 and len(targets) >= 2:
        try:
            masks = masks_of(chunk_bounds(graph, k, slice_cuts(builder, targets)))
            if workers > 1:  # the extractions hold the interpreter: once each, first
                for m in [*masks, *([graph.all_mask] if wholes else [])]:
                    builder.model_bytes(m)
        except Exception as e:
            return {"built": 0, "failed": [f"bounds: {type(e).__name__}: {str(e)[:160]}"],
                    "seconds": time.perf_counter() - t0, "workers": workers}

        def one(t: Target) -> tuple[int, list[str]]:
            layouts = [[Part(m, t) for m in masks]]
            if wholes:
                layouts.append([Part(graph.all_mask, t)])
            ok, bad = 0, []
            for parts in layouts:
                try:
                    builder.executor(parts, sliced=True)
                    ok += 1
                except Exception as e:
                    bad.append(f"{t.id}: {type(e).__name__}: {str(e)[:160]}")
            return ok, bad
        if workers > 1:
            with ThreadPoolExecutor(workers, thread_name_prefix="probe-build") as pool:
                done = list(pool.map(one, targets))
        else:
            done = [one(t) for t in targets]
        for ok, bad in done:
            built += ok
            failed += bad
    return {"built": built, "failed": failed, "seconds": time.perf_counter() - t0,
            "workers": workers}


def measure_cut_costs(graph: DataflowGraph, targets: Sequence[Target], *, chunks: int = 6,
                      rounds: int = 5, runs_per_round: int = 4, builder: Any = None,
                      time_budget_s: float = 120.0, wholes: bool = False) -> CutCosts:
    """Measure each target's cut cost for ``graph`` (module docstring). Never raises for a
    chain that cannot be built or run: it is skipped and named in ``skipped``. With
    ``wholes``, each target's whole model (one partition) runs in the same rounds too,
    ``same_cuts`` says what one cut between two partitions of a target costs:
    (all-target chain - whole model) / (chunks - 1), floored at 0, and each chain runs as
    many times per round as fill `WHOLES_MIN_ROUND_S` (at least once) instead of
    ``runs_per_round`` (module docstring, step 3)."""
    t0 = time.perf_counter()
    k = max(1, min(int(chunks), len(graph.nodes)))
    targets = list(dict.fromkeys(targets))
    if k < 2 or len(targets) < 2:
        return CutCosts({t.id: 0.0 for t in targets}, k, 0)
    builder = builder or PlanBuilder(graph, threads=1)
    bounds = chunk_bounds(graph, k, slice_cuts(builder, targets))
    masks = masks_of(bounds)
    steps = {"cuts_s": time.perf_counter() - t0}
    layouts: dict[str, list[Target]] = {t.id: [t] * len(masks) for t in targets}
    if wholes:
        layouts.update({f"{t.id}@whole": [t] for t in targets})
    for a in targets:
        for b in targets:
            if a.id != b.id:
                layouts[f"{a.id}/{b.id}"] = [a if j % 2 == 0 else b for j in range(len(masks))]
    chains, runs, skipped = _ready_chains(builder, masks, layouts, wholes, runs_per_round,
                                          steps)
    t1 = time.perf_counter()
    ids = {label: [rt.id for rt in ex.partitions] for label, ex in chains.items()}
    samples: dict[str, dict[str, list[float]]] = {k: {} for k in chains}
    totals: dict[str, list[float]] = {k: [] for k in chains}
    done = 0
    for _ in range(max(1, rounds)):
        for label, ex in chains.items():
            tot, per = ex.measure_in_chain(runs[label])
            totals[label] += tot
            for pid, xs in per.items():
                samples[label].setdefault(pid, []).extend(xs)
        done += 1
        if time.perf_counter() - t0 > time_budget_s:
            break
    steps["rounds_s"] = time.perf_counter() - t1
    # median seconds of chunk j inside each chain, by position
    med = {label: [statistics.median(samples[label][pid]) for pid in ids[label]]
           for label in chains}
    nbytes = tuple(entering_bytes(SubGraph(graph, m)) for m in masks)
    extra = _mixed_points(layouts, med, nbytes, targets)
    cuts = {t: max(0.0, statistics.median(x for _, x in xs)) if xs else 0.0
            for t, xs in extra.items()}
    charges = {t: fit_cut_charge(xs) for t, xs in extra.items() if xs}
    chain_s = {label: statistics.median(xs) for label, xs in totals.items() if xs}
    same = {t.id: max(0.0, (chain_s[t.id] - chain_s[f"{t.id}@whole"]) / (len(masks) - 1))
            for t in targets if t.id in chain_s and f"{t.id}@whole" in chain_s}
    wholes_s = {t.id: chain_s[f"{t.id}@whole"] for t in targets if f"{t.id}@whole" in chain_s}
    out = CutCosts(cuts, len(masks), done, tuple(skipped), chain_s, time.perf_counter() - t0,
                   same_cuts=same, wholes_s=wholes_s, runs=runs, charges=charges,
                   chunk_bytes=nbytes, chunk_s=med,
                   steps_s={k: round(v, 3) for k, v in steps.items()}, bounds=tuple(bounds))
    log.info("cut costs for %s: %s (%d chunks, %d rounds, %.1f s)", graph.name,
             {k: f"{c.fixed_s * 1e6:.0f} us + {c.per_byte_s * 1e9:.2f} us/KB"
              for k, c in charges.items()}, len(masks), done, out.wall_s)
    return out


def _ready_chains(builder: PlanBuilder, masks: Sequence[int],
                  layouts: dict[str, list[Target]], wholes: bool, runs_per_round: int,
                  steps: dict[str, float]
                  ) -> tuple[dict[str, Any], dict[str, int], list[str]]:
    """Each chain of ``layouts`` built (its chunks, or the whole model for a one-target
    layout), warmed and proved to run (module docstring, step 3): (chain label -> executor,
    chain label -> runs per round, skipped chains with why). Adds the seconds spent building
    (``build_s``) and warming (``warm_s``) to ``steps``."""
    chains: dict[str, Any] = {}
    runs: dict[str, int] = {}
    skipped: list[str] = []
    whole = builder.graph.all_mask
    for label, ts in layouts.items():
        if "/" in label and not all(t.id in chains for t in ts):
            skipped.append(f"{label}: a single-target chain failed")
            continue
        t0 = time.perf_counter()
        try:
            parts = [Part(m, t) for m, t in zip(masks, ts)] if len(ts) == len(masks) \
                else [Part(whole, ts[0])]
            ex = builder.executor(parts, sliced=True)
            t1 = time.perf_counter()
            steps["build_s"] = steps.get("build_s", 0.0) + t1 - t0
            first, _ = ex.measure_in_chain(1, warmup=1)  # binds, warms, proves it runs
            if wholes and first[0] < WHOLES_MIN_ROUND_S:  # it sizes the rounds: warm it more
                first, _ = ex.measure_in_chain(1)
            steps["warm_s"] = steps.get("warm_s", 0.0) + time.perf_counter() - t1
            chains[label] = ex
            runs[label] = (runs_to_fill(WHOLES_MIN_ROUND_S, first[0]) if wholes
                           else runs_per_round)
        except Exception as e:  # an op a target cannot run in some chunk, a build error
            skipped.append(f"{label}: {type(e).__name__}: {str(e)[:160]}")
    return chains, runs, skipped


def _mixed_points(layouts: dict[str, list[Target]], med: dict[str, list[float]],
                  nbytes: Sequence[int], targets: Sequence[Target]
                  ) -> dict[str, list[tuple[int, float]]]:
    """Per target, ``(bytes entering the chunk, its median in the mixed chain - in the
    all-target chain)`` for every chunk of every mixed chain that ran (module docstring,
    steps 4 and 5)."""
    extra: dict[str, list[tuple[int, float]]] = {t.id: [] for t in targets}
    for label, ts in layouts.items():
        if "/" not in label or label not in med or len(ts) != len(nbytes):
            continue  # single-target chains are the reference; skipped chains have nothing
        for j in range(1, len(nbytes)):  # chunk j entered from chunk j-1's other toolchain
            extra[ts[j].id].append((nbytes[j], med[label][j] - med[ts[j].id][j]))
    return extra


def cut_fingerprint(graph: DataflowGraph, chunks: int, wholes: bool = False) -> str:
    """The cost-table fingerprint of a model's cut costs (structure, weights' shapes, chunks);
    a probe ``wholes`` (`measure_cut_costs`) has rows of its own, ending ``:w``."""
    whole = SubGraph(graph, graph.all_mask)
    fp = f"{CUT_PREFIX}{whole.structural_hash[:24]}:{max(1, min(chunks, len(graph.nodes)))}"
    return fp + ":w" if wholes else fp


def cached_cut_costs(table: CostTable | None, graph: DataflowGraph, targets: Sequence[Target],
                     *, writer: CostTableWriter | None = None, chunks: int = 6,
                     measure: bool = True, campaign_id: str = "", wholes: bool = False,
                     **probe: Any) -> CutCosts | None:
    """This model's cut costs from ``table`` (this host's rows; None: no table to read), else
    measured (``measure``) and appended to ``writer`` (None: not written); None when neither.
    ``wholes``: with same-target cut costs (`measure_cut_costs`; rows of their own, the
    same-target cost in each row's details as ``same_cut_s``). Each row's details carry the
    target's charge by bytes (``cut_fixed_s``, ``cut_per_byte_s``, ``cut_cap_s``), its
    all-target chain's per-chunk medians (``chunk_s``) and each chunk's entering bytes
    (``chunk_bytes``); a row without them (written before the fit) reads back as its constant
    only. ``probe``: `measure_cut_costs` options.
    """
    targets = list(dict.fromkeys(targets))
    fp = cut_fingerprint(graph, chunks, wholes)
    host = DeviceDescription.host_cpu()
    if table is not None:
        hits = table.lookup([(fp, t.measure_key) for t in targets], device=host.describe(),
                            strictness="device")
        if all((fp, t.measure_key) in hits and hits[fp, t.measure_key].ok for t in targets):
            return CutCosts.from_rows(
                {t.id: hits[fp, t.measure_key].seconds for t in targets},
                {t.id: hits[fp, t.measure_key].details_dict() for t in targets},
                max(1, min(chunks, len(graph.nodes))))
    if not measure:
        return None
    cc = measure_cut_costs(graph, targets, chunks=chunks, wholes=wholes, **probe)
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
                            details=cc.row_details(t.id))
        writer.append(row_from_result(res, campaign_id=campaign_id, model=graph.name,
                                      nodes=[], op_types=["cut"]))
    return cc

