"""Vela's own partitioning of a model ("Vela whole"): the baseline of an Ethos-U campaign.

What an Ethos-U user gets without Collage: the whole model compiled by Vela, which places on the
NPU every operator it can and leaves the rest to the Cortex-M host, the model's operator order
deciding where the NPU sub-graphs start and end. `vela_whole_parts` is that split
(`collage_farm.postsearch.vela_split.vela_split`): read back from one Vela compile of the whole
model, or, where that compile cannot be made, derived from the NPU target's capability check;
the summary says which (``vela_whole_source``) and lists each host node with its reason
(``vela_whole_split``).

The baseline is costed exactly like the search's plans: its partitions are ordinary candidates
(``rule="vela-whole"``), priced by the campaign's estimator (Vela cycles for the NPU, the host's
cycle model for the Cortex-M: the same rows and the same cost table), and the search over just
those candidates charges the same transition model (NPU invocations, hand-overs).
`baseline_candidates` adds them to a campaign's candidates, so the search can only do better;
`exact_never_worse` then compares the plan with the baseline exactly: both figures are
deterministic (Vela is; the host model is a formula), so no noise threshold applies, and the
summary says the figures are simulated.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from collage_farm.core.calibration_data import CalibrationData
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.estimator import CostEstimator
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.search import NoCoverError, SearchResult, search
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import EMBEDDED_TOOLCHAINS, Target
from collage_farm.core.transition import TransitionModel
from collage_farm.execute.builder import Part
from collage_farm.postsearch.vela_split import Board, VelaSplit, vela_split

__all__ = ["Board", "baseline_candidates", "ethos_u_board", "exact_never_worse",
           "profile_candidates", "split_info", "vela_whole", "vela_whole_parts"]

RULE = "vela-whole"
FIGURES = ("simulated: Vela's cycle estimate for the NPU and the analytic cycle model of the "
           "Cortex-M host (runners.host_model); not measured on a board")


def ethos_u_board(targets: Sequence[Target]) -> Board | None:
    """The board of a campaign whose targets are all Ethos-U parts with at least one NPU and
    one host (the first of each: variants of either are the search's business), else None."""
    if not targets or any(t.toolchain not in EMBEDDED_TOOLCHAINS for t in targets):
        return None
    npus = [t for t in targets if t.toolchain == "vela"]
    hosts = [t for t in targets if t.toolchain == "cortex-m"]
    return Board(npus[0], hosts[0]) if npus and hosts else None


def vela_whole_parts(graph: DataflowGraph, board: Board,
                     calibration: CalibrationData | None = None) -> list[Part]:
    """Vela's split of ``graph`` (module docstring), in execution order; ``calibration``:
    the int8 samples (seeded random by default).

    ValueError names the first node that neither the NPU nor the host takes.
    """
    return list(vela_split(graph, board, calibration).parts)


def _candidates(graph: DataflowGraph, parts: Sequence[Part]) -> list[CandidatePartition]:
    return [CandidatePartition(SubGraph(graph, p.mask), p.target, rule=RULE) for p in parts]


def baseline_candidates(graph: DataflowGraph, targets: Sequence[Target],
                        calibration: CalibrationData | None = None
                        ) -> list[CandidatePartition]:
    """The Vela-whole partitions as candidates when ``targets`` are an Ethos-U board (none
    otherwise, or when some node runs on neither half: the search then says which);
    ``calibration``: the campaign's int8 samples (seeded random by default)."""
    board = ethos_u_board(targets)
    if board is None:
        return []
    try:
        return _candidates(graph, vela_whole_parts(graph, board, calibration))
    except ValueError:
        return []


def profile_candidates(graph: DataflowGraph, targets: Sequence[Target],
                       calibration: CalibrationData | None = None
                       ) -> list[CandidatePartition]:
    """The profile builds of a board's ``profile`` mode (`estimators.board_profiled`):
    Vela's split's NPU partitions on each NPU target (variants included), every partition of
    the split on each host target; none when ``targets`` are no board or the split fails."""
    board = ethos_u_board(targets)
    if board is None:
        return []
    try:
        parts = vela_whole_parts(graph, board, calibration)
    except ValueError:
        return []
    out: list[CandidatePartition] = []
    for t in targets:
        for p in parts:
            if t.toolchain == "cortex-m" or (t.toolchain == "vela" and p.target == board.npu):
                out.append(CandidatePartition(SubGraph(graph, p.mask), t, rule=RULE))
    return out


def vela_whole(graph: DataflowGraph, board: Board, est: CostEstimator,
               transition: TransitionModel, calibration: CalibrationData | None = None
               ) -> SearchResult:
    """The Vela-whole plan costed by ``est`` with ``transition`` (the search over its own
    partitions only, so transfers and invocations are charged as for any plan).

    ValueError when a node runs on neither half or a partition has no valid cost."""
    cands = _candidates(graph, vela_whole_parts(graph, board, calibration))
    try:
        return search(graph, cands, est, transition, lazy=False)
    except NoCoverError as e:
        why = [est.why_invalid(c) for c in cands]
        raise ValueError(f"Vela whole has no cost: {e}; "
                         + "; ".join(w for w in why if w)[:300]) from None


def _placement(graph: DataflowGraph, result: SearchResult) -> dict[str, str]:
    return {graph.nodes[i].name: p.candidate.target.id for p in result.partitions
            for i in range(len(graph.nodes)) if p.candidate.mask >> i & 1}


def split_info(graph: DataflowGraph, board: Board,
               calibration: CalibrationData | None = None) -> dict:
    """The summary's account of Vela whole's split: ``vela_whole_source`` (one line: the
    whole-model compile or the capability check, and why) and ``vela_whole_split`` (the
    source, each host node with its reason, the nodes compile and check disagree on)."""
    try:
        split: VelaSplit = vela_split(graph, board, calibration)
    except ValueError as e:
        return {"vela_whole_source": f"none: {e}"}
    return {"vela_whole_source": f"{split.source.value}: {split.note}",
            "vela_whole_split": split.to_json()}


def exact_never_worse(graph: DataflowGraph, board: Board, result: SearchResult,
                      est: CostEstimator, transition: TransitionModel,
                      calibration: CalibrationData | None = None
                      ) -> tuple[SearchResult, dict]:
    """The plan to write (the search's, or Vela whole when it is not cheaper: no noise
    threshold) and the summary's figures of the comparison; ``calibration``: the campaign's
    int8 samples."""
    info: dict = {"figures": FIGURES, "baseline": "vela_whole",
                  "verify": "exact: the plan's simulated figures against Vela whole's (both "
                            "deterministic); nothing is timed end to end",
                  **split_info(graph, board, calibration)}
    try:
        base = vela_whole(graph, board, est, transition, calibration)
    except ValueError as e:
        info.update(plan_is="dijkstra", vela_whole_estimated_s=None,
                    never_worse=f"not checked: {e}")
        return result, info
    plan_s, base_s = result.total_s, base.total_s
    same = ({(p.candidate.mask, p.candidate.target.id) for p in result.partitions}
            == {(p.candidate.mask, p.candidate.target.id) for p in base.partitions})
    keep = same or plan_s <= base_s
    out = result if keep else base
    before, after = _placement(graph, base), _placement(graph, out)
    moved = sorted(n for n in after if after[n] != before.get(n))
    info.update({
        "plan_is": "dijkstra" if keep else "vela_whole",
        "vela_whole_estimated_s": base_s,
        "vela_whole_partitions": len(base.partitions),
        "speedup_vs_vela_whole": (base_s / out.total_s
                                  if out.total_s > 0 and math.isfinite(base_s) else None),
        "moved_from_vela_whole": {
            "to_npu": [n for n in moved if before.get(n) == board.host.id],
            "to_host": [n for n in moved if after[n] == board.host.id],
            # on the NPU either way, compiled with another variant's options (e.g. Size)
            "npu_options": {n: after[n] for n in moved
                            if board.host.id not in (after[n], before.get(n))}},
        "never_worse": (
            f"the plan is Vela's own partitioning ({base_s * 1e3:.4f} ms simulated; exact "
            "comparison)" if same else
            f"the plan ({plan_s * 1e3:.4f} ms simulated) is "
            f"{'not slower than' if keep else 'slower than'} Vela whole "
            f"({base_s * 1e3:.4f} ms simulated; exact comparison, both figures deterministic)"
            + ("" if keep else ": the output plan is Vela whole")),
    })
    return out, info
