"""ProfiledEstimator: candidate costs from each target's in-network operator profile.

A campaign in ``profile`` measure mode runs each target's whole model once with the toolchain's
own per-operator profiler (`runners.profile`) instead of timing every candidate partition in
isolation. A candidate's cost on a profiled target is then:

* what its nodes cost inside the whole model: the profile's per-node seconds (a fused group's
  time split evenly over its nodes), scaled so that the whole model's nodes add up to the
  *unprofiled* whole-model time of the same profile run (profiling adds a few percent, and
  time the profiler attributes to no node is spread over the nodes in proportion);
* plus, when the candidate is fed by another partition (it reads a tensor that is not a graph
  input), the target's measured same-toolchain cut cost (``cut_s``: what cutting the model
  into partitions of this toolchain costs per cut; the transition model adds what entering
  from *another* toolchain costs on top).

A candidate is **uncertain** when it splits a group the toolchain fused in the profile (its
cost inside the group is a guess) or holds a node the profile does not account for (folded or
eliminated, so 0 s in the whole model, but not alone). Uncertain candidates are answered with
their profile estimate until `measure_isolated` measures them in isolation (the campaign does
that for the uncertain candidates on the best plans, `collage_farm.postsearch.screen`); from
then on they answer the isolated measurement.

Targets without a usable profile (no profiler, a failed profile run, or a profile rejected by
`TargetProfile.of`: its per-operator sum more than ``tolerance`` from the unprofiled whole
model, or too little of its time on ONNX nodes) are answered by the ``isolated`` estimator for
every candidate: today's isolated measurement (`estimators.measured.FarmEstimator`), or, offline,
the cost table (`estimators.table.TableEstimator`).

The campaign's confirmation step re-measures the chosen path in isolation as it does in
exhaustive mode (`remeasure`); a confirmed candidate answers its confirmed cost from then on,
and, in later campaigns on the same table (a re-run, an offline search), from the start
(`CostEstimator.stored_confirmations`), so they price the path as the confirming campaign did.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from estimators.base import CostEstimator, EstimatorStats
from runners.profile import OperatorProfile

__all__ = ["DEFAULT_TOLERANCE", "MeasureStrategy", "ProfileRejected", "ProfiledEstimator",
           "TargetProfile", "fed_by_partition"]

#: how far (relative) a profile's per-operator sum may be from its unprofiled whole-model time
DEFAULT_TOLERANCE = 0.20


class MeasureStrategy(str, enum.Enum):
    """How a campaign gets its candidates' costs (``tune --measure``).

    ``PROFILE``: each target's in-network operator profile (this module), isolated
    measurement only for the uncertain candidates on the best plans and the confirmation step.
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

    @staticmethod
    def of(profile: OperatorProfile, *, cut_s: float = 0.0,
           tolerance: float = DEFAULT_TOLERANCE) -> TargetProfile:
        """The estimator's view of ``profile``; `ProfileRejected` when it cannot be trusted:
        no unprofiled time, a per-operator sum more than ``tolerance`` from it, or more than
        ``tolerance`` of the profiled time on no ONNX node."""
        total = profile.profiled_total_s
        attributed = sum(s for _, s in profile.groups)
        if not (profile.whole_s > 0 and math.isfinite(profile.whole_s)) or total <= 0:
            raise ProfileRejected(f"{profile.method.value} profile has no time "
                                  f"(whole {profile.whole_s!r} s, operators {total!r} s)")
        ratio = total / profile.whole_s
        if abs(ratio - 1.0) > tolerance:
            raise ProfileRejected(
                f"{profile.method.value} per-operator sum {total * 1e3:.3f} ms is "
                f"{ratio:.2f}x the unprofiled whole model's {profile.whole_s * 1e3:.3f} ms "
                f"(more than {tolerance:.0%} off)")
        if attributed < (1.0 - tolerance) * total:
            raise ProfileRejected(f"{profile.method.value} profile puts only "
                                  f"{attributed / total:.0%} of its time on ONNX nodes")
        scale = profile.whole_s / attributed
        node_s: dict[str, float] = {}
        group_of: dict[str, int] = {}
        group_size: dict[int, int] = {}
        for g, (nodes, seconds) in enumerate(profile.groups):
            group_size[g] = len(nodes)
            for n in nodes:
                node_s[n] = seconds * scale / len(nodes)
                group_of[n] = g
        return TargetProfile(node_s, group_of, group_size, scale, profile.whole_s,
                             max(0.0, cut_s), profile.method.value, ratio, profile.notes)

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
        """Seconds of a candidate of ``nodes`` (module docstring)."""
        s = sum(self.node_s.get(n, 0.0) for n in nodes)
        return s + (self.cut_s if fed_by_partition else 0.0)


def fed_by_partition(c: CandidatePartition) -> bool:
    """Whether ``c`` reads a tensor some other partition makes (not only graph inputs)."""
    inputs = set(c.sub_graph.graph.graph_inputs)
    return any(t not in inputs for t in c.sub_graph.input_tensors)


class ProfiledEstimator(CostEstimator):
    """Profile costs where a target has a usable profile, ``isolated`` elsewhere (module
    docstring). ``profiles``: by `Target.id`; ``isolated``: the estimator of isolated
    measurements (or table rows), closed with this one."""

    def __init__(self, profiles: Mapping[str, TargetProfile], isolated: CostEstimator) -> None:
        self.profiles = dict(profiles)
        self.isolated = isolated
        self.kind = isolated.kind
        # what the costs that are measurements come from ("farm", "table"); the campaign
        # summary's ``measure`` says the rest are profile estimates
        self.label = isolated.label
        self.has_lower_bound = isolated.has_lower_bound
        self._measured: set[str] = set()  # fingerprints the isolated estimator answers
        self._peeked: set[str] = set()  # fingerprints whose stored confirmation was looked up

    @property
    def measure_mode(self) -> str | None:
        return self.isolated.measure_mode

    def _profile(self, c: CandidatePartition) -> TargetProfile | None:
        """The profile that answers ``c``, or None when ``isolated`` does."""
        if c.fingerprint in self._measured:
            return None
        return self.profiles.get(c.target.id)

    def uncertain(self, c: CandidatePartition) -> bool:
        """Whether ``c``'s profile estimate is uncertain (module docstring); False for
        candidates the isolated estimator answers."""
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
            p = self._profile(c)
            if p is None:
                out.append(None)
                rest.append(i)
            else:
                out.append(Cost(p.cost_s(c.node_names, fed_by_partition(c))))
        if rest:
            for i, cost in zip(rest, self.isolated.estimate([candidates[i] for i in rest])):
                out[i] = cost
        return [c if c is not None else Cost.unknown() for c in out]

    def measure_isolated(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        """Measure ``candidates`` in isolation (the table first); from now on they answer the
        isolated measurement instead of their profile estimate."""
        self._measured.update(c.fingerprint for c in candidates)
        return self.isolated.estimate(candidates)

    def measured_isolated(self, c: CandidatePartition) -> bool:
        """Whether ``c`` was measured in isolation through `measure_isolated`."""
        return c.fingerprint in self._measured

    def lower_bound(self, candidate: CandidatePartition) -> Cost:
        """The isolated estimator's bound: a candidate may come to answer an isolated cost
        (screened, confirmed) below its profile estimate."""
        return self.isolated.lower_bound(candidate)

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
        """Whether the candidate answers a confirmed isolated cost (a profile estimate is
        not a confirmation: the confirmation step re-measures it like any other)."""
        if self._profile(candidate) is not None:
            return False
        return self.isolated.is_confirmed(candidate)

    def why_invalid(self, candidate: CandidatePartition) -> str | None:
        return self.isolated.why_invalid(candidate)

    def stats(self) -> EstimatorStats:
        return self.isolated.stats()

    def close(self) -> None:
        self.isolated.close()
