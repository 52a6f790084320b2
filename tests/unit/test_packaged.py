"""Real exported models from pip wheels (``pkg:NAME``): registry, loading, candidates, numerics.

The packages are an optional extra (``pip install -e '.[real]'``), not part of ``.[test]``: a
model whose package is absent is skipped, and the skip reason is the exact install command.
Each check is one model at its default (small) shapes, so each test stays within seconds.
"""

from __future__ import annotations

import io
import itertools
import json
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from collage_farm.cli import main
from collage_farm.core.candidate import CandidatePartition
from collage_farm.core.cost import Cost
from collage_farm.core.graph import DataflowGraph, ModelError, random_inputs
from collage_farm.core.plan import load_plan, make_plan, write_plan
from collage_farm.core.rules import RuleOptions, all_candidates, default_spec
from collage_farm.core.search import PlannedPartition, SearchResult
from collage_farm.core.subgraph import SubGraph
from collage_farm.core.target import parse_targets
from collage_farm.execute import PlanExecutor, reference_model
from collage_farm.zoo import packaged
from collage_farm.zoo.source import load_source
from runners.registry import capabilities_for

NAMES = packaged.names()


def _need(name: str) -> None:
    if not packaged.installed(name):
        pytest.skip(f"{packaged.get(name).requirement} not installed: "
                    f"{packaged.get(name).install_command}")


_GRAPHS: dict[str, DataflowGraph] = {}


def _graph(name: str) -> DataflowGraph:
    """``pkg:NAME`` at its default shapes, loaded once per session (loading is the slow part)."""
    _need(name)
    if name not in _GRAPHS:
        _GRAPHS[name] = load_source(f"pkg:{name}")
    return _GRAPHS[name]


def _session(model: onnx.ModelProto | Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


# --- registry ------------------------------------------------------------------------------


def test_registry_entries_are_well_formed() -> None:
    assert {"ppocr-det", "ppocr-rec", "ppocr-cls", "magika"} <= set(NAMES)
    for name in NAMES:
        e = packaged.get(name)
        assert e.name == name and e.spec == f"pkg:{name}"
        assert re.fullmatch(r"[a-z][a-z0-9_]*", e.package), e.package
        assert re.fullmatch(r"\d+(\.\d+)+", e.version), e.version
        assert e.requirement == f"{e.package}=={e.version}"
        assert e.install_command == f"pip install --no-deps {e.requirement}"
        assert e.path.endswith(".onnx") and not Path(e.path).is_absolute()
        assert e.shapes and all(isinstance(d, int) and d > 0
                                for shape in e.shapes.values() for d in shape)
        assert len(e.description) > 20


def test_registry_matches_the_real_extra_in_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert sorted(extras["real"]) == sorted({packaged.get(n).requirement for n in NAMES})
    assert not set(extras["real"]) & set(extras["test"])  # CI's .[test] stays without them


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(ModelError, match="pkg:magika"):
        load_source("pkg:nope")


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    fake = packaged.PackagedModel("fake", "collage_farm_no_such_pkg", "9.9.9", "m.onnx",
                                  {"x": (1, 4)}, "a model in a package nobody installed")
    monkeypatch.setitem(packaged._REGISTRY, "fake", fake)
    assert not packaged.installed("fake")
    want = "pip install --no-deps collage_farm_no_such_pkg==9.9.9"
    with pytest.raises(packaged.PackageNotInstalledError, match=re.escape(want)):
        load_source("pkg:fake")
    with pytest.raises(ModelError, match="--layers applies to zoo models only"):
        load_source("pkg:fake", layers=2)
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        rc = main(["compare", "pkg:fake", "--rounds", "1"])
    assert rc == 2
    assert want in err.getvalue() and err.getvalue().count("\n") == 1
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["zoo", "list"]) == 0
    assert "pkg:fake" in out.getvalue() and f"not installed: {want}" in out.getvalue()


def test_missing_file_in_an_installed_package(monkeypatch: pytest.MonkeyPatch) -> None:
    # an installed package of another version may lack the file: say which version is pinned
    fake = packaged.PackagedModel("gone", "onnx", "0.0.1", "models/nothing_here.onnx",
                                  {"x": (1,)}, "a file the installed onnx does not ship")
    monkeypatch.setitem(packaged._REGISTRY, "gone", fake)
    with pytest.raises(packaged.PackageNotInstalledError,
                       match=r"nothing_here\.onnx not found.*onnx==0\.0\.1"):
        packaged.locate("gone")


# --- each installed model --------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_loads_with_every_input_bound_to_the_default_shape(name: str) -> None:
    g = _graph(name)
    e = packaged.get(name)
    assert g.name == name
    assert len(g.nodes) > 0
    assert set(g.graph_inputs) == set(e.shapes)
    for inp, shape in e.shapes.items():
        assert g.tensors[inp].shape == shape
    assert all(n.name for n in g.nodes)
    assert not any(n.op_type == "Constant" for n in g.nodes)  # folded into initializers
    # every tensor a node produces has a concrete shape (static inference or the probe)
    assert all(o in g.tensors for n in g.nodes for o in n.outputs if o)


@pytest.mark.parametrize("name", NAMES)
def test_candidates_enumerate_for_cpu_toolchains(name: str) -> None:
    g = _graph(name)
    specs = []
    for t in parse_targets("ort-cpu,openvino-cpu"):
        caps = capabilities_for(t.toolchain)
        specs.append(default_spec(t, caps.supports, caps.style, RuleOptions(max_depth=3)))
    cands = all_candidates(g, specs)
    assert len(cands) > len(g.nodes)
    covered = 0
    for c in cands:
        covered |= c.sub_graph.mask
    assert covered == g.all_mask  # every node can be placed somewhere


@pytest.mark.parametrize("name", NAMES)
def test_loaded_model_matches_the_original_file_in_ort(name: str) -> None:
    g = _graph(name)
    feeds = random_inputs(g, seed=1)
    got = _session(g.model).run(list(g.graph_outputs), feeds)
    ref = _session(packaged.locate(name)).run(list(g.graph_outputs), feeds)
    for a, b in zip(got, ref):
        assert a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_no_runtime_shape_vectors_cross_node_boundaries(name: str) -> None:
    """Regression (magika, ppocr-rec): Reshape/Expand targets computed by Shape -> Concat
    chains were runtime tensors; a candidate cut between them got random integers for the
    target and failed to measure. Bound and folded, they are initializers."""
    g = _graph(name)
    assert not [n.name for n in g.nodes if n.op_type in ("Shape", "Size")]
    for n in g.nodes:
        if n.op_type in ("Reshape", "Expand") and len(n.inputs) > 1:
            assert n.inputs[1] in g.initializers, (n.name, n.inputs[1])


def test_user_shape_overrides_the_default_for_that_input() -> None:
    _need("ppocr-det")
    g = load_source("pkg:ppocr-det", {"x": (1, 3, 64, 96)})
    assert g.tensors["x"].shape == (1, 3, 64, 96)
    out = g.tensors[g.graph_outputs[0]].shape
    assert out == (1, 1, 64, 96)


def test_cls_model_with_dim_value_minus_one_binds() -> None:
    """Regression: paddle2onnx writes the batch dim as dim_value -1, which `--shape` rejected
    ('dim 0 is fixed to -1 in the model, 1 given')."""
    _need("ppocr-cls")
    raw = onnx.load(str(packaged.locate("ppocr-cls")))
    assert raw.graph.input[0].type.tensor_type.shape.dim[0].dim_value == -1
    g = load_source("pkg:ppocr-cls", {"x": (2, 3, 48, 192)})
    assert g.tensors["x"].shape == (2, 3, 48, 192)
    assert g.tensors[g.graph_outputs[0]].shape == (2, 2)


def test_magika_int32_input_and_ml_domain_import() -> None:
    g = _graph("magika")
    assert g.tensors["bytes"].dtype == "int32"
    assert any(i.domain == "ai.onnx.ml" for i in g.model.opset_import)
    assert random_inputs(g)["bytes"].dtype == np.int32


# --- plans of pkg models round-trip ----------------------------------------------------------


def _chunked_plan(g: DataflowGraph, out: Path, k: int = 3) -> Path:
    """A plan alternating ORT and OpenVINO over ``k`` runs of the post-DFS order."""
    orti, ov = parse_targets("ort-cpu,openvino-cpu")
    n = len(g.nodes)
    bounds = [round(i * n / k) for i in range(k + 1)]
    planned = tuple(
        PlannedPartition(CandidatePartition(
            SubGraph(g, sum(1 << j for j in range(a, b))), (orti, ov)[i % 2]), Cost(1e-5), 0.0)
        for i, (a, b) in enumerate(itertools.pairwise(bounds)) if b > a)
    result = SearchResult(planned, 1e-5 * len(planned), 0, 0, 0, 0, 0.0)
    plan = make_plan(g, result, [orti, ov], estimator="test")
    plan.extra["source"] = f"pkg:{g.name}"
    plan.extra["shapes"] = {i: list(g.tensors[i].shape) for i in g.graph_inputs}
    write_plan(plan, g, result, out)
    return out


def test_plan_source_pkg_round_trips_through_run(tmp_path: Path) -> None:
    pytest.importorskip("openvino")
    _need("ppocr-cls")
    g = load_source("pkg:ppocr-cls", {"x": (1, 3, 48, 96)})
    d = _chunked_plan(g, tmp_path / "plan")
    plan, _ = load_plan(d)
    ref = reference_model(plan, None, d)  # resolved from plan.json's source and shapes
    dims = [x.dim_value for x in ref.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 48, 96]
    ex = PlanExecutor(d)
    assert len(ex.partitions) == 3
    errors = ex.check()  # against the original file run whole in ORT
    assert all(v < 1e-3 for v in errors.values())
    out = io.StringIO()
    with redirect_stdout(out), redirect_stderr(io.StringIO()):
        rc = main(["run", str(d), "--rounds", "1", "--min-round-s", "0", "--json"])
    assert rc == 0
    res = json.loads(out.getvalue())
    assert res["check"]["ok"] and set(res["singles_s"]) == {"ort-cpu", "openvino-cpu"}
