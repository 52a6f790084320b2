"""Benchmark the simulated Ethos-U toolchain: estimates per NPU configuration, side by side.

Why: the Vela runner's numbers are estimates, not timings, so what needs a baseline is (1) what
it says for whole zoo models on every accelerator configuration the targets offer (the Ethos-U
column of the toolchain comparison: more MACs per cycle should help compute-bound models and
barely help memory-bound ones), (2) how much of each model it takes (capability coverage:
nodes on the NPU / nodes), and (3) what a build costs on a farm node (int8 conversion + Vela
compile, wall time), which bounds how many candidates per second an ``ethosu_sim`` slot serves.

    python bench/ethos_u.py [--out bench/results] [--quick]

Results go to bench/results/ethosu-<host>.md with the machine description and load average
(other jobs may share the machine; build times are wall times).
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from collage_farm import zoo
from collage_farm.core.graph import load_graph
from collage_farm.core.target import BUILTIN_TARGETS, ETHOS_U_CONFIGS
from runners.base import BuildInput, DeviceDescription, MeasureConfig, MeasureInput
from runners.calibration import calibrate
from runners.ethosu import VelaCapabilities, VelaToolchain

#: zoo models at sizes a 2-core VM compiles in seconds (transformers: coverage only)
MODELS: dict[str, dict[str, object]] = {
    "mnist": {},
    "mobilenet_v2": {"image_size": 96},
    "resnet18": {"image_size": 64},
    "resnet50": {"image_size": 64},
}
COVERAGE_ONLY: dict[str, dict[str, object]] = {
    "gpt2": {"layers": 2, "width": 256, "heads": 4, "vocab": 1000, "seq_len": 32},
    "bert": {"layers": 2, "width": 256, "heads": 4, "vocab": 1000, "seq_len": 64},
}


def machine() -> list[str]:
    dev = DeviceDescription.host_cpu()
    return [
        f"- date: {datetime.now(timezone.utc).isoformat(timespec='seconds')}",
        f"- host: {socket.gethostname()}, {dev.name}, {dev.cores} cores",
        f"- python {platform.python_version()}, {VelaToolchain().version()}",
        "- load average at start (1/5/15 min): "
        + " / ".join(f"{x:.2f}" for x in os.getloadavg()),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--quick", action="store_true", help="mnist and mobilenet_v2 only")
    args = ap.parse_args()
    models = {k: v for k, v in MODELS.items() if not args.quick or k in ("mnist",
                                                                          "mobilenet_v2")}
    tc = VelaToolchain()
    caps = VelaCapabilities()
    lines = ["# Simulated Ethos-U (Vela) estimates, whole zoo models", "", *machine(), ""]
    head = "| model | nodes on NPU | " + " | ".join(ETHOS_U_CONFIGS) + " |"
    lines += ["Estimate per accelerator configuration (ms; Vela defaults: U55 "
              "Ethos_U55_High_End_Embedded/Shared_Sram 500 MHz, U65 Ethos_U65_Client_Server/"
              "Dedicated_Sram_384KB 1 GHz), then build wall time (s) in brackets.", "",
              head, "|" + "---|" * (2 + len(ETHOS_U_CONFIGS))]
    for name, kw in models.items():
        g = load_graph(zoo.build(name, **kw), name=name)
        taken = sum(caps.supports(n, g) for n in g.nodes)
        ranges = tuple((k, lo, hi) for k, (lo, hi) in calibrate(g).items())
        data = g.model.SerializeToString()
        cells = []
        for acc in ETHOS_U_CONFIGS:
            t0 = time.perf_counter()
            b = tc.build(BuildInput(f"{name}-{acc}", BUILTIN_TARGETS[acc], data, ranges))
            dt = time.perf_counter() - t0
            if not b.ok:
                cells.append(f"{b.status.value}: {b.error[:60]}")
                continue
            m = tc.measure(MeasureInput(b, MeasureConfig()))
            est = b.detail("vela")
            cpu = f", {est['cpu_ops']} on CPU" if est["cpu_ops"] else ""
            cells.append(f"{m.seconds * 1e3:.3f} ({dt:.2f} s{cpu})")
        size = ", ".join(f"{k}={v}" for k, v in kw.items())
        row = f"| {name}{f' ({size})' if size else ''} | {taken}/{len(g.nodes)} | "
        lines.append(row + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    lines += ["", "Capability coverage of the transformers (nodes Vela takes / nodes; the rest "
              "are not converted: LayerNorm pieces, Gather, attention Softmax over a non-channel "
              "axis, ...):", ""]
    for name, kw in COVERAGE_ONLY.items():
        g = load_graph(zoo.build(name, **kw), name=name)
        refused: dict[str, int] = {}
        for n in g.nodes:
            if not caps.supports(n, g):
                refused[n.op_type] = refused.get(n.op_type, 0) + 1
        taken = len(g.nodes) - sum(refused.values())
        lines.append(f"- {name}: {taken}/{len(g.nodes)} taken; refused by op type: "
                     + ", ".join(f"{k} {v}" for k, v in sorted(refused.items())))
        print(lines[-1], flush=True)
    lines += ["", "- load average at end (1/5/15 min): "
              + " / ".join(f"{x:.2f}" for x in os.getloadavg())]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"ethosu-{socket.gethostname()}.md"
    path.write_text("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
