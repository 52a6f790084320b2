"""Each target's in-network operator profile of a model: from the cost table, else profiled now.

A profile run (`runners.profile`) is a farm measurement of the whole model whose
`runners.base.MeasureConfig` mode is ``profile``: the runner's worker times the whole model
unprofiled, then reads the toolchain's own per-operator profile (or, where that fails or is not
trusted, prefix differences of the same toolchain, whose ``rejected`` says why, shown in the
outcome's JSON), and the result is one row of
kind ``profiled`` in the cost table, fingerprint ``profile:<whole-model structural hash>``, the
`runners.profile.OperatorProfile` as JSON in its details. A later campaign on the same model and
machine reads the row back instead of profiling again (so a re-run profiles nothing and
searches the same costs); an offline campaign reads it under its strictness.

A toolchain with no per-operator timer of its own (LiteRT: its profile would be prefix
differences) need not be profiled at all where the campaign's cut-cost probe timed its
one-toolchain chain on the runners' device: each chunk of that chain, timed inside the running
chain, is a segment of the whole model (`profile_from_chain`, method ``probe-chain``); the
campaign hands such profiles in as ``given`` and no request goes out for them. They are not
written as profile rows: the probe's own rows carry the chunks and their times, so a re-run or
an offline search reads the same profile back from them.

A campaign whose process times on the device the target's runner measures on (an embedded
local Ray, or a coordinator of the runners' instance type) profiles that target in its own
process instead (``here``: the whole-model session its cut-cost probe built, timed
unprofiled between the profiled runs exactly as a worker would time its own): the same
measurement, recorded as the same row with the runner's device and toolchain version, without
sending the whole model to a worker (gpt2-2L's is 348 MB) nor compiling it there a second
time (ORT 3.0 s, OpenVINO 2.4 s of gpt2-2L's 14.9 and 9.0 s requests, besides ~5 s of
transfer and start-up). The profiler still compiles its own profiling session.

Simulated toolchains (Vela, the Cortex-M cycle model) are not profiled here: their figures
are deterministic and their per-operator cycles are already in each row; an Ethos-U board's
profile is a few ordinary builds of Vela's own split (`collage_farm.probes.board_profiles`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from collage_farm.core.graph import DataflowGraph
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import Target
from collage_farm.costtable import CostRow, CostTable
from collage_farm.execute import SIMULATED_TOOLCHAINS
from estimators.sources import CostStore, MeasurementService, Strictness
from runners.base import (
    BuildInput,
    BuildResult,
    Kind,
    MeasureConfig,
    MeasureInput,
    MeasureRequest,
    MeasureResult,
    Status,
)
from runners.profile import (
    PROFILE_DETAIL,
    PROFILE_PREFIX,
    PROFILE_STEPS,
    OperatorProfile,
    PrefixProfiler,
    ProfileMethod,
    profile_config,
    profile_measure,
)
from runners.registry import get_toolchain

log = logging.getLogger(__name__)

__all__ = ["ProfileOutcome", "collect_profiles", "prefix_profiled", "profile_fingerprint",
           "profile_from_chain", "table_has_profiles"]


@dataclass(frozen=True)
class ProfileOutcome:
    """One target's profile of the model, or why there is none (``error``, one line).

    ``cached``: read from the cost table; ``ran``: profiled now (``here``: in the campaign's
    own process, not sent to the farm);
    ``steps_s``: where the worker's seconds went (`runners.profile.PROFILE_STEPS`, plus
    ``build_s``, the whole model's build) and ``wall_s``, the request's wall time on the farm
    as the campaign saw it (transfers and queueing included); empty / 0 when not profiled now.
    """

    target: str
    profile: OperatorProfile | None = None
    error: str = ""
    cached: bool = False
    ran: bool = False
    steps_s: Mapping[str, float] = field(default_factory=dict)
    wall_s: float = 0.0
    here: bool = False

    def to_json(self) -> dict:
        p = self.profile
        return {"method": p.method.value if p else None, "ratio": p.ratio if p else None,
                "whole_s": p.whole_s if p else None, "groups": len(p.groups) if p else 0,
                "cached": self.cached, "error": self.error or None,
                "rejected": (p.rejected or None) if p else None,
                **({"steps_s": dict(self.steps_s), "wall_s": round(self.wall_s, 3),
                    "where": "campaign process" if self.here else "farm"}
                   if self.ran else {})}


def profile_fingerprint(graph: DataflowGraph) -> str:
    """The cost-table fingerprint of a model's profile rows (structure and weights' shapes)."""
    return f"{PROFILE_PREFIX}{SubGraph(graph, graph.all_mask).structural_hash[:24]}"


def table_has_profiles(table: CostTable, graph: DataflowGraph) -> bool:
    """Whether ``table`` holds a profile row of ``graph`` (any target, any status)."""
    if not table.path.is_dir():
        return False
    fp = profile_fingerprint(graph)
    return table.read(filters={"fingerprint": fp}, columns=["fingerprint"]).num_rows > 0


def prefix_profiled(target: Target) -> bool:
    """Whether ``target``'s toolchain has no per-operator timer of its own: its profile request
    would time prefixes (`runners.profile.PrefixProfiler`)."""
    return isinstance(get_toolchain(target.toolchain).profiler(), PrefixProfiler)


def profile_from_chain(graph: DataflowGraph, cut_info: Mapping | None, target_id: str
                       ) -> OperatorProfile | None:
    """Target ``target_id``'s profile read off the cut-cost probe (``cut_info``: the probe's
    JSON, `collage_farm.probes.cutcost.CutCosts.to_json`, measured now or read back): one
    group per chunk of the target's one-toolchain chain (its nodes, ``chunk_bounds`` in the
    graph's node order; its median seconds inside the running chain, ``chunk_s``, less one
    same-toolchain cut, ``same_cuts_s``, for every chunk another chunk feeds, floored at 0:
    what entering it costs is the cut's, charged apart), the whole model's time from the same
    rounds (``wholes_s``) as ``whole_s``. None when the probe has no such chain for the target
    (not run, skipped, rows of an older version, another graph). On a model of tens of
    microseconds the chunks' own times are within the noise of their cuts' and the profile
    fails `OperatorProfile.problem`; the caller profiles such a target by request instead."""
    info = cut_info or {}
    bounds = [int(b) for b in info.get("chunk_bounds") or ()]
    chunk_s = (info.get("chunk_s") or {}).get(target_id)
    whole = float((info.get("wholes_s") or {}).get(target_id) or 0.0)
    cut = max(0.0, float((info.get("same_cuts_s") or {}).get(target_id) or 0.0))
    if (not chunk_s or len(bounds) != len(chunk_s) + 1 or not whole > 0
            or bounds[0] != 0 or bounds[-1] != len(graph.nodes)
            or any(b <= a for a, b in itertools.pairwise(bounds))):
        return None
    names = [n.name for n in graph.nodes]
    groups = tuple((tuple(names[a:b]), max(0.0, float(s) - (cut if j else 0.0)))
                   for j, ((a, b), s) in enumerate(zip(itertools.pairwise(bounds), chunk_s)))
    return OperatorProfile(ProfileMethod.CHAIN, groups, runs=int(info.get("rounds") or 0),
                           whole_s=whole, kernels=len(groups),
                           notes="chunks of the cut-cost probe's one-toolchain chain")


def _from_row(target: Target, row: CostRow) -> ProfileOutcome:
    if not row.ok:
        return ProfileOutcome(target.id, error=f"profile run {row.status}: "
                              f"{' '.join(str(row.error).split())[:200]}", cached=True)
    try:
        prof = OperatorProfile.from_json(row.details_dict()[PROFILE_DETAIL])
    except (KeyError, ValueError, TypeError) as e:
        return ProfileOutcome(target.id, error=f"unreadable profile row ({type(e).__name__})",
                              cached=True)
    return ProfileOutcome(target.id, prof, cached=True)


def _lookup(table: CostTable, fp: str, targets: Sequence[Target],
            farm: MeasurementService | None, strictness: Strictness
            ) -> dict[str, ProfileOutcome]:
    devices: dict[str, str] = {}
    versions: dict[str, str] = {}
    for t in targets:
        got = farm.describe(t) if farm is not None else None
        if got is not None:
            if got[0] is not None:
                devices[t.measure_key] = got[0].describe()
            if got[1]:
                versions[t.measure_key] = got[1]
    hits = table.lookup([(fp, t.measure_key) for t in targets], devices or None,
                        versions or None, strictness)
    return {t.id: _from_row(t, hits[fp, t.measure_key]) for t in targets
            if (fp, t.measure_key) in hits}


def _steps(res: MeasureResult) -> dict[str, float]:
    """The worker's step times of a profile result (`PROFILE_STEPS`), its build's and its
    whole measurement's seconds."""
    try:
        steps = {k: float(v) for k, v in json.loads(
            str(dict(res.details).get(PROFILE_STEPS, "{}"))).items()}
    except (ValueError, TypeError, AttributeError):
        steps = {}
    return {**steps, "build_s": round(res.build_s, 4), "measure_s": round(res.measure_s, 4)}


def _profile_here(t: Target, fp: str, data: bytes,
                  timer: Callable[[MeasureConfig], list[float]], farm: MeasurementService
                  ) -> MeasureResult:
    """``t``'s profile of the whole model ``data`` taken in this process, its unprofiled
    rounds timed by ``timer``; the result carries the device and toolchain version of the
    runner that serves ``t`` (this process times on that device), so that a re-run on the
    table finds the row as it would the runner's. Never raises: a failure is a failed
    result."""
    tc = get_toolchain(t.toolchain)
    build = BuildResult(fp, t, Status.OK, data, "onnx", build_s=0.0)
    config = profile_config()
    try:
        res = profile_measure(tc, MeasureInput(build, config), data, timer=timer)
    except Exception as e:  # profile_measure turns a profiler's failure into data already
        res = MeasureResult.failed(build, Status.RUNTIME_ERROR,
                                   f"{type(e).__name__}: {e}"[:4000], config,
                                   kind=Kind.PROFILED)
    described = farm.describe(t)
    device, version = described if described is not None else (None, "")
    return dataclasses.replace(res, device=device or tc.device_description(t),
                               toolchain_version=version or tc.version())


def collect_profiles(graph: DataflowGraph, targets: Sequence[Target], *,
                     table: CostTable | None, farm: MeasurementService | None = None,
                     store: CostStore | None = None,
                     strictness: Strictness = Strictness.EXACT,
                     whole_model: Callable[[], bytes] | None = None,
                     given: Mapping[str, OperatorProfile] | None = None,
                     here: Mapping[str, Callable[[MeasureConfig], list[float]]] | None = None
                     ) -> dict[str, ProfileOutcome]:
    """Every live target's profile of ``graph`` (module docstring), by target id.

    Rows of ``table`` answer first (the device and toolchain version ``farm`` reports, under
    ``strictness``); then ``given`` (target id -> a profile the campaign already has:
    `profile_from_chain`); the rest are profiled on ``farm`` and recorded in ``store``, when
    both are given, else they have none. Never raises for a profile run that fails: its outcome
    carries the runner's error. ``whole_model`` gives the whole model as ONNX bytes when a
    profile request needs it (a campaign's plan builder has it extracted already; default:
    extracted here). ``here``: target id -> the whole model's unprofiled timer in this
    process (a `runners.base.Toolchain.timer` contract), for targets this process times on
    their runner's device: those are profiled here (module docstring), the rest on ``farm``.
    """
    live = [t for t in dict.fromkeys(targets) if t.toolchain not in SIMULATED_TOOLCHAINS]
    fp = profile_fingerprint(graph)
    out: dict[str, ProfileOutcome] = {}
    if table is not None and table.path.is_dir():
        out.update(_lookup(table, fp, live, farm, strictness))
    for t in live:
        if t.id not in out and (given or {}).get(t.id) is not None:
            out[t.id] = ProfileOutcome(t.id, (given or {})[t.id])
    todo = [t for t in live if t.id not in out]
    if not todo or farm is None or store is None:
        for t in todo:
            out[t.id] = ProfileOutcome(t.id, error="no profile row in the cost table")
        return out
    data = whole_model() if whole_model is not None else SubGraph(
        graph, graph.all_mask).extract(f"{graph.name}_whole").SerializeToString()

    def take(t: Target, res: MeasureResult, wall: float, local: bool) -> None:
        store.record(res, model=graph.name, nodes=(), op_types=("profile",))
        steps = _steps(res)
        if res.status is not Status.OK:
            out[t.id] = ProfileOutcome(t.id, error=f"profile run {res.status.value}: "
                                       f"{' '.join(res.error.split())[:200]}", ran=True,
                                       steps_s=steps, wall_s=wall, here=local)
            return
        prof = OperatorProfile.from_json(dict(res.details)[PROFILE_DETAIL])
        out[t.id] = ProfileOutcome(t.id, prof, ran=True, steps_s=steps, wall_s=wall,
                                   here=local)

    for t in [t for t in todo if (here or {}).get(t.id) is not None]:
        t0 = time.perf_counter()
        take(t, _profile_here(t, fp, data, (here or {})[t.id], farm),
             time.perf_counter() - t0, True)
    sent = [t for t in todo if t.id not in out]
    reqs = [MeasureRequest(BuildInput(fp, t, data, (), f"{graph.name}:profile:{t.id}"),
                           profile_config()) for t in sent]
    by_key: Mapping[str, Target] = {t.measure_key: t for t in sent}
    last = time.perf_counter()
    for res in farm.measure(reqs) if reqs else ():
        now = time.perf_counter()
        wall, last = now - last, now  # one runner serves them in turn: time since the last
        t = by_key.get(res.target.measure_key)
        if t is not None:
            take(t, res, wall, False)
    for t in todo:
        out.setdefault(t.id, ProfileOutcome(t.id, error="the farm returned no profile",
                                            ran=True))
    store.flush()
    log.info("profiles of %s: %s", graph.name,
             {k: (f"{v.profile.ratio:.2f}" if v.profile else v.error) for k, v in out.items()})
    return out
