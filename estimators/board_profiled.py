"""BoardProfiledEstimator: an Ethos-U board's candidate costs from per-operator profile builds.

On a simulated Ethos-U board (an NPU target of toolchain ``vela``, a Cortex-M host target of
toolchain ``cortex-m``) every figure is deterministic: Vela's cycle estimate of the candidate
compiled alone, or the host's analytic cycle model of the candidate converted alone. An
exhaustive campaign builds every candidate the search asks for (thousands of Vela compiles on a
CNN). In ``profile`` mode a handful of *profile builds* stand in for them during the search:

* per NPU target, Vela's own split of the model (its NPU partitions, ordinary candidates)
  compiled once: Vela reports the cycles of every TFLite operator it places
  (``details["ops"]``: cycles and the ONNX nodes each operator implements);
* per host target, every partition of that split converted for the host: the host's cycle
  model prices every TFLite operator (``details["ops"]``) and, for a float partition, the
  DEQUANTIZE / QUANTIZE at its boundary (``boundary_cycles``).

A *group* is the nodes of one operator of a profile build, joined with any other operator that
shares a node (a Conv with its fused bias Add and Relu; a Flatten written as TRANSPOSE and
RESHAPE). A candidate's profile estimate is the cycles of the groups it holds over the target's
clock, plus, on the host, its own float boundary (`HostModel.fp32_boundary_cycles` of its float
inputs and its outputs) when the host converts it in float32. Vela's figure of a compile is the
sum of its operators' cycles (no fixed per-compile cycles: checked by a unit test), and the
host's is its operators' plus the boundary, so the profile estimate of each profile build
equals that build's figure exactly. What a candidate pays for being invoked or handed over is
the board's transition model's, charged by the search on top, as for built candidates.

A candidate is **accounted** on its target when every node it holds is in a group of that
target's profile, it holds each of its groups whole, and (host) every node was priced in the
precision the host converts the candidate in (int8 when the converter maps each of its nodes in
int8, else float32). A candidate that splits fused groups (a Conv without its fused Relu, a
Relu without its Conv: what the segment rules make at every group boundary; a Conv ->
BatchNormalization -> Mul -> Add chain the converter folds into one operator, cut in two) is
accounted too, each split group's part in it priced by its own build of just that part (an
ordinary candidate, built once and shared by every candidate that splits the group there):
Vela runs a lone Relu as an operator of its own, and a Conv without its activation at the fused
group's cycles or close to them, so neither is a share of the group guessed. Every other
candidate (a node Vela leaves to the host, a part that is not convex or that the host would
convert in another precision alone, a Vela Passthrough operator) is **built** now, as in an
exhaustive campaign, and answers its exact figure (or invalid, exactly as there). A candidate
whose exact figure is known (a profile build, one built before, a row of the cost table:
``known``) always answers it.

A profile estimate is *provisional*: Vela's cycles of an operator depend on what it is compiled
with (cascading, SRAM placement), so a candidate's own compile can differ. The campaign's exact
confirmation (`collage_farm.postsearch.exact_confirm`) builds the chosen plan's provisional
candidates and searches again until the plan is made of built candidates only, so the figures a
campaign writes and compares with Vela's own split are exact builds, never estimates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.subgraph import SubGraph
from estimators.base import CostEstimator, EstimatorStats
from runners.cortex_m import host_mode
from runners.host_model import HostModel

__all__ = ["BoardProfile", "BoardProfiledEstimator", "ProfileBuild"]

#: the precision a Vela profile prices a node in (the NPU has one)
NPU_MODE = "npu"


@dataclass(frozen=True)
class ProfileBuild:
    """One profile build as a profile reads it: its nodes, and the details of its row."""

    nodes: tuple[str, ...]
    details: Mapping[str, Any]


@dataclass(frozen=True)
class BoardProfile:
    """One board target's profile (module docstring): groups of nodes and their cycles.

    Keys are (node, precision): ``"npu"`` for Vela; ``"int8"`` / ``"fp32"`` for the host,
    which prices a node in the precision its candidate is converted in. ``host``: the host's
    cycle model (None for an NPU target), for a float candidate's boundary; ``int8_nodes``:
    the nodes the converter maps in int8. ``dropped``: nodes of profile builds left
    unaccounted, and why (a Vela Passthrough operator, a node no operator implements)."""

    target: str
    clock_hz: float
    group_of: Mapping[tuple[str, str], int]
    group_size: Mapping[int, int]
    group_cycles: Mapping[int, float]
    host: HostModel | None = None
    dropped: Mapping[str, str] = field(default_factory=dict)
    int8_nodes: frozenset[str] = frozenset()

    @staticmethod
    def of(target: str, builds: Iterable[ProfileBuild], host: HostModel | None = None,
           graph: DataflowGraph | None = None) -> BoardProfile:
        """The profile of ``target`` from its profile builds' details (``host`` and the
        model's ``graph`` for a host target, whose builds say their ``mode``; ValueError when
        a build carries no clock or operators)."""
        parent: dict[tuple[str, str], tuple[str, str]] = {}

        def find(n: tuple[str, str]) -> tuple[str, str]:
            while parent[n] != n:
                parent[n] = parent[parent[n]]
                n = parent[n]
            return n

        ops: list[tuple[list[tuple[str, str]], float]] = []
        dropped: dict[str, str] = {}
        covered: set[tuple[str, str]] = set()
        clock = 0.0
        for b in builds:
            d = b.details
            if "ops" not in d or not d.get("clock_hz"):
                raise ValueError(f"profile build of {len(b.nodes)} node(s) on {target} has no "
                                 "per-operator cycles")
            clock = float(d["clock_hz"])
            mode = NPU_MODE if host is None else str(d.get("mode", "int8"))
            for op in d["ops"]:
                nodes = [(str(n), mode) for n in op.get("nodes") or ()]
                if op.get("target") == "cpu":  # Vela Passthrough: priced analytically
                    dropped.update({n: "Vela leaves its operator to the CPU" for n, _ in nodes})
                elif nodes:
                    ops.append((nodes, float(op["cycles"])))
            covered.update((n, mode) for n in b.nodes)
        for nodes, _ in ops:
            for k in nodes:
                parent.setdefault(k, k)
            for k in nodes[1:]:
                parent[find(k)] = find(nodes[0])
        roots: dict[tuple[str, str], int] = {}
        group_of = {k: roots.setdefault(find(k), len(roots)) for k in parent
                    if k[0] not in dropped}
        group_cycles: dict[int, float] = {}
        for nodes, cycles in ops:
            g = group_of.get(nodes[0])
            if g is not None:
                group_cycles[g] = group_cycles.get(g, 0.0) + cycles
        group_size: dict[int, int] = {}
        for g in group_of.values():
            group_size[g] = group_size.get(g, 0) + 1
        for k in covered - set(group_of):
            dropped.setdefault(k[0], "no operator of its profile build implements it")
        int8 = frozenset(n.name for n in graph.nodes if host_mode(n, graph)[0] == "int8"
                         ) if host is not None and graph is not None else frozenset()
        return BoardProfile(target, clock, group_of, group_size, group_cycles, host, dropped,
                            int8)

    def mode(self, c: CandidatePartition) -> str:
        """The precision ``c`` is priced in: the NPU's, or on the host int8 when the
        converter maps every node of it in int8, else float32."""
        if self.host is None:
            return NPU_MODE
        return "int8" if all(n in self.int8_nodes for n in c.node_names) else "fp32"

    def why_not(self, c: CandidatePartition) -> str | None:
        """Why ``c`` is not accounted by this profile (module docstring); None when it is."""
        mode = self.mode(c)
        seen: dict[int, int] = {}
        for n in c.node_names:
            g = self.group_of.get((n, mode))
            if g is None:
                if n in self.dropped:
                    return f"{n}: {self.dropped[n]}"
                return f"{n}: in no profile build in {mode}"
            seen[g] = seen.get(g, 0) + 1
        split = [g for g, k in seen.items() if k != self.group_size[g]]
        return f"splits {len(split)} fused operator group(s)" if split else None

    def fragments(self, c: CandidatePartition) -> list[tuple[str, ...]] | None:
        """The parts by which ``c`` splits fused groups, when it is accounted but for those:
        each split group's nodes in ``c`` (a Conv without its fused Relu, the Relu without
        its Conv, a folded Conv -> BatchNormalization -> Mul -> Add chain cut in two) is then
        priced by its own build of just those nodes (on the host, less that build's own
        float boundary). None otherwise: a node in no group, a part that is not convex (it
        could not be built alone), or on the host a part that would be converted alone in
        another precision than the candidate."""
        mode = self.mode(c)
        held: dict[int, list[str]] = {}
        for n in c.node_names:
            g = self.group_of.get((n, mode))
            if g is None:
                return None
            held.setdefault(g, []).append(n)
        out: list[tuple[str, ...]] = []
        for g, nodes in held.items():
            if len(nodes) == self.group_size[g]:
                continue
            # on the host a part alone is converted in int8 only when the converter maps all
            # its nodes so: it must be priced in the candidate's precision
            if self.host is not None and mode != (
                    "int8" if all(n in self.int8_nodes for n in nodes) else "fp32"):
                return None
            out.append(tuple(nodes))
        return out

    def boundary_s(self, c: CandidatePartition) -> float:
        """Seconds of the DEQUANTIZE / QUANTIZE the host adds around ``c`` when it converts
        ``c`` in float32 (`HostModel.fp32_boundary_cycles`); 0 on the NPU and in int8."""
        return self.boundary_cycles(c) / self.clock_hz

    def boundary_cycles(self, c: CandidatePartition) -> float:
        """`boundary_s` in host cycles."""
        if self.host is None or self.mode(c) != "fp32":
            return 0.0
        sg = c.sub_graph
        g = sg.graph
        floats_in = sum(g.tensors[t].size for t in sg.input_tensors
                        if t in g.tensors and g.tensors[t].dtype == "float32")
        floats_out = sum(g.tensors[t].size for t in sg.output_tensors if t in g.tensors)
        return self.host.fp32_boundary_cycles(floats_in, floats_out)

    def seconds(self, c: CandidatePartition, split: Mapping[str, float] | None = None
                ) -> float:
        """``c``'s profile estimate (module docstring); ``c`` must be accounted, or hold
        the parts of `fragments`, whose builds' seconds ``split`` gives by node (a part's
        seconds on one of its nodes, 0 on the others)."""
        mode = self.mode(c)
        groups = {self.group_of[(n, mode)] for n in c.node_names if n not in (split or {})}
        cycles = sum(self.group_cycles.get(g, 0.0) for g in sorted(groups))
        if split:
            return cycles / self.clock_hz + sum(split.values()) + self.boundary_s(c)
        return (cycles + self.boundary_cycles(c)) / self.clock_hz


class BoardProfiledEstimator(CostEstimator):
    """Profile estimates for accounted candidates, exact builds for the rest (module
    docstring). ``profiles``: by `Target.id`; ``exact``: the estimator of built figures (the
    board's isolated runners, or offline the cost table), closed with this one; ``known``:
    (fingerprint, measure key) pairs whose exact figure the cost table already holds;
    ``profile_builds``: how many of ``exact``'s builds were the profile's own (not counted in
    `stats`' ``measured``)."""

    def __init__(self, profiles: Mapping[str, BoardProfile], exact: CostEstimator, *,
                 known: Iterable[tuple[str, str]] = (), profile_builds: int = 0) -> None:
        self.profiles = dict(profiles)
        self.exact = exact
        self.kind = exact.kind
        self.label = exact.label
        self.has_lower_bound = exact.has_lower_bound
        self.known = set(known)
        self.profile_builds = profile_builds
        self._built: set[str] = set()  # fingerprints answered by `exact`
        self._estimated: dict[str, Cost] = {}  # fingerprint -> its profile estimate

    @property
    def measure_mode(self) -> str | None:
        return self.exact.measure_mode

    def _is_exact(self, c: CandidatePartition) -> bool:
        return c.fingerprint in self._built or (c.fingerprint, c.target.measure_key) in self.known

    def why_built(self, c: CandidatePartition) -> str | None:
        """Why ``c`` answers its exact figure rather than a profile estimate; None when it
        answers the estimate."""
        if self._is_exact(c):
            return "its exact figure is known"
        p = self.profiles.get(c.target.id)
        if p is None:
            return f"{c.target.id} has no profile"
        return p.why_not(c)

    def provisional(self, c: CandidatePartition) -> bool:
        """Whether ``c`` answers a profile estimate (not yet built)."""
        if c.fingerprint in self._estimated:
            return c.fingerprint not in self._built
        return self.why_built(c) is None or self._fragments(c) is not None

    def estimate(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        out: dict[int, Cost] = {}
        split: dict[int, list[CandidatePartition]] = {}  # candidate -> its single-node builds
        rest: list[int] = []
        for i, c in enumerate(candidates):
            fp = c.fingerprint
            if fp in self._estimated and fp not in self._built:
                out[i] = self._estimated[fp]
            elif self.why_built(c) is None:
                out[i] = self._estimated[fp] = Cost(self.profiles[c.target.id].seconds(c))
            elif (frags := self._fragments(c)) is not None:
                split[i] = frags
            else:
                rest.append(i)
        if split:
            singles = {f.fingerprint: f for fs in split.values() for f in fs}
            cost = dict(zip(singles, self.build(list(singles.values()))))
            for i, fs in split.items():
                c = candidates[i]
                if all(cost[f.fingerprint].is_known for f in fs):
                    p = self.profiles[c.target.id]  # a part's own boundary left out
                    given = {n: 0.0 for f in fs for n in f.node_names}
                    given.update({f.node_names[0]: cost[f.fingerprint].seconds
                                  - p.boundary_s(f) for f in fs})
                    out[i] = self._estimated[c.fingerprint] = Cost(
                        self.profiles[c.target.id].seconds(c, given))
                else:
                    rest.append(i)
        if rest:
            for i, got in zip(rest, self.build([candidates[i] for i in rest])):
                out[i] = got
        return [out.get(i, Cost.unknown()) for i in range(len(candidates))]

    def _fragments(self, c: CandidatePartition) -> list[CandidatePartition] | None:
        """The candidates of the parts that price ``c``'s split groups (`BoardProfile
        .fragments`), or None when ``c`` is built."""
        if self._is_exact(c) or c.target.id not in self.profiles:
            return None
        parts = self.profiles[c.target.id].fragments(c)
        if not parts:
            return None
        index = {n.name: n.index for n in c.sub_graph.nodes}
        g = c.sub_graph.graph
        singles = [CandidatePartition(SubGraph(g, sum(1 << index[n] for n in part)), c.target)
                   for part in parts]
        if not all(f.sub_graph.is_convex for f in singles):
            return None
        if not self.exact.kind.measures and not all(self._is_exact(f) for f in singles):
            return None  # offline: only single-node builds the table holds price a split
        return singles

    def build(self, candidates: Sequence[CandidatePartition]) -> list[Cost]:
        """``candidates``' exact figures (built now, or the table's); from now on they answer
        them instead of a profile estimate."""
        self._built.update(c.fingerprint for c in candidates)
        return self.exact.estimate(candidates)

    def estimated(self) -> int:
        """Distinct candidates answered by a profile estimate and never built."""
        return len(set(self._estimated) - self._built)

    def lower_bound(self, candidate: CandidatePartition) -> Cost:
        """The exact estimator's bound, capped by the profile estimate where ``candidate``
        answers one (a node the profile prices at 0 s, folded into its neighbour, is below
        the analytic floor): a lazy search never prices an edge above what it will answer."""
        lb = self.exact.lower_bound(candidate)
        if lb.is_known and self.why_built(candidate) is None:
            est = self.profiles[candidate.target.id].seconds(candidate)
            return Cost(min(lb.seconds, est))
        return lb

    def is_confirmed(self, candidate: CandidatePartition) -> bool:
        """Whether ``candidate`` answers an exact figure: a profile estimate is not one."""
        return self._is_exact(candidate)

    def why_invalid(self, candidate: CandidatePartition) -> str | None:
        return self.exact.why_invalid(candidate)

    def stats(self) -> EstimatorStats:
        s = self.exact.stats()
        return dataclasses.replace(s, measured=max(0, s.measured - self.profile_builds))

    def close(self) -> None:
        self.exact.close()
