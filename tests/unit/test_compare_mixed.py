"""``collage-farm compare`` with Ethos-U parts beside timed targets, and targets that fail.

An Ethos-U NPU listed with ONNX Runtime gets its Vela-whole figure on its board (a real Vela
compile, the Cortex-M host's cycle model), labelled simulated, instead of "no whole-model
measurement"; a target that cannot build the model (LiteRT on an ``If`` gated by ``Greater``)
is printed with why, and the chart lists it under the bars.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from matplotlib.image import imread

from collage_farm.cli import main
from collage_farm.report import plot_bars


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_ethos_target_beside_ort_gets_a_simulated_vela_whole_figure() -> None:
    pytest.importorskip("ethosu.vela")
    rc, out, err = _cli(["compare", "zoo:mnist", "--targets", "ort-cpu,ethos-u55-128",
                         "--rounds", "2", "--min-round-s", "0.005", "--json"])
    assert rc == 0, err
    d = json.loads(out)
    assert d["simulated_s"]["ethos-u55-128"] > 0
    assert "simulated" in d["simulated_figures"]
    assert "ethos-u55-128" not in d["single_errors"]
    # the split was read back from one Vela compile of the whole model, and says so
    assert d["vela_whole_source"]["ethos-u55-128"].startswith("vela-compile: one Vela compile")
    assert d["singles_s"]["ort-cpu"] > 0
    rc, out, err = _cli(["compare", "zoo:mnist", "--targets", "ort-cpu,ethos-u55-128",
                         "--rounds", "2", "--min-round-s", "0.005"])
    assert rc == 0 and "ethos-u55-128 Vela whole (simulated)" in out, out + err
    assert "ethos-u55-128 vela-whole split: vela-compile" in out
    assert "no whole-model measurement" not in out


def test_failed_target_is_printed_with_why_and_listed_under_the_chart(tmp_path: Path) -> None:
    pytest.importorskip("ai_edge_litert")
    plot = tmp_path / "c.png"
    rc, out, err = _cli(["compare", "zoo:if_gate", "--targets", "ort-cpu,litert-cpu",
                         "--rounds", "2", "--min-round-s", "0.005", "--plot", str(plot)])
    assert rc == 0, err
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("litert-cpu"))
    assert "failed:" in line and "no TFLite mapping for Greater" in line
    assert plot.stat().st_size > 1000
    # the notes under the bars are drawn: the same bars with them make a taller chart
    bare = plot_bars([("ort-cpu", 1e-5)], tmp_path / "bare.png", "t")
    noted = plot_bars([("ort-cpu", 1e-5)], tmp_path / "noted.png", "t",
                      notes=["litert-cpu: failed: no TFLite mapping for Greater"])
    assert imread(str(noted)).shape[0] > imread(str(bare)).shape[0]


def test_npu_alone_gets_its_board_figure_and_nothing_is_timed() -> None:
    """An NPU named without its host and without timed targets: its Vela-whole figure on the
    built-in board that declares it, and no interleaved run over zero callables."""
    pytest.importorskip("ethosu.vela")
    rc, out, err = _cli(["compare", "zoo:mnist", "--targets", "ethos-u55-128",
                         "--rounds", "2", "--min-round-s", "0.005"])
    assert rc == 0, err
    assert "nothing timed here" in out
    assert "ethos-u55-128 Vela whole (simulated)" in out
