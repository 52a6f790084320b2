"""Bad input, end to end: every malformed model, config and cost table gets one clear line.

Why this file exists beside test_graph.py / test_config.py / test_costtable.py: those check the
API of one module each. A user meets the *command line*: what matters there is that each bad
input ends in one line on stderr naming the problem, exit status 2, and nothing written to
``--out`` (not even an empty directory). So every case here runs twice: through the API
(`load_graph`, `load_config`, `CostTable`) and through the real CLI in a fresh interpreter
(``python -m collage_farm.cli``, and the ``collage-farm`` console script once). The CLI cases
run as one parallel batch (a module fixture) because each interpreter costs ~1 s to start.

The 2 GiB+ model is real: its external data file is created sparse (``truncate``), so it
takes no disk, and the loader must refuse it from the size recorded in the model before
reading a byte of it (reading it cost 34 s and 4 GB of RSS before the check existed).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from onnx import TensorProto, helper, numpy_helper

from collage_farm.core.graph import ModelError, load_graph
from collage_farm.core.subgraph import SubGraph
from collage_farm.costtable import CostTable, CostTableWarning, CostTableWriter

REPO = Path(__file__).resolve().parents[2]
BIG_ROWS = 2**31 // 16 + 2**25  # an [N, 4] float32 table of 2.5 GiB


def _vi(name: str, shape: list | None, t: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, t, shape)


def _model(nodes: list, inputs: list, outputs: list, inits: tuple = (), opset: int = 17,
           ir: int = 10) -> onnx.ModelProto:
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir
    return m


def _relu(**kw: object) -> onnx.ModelProto:
    return _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1, 4])],
                  [_vi("y", [1, 4])], **kw)


def _save(m: onnx.ModelProto | bytes, path: Path) -> Path:
    path.write_bytes(m if isinstance(m, bytes) else m.SerializeToString())
    return path


def _external(d: Path, location: str, rows: int, create: bool) -> Path:
    """An embedding lookup whose [rows, 4] table lives in external data at ``location``."""
    w = onnx.TensorProto(name="emb", data_type=TensorProto.FLOAT, dims=[rows, 4],
                         data_location=TensorProto.EXTERNAL)
    for k, v in (("location", location), ("offset", "0"), ("length", str(rows * 16))):
        w.external_data.add(key=k, value=v)
    m = _model([helper.make_node("Gather", ["emb", "ids"], ["h"], name="lookup"),
                helper.make_node("Relu", ["h"], ["y"], name="act")],
               [_vi("ids", [1, 2], TensorProto.INT64)], [_vi("y", [1, 2, 4])], (w,))
    if create:
        with open(d / location, "wb") as f:
            f.truncate(rows * 16)  # sparse: no disk blocks are written
    return _save(m, d / "model.onnx")


# --- the bad models: name -> (writer into a fresh directory, what the message must say) -----


def _truncated(d: Path) -> Path:
    from collage_farm import zoo

    good = zoo.build("mnist").SerializeToString()
    return _save(good[: len(good) // 3], d / "truncated.onnx")


def _random(d: Path) -> Path:
    return _save(np.random.default_rng(7).bytes(4096), d / "random.onnx")


def _not_a_model(d: Path) -> Path:  # a valid protobuf message of another type (a GraphProto)
    return _save(_relu().graph.SerializeToString(), d / "graph.onnx")


def _cyclic(d: Path) -> Path:
    return _save(_model([helper.make_node("Add", ["x", "b"], ["a"], name="first"),
                         helper.make_node("Relu", ["a"], ["b"], name="second")],
                        [_vi("x", [1, 4])], [_vi("b", [1, 4])]), d / "cyclic.onnx")


def _missing_initializer(d: Path) -> Path:
    return _save(_model([helper.make_node("MatMul", ["x", "w_gone"], ["y"], name="mm")],
                        [_vi("x", [1, 4])], [_vi("y", [1, 4])]), d / "noinit.onnx")


def _duplicate_outputs(d: Path) -> Path:
    return _save(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [1, 4])],
                        [_vi("y", [1, 4]), _vi("y", [1, 4])]), d / "dupout.onnx")


def _opset_too_new(d: Path) -> Path:
    return _save(_relu(opset=onnx.defs.onnx_opset_version() + 3), d / "opset.onnx")


def _ir_too_new(d: Path) -> Path:
    return _save(_relu(ir=onnx.IR_VERSION + 5), d / "irnew.onnx")


def _ir_opset_mismatch(d: Path) -> Path:  # IR 3 cannot hold opset 17 (needs IR 8)
    return _save(_relu(ir=3), d / "irmismatch.onnx")


def _dynamic_dim(d: Path) -> Path:
    return _save(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["batch", 4])],
                        [_vi("y", None)]), d / "dynamic.onnx")


def _zero_size(d: Path) -> Path:
    return _save(_model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [0, 4])],
                        [_vi("y", [0, 4])]), d / "empty.onnx")


def _custom_op_unknown_shape(d: Path) -> Path:
    m = _model([helper.make_node("Relu", ["x"], ["a"]),
                helper.make_node("Fancy", ["a"], ["y"], domain="com.example", name="fancy")],
               [_vi("x", [1, 4])], [_vi("y", None)])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    return _save(m, d / "custom.onnx")


def _custom_op_no_opset(d: Path) -> Path:
    return _save(_model([helper.make_node("Fancy", ["x"], ["y"], domain="com.example")],
                        [_vi("x", [1, 4])], [_vi("y", None)]), d / "custom_noopset.onnx")


def _constant_output(d: Path) -> Path:  # valid ONNX: an initializer is also an output
    w = numpy_helper.from_array(np.ones((1, 4), np.float32), "w")
    return _save(_model([helper.make_node("Relu", ["x"], ["y"], name="r")], [_vi("x", [1, 4])],
                        [_vi("y", [1, 4]), _vi("w", [1, 4])], inits=(w,)), d / "m.onnx")


def _no_nodes(d: Path) -> Path:
    return _save(_model([], [_vi("x", [1, 4])], [_vi("x", [1, 4])]), d / "nonodes.onnx")


def _huge_external(d: Path) -> Path:
    return _external(d, "weights.bin", BIG_ROWS, create=True)


def _missing_external(d: Path) -> Path:
    return _external(d, "weights.bin", 16, create=False)


def _escaping_external(d: Path) -> Path:  # external data must stay beside the model
    (d.parent / f"{d.name}-secret.bin").write_bytes(b"\0" * 256)
    return _external(d, f"../{d.name}-secret.bin", 16, create=False)


def _missing_file(d: Path) -> Path:
    return d / "absent.onnx"


BAD_MODELS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "truncated": (_truncated, r"truncated\.onnx: not a readable ONNX model"),
    "random_bytes": (_random, r"random\.onnx: not a readable ONNX model"),
    "protobuf_not_a_model": (_not_a_model, r"graph\.onnx: parsed, but holds no ONNX graph"),
    "cyclic": (_cyclic, r"cycle through node '(first|second)'"),
    "missing_initializer": (_missing_initializer, r"'w_gone'.*missing initializer"),
    "duplicate_outputs": (_duplicate_outputs, r"duplicate graph output names: \['y'\]"),
    "opset_too_new": (_opset_too_new, r"opset \d+ is newer than supported"),
    "ir_too_new": (_ir_too_new, r"IR version \d+ is newer than"),
    "unbound_dynamic_dim": (_dynamic_dim, r"dynamic dimension 0 \('batch'\).*--shape x=Nx4"),
    "zero_size_input": (_zero_size, r"'x' has dimension 0 of size 0"),
    "custom_op_unknown_shape": (_custom_op_unknown_shape,
                                r"'y', output of node 'fancy' \(com\.example:Fancy\).*value_info"),
    "custom_op_without_opset": (_custom_op_no_opset, r"No opset import for domain com\.example"),
    "no_nodes": (_no_nodes, r"no operator nodes"),
    "constant_output": (_constant_output, r"output\(s\) \['w'\] are constants"),
    "over_2gib_external_data": (_huge_external, r"2\.500 GiB\), over the 2 GiB protobuf limit"),
    "missing_external_data": (_missing_external, r"cannot read its external data"),
    "external_data_outside_dir": (_escaping_external, r"cannot read its external data"),
    "no_such_file": (_missing_file, r"absent\.onnx: no such file"),
}


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_bad_model_api(case: str, tmp_path: Path) -> None:
    make, message = BAD_MODELS[case]
    path = make(tmp_path)
    with pytest.raises(ModelError, match=message):
        load_graph(path)


def test_ir_version_below_its_opsets_is_lifted_in_memory_with_one_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """ONNX Runtime runs an IR 3 file that imports opset 17: so does collage-farm. The copy in
    memory (and every sub-model cut from it) says IR 8; the file on disk is left as it was."""
    path = _ir_opset_mismatch(tmp_path)
    with caplog.at_level(logging.WARNING):
        g = load_graph(path)
    warned = [r for r in caplog.records if "IR version 3" in r.getMessage()]
    assert len(warned) == 1 and "read as IR 8" in warned[0].getMessage()
    assert g.model.ir_version == 8 and onnx.load(str(path)).ir_version == 3
    sub = SubGraph(g, g.all_mask).extract("irlift")
    assert sub.ir_version == 8
    out = ort.InferenceSession(sub.SerializeToString()).run(
        None, {"x": -np.ones((1, 4), np.float32)})
    assert np.array_equal(out[0], np.zeros((1, 4), np.float32))


def test_custom_domain_op_with_declared_shape_loads_as_opaque(tmp_path: Path) -> None:
    """The good twin of the custom-op cases: declared shapes are enough, no probe needed."""
    m = _model([helper.make_node("Relu", ["x"], ["a"]),
                helper.make_node("Fancy", ["a"], ["y"], domain="com.example")],
               [_vi("x", [1, 4])], [_vi("y", [1, 4])])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    g = load_graph(_save(m, tmp_path / "ok.onnx"))
    assert [n.kind.name for n in g.nodes] == ["ELEMWISE", "OPAQUE"]


def test_zero_size_weights_inside_the_graph_are_fine() -> None:
    """Empty initializers (Concat with an empty block, Resize's empty roi) are real."""
    w = numpy_helper.from_array(np.zeros((0, 4), np.float32), "w")
    g = load_graph(_model([helper.make_node("Concat", ["x", "w"], ["y"], axis=0)],
                          [_vi("x", [1, 4])], [_vi("y", [1, 4])], (w,)))
    assert g.tensors["y"].shape == (1, 4)


# --- bad configs and cost tables, written once per module ------------------------------------

SYSTEM = """\
schema: 1
system: mine
devices:
  host:
    kind: cpu
    targets:
      ort-cpu: {toolchain: ort-cpu}
      openvino-cpu: {toolchain: openvino}
"""

CONFIG_FILES = {
    "system.yaml": SYSTEM,
    "malformed.yaml": "devices:\n  host: {kind: cpu\n   targets: [\n",
    "unknown_key.yaml": SYSTEM.replace("targets:", "targetz:"),
    "unknown_toolchain.yaml": SYSTEM.replace("{toolchain: openvino}", "{toolchain: openvino9}"),
    "not_a_mapping.yaml": "- just\n- a list\n",
    "app_unknown_target.yaml": "schema: 1\ntargets: [ort-cpu, tensorrt-turbo]\n",
    "app_pin_no_device.yaml": "schema: 1\npins:\n  - {op: Conv, device: cuda:0}\n",
    "app_pin_matches_nothing.yaml": "schema: 1\npins:\n  - {node: 'nowhere_*', target: ort-cpu}\n",
    "app_bad_option.yaml": "schema: 1\noptions:\n  ort-cpu: {threads: many}\n",
    "cluster_typo.yaml": (
        "cluster_name: x\nmax_workers: 2\nprovider: {type: aws, region: us-west-2}\n"
        "available_node_types:\n  head:\n    resorces: {CPU: 4}\n"
        "    node_config: {InstanceType: m5.xlarge}\nhead_node_type: head\n"),
    "cluster_malformed.yaml": "cluster_name: [x\n",
}


def _table_row(fp: str, median: float = 1e-3, status: str = "ok") -> dict:
    return {"fingerprint": fp, "target": "ort-cpu", "target_key": "ort-cpu", "status": status,
            "median": median, "samples": [median], "toolchain": "ort-cpu", "n": 1}


BAD_PARTS = ("part-corrupt.parquet", "part-truncated.parquet", "part-foreign.parquet",
             "part-wrong-types.parquet", "part-empty.parquet")


def _bad_table(d: Path, good_rows: int) -> None:
    """A cost-table directory holding ``good_rows`` good rows and one bad file of each kind."""
    d.mkdir(parents=True)
    if good_rows:
        with CostTableWriter(d, background=False) as w:
            w.extend(_table_row(f"good{i}") for i in range(good_rows))
    template = d.parent / f"{d.name}.template"
    with CostTableWriter(template, background=False) as w:  # whole files to spoil
        w.extend(_table_row(f"spoilt{i}") for i in range(5))
    good = next(template.glob("*.parquet"))
    data = good.read_bytes()
    (d / "part-corrupt.parquet").write_bytes(b"PAR1" + os.urandom(200) + b"PAR1")
    (d / "part-truncated.parquet").write_bytes(data[: len(data) // 2])
    pq.write_table(pa.table({"id": [1, 2], "fingerprint": ["a", "b"]}),
                   d / "part-foreign.parquet")
    t = pq.read_table(good)
    i = t.column_names.index("median")
    pq.write_table(t.set_column(i, "median", pa.array(["fast"] * t.num_rows)),
                   d / "part-wrong-types.parquet")
    (d / "part-empty.parquet").write_bytes(b"")


@dataclass(frozen=True)
class CliCase:
    argv: tuple[str, ...]
    message: str  # regex the error line must match
    out: Path | None = None  # must not exist afterwards (or keep its earlier content)
    one_line: bool = True  # stderr is exactly one line


@dataclass(frozen=True)
class CliResult:
    returncode: int
    stderr: str
    stdout: str


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    """A TCP port that completes connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        yield s.getsockname()[1]


def _cli_cases(root: Path, silent_port: int) -> dict[str, CliCase]:
    cases: dict[str, CliCase] = {}
    for name, (make, message) in BAD_MODELS.items():
        d = root / "models" / name
        d.mkdir(parents=True)
        out = root / "out" / name
        cases[f"model:{name}"] = CliCase(
            ("tune", str(make(d)), "--mock", "--targets", "ort-cpu", "--out", str(out)),
            message, out)
    cfg = root / "cfg"
    cfg.mkdir()
    for fname, text in CONFIG_FILES.items():
        (cfg / fname).write_text(text)
    dyn = _dynamic_dim(cfg)

    def tune(key: str, *args: str, model: str = "zoo:mnist", message: str) -> None:
        out = root / "out" / key
        cases[key] = CliCase(("tune", model, "--mock", *args, "--out", str(out)), message, out)

    system = str(cfg / "system.yaml")
    tune("config:malformed_yaml", "--system", str(cfg / "malformed.yaml"),
         message=r"malformed\.yaml: line 3, column \d+: malformed YAML")
    tune("config:not_a_mapping", "--system", str(cfg / "not_a_mapping.yaml"),
         message=r"not_a_mapping\.yaml.*expected a YAML mapping")
    tune("config:unknown_key", "--system", str(cfg / "unknown_key.yaml"),
         message=r"devices\.host\.targetz: unknown key 'targetz'")
    tune("config:unknown_toolchain", "--system", str(cfg / "unknown_toolchain.yaml"),
         message=r"toolchain: 'openvino9' is not allowed")
    tune("config:missing_file", "--system", str(cfg / "absent.yaml"),
         message=r"absent\.yaml.*no such file")
    tune("config:unknown_builtin_system", "--builtin-system", "cray-1",
         message=r"unknown built-in system 'cray-1'")
    tune("config:app_unknown_target", "--system", system, "--app",
         str(cfg / "app_unknown_target.yaml"), message=r"tensorrt-turbo")
    tune("config:bad_pin_device", "--system", system, "--app",
         str(cfg / "app_pin_no_device.yaml"), message=r"cuda:0")
    tune("config:pin_matches_nothing", "--system", system, "--app",
         str(cfg / "app_pin_matches_nothing.yaml"), message=r"nowhere_\*")
    tune("config:bad_option_value", "--system", system, "--app",
         str(cfg / "app_bad_option.yaml"), message=r"options\.ort-cpu\.threads")
    tune("targets:unknown", "--targets", "ort-cpu,tpu-v9", message=r"unknown target 'tpu-v9'")
    tune("targets:empty", "--targets", "", message=r"no targets given")
    tune("shape:not_integers", "--shape", "x=1xAx4", model=str(dyn),
         message=r"bad --shape 'x=1xAx4': dims must be integers")
    tune("shape:no_equals", "--shape", "x", model=str(dyn), message=r"expected NAME=DxDx")
    tune("shape:zero", "--shape", "x=0x4", model=str(dyn), message=r"zero dimension")
    tune("shape:negative", "--shape", "x=-1x4", model=str(dyn), message=r"negative dimension")
    tune("shape:unknown_input", "--shape", "nope=1x4", model=str(dyn),
         message=r"'nope', which is not a model input")
    tune("shape:wrong_rank", "--shape", "x=1x4x4", model=str(dyn), message=r"rank 3 given")
    tune("shape:conflicts_with_fixed_dim", "--shape", "x=2x5", model=str(dyn),
         message=r"dim 1 is fixed to 4 in the model, 5 given")
    tune("args:max_depth_zero", "--max-depth", "0", message=r"--max-depth must be at least 1")
    tune("args:slots_zero", "--slots", "0", message=r"--slots must be at least 1, not 0")
    tune("args:slots_offline", "--slots", "2", "--mock",
         message=r"--slots applies to campaigns that measure")
    tune("args:layers_huge", "--layers", "100000", model="zoo:gpt2",
         message=r"layers must be 1\.\.128, not 100000")
    out = root / "out" / "args:offline_without_table"
    cases["args:offline_without_table"] = CliCase(
        ("tune", "zoo:mnist", "--offline", "--out", str(out)),
        r"cost table directory not found: .*offline_without_table/costs",
        out)

    # a plan directory from an earlier run must survive a failing run untouched
    kept = root / "out" / "kept"
    kept.mkdir(parents=True)
    (kept / "plan.json").write_text('{"earlier": true}')
    cases["out:earlier_plan_untouched"] = CliCase(
        ("tune", str(_cyclic(root / "models" / "cyclic")), "--mock", "--out", str(kept)),
        r"cycle", kept)

    # cluster.yaml (Ray's own schema validation; several lines when several keys are bad)
    cases["cluster:typo"] = CliCase(("cluster", "check", str(cfg / "cluster_typo.yaml")),
                                    r"unknown key 'resorces'.*did you mean 'resources'",
                                    one_line=False)
    cases["cluster:malformed"] = CliCase(
        ("cluster", "check", str(cfg / "cluster_malformed.yaml")), r"YAML syntax error at line")
    cases["cluster:missing"] = CliCase(("cluster", "check", str(cfg / "absent.yaml")),
                                       r"cannot read")

    # cost tables: only bad files -> every cost is missing offline; the files are named
    bad_only = root / "tables" / "bad_only"
    _bad_table(bad_only, 0)
    out = root / "out" / "costs:offline_bad_files"
    cases["costs:offline_bad_files"] = CliCase(
        ("tune", "zoo:mnist", "--offline", "--cost-table", str(bad_only), "--targets",
         "ort-cpu", "--out", str(out)), r"missing|no cost", out, one_line=False)
    cases["costs:missing_dir"] = CliCase(("costs", "show", str(root / "tables" / "absent")),
                                         r"cost table directory not found")
    plan_dir = root / "tables" / "a_plan"  # `costs show OUT` instead of `OUT/costs`
    (plan_dir / "costs").mkdir(parents=True)
    (plan_dir / "plan.json").write_text("{}")
    cases["costs:plan_dir"] = CliCase(("costs", "show", str(plan_dir)),
                                      r"is a plan directory, not a cost table: did you mean "
                                      r".*a_plan/costs\?")
    # where the campaign's results go: refused before anything is measured
    a_file = root / "out" / "a_file"
    a_file.write_text("not a directory")
    cases["out:is_a_file"] = CliCase(("tune", "zoo:mnist", "--mock", "--out", str(a_file)),
                                     r"exists and is not a directory")
    out = root / "out" / "table:is_a_file"
    cases["table:is_a_file"] = CliCase(
        ("tune", "zoo:mnist", "--targets", "ort-cpu", "--cost-table", str(a_file), "--out",
         str(out)), r"cost table .* not a directory", out)
    out = root / "out" / "ray:bad_address"
    out = root / "out" / "ray:nothing_listens"
    cases["ray:nothing_listens"] = CliCase(
        ("tune", "zoo:mnist", "--targets", "ort-cpu", "--address", "127.0.0.1:1", "--out",
         str(out)), r"cannot join the Ray cluster at '127\.0\.0\.1:1': nothing answers", out)
    cases["ray:bad_address"] = CliCase(
        ("tune", "zoo:mnist", "--targets", "ort-cpu", "--address", "no-such-format", "--out",
         str(out)), r"cannot join the Ray cluster at 'no-such-format'", out)
    # a port that accepts connections but never answers as a Ray GCS: given up within
    # seconds (ray.init retried it for minutes); Ray's C++ client warns once on its own line
    out = root / "out" / "ray:silent_gcs"
    cases["ray:silent_gcs"] = CliCase(
        ("tune", "zoo:mnist", "--targets", "ort-cpu", "--address", f"127.0.0.1:{silent_port}",
         "--out", str(out)), r"no Ray GCS answered within 10 s", out, one_line=False)
    # plan directories for `run`: exit 2 and one line (exit 1 means a numerics mismatch)
    for name, (d, extra, message) in _bad_plans(root / "plans").items():
        cases[f"plan:{name}"] = CliCase(("run", str(d), *extra, "--no-singles", "--rounds",
                                         "1", "--min-round-s", "0"), message)
    return cases


def _good_plan(d: Path) -> Path:
    """A real two-partition mnist plan (ORT CPU, then OpenVINO) written by `write_plan`."""
    import json as _json

    from collage_farm import zoo
    from collage_farm.core.candidate import CandidatePartition
    from collage_farm.core.cost import Cost
    from collage_farm.core.plan import make_plan, write_plan
    from collage_farm.core.search import PlannedPartition, SearchResult
    from collage_farm.core.subgraph import SubGraph
    from collage_farm.core.target import parse_targets

    g = load_graph(zoo.build("mnist"), name="mnist")
    ort, ov = parse_targets("ort-cpu,openvino-cpu")
    half = len(g.nodes) // 2
    masks = [(1 << half) - 1, g.all_mask & ~((1 << half) - 1)]
    planned = tuple(PlannedPartition(CandidatePartition(SubGraph(g, m), t), Cost(1e-5), 0.0)
                    for m, t in zip(masks, (ort, ov)))
    result = SearchResult(planned, 2e-5, 0, 0, 0, 0, 0.0)
    plan = make_plan(g, result, [ort, ov], estimator="test")
    plan.extra["source"] = "zoo:mnist"
    write_plan(plan, g, result, d)
    assert len(_json.loads((d / "plan.json").read_text())["partitions"]) == 2
    return d


def _bad_plans(root: Path) -> dict[str, tuple[Path, tuple[str, ...], str]]:
    """name -> (plan dir, extra `run` args, the error line's regex): plans broken the ways
    a user's copy breaks (an editor, a disk, a hand-made swap)."""
    import json as _json

    good = _good_plan(root / "good")

    def variant(name: str, edit: Callable[[dict, Path], None]) -> Path:
        d = root / name
        shutil.copytree(good, d)
        pj = d / "plan.json"
        doc = _json.loads(pj.read_text())
        edit(doc, d)
        pj.write_text(_json.dumps(doc))
        return d

    def files(doc: dict) -> list[dict]:
        return doc["partitions"]

    def swap(doc: dict, d: Path) -> None:
        a, b = files(doc)
        a["file"], b["file"] = b["file"], a["file"]

    def corrupt(doc: dict, d: Path) -> None:
        f = d / files(doc)[1]["file"]
        f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 3])

    binary = root / "binary_json"
    shutil.copytree(good, binary)
    (binary / "plan.json").write_bytes(b"\xb5\x00\xff plan")
    garbage = root / "garbage.onnx"
    garbage.write_bytes(b"\x08\x07garbage, not a model")
    return {
        "binary_json": (binary, (), r"not valid JSON"),
        "nul_path": (variant("nul_path", lambda doc, d: files(doc)[0].update(
            file="partitions/a\x00b.onnx")), (), r"NUL byte"),
        "dir_path": (variant("dir_path", lambda doc, d: files(doc)[0].update(
            file="partitions")), (), r"cannot read .*partitions"),
        "corrupt_partition": (variant("corrupt_partition", corrupt), (),
                              r"p001: .* does not load on openvino"),
        "no_partitions": (variant("no_partitions", lambda doc, d: doc.update(partitions=[])),
                          (), r"no partitions"),
        "swapped_files": (variant("swapped_files", swap), (),
                          r"does not run against its original model"),
        "garbage_model": (good, ("--model", str(garbage)), r"not a readable ONNX model"),
        "unknown_shape_input": (good, ("--shape", "nope=1x2"),
                                r"'nope', which is not an input of the plan"),
    }


def _run(argv: tuple[str, ...], console: bool = False) -> CliResult:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO)
    env["COLLAGE_WORKER_MAX_RSS_MB"] = "2048"
    cmd = ["collage-farm", *argv] if console else [sys.executable, "-m", "collage_farm.cli",
                                                   *argv]
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    return CliResult(p.returncode, p.stderr, p.stdout)


#: run in a fresh interpreter each (one per kind of input); the rest run through `main()` here
SUBPROCESS_CASES = ("model:truncated", "model:over_2gib_external_data", "config:malformed_yaml",
                    "shape:not_integers", "args:offline_without_table", "cluster:typo",
                    "costs:offline_bad_files", "out:earlier_plan_untouched",
                    "ray:bad_address", "ray:nothing_listens", "ray:silent_gcs")
# (no ray.init in this process)


def _run_here(argv: tuple[str, ...]) -> CliResult:
    """`collage_farm.cli.main` in this process, stdout and stderr captured."""
    import contextlib
    import io

    from collage_farm.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as e:  # argparse errors
            code = e.code if isinstance(e.code, int) else 1
    return CliResult(code, err.getvalue(), out.getvalue())


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory: pytest.TempPathFactory, silent_port: int
             ) -> Iterator[tuple[dict[str, CliCase], dict[str, CliResult]]]:
    root = tmp_path_factory.mktemp("cli")
    cases = _cli_cases(root, silent_port)
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {k: pool.submit(_run, cases[k].argv) for k in SUBPROCESS_CASES}
        results = {k: _run_here(c.argv) for k, c in cases.items() if k not in futures}
        results.update({k: f.result() for k, f in futures.items()})
    yield cases, results
    shutil.rmtree(root, ignore_errors=True)


def _cli_case_ids() -> list[str]:
    return ([f"model:{n}" for n in sorted(BAD_MODELS)] + [
        "config:malformed_yaml", "config:not_a_mapping", "config:unknown_key",
        "config:unknown_toolchain", "config:missing_file", "config:unknown_builtin_system",
        "config:app_unknown_target", "config:bad_pin_device", "config:pin_matches_nothing",
        "config:bad_option_value", "targets:unknown", "targets:empty", "shape:not_integers",
        "shape:no_equals", "shape:zero", "shape:negative", "shape:unknown_input",
        "shape:wrong_rank", "shape:conflicts_with_fixed_dim", "args:max_depth_zero",
        "args:slots_zero", "args:slots_offline", "args:layers_huge",
        "args:offline_without_table", "out:earlier_plan_untouched", "cluster:typo",
        "cluster:malformed", "cluster:missing", "costs:offline_bad_files",
        "costs:missing_dir", "out:is_a_file", "table:is_a_file", "ray:bad_address",
        "ray:nothing_listens", "ray:silent_gcs"] + [
        f"plan:{n}" for n in (
            "binary_json", "nul_path", "dir_path", "corrupt_partition", "no_partitions",
            "swapped_files", "garbage_model", "unknown_shape_input")])


@pytest.mark.parametrize("key", _cli_case_ids())
def test_cli_bad_input_one_line_exit_2_nothing_written(
        key: str, cli_runs: tuple[dict[str, CliCase], dict[str, CliResult]]) -> None:
    cases, results = cli_runs
    case, res = cases[key], results[key]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "Traceback" not in res.stderr, res.stderr[-2000:]
    assert re.search(case.message, res.stderr), (case.message, res.stderr[-2000:])
    if case.one_line:
        assert len(lines) == 1, lines
    if case.out is not None:
        if key == "out:earlier_plan_untouched":
            assert sorted(p.name for p in case.out.iterdir()) == ["plan.json"]
            assert (case.out / "plan.json").read_text() == '{"earlier": true}'
        else:
            assert not case.out.exists(), sorted(case.out.rglob("*"))


def test_a_target_that_cannot_run_here_is_refused_before_ray(tmp_path: Path) -> None:
    """The embedded farm runs every target here: ort-cuda without a CUDA EP is refused with
    the reason `targets list --check` gives, before Ray starts, and nothing is written."""
    from collage_farm.cli.targets import toolchain_unavailable

    why = toolchain_unavailable("ort-cuda")
    if why is None:
        pytest.skip("ort-cuda runs on this machine")
    out = tmp_path / "out"
    t0 = time.perf_counter()
    res = _run_here(("tune", "zoo:mnist", "--targets", "ort-cpu,ort-cuda", "--out", str(out)))
    assert res.returncode == 2, res.stderr
    assert time.perf_counter() - t0 < 10  # no Ray started (that alone takes ~5-15 s here)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "ort-cuda cannot run on this machine" in lines[0], lines
    assert why in lines[0] and "targets list --check" in lines[0]
    assert not out.exists()
    check = _run_here(("targets", "list", "--check"))
    assert why in check.stdout  # the same reason


def test_joining_a_silent_cluster_ends_on_sigterm(tmp_path: Path, silent_port: int) -> None:
    """While it waits for a Ray GCS that does not answer, `tune` ends on SIGTERM at once."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO)
    p = subprocess.Popen([sys.executable, "-m", "collage_farm.cli", "tune", "zoo:mnist",
                          "--targets", "ort-cpu", "--address", f"127.0.0.1:{silent_port}",
                          "--out", str(tmp_path / "out")], cwd=REPO, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(4.0)  # imports, model load, then the wait for the GCS
        assert p.poll() is None, "gave up before the signal: raise the sleep"
        p.send_signal(signal.SIGTERM)
        t0 = time.perf_counter()
        rc = p.wait(timeout=10)
        assert time.perf_counter() - t0 < 3
        assert rc in (-signal.SIGTERM, 128 + signal.SIGTERM, 130), rc
    finally:
        if p.poll() is None:
            p.kill()


@pytest.mark.parametrize(("argv", "expected"), [
    (("zoo", "export"), ("built-in model", "the ONNX file to write", "layers of a transformer",
                         "seed of the random weights")),
    (("compare",), ("default: ort-cpu,openvino-cpu", "bind a dynamic input shape")),
    (("tune",), ("HOST:PORT", "ray://HOST:PORT", "auto", "default: ort-cpu,openvino-cpu")),
    (("targets", "list"), ("List the built-in systems",)),
])
def test_help_texts_are_complete(argv: tuple[str, ...], expected: tuple[str, ...],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # argparse wraps at the terminal's width
    res = _run_here((*argv, "--help"))
    assert res.returncode == 0
    text = " ".join(res.stdout.split())
    for e in expected:
        assert e in text, (e, res.stdout)
    if argv[0] == "targets":
        assert "targets list`" not in text  # not "see `collage-farm targets list`" in itself


def test_cli_offline_names_every_skipped_cost_table_file(
        cli_runs: tuple[dict[str, CliCase], dict[str, CliResult]]) -> None:
    _, results = cli_runs
    err = results["costs:offline_bad_files"].stderr
    for name in BAD_PARTS:
        assert name in err, (name, err[-3000:])


@pytest.mark.skipif(shutil.which("collage-farm") is None, reason="console script not installed")
def test_console_script_same_contract(tmp_path: Path) -> None:
    res = _run(("tune", str(_random(tmp_path)), "--mock", "--out", str(tmp_path / "o")),
               console=True)
    assert res.returncode == 2 and res.stderr.startswith("collage-farm tune: error: ")
    assert len(res.stderr.strip().splitlines()) == 1 and not (tmp_path / "o").exists()


# --- cost tables through the API -----------------------------------------------------------


def test_bad_table_files_skipped_good_rows_kept(tmp_path: Path) -> None:
    d = tmp_path / "t"
    _bad_table(d, 7)
    table = CostTable(d)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        got = table.read()
    assert sorted(got["fingerprint"].to_pylist()) == sorted(f"good{i}" for i in range(7))
    warned = {n for n in BAD_PARTS for w in rec
              if issubclass(w.category, CostTableWarning) and n in str(w.message)}
    assert warned == set(BAD_PARTS)
    assert sorted(p.name for p, _ in table.skipped()) == sorted(BAD_PARTS)


def test_costs_show_reports_skipped_files_and_counts_good_rows(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture
                                                               ) -> None:
    from collage_farm.cli import main

    d = tmp_path / "t"
    _bad_table(d, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CostTableWarning)
        assert main(["costs", "show", str(d), "--json"]) == 0
    import json

    shown = json.loads(capsys.readouterr().out)
    assert shown["rows"] == 3
    assert sorted(s["file"] for s in shown["skipped"]) == sorted(BAD_PARTS)


def test_superset_schema_files_are_read_without_the_extra_columns(tmp_path: Path) -> None:
    """A newer writer adding a column must not make older readers drop its rows."""
    d = tmp_path / "t"
    with CostTableWriter(d, background=False) as w:
        w.extend(_table_row(f"fp{i}") for i in range(3))
    f = next(d.glob("*.parquet"))
    t = pq.read_table(f)
    pq.write_table(t.append_column("energy_j", pa.array([1.0] * t.num_rows)), f)
    got = CostTable(d).read()
    assert got.num_rows == 3 and "energy_j" not in got.column_names


@pytest.mark.parametrize("median", [-1e-3, float("nan"), float("inf")])
def test_ok_rows_with_impossible_medians_are_ignored(tmp_path: Path, median: float) -> None:
    """A hand-edited or foreign row must never give the search a negative or NaN cost: it is
    ignored with a warning, so the candidate is measured (or reported missing offline), and
    a good row under it still answers (test_costtable)."""
    d = tmp_path / "t"
    with CostTableWriter(d, background=False) as w:
        w.append(_table_row("poisoned", median))
        w.append(_table_row("fine", 2e-3))
    with pytest.warns(CostTableWarning, match="1 ok row"):
        hit = CostTable(d).lookup([("poisoned", "ort-cpu"), ("fine", "ort-cpu")])
    assert ("poisoned", "ort-cpu") not in hit
    assert hit[("fine", "ort-cpu")].seconds == 2e-3
