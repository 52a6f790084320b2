"""Security properties, checked on the source and on the behaviour.

Why: cost tables, plans and configs travel between people and machines (a table measured on
a shared cluster, a plan handed to a colleague, an app YAML from a repository). Reading one
must never run code from it. Python makes that easy to get wrong in one line: ``pickle.load``,
``yaml.load`` without a safe loader, ``eval``. So an AST scan of every module of the three
packages fails on any such call, with one explicit, justified exception. The same scan checks
that no package module turns Ray token authentication off (only the test fixture in
tests/ray/conftest.py does; `tests/ray/test_faults.py` checks at run time that an embedded Ray
started by the farm has it on). Plan paths: `tests/unit/test_plan.py` covers ``..`` and
absolute paths; a symlink pointing out of the plan directory is covered here.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("collage_farm", "runners", "estimators")

#: (module, dotted call) pairs allowed to deserialise with pickle, and why.
ALLOWED = {
    # The worker child unpickles requests that its own parent pickled a moment earlier and
    # sent over a private multiprocessing pipe (a socketpair inherited at spawn, not a file or
    # a network port); the payloads are the frozen dataclasses of runners.base built by the
    # runner itself. Nothing read from a table, plan or config reaches this pipe unparsed.
    ("runners/worker_child.py", "pickle.loads"),
}

#: calls that deserialise or execute data
DANGEROUS = {
    "pickle.load", "pickle.loads", "pickle.Unpickler", "cPickle.load", "cPickle.loads",
    "cloudpickle.load", "cloudpickle.loads", "dill.load", "dill.loads", "marshal.load",
    "marshal.loads", "shelve.open", "eval", "exec", "compile", "yaml.unsafe_load",
    "yaml.full_load", "yaml.load_all", "yaml.unsafe_load_all", "pandas.read_pickle",
    "pd.read_pickle", "torch.load", "jsonpickle.decode",
}
SAFE_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader"}


def _modules() -> list[Path]:
    files = [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    assert len(files) > 20, files  # the scan really sees the packages
    return files


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local names bound by imports (``from pickle import loads as l`` -> ``l: pickle.loads``)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _calls(path: Path) -> list[tuple[str, ast.Call]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases = _aliases(tree)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = _dotted(node.func)
            head, _, rest = name.partition(".")
            if head in aliases and aliases[head] != head:
                name = aliases[head] + (f".{rest}" if rest else "")
            out.append((name, node))
    return out


def _unsafe_calls(path: Path) -> set[tuple[str, int]]:
    found = set()
    for name, call in _calls(path):
        if name == "__builtins__.eval":
            name = "eval"
        if name in DANGEROUS or name.endswith((".read_pickle", "pickle.loads", "pickle.load")):
            found.add((name, call.lineno))
        elif name == "yaml.load":  # safe only with an explicit safe Loader
            loader = next((k.value for k in call.keywords if k.arg == "Loader"),
                          call.args[1] if len(call.args) > 1 else None)
            if loader is None or _dotted(loader).split(".")[-1] not in SAFE_LOADERS:
                found.add((name, call.lineno))
        elif name in ("np.load", "numpy.load") and any(
                k.arg == "allow_pickle"
                and not (isinstance(k.value, ast.Constant) and k.value.value is False)
                for k in call.keywords):
            found.add(("numpy.load(allow_pickle)", call.lineno))
    return found


def test_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The scanner itself: every spelling below must be caught, the safe ones not."""
    src = tmp_path / "m.py"
    src.write_text(
        "import pickle, yaml, numpy as np\n"
        "from pickle import loads as l\n"
        "import pickle as pk\n"
        "pickle.load(f)\n"
        "l(b)\n"
        "pk.loads(b)\n"
        "yaml.load(t)\n"
        "yaml.load(t, Loader=yaml.FullLoader)\n"
        "yaml.load(t, Loader=yaml.SafeLoader)\n"
        "yaml.safe_load(t)\n"
        "eval('1')\n"
        "np.load(p, allow_pickle=True)\n"
        "np.load(p)\n")
    got = sorted(_unsafe_calls(src))
    assert got == [("eval", 11), ("numpy.load(allow_pickle)", 12), ("pickle.load", 4),
                   ("pickle.loads", 5), ("pickle.loads", 6), ("yaml.load", 7),
                   ("yaml.load", 8)]


def test_no_pickle_eval_or_unsafe_yaml_on_data() -> None:
    found = set()
    for path in _modules():
        rel = path.relative_to(REPO).as_posix()
        for name, line in _unsafe_calls(path):
            found.add((rel, name, line))
    unexpected = sorted(f for f in found if (f[0], f[1]) not in ALLOWED)
    assert not unexpected, f"deserialising or executing calls: {unexpected}"
    # the exception is still needed (else drop it from ALLOWED so it cannot hide a new one)
    assert {(f[0], f[1]) for f in found} == ALLOWED


def test_every_yaml_read_is_safe_load() -> None:
    users = [p for p in _modules() if "yaml." in p.read_text()]
    assert users, "no module reads YAML?"
    for path in users:
        names = {n for n, _ in _calls(path) if n.startswith("yaml.")}
        # compose builds a node tree (line numbers for duplicate-key errors) and never
        # constructs Python objects, whatever the loader; safe_load is the only constructor
        assert names <= {"yaml.safe_load", "yaml.safe_load_all", "yaml.safe_dump",
                         "yaml.dump", "yaml.compose", "yaml.YAMLError",
                         "yaml.MarkedYAMLError"}, (path, names)


def _assignments_to_env(path: Path, var: str) -> list[int]:
    """Lines that set ``var`` in the environment (subscript, setdefault, update, putenv, dict
    literals handed to ``env=``); reading it (``os.environ.get``) is fine."""
    tree = ast.parse(path.read_text())
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if (isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                        and t.slice.value == var):
                    lines.append(node.lineno)
        elif isinstance(node, ast.Call):
            name = _dotted(node.func)
            if name.endswith((".setdefault", "putenv")) and node.args and isinstance(
                    node.args[0], ast.Constant) and node.args[0].value == var:
                lines.append(node.lineno)
            for k in node.keywords:
                if k.arg == var:
                    lines.append(node.lineno)
        elif isinstance(node, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == var for k in node.keys):
            lines.append(node.lineno)
    return lines


def test_no_package_module_sets_ray_auth_mode() -> None:
    offenders = {p.relative_to(REPO).as_posix(): ln for p in _modules()
                 if (ln := _assignments_to_env(p, "RAY_AUTH_MODE"))}
    assert not offenders, offenders
    conftest = REPO / "tests" / "ray" / "conftest.py"
    assert _assignments_to_env(conftest, "RAY_AUTH_MODE"), "the scan misses the fixture's line"


def test_plan_partition_symlinked_out_of_the_plan_directory_is_refused(tmp_path: Path) -> None:
    from collage_farm.core.plan import PlanError, load_plan
    from tests.unit.test_plan import _first_dag, _tune

    plan_dir = tmp_path / "plan"
    _tune(_first_dag(), plan_dir)
    d = json.loads((plan_dir / "plan.json").read_text())
    victim = plan_dir / d["partitions"][0]["file"]
    secret = tmp_path / "secret.onnx"
    secret.write_bytes(victim.read_bytes())
    victim.unlink()
    victim.symlink_to(secret)
    with pytest.raises(PlanError, match="escapes the plan directory"):
        load_plan(plan_dir)
