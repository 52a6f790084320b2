"""Phase 4: the chosen partitions as files a runtime can execute.

A plan directory holds ``plan.json`` and one ONNX file per partition (``partitions/``). Partition
files are standalone models whose tensor names are the original model's, so an executor wires
them together by name (each also names its target and options in its ``metadata_props``:
``collage.target``, ``collage.options``, JSON); they are listed in execution order (the
search only applies a candidate once its inputs are computed). Every node of the model lies in
exactly one partition.

``plan.json`` keys (the interface scripts rely on): ``model``, ``targets``, ``partitions`` (each
with ``id``, ``target``, ``nodes``, ``file``, ``inputs``, ``outputs``, ``estimated_s``,
``fingerprint``; plus ``penalty_s``, ``op_types``, ``rule``, ``toolchain``, ``device``,
``options``: the target's toolchain options the partition is compiled with, e.g. Vela's
``optimise``, and on an Ethos-U board ``ethos``: the per-partition simulated figures of
`collage_farm.postsearch.ethos_parts`),
``estimated_total_s``, ``graph_inputs``, ``graph_outputs``, ``estimator``, ``transition``.

Loading validates paths: a partition file must resolve inside the plan directory, so a plan
handed over by someone else cannot make the executor read arbitrary files.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

from collage_farm.core.graph import DataflowGraph
from collage_farm.core.search import SearchResult
from collage_farm.core.target import Target

PLAN_FILE = "plan.json"
PLAN_VERSION = 1


class PlanError(ValueError):
    """A plan directory that is missing, malformed or unsafe."""


@dataclass(frozen=True)
class PartitionEntry:
    id: str
    target: str
    toolchain: str
    device: str
    nodes: tuple[str, ...]
    op_types: tuple[str, ...]
    file: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    estimated_s: float
    penalty_s: float
    fingerprint: str
    rule: str = ""
    options: tuple[tuple[str, object], ...] = ()
    ethos: dict | None = field(default=None, compare=False)  # JSON figures, not identity


@dataclass(frozen=True)
class Plan:
    model: str
    targets: tuple[dict, ...]
    partitions: tuple[PartitionEntry, ...]
    estimated_total_s: float
    graph_inputs: tuple[str, ...]
    graph_outputs: tuple[str, ...]
    estimator: str = ""
    transition: str = ""
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        d = {
            "version": PLAN_VERSION,
            "model": self.model,
            "targets": list(self.targets),
            "partitions": [
                _partition_json(p) for p in self.partitions
            ],
            "estimated_total_s": self.estimated_total_s,
            "graph_inputs": list(self.graph_inputs),
            "graph_outputs": list(self.graph_outputs),
            "estimator": self.estimator,
            "transition": self.transition,
        }
        d.update(self.extra)
        return d

    def target_of_node(self) -> dict[str, str]:
        return {n: p.target for p in self.partitions for n in p.nodes}


def _partition_json(p: PartitionEntry) -> dict:
    d = {**asdict(p), "nodes": list(p.nodes), "op_types": list(p.op_types),
         "inputs": list(p.inputs), "outputs": list(p.outputs), "options": dict(p.options)}
    if p.ethos is None:
        del d["ethos"]
    return d


def target_json(t: Target) -> dict:
    return {
        "id": t.id,
        "toolchain": t.toolchain,
        "device": {"kind": t.device.kind, "device_id": t.device.device_id,
                   "memory_scope": t.device.memory_scope},
        "options": {k: v for k, v in t.options},
        "measure_key": t.measure_key,
    }


def _safe(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s)[:48]


def make_plan(graph: DataflowGraph, result: SearchResult, targets: Sequence[Target], *,
              estimator: str = "", transition: str = "", model: str | None = None) -> Plan:
    entries = []
    for k, pp in enumerate(result.partitions):
        c = pp.candidate
        sg = c.sub_graph
        pid = f"p{k:03d}"
        entries.append(PartitionEntry(
            id=pid,
            target=c.target.id,
            toolchain=c.target.toolchain,
            device=c.target.device.label,
            nodes=tuple(c.node_names),
            op_types=tuple(c.op_types),
            file=f"partitions/{pid}_{_safe(c.target.id)}.onnx",
            inputs=sg.input_tensors,
            outputs=sg.output_tensors,
            estimated_s=pp.cost.seconds,
            penalty_s=pp.penalty_s,
            fingerprint=c.fingerprint,
            rule=c.rule,
            options=c.target.options,
        ))
    return Plan(
        model=model or graph.name,
        targets=tuple(target_json(t) for t in targets),
        partitions=tuple(entries),
        estimated_total_s=result.total_s,
        graph_inputs=graph.graph_inputs,
        graph_outputs=graph.graph_outputs,
        estimator=estimator,
        transition=transition,
    )


def write_plan(plan: Plan, graph: DataflowGraph, result: SearchResult, out_dir: str | Path,
               models: Callable[[int], bytes] | None = None) -> Path:
    """Write ``plan.json`` and the partition files; the JSON is renamed in last (atomic).

    ``models(mask)``, when given, is the node set ``mask`` already extracted as an ONNX model
    by `collage_farm.core.subgraph.SubGraph.extract` (a campaign's plan builder keeps the
    ones it ran): the file is those bytes with the partition's graph name and properties
    appended as a second serialised `onnx.ModelProto`, which protobuf merges into the first
    when the file is read (a few hundred MB of a transformer are then neither extracted nor
    serialised again). Without it, each partition is extracted here. Partition files of an
    earlier plan in ``out_dir`` that this one does not name are removed after plan.json."""
    out = Path(out_dir)
    (out / "partitions").mkdir(parents=True, exist_ok=True)
    check_cover(plan, graph)
    for entry, pp in zip(plan.partitions, result.partitions):
        props = {"collage.target": entry.target,
                 "collage.options": json.dumps(dict(entry.options), sort_keys=True,
                                               default=str)}
        name = f"{plan.model}_{entry.id}"
        if models is not None:
            tail = onnx.ModelProto()
            tail.graph.name = name
            onnx.helper.set_model_props(tail, props)
            data = models(pp.candidate.sub_graph.mask) + tail.SerializeToString()
        else:
            model = pp.candidate.sub_graph.extract(name=name)
            onnx.helper.set_model_props(model, {
                **{m.key: m.value for m in model.metadata_props}, **props})
            data = model.SerializeToString()
        _atomic_write(out / entry.file, data)
    _atomic_write(out / PLAN_FILE, json.dumps(plan.to_json(), indent=2).encode())
    _remove_stale(out, {entry.file for entry in plan.partitions})
    return out / PLAN_FILE


def _remove_stale(out: Path, keep: set[str]) -> None:
    """Partition files an earlier plan left in ``out`` (``partitions/pNNN_*.onnx`` that the
    plan.json just written does not name): a directory holds one plan's files."""
    for f in (out / "partitions").glob("p[0-9][0-9][0-9]_*.onnx"):
        if f.relative_to(out).as_posix() not in keep:
            f.unlink(missing_ok=True)


def _atomic_write(path: Path, data: bytes) -> None:
    """``data`` to a hidden file beside ``path``, renamed over it: readers see the old file or
    the new one. The file gets the user's umask like any other (``mkstemp`` would make it
    0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".tmp-{uuid.uuid4().hex}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_cover(plan: Plan, graph: DataflowGraph) -> None:
    """Every node of the model in exactly one partition."""
    seen: dict[str, str] = {}
    for p in plan.partitions:
        for n in p.nodes:
            if n in seen:
                raise PlanError(f"node {n!r} is in partitions {seen[n]} and {p.id}")
            seen[n] = p.id
    missing = [nd.name for nd in graph.nodes if nd.name not in seen]
    if missing:
        raise PlanError(f"nodes in no partition: {missing[:5]}")


def resolve_inside(root: Path, rel: str) -> Path:
    """``root/rel`` if it stays inside ``root`` (no absolute paths, no '..' escapes)."""
    if os.path.isabs(rel):
        raise PlanError(f"partition file {rel!r} is an absolute path; plans use relative paths")
    if "\0" in rel:
        raise PlanError(f"partition file {rel!r} contains a NUL byte")
    base = root.resolve()
    p = (base / rel).resolve()
    if p != base and base not in p.parents:
        raise PlanError(f"partition file {rel!r} escapes the plan directory {root}")
    return p


def load_plan(plan_dir: str | Path) -> tuple[Plan, dict[str, Path]]:
    """Read a plan directory; returns the plan and each partition's resolved file path."""
    root = Path(plan_dir)
    pj = root / PLAN_FILE if root.is_dir() else root
    root = pj.parent
    if not pj.exists():
        raise PlanError(f"{pj}: no plan.json")
    try:
        d = json.loads(pj.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PlanError(f"{pj}: not valid JSON ({e})") from None
    try:
        parts = tuple(
            PartitionEntry(
                id=str(p["id"]), target=str(p["target"]), toolchain=str(p.get("toolchain", "")),
                device=str(p.get("device", "")), nodes=tuple(p["nodes"]),
                op_types=tuple(p.get("op_types", ())), file=str(p["file"]),
                inputs=tuple(p["inputs"]), outputs=tuple(p["outputs"]),
                estimated_s=float(p["estimated_s"]), penalty_s=float(p.get("penalty_s", 0.0)),
                fingerprint=str(p["fingerprint"]), rule=str(p.get("rule", "")),
                options=tuple(sorted(dict(p.get("options") or {}).items())),
                ethos=p.get("ethos"),
            )
            for p in d["partitions"]
        )
        plan = Plan(
            model=str(d["model"]), targets=tuple(d["targets"]), partitions=parts,
            estimated_total_s=float(d["estimated_total_s"]),
            graph_inputs=tuple(d.get("graph_inputs", ())),
            graph_outputs=tuple(d.get("graph_outputs", ())),
            estimator=str(d.get("estimator", "")), transition=str(d.get("transition", "")),
            extra={k: v for k, v in d.items() if k not in {
                "version", "model", "targets", "partitions", "estimated_total_s",
                "graph_inputs", "graph_outputs", "estimator", "transition"}},
        )
    except (KeyError, TypeError, ValueError) as e:
        raise PlanError(f"{pj}: malformed plan ({type(e).__name__}: {e})") from None
    files = {}
    for p in plan.partitions:
        f = resolve_inside(root, p.file)
        if not f.exists():
            raise PlanError(f"{pj}: partition {p.id} file {p.file} is missing")
        files[p.id] = f
    return plan, files


def load_partition(path: Path) -> onnx.ModelProto:
    return onnx.load(str(path))
