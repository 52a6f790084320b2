"""Never worse: plans against every single toolchain's whole model, in interleaved runs.

`verify` checks the final candidate plans (the Dijkstra plan, the refined plan) and every
searched target's whole model numerically against the model, then times them all interleaved
in one run (A B C, B C A, ...), so each plan can be compared with each whole model round by
round (`collage_farm.postsearch.noise.paired`). The caller keeps a mix only when it beats the
best single toolchain beyond noise.

The run stops before its last round once the decision is clear (`decision_is_clear`, from
``min_rounds`` rounds on): every plan either cannot beat the best single toolchain beyond the
noise floor (the 95% interval of its per-round ratio lies above ``1 - NOISE_FLOOR``) or beats
it with the whole interval below 1, and the best single is told apart from each other single
(interval below 1) or the same as it within the floor. ``rounds`` stays the upper limit.

A mix that looks faster than the noise floor but not beyond one run's noise is worth more
evidence (`should_extend`): `extend` times more rounds of just the mix and the best single
and pools the pairs of both runs. A mix that wins must win again in a `second_run`: on a
shared VM one run's win can be drift.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

# the module, not its function: measure_interleaved_rounds is looked up at call time, so tests
# can script the timings
from collage_farm import execute
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.pins import PinSet
from collage_farm.core.target import Target
from collage_farm.execute import SIMULATED_TOOLCHAINS
from collage_farm.execute.builder import Part, PlanBuilder
from collage_farm.execute.interleaved import plan_round_config
from collage_farm.postsearch.moves import order_parts, plan_signature
from collage_farm.postsearch.noise import NOISE_FLOOR, Paired, paired
from runners.base import MeasureConfig, Summary

__all__ = ["VerifyResult", "decision_is_clear", "extend", "mix_run", "second_run",
           "should_extend", "verify"]


@dataclass(frozen=True)
class VerifyResult:
    """Plans and single-toolchain whole models, checked and timed in one interleaved run."""

    summaries: dict[str, Summary]  # name -> summary (plans by name, singles by target id)
    errors: dict[str, str]  # name -> why it could not be checked or run
    singles: tuple[str, ...]  # the names that are single-target whole models
    rounds: int
    check_errors: dict[str, dict[str, float]] = field(default_factory=dict)
    round_medians: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # single -> why it may not be the output plan (pins keep a node off its target); such a
    # whole model is still timed, for information, but never chosen as the fallback
    ineligible: dict[str, str] = field(default_factory=dict)

    def median(self, name: str) -> float | None:
        s = self.summaries.get(name)
        return s.median if s is not None else None

    @property
    def best_single(self) -> str | None:
        """The fastest single-target whole model that ran and that the pins allow."""
        ok = [n for n in self.singles if n in self.summaries and n not in self.ineligible]
        return min(ok, key=lambda n: self.summaries[n].median) if ok else None

    def compare(self, a: str, b: str) -> Paired:
        """``a`` against ``b``, round by round (`paired`)."""
        return paired(self.summaries[a], self.summaries[b], self.round_medians.get(a, ()),
                      self.round_medians.get(b, ()), self.rounds)

    def beats(self, name: str, other: str) -> bool:
        """``name`` faster than ``other`` beyond noise."""
        return self.compare(name, other).a_faster

    def threshold(self, a: str, b: str) -> float:
        return self.compare(a, b).threshold


def decision_is_clear(round_medians: Mapping[str, Sequence[float]], plans: Sequence[str],
                      singles: Sequence[str], min_rounds: int) -> bool:
    """Whether more interleaved rounds would not change what the never-worse check keeps.

    ``round_medians``: each name's round medians so far (round ``i`` of all from one turn);
    ``plans``: the mixes; ``singles``: the whole models that may be the fallback. Clear from
    ``min_rounds`` (at least 3) paired rounds on when the best single so far (lowest median of
    round medians) is told apart from each other single (95% interval of the paired ratio below
    1) or the same within the floor (interval inside ``1 -/+ NOISE_FLOOR``), and each plan
    either cannot beat it beyond the floor (interval above ``1 - NOISE_FLOOR``) or beats it
    beyond noise with the whole interval below 1. False while anything is open, or with no
    single to compare with.
    """
    n = min((len(v) for v in round_medians.values()), default=0)
    ok = [s for s in singles if round_medians.get(s)]
    if n < max(3, min_rounds) or not ok:
        return False

    def cmp(a: str, b: str) -> Paired:
        ra, rb = round_medians[a], round_medians[b]
        return paired(Summary.of(ra, ra), Summary.of(rb, rb), ra, rb, n)

    best = min(ok, key=lambda s: float(np.median(round_medians[s])))
    for s in ok:
        if s == best:
            continue
        c = cmp(best, s)
        if not (c.high < 1.0 or (c.low > 1.0 - NOISE_FLOOR and c.high < 1.0 + NOISE_FLOOR)):
            return False
    for p in plans:
        if not round_medians.get(p):
            continue
        c = cmp(p, best)
        if not (c.low > 1.0 - NOISE_FLOOR or (c.a_faster and c.high < 1.0)):
            return False
    return True


def verify(graph: DataflowGraph, plans: Mapping[str, Sequence[Part]],
           targets: Sequence[Target], *, config: MeasureConfig | None = None,
           threads: int = 1, builder: PlanBuilder | None = None,
           pins: PinSet | None = None, min_rounds: int = 0) -> VerifyResult:
    """Check every plan and every target's whole model, then time them all interleaved.

    Plans identical to another entry are timed once (aliases share the summary). A plan or
    whole model that fails to build, run or match the reference is left out with its error.
    A whole model that ``pins`` (a `collage_farm.core.pins.PinSet`) forbid is timed but marked
    `VerifyResult.ineligible`, so it is never `best_single`: the never-worse fallback must
    still honour the user's pins. ``min_rounds`` > 0: stop before ``config.rounds`` once
    `decision_is_clear` (from that many rounds on); `VerifyResult.rounds` is what ran.
    """
    config = config or plan_round_config(7)
    builder = builder or PlanBuilder(graph, threads=threads)
    entries: dict[str, tuple[Part, ...]] = {k: tuple(v) for k, v in plans.items()}
    singles = []
    ineligible: dict[str, str] = {}
    for t in targets:
        if t.toolchain in SIMULATED_TOOLCHAINS:
            continue
        entries[t.id] = (Part(graph.all_mask, t),)
        singles.append(t.id)
        if pins:
            banned = next((n.name for n in graph.nodes if not pins.allowed(n, t)), None)
            if banned is not None:
                ineligible[t.id] = f"pins keep {banned} off {t.id}"
    fns: dict[str, Callable[[], None]] = {}
    errors: dict[str, str] = {}
    checks: dict[str, dict[str, float]] = {}
    alias: dict[str, str] = {}
    by_sig: dict[frozenset, str] = {}
    for name, parts in entries.items():
        sig = plan_signature(parts)
        if sig in by_sig:
            alias[name] = by_sig[sig]
            continue
        by_sig[sig] = name
        try:
            ordered = order_parts(graph, parts)
            if ordered is None:
                raise ValueError("partitions depend on each other in a cycle")
            ex = builder.executor(ordered)
            checks[name] = builder.check(ex)
            fns[name] = ex.timed_callable(builder.feeds(ex))
        except Exception as e:
            errors[name] = f"{type(e).__name__}: {str(e)[:300]}"
    run = _timed_run(fns, config, singles, ineligible, min_rounds) if fns else None
    done = min((len(r) for r in run.rounds.values()), default=0) if run else 0
    summaries = dict(run.summaries) if run else {}
    per_round = dict(run.rounds) if run else {}
    for name, src in alias.items():
        if src in summaries:
            summaries[name] = summaries[src]
            per_round[name] = per_round.get(src, ())
            checks[name] = checks.get(src, {})
        elif src in errors:
            errors[name] = errors[src]
    return VerifyResult(summaries, errors, tuple(singles), max(1, done or config.rounds),
                        checks, per_round, ineligible)


def _timed_run(fns: Mapping[str, Callable[[], None]], config: MeasureConfig,
               singles: Sequence[str], ineligible: Mapping[str, str], min_rounds: int
               ) -> execute.Interleaved:
    """The interleaved run of `verify`, stopped once `decision_is_clear` when ``min_rounds``
    > 0 (the stop rule is passed only then: tests script the two-argument form)."""
    if min_rounds <= 0:
        return execute.measure_interleaved_rounds(fns, config)
    mixes = [k for k in fns if k not in singles]
    eligible = [k for k in singles if k in fns and k not in ineligible]

    def stop(meds: Mapping[str, Sequence[float]]) -> bool:
        return decision_is_clear(meds, mixes, eligible, min_rounds)
    return execute.measure_interleaved_rounds(fns, config, stop)


def should_extend(cmp: Paired, whole: bool, extend_rounds: int) -> bool:
    """A mix is worth more rounds when it looks faster than the floor but not beyond noise."""
    return (extend_rounds > 0 and not whole and not cmp.a_faster and cmp.pairs > 0
            and cmp.ratio < 1.0 - NOISE_FLOOR)


def mix_run(graph: DataflowGraph, parts: Sequence[Part], targets: Sequence[Target],
            best: str, rounds: int, builder: PlanBuilder) -> VerifyResult | None:
    """One interleaved run of the mix (as ``"mix"``) and the best single toolchain's whole
    model, or None when either fails to run in it."""
    t = [x for x in targets if x.id == best]
    v = verify(graph, {"mix": parts}, t, config=plan_round_config(rounds), builder=builder)
    return v if "mix" in v.summaries and best in v.summaries else None


def extend(graph: DataflowGraph, parts: Sequence[Part], targets: Sequence[Target], best: str,
           rounds: int, builder: PlanBuilder, first: VerifyResult, mix: str) -> Paired | None:
    """More evidence for an undecided mix: ``rounds`` more interleaved rounds of the mix and
    the best single, paired round by round and pooled with the first run's pairs (each pair
    comes from one turn of one rotation, so pooling two runs keeps every pair clean). None
    when either fails to run, or the first run has no round medians to pool with."""
    a0, b0 = first.round_medians.get(mix, ()), first.round_medians.get(best, ())
    if not a0 or not b0:
        return None
    v = mix_run(graph, parts, targets, best, rounds, builder)
    if v is None:
        return None
    return paired(v.summaries["mix"], v.summaries[best],
                  (*a0, *v.round_medians.get("mix", ())), (*b0, *v.round_medians.get(best, ())),
                  len(a0) + v.rounds)


def second_run(graph: DataflowGraph, parts: Sequence[Part], targets: Sequence[Target],
               best: str, rounds: int, builder: PlanBuilder) -> Paired | None:
    """The mix against the best single toolchain in a second interleaved run (`Paired`, mix
    first), or None when either fails to run in it."""
    v = mix_run(graph, parts, targets, best, rounds, builder)
    return v.compare("mix", best) if v is not None else None
