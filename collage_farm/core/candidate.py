"""CandidatePartition: a sub-graph paired with the target that would run it.

All Collage search and measurement is in terms of candidates (RFC 0062). A candidate's
*fingerprint* names the measurement it needs: a hash of the sub-graph's structure (op types,
attributes, boundary shapes and dtypes, internal topology; not node names, not weight values)
and of the target's measure key. Equal fingerprints share one measurement, across the repeated
layers of one model and across models, which is what makes cost tables reusable.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cached_property

from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import Target


@dataclass(frozen=True, eq=False)
class CandidatePartition:
    """A `SubGraph` to be run by a `Target`; ``rule`` names the partition rule that found it."""

    sub_graph: SubGraph
    target: Target
    rule: str = ""
    composite: str = ""  # label given by a CompositePartitionRule, if any

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, CandidatePartition)
            and other.sub_graph == self.sub_graph
            and other.target == self.target
        )

    def __hash__(self) -> int:
        return hash((self.sub_graph.mask, self.target))

    @cached_property
    def fingerprint(self) -> str:
        raw = f"{self.sub_graph.structural_hash}|{self.target.measure_key}"
        return hashlib.sha256(raw.encode()).hexdigest()[:32]

    @property
    def mask(self) -> int:
        return self.sub_graph.mask

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.sub_graph.nodes]

    @property
    def op_types(self) -> list[str]:
        return [n.op_type for n in self.sub_graph.nodes]

    def label(self) -> str:
        names = self.node_names
        span = names[0] if len(names) == 1 else f"{names[0]}..{names[-1]} ({len(names)} nodes)"
        return f"{self.target.id}:{span}"

    def __repr__(self) -> str:
        return f"CandidatePartition({self.target.id}, {self.sub_graph.indices})"
