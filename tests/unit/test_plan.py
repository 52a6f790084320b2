"""Plans on disk: exact cover, execution-ordered partition files, path safety, bad files."""

from __future__ import annotations

import json

import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import HealthCheck, given, settings

from collage_farm.core.graph import load_graph, random_inputs
from collage_farm.core.plan import PlanError, load_plan, make_plan, write_plan
from collage_farm.core.rules import all_candidates, default_spec
from collage_farm.core.search import search
from collage_farm.core.target import BUILTIN_TARGETS as T
from tests.strategies import dags
from tests.unit.test_search import HashEstimator


def _tune(model, out):
    g = load_graph(model)
    targets = [T["ort-cpu"], T["openvino-cpu"]]
    cands = all_candidates(g, [default_spec(t, lambda n, gr: True) for t in targets])
    r = search(g, cands, HashEstimator())
    plan = make_plan(g, r, targets, estimator="test-hash")
    write_plan(plan, g, r, out)
    return g


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dags(max_nodes=10))
def test_plan_files_run_in_order_and_reproduce_outputs(tmp_path_factory, model):
    out = tmp_path_factory.mktemp("plan")
    g = _tune(model, out)
    plan, files = load_plan(out)
    d = json.loads((out / "plan.json").read_text())
    for key in ("model", "targets", "partitions", "estimated_total_s"):
        assert key in d
    for p in d["partitions"]:
        assert {"id", "target", "nodes", "file", "inputs", "outputs", "estimated_s",
                "fingerprint"} <= set(p)
    names = [n for p in plan.partitions for n in p.nodes]
    assert sorted(names) == sorted(n.name for n in g.nodes)  # each node exactly once
    feeds = random_inputs(g)
    env = dict(feeds)
    for p in plan.partitions:
        s = ort.InferenceSession(str(files[p.id]), providers=["CPUExecutionProvider"])
        outs = s.run(list(p.outputs), {t: env[t] for t in p.inputs})
        env.update(zip(p.outputs, outs))
    whole = ort.InferenceSession(g.model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, ref in zip(g.graph_outputs, whole.run(list(g.graph_outputs), feeds)):
        np.testing.assert_allclose(env[name], ref, rtol=1e-4, atol=1e-5)


def test_plan_paths_cannot_escape(tmp_path):
    model = next(iter([_first_dag()]))
    _tune(model, tmp_path)
    d = json.loads((tmp_path / "plan.json").read_text())
    for bad in ("../outside.onnx", "/etc/passwd", "partitions/../../x.onnx"):
        d["partitions"][0]["file"] = bad
        (tmp_path / "plan.json").write_text(json.dumps(d))
        with pytest.raises(PlanError, match="escapes|absolute"):
            load_plan(tmp_path)


def test_malformed_plans(tmp_path):
    with pytest.raises(PlanError, match="no plan.json"):
        load_plan(tmp_path)
    (tmp_path / "plan.json").write_text("{not json")
    with pytest.raises(PlanError, match="not valid JSON"):
        load_plan(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps({"model": "m"}))
    with pytest.raises(PlanError, match="malformed"):
        load_plan(tmp_path)


def _first_dag():
    from tests.unit.test_subgraph import _chain

    return _chain(6)


def test_plan_files_get_the_users_umask(tmp_path):
    """plan.json, partition files and the report are written as any file the user writes:
    mode 0666 less the umask (a temporary file renamed into place was 0600)."""
    import os
    import stat

    from collage_farm.campaign import TuneOptions, run_tune
    from collage_farm.core.target import parse_targets

    old = os.umask(0o027)
    try:
        run_tune(TuneOptions(model="zoo:mnist", targets=tuple(parse_targets("ort-cpu")),
                             out=tmp_path / "out", estimator="mock"))
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"plan.json", "report.html"}
    assert any(p.parent.name == "partitions" for p in files)
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o640, (p, oct(p.stat().st_mode))


def test_partition_files_from_a_builders_extractions_read_back_the_same(tmp_path):
    """`write_plan(models=...)`: the builder's extracted bytes with the partition's name and
    properties appended read back as the same `onnx.ModelProto` as a fresh extraction."""
    import onnx

    from collage_farm import zoo
    from collage_farm.execute.builder import PlanBuilder

    g = load_graph(zoo.build("mnist"), name="mnist")
    targets = [T["ort-cpu"], T["openvino-cpu"]]
    cands = all_candidates(g, [default_spec(t, lambda n, gr: True) for t in targets])
    r = search(g, cands, HashEstimator())
    plan = make_plan(g, r, targets, estimator="test-hash")
    builder = PlanBuilder(g)
    asked: list[int] = []

    def models(mask: int) -> bytes:
        asked.append(mask)
        return builder.model_bytes(mask)
    write_plan(plan, g, r, tmp_path / "fresh")
    write_plan(plan, g, r, tmp_path / "reused", models=models)
    assert asked == [p.candidate.sub_graph.mask for p in r.partitions]
    for p in plan.partitions:
        a = onnx.load(str(tmp_path / "fresh" / p.file))
        b = onnx.load(str(tmp_path / "reused" / p.file))
        assert a == b and b.graph.name == f"{plan.model}_{p.id}"
        assert {m.key: m.value for m in b.metadata_props}["collage.target"] == p.target
    load_plan(tmp_path / "reused")
