"""Vela whole's split from one Vela compile of the whole model, against the capability check.

Why: an Ethos-U campaign's baseline ("Vela whole") is the split Vela itself makes when it
compiles the whole model (`collage_farm.postsearch.vela_split`); the NPU target's capability
check (`runners.ethosu.VelaCapabilities`) restates Vela's constraints per node and decides what
every candidate may hold. Where the two place a node differently, one of them is wrong. Per
model (bench sizes) and built-in board this prints: where the split came from, what was
compiled, how many TFLite operators Vela left on the CPU, the partitions (NPU + host), the
wall time of the conversion and compile, and every node the two place differently.

    python bench/vela_whole_check.py [--models mnist,...] [--systems A,B] [--out FILE]

Figures are Vela's placement (deterministic); the wall times depend on the machine's load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_farm import zoo
from collage_farm.config import load_config
from collage_farm.core.graph import DataflowGraph, load_graph
from collage_farm.postsearch.vela_split import vela_split
from collage_farm.postsearch.vela_whole import ethos_u_board
from collage_farm.zoo.source import load_source

#: the bench models at the sizes bench/ethos_u.py uses
MODELS: dict[str, dict[str, object]] = {
    "mnist": {}, "resnet18": {"image_size": 64}, "mobilenet_v2": {"image_size": 96},
    "gpt2": {"layers": 2, "width": 256, "heads": 4, "vocab": 1000, "seq_len": 32},
    "bert": {"layers": 2, "width": 256, "heads": 4, "vocab": 1000, "seq_len": 64},
    "pkg:magika": {}, "pkg:ppocr-cls": {}, "pkg:ppocr-det": {}, "pkg:ppocr-rec": {},
}
SYSTEMS = "ethos-u55-128,ethos-u55-256,ethos-u65-256,ethos-u85-256"


def _graph(name: str) -> DataflowGraph:
    if name.startswith("pkg:"):
        return load_source(name)
    return load_graph(zoo.build(name, **MODELS[name]), name=name)  # type: ignore[arg-type]


def rows(models: list[str], systems: list[str]) -> list[str]:
    """One table row per model and board, printed as they come."""
    out = []
    for name in models:
        g = _graph(name)
        for system in systems:
            board = ethos_u_board(load_config(builtin_system=system).selected_targets)
            assert board is not None, system
            t0 = time.perf_counter()
            split = vela_split(g, board)
            wall = time.perf_counter() - t0
            npu = sum(p.target == board.npu for p in split.parts)
            by = {}
            for h in split.on_host:
                by[h.source] = by.get(h.source, 0) + 1
            host = ", ".join(f"{k} {v}" for k, v in sorted(by.items())) or "-"
            out.append(f"| {system} | {name} | {len(g.nodes)} | {split.source.value} | "
                       f"{split.note} | {npu} + {len(split.parts) - npu} | {host} | "
                       f"{wall:.1f} | {'; '.join(split.disagreements) or 'none'} |")
            print(out[-1], flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--systems", default=SYSTEMS)
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args()
    lines = ["- load average at start (1/5/15 min): "
             + " / ".join(f"{x:.2f}" for x in os.getloadavg()), "",
             "| board | model | nodes | split from | what was compiled | partitions (NPU + "
             "host) | host nodes by source | wall (s, incl. calibration) | disagreements |",
             "|---|---|---|---|---|---|---|---|---|"]
    lines += rows(args.models.split(","), args.systems.split(","))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
