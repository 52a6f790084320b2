"""report.html: self-contained, and it renders in a real headless Chromium without errors.

The report comes from a real (mock-cost) campaign and a real `collage-farm run --report` of a
mixed ORT/OpenVINO plan. Chromium (Debian package ``chromium``) loads a copy of the report with
a probe script appended that records, once the page has loaded, whether every image decoded;
``--dump-dom`` returns the DOM with that record, and Chromium's console log (``--enable-logging
=stderr``) must hold no error. Without Chromium the browser test skips, saying why.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from collage_farm.campaign import TuneOptions, run_tune
from collage_farm.cli import main
from collage_farm.core.target import parse_targets
from collage_farm.report import layered_layout, write_report

CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(n)), None)
PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = [...document.images];
  document.body.setAttribute('data-probe', 'loaded');
  document.body.setAttribute('data-imgs',
    imgs.map(i => (i.complete && i.naturalWidth > 0) ? 'ok' : 'broken').join(','));
});
</script>"""


@pytest.fixture(scope="module")
def mock_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("mock") / "plan"
    s = run_tune(TuneOptions(model="zoo:mnist", targets=tuple(parse_targets(
        "ort-cpu,openvino-cpu")), out=out, estimator="mock"))
    return out, s


def _render(html_path: Path) -> tuple[str, str]:
    assert CHROMIUM is not None
    probe = html_path.with_name("probe_" + html_path.name)
    probe.write_text(html_path.read_text().replace("</body>", PROBE + "</body>"))
    r = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000",
         f"--user-data-dir={html_path.parent / '.chromium'}", "--dump-dom",
         probe.as_uri()],
        capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, r.stderr


def test_layered_layout_is_topological() -> None:
    pos = layered_layout(["a", "b", "c", "d"], [("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])
    assert pos["a"][0] == 0 and pos["b"][0] == pos["c"][0] == 1 and pos["d"][0] == 2
    assert pos["b"][1] != pos["c"][1]


def test_mock_campaign_report_is_self_contained(mock_plan: tuple[Path, dict]) -> None:
    out, s = mock_plan
    assert s["report"] == str(out / "report.html")
    assert "skipped" in s["verify"]  # mock costs: no end-to-end claim
    text = (out / "report.html").read_text()
    for png in ("report_graph.png", "report_costs.png"):
        assert (out / png).stat().st_size > 1000
    assert "MOCK" in text
    assert not re.search(r"""(src|href)\s*=\s*['"](?!data:)""", text)  # nothing fetched
    assert text.count("data:image/png;base64,") >= 2
    assert "<script" not in text
    plan = json.loads((out / "plan.json").read_text())
    assert "id='partitions'" in text
    for p in plan["partitions"]:
        assert f"<td>{p['id']}</td>" in text
    if plan.get("runner_ups"):
        assert "same nodes on" in text or "pruned" in text


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (Debian: apt-get install chromium)")
def test_report_renders_in_headless_chromium(mock_plan: tuple[Path, dict], tmp_path: Path
                                             ) -> None:
    out, _ = mock_plan
    dom, log = _render(out / "report.html")
    assert 'data-probe="loaded"' in dom
    imgs = re.search(r'data-imgs="([^"]*)"', dom)
    assert imgs is not None and imgs.group(1)
    assert set(imgs.group(1).split(",")) == {"ok"}, imgs.group(1)
    assert "Plan for mnist" in dom and "Partitions" in dom
    console = [ln for ln in log.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]
    assert not console, console


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium (Debian: apt-get install chromium)")
def test_measured_report_of_a_mixed_plan_renders(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    from collage_farm import zoo
    from collage_farm.core.graph import load_graph
    from collage_farm.execute.builder import Part
    from tests.unit.test_executor import ORT, OV, write_parts

    g = load_graph(zoo.build("mnist"), name="mnist")
    half = sum(1 << i for i in range(len(g.nodes) // 2))
    d = write_parts(g, [Part(half, ORT), Part(g.all_mask & ~half, OV)], tmp_path / "p",
                    "zoo:mnist")
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["run", str(d), "--json", "--report", "--rounds", "2",
                     "--min-round-s", "0.005"]) == 0
    out = json.loads(buf.getvalue())
    text = (d / "report.html").read_text()
    assert "additive error" in text and "apparent loss" in text
    assert "measured in the plan (ms)" in text
    dom, log = _render(d / "report.html")
    imgs = re.search(r'data-imgs="([^"]*)"', dom)
    assert imgs is not None and set(imgs.group(1).split(",")) == {"ok"}
    assert f"{out['plan_measured_s'] * 1e3:.4f}" in dom
    assert not [ln for ln in log.splitlines() if "CONSOLE" in ln or "Uncaught" in ln]


def test_report_needs_a_plan(tmp_path: Path) -> None:
    from collage_farm.core.plan import PlanError

    with pytest.raises(PlanError):
        write_report(tmp_path, {})
