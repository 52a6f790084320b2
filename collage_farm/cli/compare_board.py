"""``collage-farm compare``'s simulated figures: Ethos-U boards, alone or beside timed targets.

Nothing of an Ethos-U board can be timed on this machine, so `compare` gives its targets
simulated figures, costed by real builds (Vela compiles for the NPU, the host's cycle model for
the Cortex-M) through a `LocalService`, with the board's transition model:

* `simulated_board`: ``--targets`` is a board (an NPU and its host): each target's whole model
  (where it takes every node), **Vela whole** (Vela's own NPU / host split,
  `collage_farm.postsearch.vela_whole`, with the line saying whether it was read back from
  one Vela compile of the whole model or derived from the capability check) and, with
  ``--plan``, the plan's estimate;
* `simulated_wholes`: ``--targets`` mixes timed toolchains with Ethos-U parts: each NPU target
  gets its Vela-whole figure on its board (its host: a Cortex-M target in the list, else the
  one of the built-in system declaring the NPU), each Cortex-M target its whole model; the
  timed targets are timed as usual, and the two kinds are printed apart.

Every figure here is simulated (`FIGURES`) and labelled so wherever it is shown.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from collage_farm.campaign.costs import with_requantise
from collage_farm.config import builtin_system_for
from collage_farm.core.calibration_data import CalibrationData
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.graph import DataflowGraph
from collage_farm.core.plan import load_plan
from collage_farm.core.search import NoCoverError, search
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import EMBEDDED_TOOLCHAINS, Target
from collage_farm.core.transition import AnalyticTransitionModel, TransitionModel
from collage_farm.costtable import TableStore
from collage_farm.postsearch.vela_whole import FIGURES, Board, split_info, vela_whole
from estimators.int8_ranges import channel_means_provider, tensor_ranges_provider
from estimators.local import LocalService
from estimators.measured import FarmEstimator

__all__ = ["FIGURES", "board_of", "simulated_board", "simulated_wholes", "vela_whole_sources"]


def _transition(targets: Sequence[Target]) -> TransitionModel:
    cfg = builtin_system_for(targets)
    return cfg.transition if cfg is not None else AnalyticTransitionModel()


@contextmanager
def _local_estimator(graph: DataflowGraph, targets: Sequence[Target],
                     calibration: CalibrationData | None = None) -> Iterator[FarmEstimator]:
    """An estimator over a throw-away cost table and the toolchains' local runners; int8
    builds calibrated on ``calibration`` (seeded random by default)."""
    with tempfile.TemporaryDirectory() as tmp:
        est = FarmEstimator(LocalService(sorted({t.toolchain for t in targets})),
                            TableStore(Path(tmp) / "costs", campaign_id="compare"),
                            model=graph.name, prune=False,
                            tensor_ranges_for=tensor_ranges_provider(graph, targets,
                                                                     calibration),
                            channel_means_for=channel_means_provider(graph, targets,
                                                                     calibration))
        try:
            yield est
        finally:
            est.close()


def _whole(graph: DataflowGraph, t: Target, est: FarmEstimator, transition: TransitionModel
           ) -> tuple[float | None, str]:
    """``t``'s figure for the whole model, or (None, why not)."""
    whole = CandidatePartition(SubGraph(graph, graph.all_mask), t, rule="single")
    try:
        return search(graph, [whole], est, transition, lazy=False).total_s, ""
    except NoCoverError:
        return None, est.why_invalid(whole) or "does not take every node"


def simulated_board(graph: DataflowGraph, targets: Sequence[Target], board: Board,
                    plan: str | None = None, calibration: CalibrationData | None = None
                    ) -> dict[str, Any]:
    """Simulated whole-model figures on an Ethos-U board: each target alone, Vela whole and
    (``plan``: a plan directory) the plan's own estimate; failures as text. int8 builds are
    calibrated on ``calibration`` (seeded random by default)."""
    transition = with_requantise(targets, _transition(targets))  # as a campaign prices it
    rows: dict[str, float] = {}
    errors: dict[str, str] = {}
    with _local_estimator(graph, targets, calibration) as est:
        for t in targets:
            s, why = _whole(graph, t, est, transition)
            if s is None:
                errors[t.id] = why
            else:
                rows[t.id] = s
        try:
            rows["vela-whole"] = vela_whole(graph, board, est, transition,
                                            calibration).total_s
        except ValueError as e:
            errors["vela-whole"] = str(e)
    if plan is not None:
        rows["plan"] = float(load_plan(plan)[0].estimated_total_s)
    return {"model": graph.name, "figures": FIGURES, "transition": transition.label,
            "simulated_s": rows, "errors": errors,
            **split_info(graph, board, calibration)}


def board_of(npu: Target, targets: Sequence[Target]) -> Board | None:
    """``npu``'s board: the first Cortex-M target of ``targets``, else the host of the first
    built-in system that declares ``npu``; None when there is none."""
    hosts = [t for t in targets if t.toolchain == "cortex-m"]
    if not hosts:
        cfg = builtin_system_for([npu])
        hosts = [t for t in (cfg.targets.values() if cfg else ()) if t.toolchain == "cortex-m"]
    return Board(npu, hosts[0]) if hosts else None


def simulated_wholes(graph: DataflowGraph, targets: Sequence[Target],
                     calibration: CalibrationData | None = None
                     ) -> tuple[dict[str, float], dict[str, str]]:
    """The Ethos-U targets of a mixed ``targets`` list (module doc): (figures, errors), keyed
    by target id; every figure simulated, int8 builds calibrated on ``calibration``."""
    rows: dict[str, float] = {}
    errors: dict[str, str] = {}
    embedded = [t for t in targets if t.toolchain in EMBEDDED_TOOLCHAINS]
    if not embedded:
        return rows, errors
    for t in embedded:
        board = board_of(t, targets) if t.toolchain == "vela" else None
        parts = [board.npu, board.host] if board else [t]
        transition = _transition(parts)
        with _local_estimator(graph, parts, calibration) as est:
            if board is None and t.toolchain == "vela":
                errors[t.id] = "no Cortex-M host declared for this NPU (give one in --targets)"
            elif board is not None:
                try:
                    rows[t.id] = vela_whole(graph, board, est, transition,
                                            calibration).total_s
                except ValueError as e:
                    errors[t.id] = str(e)
            else:
                s, why = _whole(graph, t, est, transition)
                if s is None:
                    errors[t.id] = why
                else:
                    rows[t.id] = s
    return rows, errors


def vela_whole_sources(graph: DataflowGraph, targets: Sequence[Target],
                       calibration: CalibrationData | None = None) -> dict[str, str]:
    """Per NPU target of a mixed ``targets`` list with a board: where its Vela whole's split
    came from, one line (the split `simulated_wholes` costed: cached, nothing is compiled
    again)."""
    out: dict[str, str] = {}
    for t in targets:
        board = board_of(t, targets) if t.toolchain == "vela" else None
        if board is not None:
            out[t.id] = split_info(graph, board, calibration)["vela_whole_source"]
    return out
