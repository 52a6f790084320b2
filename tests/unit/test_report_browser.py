"""report.html at 1300 px in a real headless Chromium: nothing overflows horizontally.

Two reports: a real (mock-cost) zoo:mnist campaign's, and a 405-node plan (a 12-layer BERT
encoder, small widths: embeddings and pooler on OpenVINO, the layers on ONNX Runtime) whose
graph must collapse its layers ("×12") and stay readable. Chromium loads a copy of each report
with a probe script appended that, once the page has loaded, writes the page's scroll width and
the right edge of its widest element into ``data-`` attributes; ``--dump-dom`` returns them and
``--screenshot`` takes the picture in the same run. A page made to overflow is rendered too,
so the check is seen to fail where it should. Without Chromium (PATH or /usr/bin/chromium)
the tests skip, saying why. ``COLLAGE_SCREENSHOTS=DIR`` keeps the screenshots there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import onnx
import pytest

from collage_farm import zoo
from collage_farm.campaign import TuneOptions, run_tune
from collage_farm.core.graph import load_graph
from collage_farm.core.target import parse_targets
from collage_farm.execute.builder import Part
from collage_farm.report import write_report
from tests.unit.test_executor import ORT, OV, write_parts

WIDTH = 1300
CHROMIUM = next((p for p in [shutil.which(n) for n in ("chromium", "chromium-browser",
                                                        "google-chrome")] + ["/usr/bin/chromium"]
                 if p and os.access(p, os.X_OK)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="no chromium on PATH or /usr/bin/chromium "
                                       "(Debian: apt-get install chromium)")
PROBE = """<script>
addEventListener('load', () => {
  const right = Math.max(0, ...[...document.querySelectorAll('body *')]
    .map(e => e.getBoundingClientRect().right));
  document.body.setAttribute('data-scroll-width', document.documentElement.scrollWidth);
  document.body.setAttribute('data-max-right', Math.ceil(right));
});
</script>"""


def _render(html_path: Path, shot: Path) -> tuple[int, int]:
    """(scroll width, widest element's right edge) of ``html_path`` at `WIDTH` px; the
    screenshot goes to ``shot``."""
    assert CHROMIUM is not None
    probe = html_path.with_name("probe_" + html_path.name)
    probe.write_text(html_path.read_text().replace("</body>", PROBE + "</body>"))
    r = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--hide-scrollbars", f"--window-size={WIDTH},900", "--virtual-time-budget=3000",
         f"--user-data-dir={html_path.parent / '.chromium'}", f"--screenshot={shot}",
         "--dump-dom", probe.as_uri()],
        capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    sw = re.search(r'data-scroll-width="(\d+)"', r.stdout)
    mr = re.search(r'data-max-right="(\d+)"', r.stdout)
    assert sw and mr, r.stdout[-500:]
    keep = os.environ.get("COLLAGE_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / shot.name)
    return int(sw.group(1)), int(mr.group(1))


def _span(a: int, b: int) -> int:
    """The node mask of positions ``a`` .. ``b - 1`` of the post-DFS order (convex)."""
    return sum(1 << i for i in range(a, b))


def test_overflow_probe_sees_a_wide_page(tmp_path: Path) -> None:
    page = tmp_path / "wide.html"
    page.write_text("<!DOCTYPE html><html><body><div style='width:2000px'>x</div></body></html>")
    sw, right = _render(page, tmp_path / "wide.png")
    assert sw > WIDTH and right > WIDTH


def test_mnist_campaign_report_fits_1300px(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    run_tune(TuneOptions(model="zoo:mnist", targets=tuple(parse_targets(
        "ort-cpu,openvino-cpu")), out=out, estimator="mock"))
    text = (out / "report.html").read_text()
    assert "<script" not in text and "1 partition " in text and "1 partitions" not in text
    assert "id='story'" in text and "class='graph'" in text
    sw, right = _render(out / "report.html", tmp_path / "report-mnist-1300.png")
    assert sw <= WIDTH and right <= WIDTH, (sw, right)
    assert (tmp_path / "report-mnist-1300.png").stat().st_size > 10_000


def test_405_node_report_collapses_layers_and_fits_1300px(tmp_path: Path) -> None:
    model = tmp_path / "bert12.onnx"
    onnx.save(zoo.build("bert", layers=12, width=32, heads=2, vocab=100, seq_len=8), model)
    g = load_graph(str(model), name="bert12")
    assert len(g.nodes) >= 400
    n = len(g.nodes)
    # the embeddings on OpenVINO, the encoder layers on ONNX Runtime, the pooler on OpenVINO
    d = write_parts(g, [Part(_span(0, 5), OV), Part(_span(5, n - 4), ORT),
                        Part(_span(n - 4, n), OV)], tmp_path / "plan", str(model))
    text = write_report(d, {}).read_text()
    svg = re.search(r"<svg class='graph'[^>]* height='(\d+)'", text)
    assert svg is not None and int(svg.group(1)) < 400  # collapsed: a few rows, not 405 boxes
    assert "×12" in text  # the encoder layer drawn once
    assert "3 partitions" in text and "openvino-cpu: 2 partitions" in text
    for p in ("p000", "p001", "p002"):
        assert f"{p} · " in text  # each partition's band is labelled
    sw, right = _render(d / "report.html", tmp_path / "report-bert12-405-nodes-1300.png")
    assert sw <= WIDTH and right <= WIDTH, (sw, right)
