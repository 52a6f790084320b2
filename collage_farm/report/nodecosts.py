"""Each node's cost on each target, from a campaign's cost table: what the heat map colours.

`node_costs` reads the rows of one model and answers, per (node, target), with the best figure
the table holds, in this order (`Source`):

1. ``SINGLE``: the newest ok row of a one-node candidate: that node alone, as measured
   (or simulated, analytic: the row's ``kind`` says which);
2. ``PROFILE``: the newest profile row of that target (`runners.profile`) that the profiled
   estimator accepts: the node's seconds inside the whole model, scaled to the unprofiled
   whole-model time; a kernel the toolchain fused over several nodes is shared evenly among
   them (`estimators.profiled.TargetProfile`);
3. ``SHARE``: an even share of the smallest ok candidate covering the node on that target (a
   search with lower-bound pruning measures few one-node candidates), when that candidate has
   at most `MAX_SHARE_NODES` nodes: approximate, and shown so;
4. ``COARSE``: no figure: the node was measured only inside larger candidates (``of_nodes``:
   the smallest), where an even share would paint a whole block one colour;
5. ``FAILED``: no figure, but a failed one-node row: its status ("unsupported", ...).

A (node, target) with none of these has no `NodeCost`.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collage_farm.costtable import CostTable
from collage_farm.costtable.inchain import INCHAIN_PREFIX
from estimators.profiled import TargetProfile
from runners.profile import PROFILE_DETAIL, PROFILE_PREFIX, OperatorProfile

__all__ = ["MAX_SHARE_NODES", "NodeCost", "Source", "node_costs"]

#: the largest candidate whose cost is shared out among its nodes
MAX_SHARE_NODES = 8


class Source(enum.Enum):
    """Where a node's figure comes from, best first (module doc)."""

    SINGLE = "single"
    PROFILE = "profile"
    SHARE = "share"
    COARSE = "coarse"
    FAILED = "failed"


@dataclass(frozen=True)
class NodeCost:
    """One node's figure on one target: ``seconds`` (None when ``source`` is ``COARSE`` or
    ``FAILED``),
    the row's ``kind`` (measured, simulated, ...), ``status`` and, for a share, the size of
    the candidate it is a share of (``of_nodes``)."""

    seconds: float | None
    source: Source
    kind: str
    status: str = "ok"
    of_nodes: int = 1


_COLUMNS = ("fingerprint", "target", "status", "kind", "median", "nodes", "created_at",
            "details")


def _rows(table_dir: Path, model: str) -> list[dict[str, Any]]:
    tbl = CostTable(table_dir).read(filters={"model": model}, columns=_COLUMNS)
    cols = {c: tbl.column(c).to_pylist() for c in _COLUMNS}
    rows = [dict(zip(_COLUMNS, vals)) for vals in zip(*cols.values())]
    rows.sort(key=lambda r: r["created_at"] or 0)  # newest last: later rows win
    return rows


def _ok(r: Mapping[str, Any]) -> bool:
    m = r["median"]
    return r["status"] == "ok" and m is not None and math.isfinite(m) and m >= 0


def _profiled(r: Mapping[str, Any]) -> dict[str, float]:
    """Node -> seconds of one profile row as the profiled estimator reads it
    (`estimators.profiled.TargetProfile.of`: scaled to the unprofiled whole-model time, a
    fused kernel shared evenly); empty when that estimator rejects the profile."""
    try:
        prof = OperatorProfile.from_json(json.loads(r["details"] or "{}")[PROFILE_DETAIL])
        return dict(TargetProfile.of(prof).node_s)
    except (KeyError, ValueError, TypeError):  # ProfileRejected is a ValueError
        return {}


def node_costs(table_dir: Path, model: str, nodes: Iterable[str]
               ) -> dict[tuple[str, str], NodeCost]:
    """(node, target) -> `NodeCost` for ``nodes`` of ``model`` from the table at
    ``table_dir`` (module doc: which row answers)."""
    want = set(nodes)
    single: dict[tuple[str, str], NodeCost] = {}
    failed: dict[tuple[str, str], NodeCost] = {}
    profile: dict[tuple[str, str], NodeCost] = {}
    share: dict[tuple[str, str], NodeCost] = {}
    for r in _rows(table_dir, model):
        t, ns = r["target"], tuple(r["nodes"] or ())
        if str(r["fingerprint"]).startswith(INCHAIN_PREFIX):
            continue  # a partition priced inside a running plan, not a candidate measured
        if str(r["fingerprint"]).startswith(PROFILE_PREFIX):
            if r["status"] == "ok":
                for n, s in _profiled(r).items():
                    profile[(n, t)] = NodeCost(s, Source.PROFILE, str(r["kind"]))
            continue
        if len(ns) == 1 and ns[0] in want:
            if _ok(r):
                single[(ns[0], t)] = NodeCost(float(r["median"]), Source.SINGLE, str(r["kind"]))
            else:
                failed[(ns[0], t)] = NodeCost(None, Source.FAILED, str(r["kind"]),
                                              str(r["status"]))
        elif len(ns) > 1 and _ok(r):
            for n in ns:
                old = share.get((n, t))
                if n in want and (old is None or len(ns) <= old.of_nodes):
                    share[(n, t)] = (
                        NodeCost(float(r["median"]) / len(ns), Source.SHARE, str(r["kind"]),
                                 of_nodes=len(ns)) if len(ns) <= MAX_SHARE_NODES
                        else NodeCost(None, Source.COARSE, str(r["kind"]), of_nodes=len(ns)))
    return {**failed, **share, **profile, **single}
