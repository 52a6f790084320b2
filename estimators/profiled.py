"""ProfiledEstimator: candidate costs from each target's in-network operator profile.

A campaign in ``profile`` measure mode runs each target's whole model once with the toolchain's
own per-operator profiler (`runners.profile`) instead of timing every candidate partition in
isolation. A candidate's cost on a profiled target is then:

* what its nodes cost inside the whole model: the profile's per-node seconds (a fused group's
  or a segment's time split over its nodes by their work, `node_weights`), scaled so that the
  whole model's nodes add up to the *unprofiled* whole-model time (profiling adds a few
  percent, and time the profiler attributes to no node is spread over the nodes in
  proportion): in a campaign, the whole model as the cut-cost probe timed it, every target
  interleaved in one run with the executor plans run in (`collage_farm.probes.cutcost`), so
  targets profiled minutes apart on a drifting machine share one time base; else the profile
  run's own;
* plus, when the candidate is fed by another partition (it reads a tensor that is not a graph
  input), the target's measured same-toolchain cut cost (``cut_s``: what cutting the model
  into partitions of this toolchain costs per cut; the transition model adds what entering
  from *another* toolchain costs on top).

A candidate priced *in chain* (`price_in_chain`: its partition timed inside a running plan the
search chose, `collage_farm.postsearch.inchain`) answers that price instead, before anything
else. From those prices the estimator learns, per target, what leaving a partition costs
beyond the profile (`exit_charges`: the median of price - profile answer over the priced
partitions that feed another partition, floored at 0) and charges it to every
profile-answered candidate of that target that feeds another partition; cutting one
toolchain's model in two then pays it on top of the measured same-toolchain cut cost, a bias
against splits the never-worse check would reject anyway.

A candidate is **uncertain** when it splits a group the toolchain fused in the profile (its
cost inside the group is a guess: by default it pays the whole group, `SplitPricing`) or holds
a node the profile does not account for (folded or eliminated, so 0 s in the whole model, but
not alone). Uncertain candidates are answered with
their profile estimate too (flagged: `uncertain`); `measure_isolated` can measure them in
isolation (`collage_farm.postsearch.screen`), and from then on they answer the isolated
measurement. A campaign does not by default: an isolated cost (its own session, caches evicted)
is on another scale than a share of an in-network run, and one search that adds both misprices
every mixed plan (measured: a Dijkstra estimate 229% off its plan on resnet18-64). The plan is
checked end to end by the campaign's refine and never-worse steps instead.

A profile is the toolchain's own per-operator profile, or, where that failed or was not
trusted on the worker (`runners.profile.profile_measure`), prefix differences at thin cuts of
the same toolchain (``rejected`` says why; the campaign prints it as one warning line).
Targets without a usable profile (no profiler, a failed profile run, or a profile rejected by
`TargetProfile.of`: `runners.profile.OperatorProfile.problem` under ``tolerance``) are
answered by the ``isolated`` estimator for
every candidate: today's isolated measurement (`estimators.measured.FarmEstimator`), or, offline,
the cost table (`estimators.table.TableEstimator`).

The campaign's confirmation step (`collage_farm.postsearch.confirm`) corrects the winner's curse
of the search picking the cheapest of thousands of independent noisy isolated measurements. A
profile estimate is not one of those: every candidate's share comes from the same in-network
run, so the step has nothing to correct there, and an isolated re-measurement would put the
path on another scale than its alternatives. Profile-answered candidates therefore count as
confirmed (`is_confirmed`), and the step re-measures only candidates answered by isolated
measurements (targets without a usable profile). A candidate re-measured anyway
(`remeasure`) answers its isolated cost from then on, and, in later campaigns on the same
table (a re-run, an offline search), from the start (`CostEstimator.stored_confirmations`).
"""

from __future__ import annotations

import enum
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.subgraph import SubGraph
from estimators.analytic import node_flops
from estimators.base import CostEstimator, EstimatorStats
from runners.profile import DEFAULT_TOLERANCE, OperatorProfile

__all__ = ["DEFAULT_TOLERANCE", "MeasureStrategy", "ProfileRejected", "ProfiledEstimator",
           "SplitPricing", "TargetProfile", "fed_by_partition", "node_weights"]


class MeasureStrategy(str, enum.Enum):
    """How a campaign gets its candidates' costs (``tune --measure``).

    ``PROFILE``: each target's in-network operator profile (this module), isolated
    measurement only for the uncertain candidates on the best plans and the confirmation step;
    on a simulated Ethos-U board, profile builds of Vela's own split and exact builds of the
    chosen path (`estimators.board_profiled`).
    ``EXHAUSTIVE``: every candidate the search asks for measured in isolation.
    """

    PROFILE = "profile"
    EXHAUSTIVE = "exhaustive"

    @classmethod
    def parse(cls, value: MeasureStrategy | str) -> MeasureStrategy:
        """The member spelled ``value``; ValueError names the spellings."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"--measure must be one of {tuple(m.value for m in cls)}, "
                             f"not {value!r}") from None


class SplitPricing(str, enum.Enum):
    """What a candidate that splits a profiled group (a fused kernel, a prefix segment) pays
    for its part of that group.

    ``WHOLE_GROUP``: the whole group's time, an upper bound (a toolchain that runs part of a
    fused kernel, or of a segment, alone does not get cheaper than the fused whole by much,
    and the split's share is a guess). A search on guessed shares picks the guesses that
    happen to be low (on resnet18-64 its plan was made of split groups only, and ran 38%
    slower than its estimate after drift was taken out), so a guess is never priced below
    what was measured. ``WORK_SHARE``: the nodes' shares by work (`node_weights`).
    """

    WHOLE_GROUP = "whole-group"
    WORK_SHARE = "work-share"


class ProfileRejected(ValueError):
    """A profile that cannot be trusted as costs; the message says why, in one line."""


@dataclass(frozen=True)
class TargetProfile:
    """One target's profile as the estimator uses it: scaled seconds per node, fused groups."""

    node_s: Mapping[str, float]
    group_of: Mapping[str, int]
    group_size: Mapping[int, int]
    scale: float
    whole_s: float
    cut_s: float = 0.0
    method: str = ""
    ratio: float = 1.0
    notes: str = field(default="", compare=False)
    rejected: str = field(default="", compare=False)  # `OperatorProfile.rejected`
    split: SplitPricing = SplitPricing.WHOLE_GROUP
    #: scaled seconds per group (the sum of its nodes' shares)
    group_s: Mapping[int, float] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        total: dict[int, float] = {}
        for n, g in self.group_of.items():
            total[g] = total.get(g, 0.0) + self.node_s.get(n, 0.0)
        object.__setattr__(self, "group_s", total)  # derived once; the dataclass is frozen

    @staticmethod
    def of(profile: OperatorProfile, *, cut_s: float = 0.0,
           tolerance: float = DEFAULT_TOLERANCE,
           weights: Mapping[str, float] | None = None,
           whole_s: float | None = None,
           split: SplitPricing = SplitPricing.WHOLE_GROUP) -> TargetProfile:
        """The estimator's view of ``profile``; `ProfileRejected` when it cannot be trusted
        (`OperatorProfile.problem` under ``tolerance``, against the profile run's own
        unprofiled time). A group's seconds are split over its nodes in proportion to
        ``weights`` (the nodes' work: a fused Conv+Relu's time is mostly the Conv's), evenly
        where no node of the group has a positive weight. The shares add up to ``whole_s``
        when given (the whole model timed on the campaign's time base: the same executor as
        plans, every target interleaved in one run), else to the profile's ``whole_s``."""
        why = profile.problem(tolerance)
        if why:
            raise ProfileRejected(why)
        base = whole_s if whole_s is not None and whole_s > 0 else profile.whole_s
        attributed = sum(s for _, s in profile.groups)
        scale = base / attributed
        node_s: dict[str, float] = {}
        group_of: dict[str, int] = {}
        group_size: dict[int, int] = {}
        for g, (nodes, seconds) in enumerate(profile.groups):
            group_size[g] = len(nodes)
            w = [max(0.0, float((weights or {}).get(n, 0.0))) for n in nodes]
            total_w = sum(w)
            for n, wn in zip(nodes, w):
                share = wn / total_w if total_w > 0 else 1.0 / len(nodes)
                node_s[n] = seconds * scale * share
                group_of[n] = g
        return TargetProfile(node_s, group_of, group_size, scale, base, max(0.0, cut_s),
                             profile.method.value, profile.ratio, profile.notes,
                             profile.rejected, split)

    def uncertain(self, nodes: Sequence[str]) -> bool:
        """Whether a candidate of ``nodes`` splits a fused group or holds a node the profile
        does not account for."""
        seen: dict[int, int] = {}
        for n in nodes:
            g = self.group_of.get(n)
            if g is None:
                return True
            seen[g] = seen.get(g, 0) + 1
        return any(k != self.group_size[g] for g, k in seen.items())

    def cost_s(self, nodes: Sequence[str], fed_by_partition: bool) -> float:
        """Seconds of a candidate of ``nodes`` (module docstring; a group it splits priced by
        ``split``)."""
        if self.split is SplitPricing.WORK_SHARE:
            s = sum(self.node_s.get(n, 0.0) for n in nodes)
        else:
            groups = {self.group_of[n] for n in nodes if n in self.group_of}
            s = sum(self.group_s[g] for g in groups)
        return s + (self.cut_s if fed_by_partition else 0.0)


#: one CPU core's rough rates, used only to apportion a group's *measured* time over its nodes
_FLOPS_PER_S = 50e9
_ELEMENTS_PER_S = 3e9
_OP_S = 1e-7


def node_weights(graph: DataflowGraph) -> dict[str, float]:
    """Each node's share weight (seconds of a rough single-core roofline: FLOPs, output
    elements and a fixed cost per operator). Only ratios inside one profiled group or segment
    matter: they split that group's measured time, never add time of their own."""
    out: dict[str, float] = {}
    for n in graph.nodes:
        elems = sum(graph.tensors[t].size for t in n.outputs if t in graph.tensors)
        out[n.name] = (node_flops(n, graph) / _FLOPS_PER_S + elems / _ELEMENTS_PER_S + _OP_S)
    return out


def fed_by_partition(c: CandidatePartition) -> bool:
    """Whether ``c`` reads a tensor some other partition makes (not only graph inputs)."""
    return _fed(c.sub_graph)


def _fed(sg: SubGraph) -> bool:
    inputs = set(sg.graph.graph_inputs)
    return any(t not in inputs for t in sg.input_tensors)


def _feeds(sg: SubGraph) -> bool:
    """Whether a node outside ``sg`` reads a tensor ``sg`` makes (it feeds a partition)."""
    g, inside = sg.graph, sg.mask
    return any(not inside >> u & 1 for o in sg.output_tensors for u in g.consumers.get(o, ()))


class ProfiledEstimator(CostEstimator):
    """Profile costs where a target has a usable profile, ``isolated`` elsewhere (module
    docstring). ``profiles``: by `Target.id`; ``isolated``: the estimator of isolated
    measurements (or table rows), closed with this one."""

    def __init__(self, profiles: Mapping[str, TargetProfile], isolated: CostEstimator,
                 graph: DataflowGraph | None = None) -> None:
        self.profiles = dict(profiles)
        self.graph = graph  # the model the masks of in-chain prices index (exit charges)
        self.isolated = isolated
        self.kind = isolated.kind
        # what the costs that are measurements come from ("farm", "table"); the campaign
        # summary's ``measure`` says the rest are profile estimates
        self.label = isolated.label
        self.has_lower_bound = isolated.has_lower_bound
        self._measured: set[str] = set()  # fingerprints the isolated estimator answers
        self._peeked: set[str] = set()  # fingerprints whose stored confirmation was looked up
        #: (target id, node mask) -> seconds: candidates priced inside their running plan
        self._in_chain: dict[tuple[str, int], float] = {}
        #: target id -> what leaving one of its partitions costs beyond its profile share
        #: (learned from the in-chain prices: `exit_charges`)
        self._exit: dict[str, float] = {}

    @property
    def measure_mode(self) -> str | None:
        return self.isolated.measure_mode

    def _profile(self, c: CandidatePartition) -> TargetProfile | None:
        """The profile that answers ``c``, or None when ``isolated`` does."""
        if c.fingerprint in self._measured:
            return None
        return self.profiles.get(c.target.id)

    def price_in_chain(self, prices: Mapping[tuple[str, int], float]) -> None:
        """Answer these candidates, by (target id, node mask), with their in-chain price
        from now on (seconds: `collage_farm.postsearch.inchain`), before their profile
        share or any isolated cost. A price once given is kept: a later one for the same
        candidate is ignored, so every search of a campaign, and of a re-run or an offline
        search that loads the same prices, sees one figure per candidate."""
        for key, s in prices.items():
            self._in_chain.setdefault(key, max(0.0, float(s)))
        self._exit = self._learn_exits()

    @property
    def exit_charges(self) -> dict[str, float]:
        """Target id -> seconds charged to every profile-answered candidate of that target
        that feeds another partition (module docstring: learned from the in-chain prices)."""
        return dict(self._exit)

    def _learn_exits(self) -> dict[str, float]:
        """Per target, the median over its in-chain priced partitions that feed another
        partition of (price - profile answer), floored at 0: the leaving side of a cut, which
        the profile shares and the cut charges (entering side) leave out. Deterministic in
        the prices and profiles, so a re-run or an offline search that loads the same
        prices charges the same. Empty without ``graph``."""
        if self.graph is None:
            return {}
        points: dict[str, list[float]] = {}
        for (tid, mask), price in sorted(self._in_chain.items()):
            prof = self.profiles.get(tid)
            sg = SubGraph(self.graph, mask)
            if prof is None or not _feeds(sg):
                continue
            raw = prof.cost_s([n.name for n in sg.nodes], _fed(sg))
            points.setdefault(tid, []).append(price - raw)
        return {tid: max(0.0, statistics.median(xs)) for tid, xs in points.items()}

    def in_chain_price(self, c: CandidatePartition) -> float | None:
        """``c``'s in-chain price, or None when it has none."""
        return self._in_chain.get((c.target.id, c.mask))

    def priceable_in_chain(self, c: CandidatePartition) -> bool:
        """Whether ``c`` is answered by its profile share now (an in-chain price would
        replace that; isolated costs stay what they are)."""
        return self.in_chain_price(c) is None and self._profile(c) is not None

    def uncertain(self, c: CandidatePartition) -> bool:
        """Whether ``c``'s profile estimate is uncertain (module docstring); False for
        candidates the isolated estimator answers."""
        if self.in_chain_price(c) is not None:
            return False
        p = self._profile(c)
        return p is not None and p.uncertain(c.node_names)

    def profile_cost(self, c: CandidatePartition) -> Cost | None:
        """``c``'s cost from its target's profile, or None when its target has none."""
        p = self.profiles.get(c.target.id)
        return None if p is None else Cost(p.cost_s(c.node_names, fed_by_partition(c)))

    def _adopt_confirmations(self, candidates: Sequence[CandidatePartition]) -> None:
        """Candidates of profiled targets whose stored cost is a confirmation answer it from
        now on (so a re-run, and an offline search, price them as the campaign that confirmed
        them did after its confirmation step)."""
        new = [c for c in candidates if c.target.id in self.profiles
               and c.fingerprint not in self._peeked and c.fingerprint not in self._measured]
        if new:
            self._peeked.update(c.fingerprint for c in new)
            self._measured.update(self.isolated.stored_confirmations(new))

    def estimate(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        self._adopt_confirmations(candidates)
        out: list[Cost | None] = []
        rest: list[int] = []
        for i, c in enumerate(candidates):
            priced = self.in_chain_price(c)
            if priced is not None:
                out.append(Cost(priced))
                continue
            p = self._profile(c)
            if p is None:
                out.append(None)
                rest.append(i)
            else:
                out.append(Cost(p.cost_s(c.node_names, fed_by_partition(c))
                                + self._exit_s(c)))
        if rest:
            for i, cost in zip(rest, self.isolated.estimate([candidates[i] for i in rest])):
                out[i] = cost
        return [c if c is not None else Cost.unknown() for c in out]

    def _exit_s(self, c: CandidatePartition) -> float:
        charge = self._exit.get(c.target.id, 0.0)
        return charge if charge > 0 and _feeds(c.sub_graph) else 0.0

    def measure_isolated(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        """Measure ``candidates`` in isolation (the table first); from now on they answer the
        isolated measurement instead of their profile estimate."""
        self._measured.update(c.fingerprint for c in candidates)
        return self.isolated.estimate(candidates)

    def measured_isolated(self, c: CandidatePartition) -> bool:
        """Whether ``c`` was measured in isolation through `measure_isolated`."""
        return c.fingerprint in self._measured

    def lower_bound(self, candidate: CandidatePartition) -> Cost:
        """The isolated estimator's bound (a candidate may come to answer an isolated cost,
        screened or confirmed, below its profile estimate), capped by the profile estimate
        while the candidate answers one: an operator's share of an in-network run can be
        below the bound's per-call floor, and a lazy search must never price an edge above
        the cost it will answer when the edge is popped."""
        lb = self.isolated.lower_bound(candidate)
        priced = self.in_chain_price(candidate)
        if priced is not None:
            return Cost(min(lb.seconds, priced)) if lb.is_known else Cost(priced)
        p = self._profile(candidate)
        if p is None or not lb.is_known:
            return lb
        return Cost(min(lb.seconds, p.cost_s(candidate.node_names, fed_by_partition(candidate))))

    def remeasure(self, candidates: Sequence[CandidatePartition]) -> list[Cost] | None:
        """Fresh isolated measurements (`CostEstimator.remeasure`, through the isolated
        estimator); the candidates answer them from now on, profile-answered ones included.
        None when the isolated estimator cannot measure."""
        fresh = self.isolated.remeasure(candidates)
        if fresh is not None:
            self._measured.update(c.fingerprint for c in candidates)
        return fresh

    def stored_confirmations(self, candidates: Sequence[CandidatePartition]) -> set[str]:
        return self.isolated.stored_confirmations(candidates)

    def is_confirmed(self, candidate: CandidatePartition) -> bool:
        """Whether the candidate needs no re-measurement by the confirmation step: a profile
        estimate does not (module docstring), an isolated cost when it is a confirmed one."""
        if self.in_chain_price(candidate) is not None or self._profile(candidate) is not None:
            return True
        return self.isolated.is_confirmed(candidate)

    def why_invalid(self, candidate: CandidatePartition) -> str | None:
        return self.isolated.why_invalid(candidate)

    def stats(self) -> EstimatorStats:
        return self.isolated.stats()

    def close(self) -> None:
        self.isolated.close()
