"""Vela's estimate of an int8 TFLite model: configuration, in-process compile, per-operator cycles.

`resolve_vela_config` resolves a Vela configuration (accelerator, system config and memory
mode of the ``vela.ini`` bundled with ethos-u-vela, parsed by Vela's own
``ArchitectureFeatures``; `runners.ethosu.vela_config` fills in a target's). `vela_estimate`
compiles a TFLite flatbuffer with Vela's C++ core (``ethosu.regor.compile``), reads its
optimised database (``perf`` rows -> ``source`` operators -> ``ext_key`` = TFLite operator
index) into per-operator cycles, and costs the operators Vela leaves on the CPU with
`HOST_MODEL`. Vela's own reason for each of those (its ``Warning (supported operators)`` lines,
`cpu_reasons`) goes with the operator (``vela_reason``), and Vela's peak usage per memory
(``memory_peak_bytes``: SRAM, flash / DRAM) with the estimate: ``--optimise Size`` shows there.

Operators Vela leaves on the CPU ("Passthrough") are priced by the host's cycle model
(`runners.host_model`: TFLM int8 kernels on a Cortex-M, CMSIS-NN where TFLM has an optimised
kernel), labelled ``analytic`` in the details so nobody mistakes them for a Vela number. A
campaign's NPU candidates hold only operators Vela places (`runners.ethosu.VelaCapabilities`),
so this part is non-zero only where Vela places an operator differently from those checks.
Hand-offs between NPU and host inside one compiled model are not costed separately.

Vela itself (``ethosu.vela``, ``ethosu.regor``) is imported only inside the functions that
compile or parse its configuration: importing this module costs nothing heavy.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from runners.host_model import HOST_MODEL, HostModel
from runners.vela_facts import vela_ini_path

if TYPE_CHECKING:
    from runners.tflite import ConvertedModel, OpInfo

__all__ = ["HOST_MODEL", "HostModel", "VelaConfig", "cpu_reasons", "resolve_vela_config",
           "vela_estimate", "vela_ini"]


@dataclass(frozen=True)
class VelaConfig:
    """Everything Vela is told, resolved through Vela's own ArchitectureFeatures."""

    accelerator_config: str  # "ethos-u55-128"
    system_config: str  # vela.ini System_Config section
    memory_mode: str  # vela.ini Memory_Mode section
    optimise: str  # "Performance" | "Size"
    clock_hz: float  # core_clock of the system config
    macs: int  # MACs per cycle per core
    cores: int
    arena_cache_size: int
    ini_path: str
    arena_given: bool = False  # arena_cache_size set by the target, not by the memory mode

    @property
    def regor_accelerator(self) -> str:
        """Vela's ``ethos-u55-128`` -> regor's ``EthosU55`` (as ``vela.main`` does it)."""
        parts = self.accelerator_config.split("-")[:-1]
        return "".join(p.capitalize() for p in parts)

    def describe(self) -> str:
        arena = (f", arena cache {self.arena_cache_size} B" if self.arena_given else "")
        return (f"{self.system_config} / {self.memory_mode} @ {self.clock_hz / 1e6:g} MHz"
                f", optimise {self.optimise}{arena}")


def vela_ini() -> str:
    """The path of the vela.ini bundled with ethos-u-vela; RuntimeError when it is missing."""
    p = vela_ini_path()
    if p is None:
        raise RuntimeError("ethos-u-vela's bundled vela.ini was not found")
    return str(p)


@lru_cache(maxsize=32)
def resolve_vela_config(accelerator: str, system_config: str, memory_mode: str,
                        optimise: str, arena_cache_size: int | None = None) -> VelaConfig:
    """These vela.ini sections resolved by Vela's ``ArchitectureFeatures`` (cached);
    ``arena_cache_size`` (bytes) overrides the memory mode's, as ``vela --arena-cache-size``.

    Raises Vela's own error (``ethosu.vela.errors.VelaError``) for an invalid combination.
    """
    from ethosu.vela.architecture_features import ArchitectureFeatures

    ini = vela_ini()
    with _captured_output():  # Vela prints notes on stdout
        arch = ArchitectureFeatures(
            vela_config_files=[ini], system_config=system_config, memory_mode=memory_mode,
            accelerator_config=accelerator, max_blockdep=ArchitectureFeatures.MAX_BLOCKDEP,
            verbose_config=False, arena_cache_size=arena_cache_size)
    return VelaConfig(
        accelerator_config=accelerator, system_config=arch.system_config,
        memory_mode=arch.memory_mode, optimise=optimise, clock_hz=float(arch.core_clock),
        macs=int(arch.num_macs_per_cycle), cores=int(arch.ncores),
        arena_cache_size=int(arch.arena_cache_size), ini_path=ini,
        arena_given=arena_cache_size is not None)


@contextlib.contextmanager
def _captured_output() -> Iterator[list[str]]:
    """Redirect fds 1 and 2 (Vela's C++ core prints there) into a buffer; yields [text]."""
    out: list[str] = []
    for s in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            s.flush()
    saved = [os.dup(1), os.dup(2)]
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        try:
            os.dup2(tmp.fileno(), 1)
            os.dup2(tmp.fileno(), 2)
            yield out
        finally:
            for s in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    s.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            tmp.seek(0)
            out.append(tmp.read().decode(errors="replace"))



def _compile(tflite: bytes, cfg: VelaConfig) -> tuple[Any, str]:
    """Vela's in-process compile (what ``vela.main`` does for U55/U65); returns (model, log)."""
    from ethosu import regor

    with open(cfg.ini_path) as f:
        ini = f.read()
    system = (f"[architecture]\nmacs={cfg.macs}\ncores={cfg.cores}\n"
              f"[vela]\nsystem_config_name={cfg.system_config}\n"
              f"memory_mode_name={cfg.memory_mode}\n{ini}")
    options = ("\n[compiler]\nenable_db=true\noutput_format=TFLite\ncop_format=COP1\n"
               f"\n[scheduler]\noptimize={cfg.optimise}\n"
               f"arena_size_limit={cfg.arena_cache_size}\n")
    with _captured_output() as log:
        compiled = regor.compile(cfg.regor_accelerator, tflite, "TFLITE", system,
                                 options=options, verbose=False)
    return compiled, (log[0] if log else "")


def _table(db: Any, name: str) -> list[dict[str, str]]:
    t = db.tables.get(name) if db is not None else None
    if t is None:
        return []
    header = list(t.header)
    return [dict(zip(header, row)) for row in t.data]


def _int(v: object) -> int:
    try:
        return int(str(v))
    except ValueError:
        return 0


def _op_records(db: Any, infos: Mapping[int, OpInfo]) -> dict[int, dict[str, Any]]:
    """Per TFLite operator index: Vela's per-layer rows of its optimised database summed.

    ``perf`` rows name a ``source`` operator whose ``ext_key`` is the TFLite operator index;
    every operator in ``infos`` (the converter's) gets a record even when Vela reports none.
    """
    ext_of = {r.get("id"): _int(r.get("ext_key", -1)) for r in _table(db, "source")}
    ops: dict[int, dict[str, Any]] = {}

    def op_record(index: int) -> dict[str, Any]:
        rec = ops.get(index)
        if rec is None:
            info = infos.get(index)
            rec = {"index": index, "op": info.op if info else "?",
                   "nodes": list(info.nodes) if info else [], "target": "npu",
                   "cycles": 0, "npu_cycles": 0, "macs": 0, "vela_ops": []}
            ops[index] = rec
        return rec

    for index in infos:
        op_record(index)
    for row in _table(db, "perf"):
        index = ext_of.get(row.get("source_id"), -1)
        rec = op_record(index)
        kind = row.get("operator", "")
        if kind == "Passthrough":
            rec["target"] = "cpu"
        rec["cycles"] += _int(row.get("op_cycles", 0))
        rec["npu_cycles"] += _int(row.get("npu_cycles", 0))
        rec["macs"] += _int(row.get("mac_count", 0))
        if kind not in rec["vela_ops"]:
            rec["vela_ops"].append(kind)
    return ops


def _memory_peaks(report: Any) -> dict[str, int]:
    """Vela's peak usage per memory (``SRAM``, ``DRAM``, ...) of the compiled model, bytes."""
    out: dict[str, int] = {}
    with contextlib.suppress(Exception):  # a Vela without per-memory figures reports none
        for name, m in dict(report.memories).items():
            out[str(name)] = int(m.peakUsage)
    return out


_REASON = re.compile(r"Warning \(supported operators\) operator: (?P<op>\w+), ofm: '(?P<ofm>[^']*)'"
                     r"\s*\nReason: (?P<reason>[^\n]*)(?P<more>(?:\n(?!Warning)[^\n]*)*)")


def cpu_reasons(log: str) -> list[dict[str, str]]:
    """Vela's own reason for each operator it places on the CPU, from its compile log
    (``Warning (supported operators) operator: OP, ofm: 'T'`` / ``Reason: ...`` followed by the
    constraint's text): ``[{"op", "ofm", "reason", "constraint"}]`` in log order."""
    return [{"op": m["op"], "ofm": m["ofm"], "reason": m["reason"].strip(),
             "constraint": " ".join(ln.strip() for ln in m["more"].splitlines()
                                    if ln.strip())[:400]}
            for m in _REASON.finditer(log)]


def _attach_reasons(ops: Mapping[int, dict[str, Any]], reasons: list[dict[str, str]]) -> None:
    """Vela's reasons, in operator order, onto the operators it left on the CPU (by type)."""
    queue: dict[str, list[dict[str, str]]] = {}
    for r in reasons:
        queue.setdefault(r["op"], []).append(r)
    for i in sorted(ops):
        rec = ops[i]
        if rec["target"] == "cpu" and queue.get(rec["op"]):
            r = queue[rec["op"]].pop(0)
            rec["vela_reason"] = r["reason"]
            rec["vela_ofm"] = r["ofm"]


def vela_estimate(tflite: bytes, cfg: VelaConfig, conv: ConvertedModel | None = None,
                  host: HostModel = HOST_MODEL) -> dict[str, Any]:
    """Compile ``tflite`` with Vela and turn its report into the cost and its details.

    ``conv`` (the converter's result for this TFLite) names the ONNX nodes of every TFLite
    operator and gives the MAC / byte counts the host model needs; without it, operators are
    named by index and Passthrough operators cost the host model's per-operator overhead only.
    """
    compiled, log = _compile(tflite, cfg)
    report = compiled.perf_report
    infos = {o.index: o for o in conv.ops} if conv is not None else {}
    ops = _op_records(compiled.opt_database, infos)
    total = int(report.totalCycles)
    npu_s = total / cfg.clock_hz
    host_s = 0.0
    host_ops = []
    for rec in ops.values():
        if rec["target"] != "cpu":
            continue
        info = infos.get(rec["index"])
        cost = host.op_cost(rec["op"], "int8", info.macs if info else 0,
                            info.bytes if info else 0, info.out_bytes if info else 0)
        rec["host_cycles"] = cost.cycles
        rec["host_kernel"] = cost.kernel.value
        rec["host_s"] = host.seconds(cost.cycles)
        rec["cost_source"] = "analytic"
        host_s += rec["host_s"]
        host_ops.append(rec["index"])
    node_cycles: dict[str, int] = {}
    for rec in ops.values():
        for i, name in enumerate(rec["nodes"]):
            node_cycles[name] = node_cycles.get(name, 0) + (rec["cycles"] if i == 0 else 0)
    warnings = "\n".join(ln for ln in log.splitlines() if ln.strip())
    reasons = cpu_reasons(warnings)
    _attach_reasons(ops, reasons)
    return {
        "seconds": npu_s + host_s,
        "npu_s": npu_s,
        "host_s": host_s,
        "total_cycles": total,
        "npu_cycles": int(report.npuCycles),
        "clock_hz": cfg.clock_hz,
        "mac_count": int(report.macCount),
        "npu_ops": int(report.npuOps),
        "cpu_ops": int(report.cpuOps),
        "ops": [ops[i] for i in sorted(ops)],
        "node_cycles": node_cycles,
        "analytic": {**host.describe(), "ops": host_ops, "seconds": host_s}
        if host_ops else {},
        "vela_tflite_bytes": len(compiled.model) if hasattr(compiled, "model") else 0,
        "cpu_reasons": reasons,
        "memory_peak_bytes": _memory_peaks(report),
        "vela_log": warnings[-4000:],
    }
