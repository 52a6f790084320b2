"""The layers of the project, checked from the source: imports point one way, no cycles.

Every module of ``collage_farm``, ``runners`` and ``estimators`` is parsed (not imported) and its
imports are held against these rules:

* a first-party import goes to the module's own package or to a layer the module's layer may
  use (`USES`, which is acyclic: the layers above point down only);
* a first-party import is at module level (inside ``if TYPE_CHECKING:`` too), never inside a
  function or class body, so the module's dependencies are what its header says;
* ``ray`` is imported only under ``collage_farm/farm/``;
* the module graph (runtime imports: ``TYPE_CHECKING`` blocks excluded) has no cycle; a
  submodule that imports its own package's ``__init__`` while that ``__init__`` re-exports it
  is such a cycle.

The layers, top to bottom::

    cli -> campaign -> report -> postsearch / probes -> execute / farm / costtable / config
        -> estimators -> runners -> zoo / core

`USES` spells out which lower layers each one may import; a layer never imports a sibling of its
own rank unless listed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = ("collage_farm", "runners", "estimators")

#: layer -> the layers its modules may import (besides their own package)
USES: dict[str, frozenset[str]] = {
    "root": frozenset(),
    "core": frozenset({"root"}),
    "zoo": frozenset({"root", "core"}),
    "runners": frozenset({"root", "core"}),
    "estimators": frozenset({"root", "core", "runners"}),
    "config": frozenset({"root", "core", "runners"}),
    "costtable": frozenset({"root", "core", "runners", "estimators"}),
    "farm": frozenset({"root", "core", "runners", "estimators"}),
    "execute": frozenset({"root", "core", "zoo", "runners"}),
    "postsearch": frozenset({"root", "core", "runners", "estimators", "execute"}),
    "probes": frozenset({"root", "core", "runners", "estimators", "execute", "costtable"}),
    "report": frozenset({"root", "core", "zoo", "runners", "estimators", "config", "costtable",
                         "execute", "postsearch"}),
    "campaign": frozenset({"root", "core", "zoo", "runners", "estimators", "config",
                           "costtable", "farm", "execute", "postsearch", "probes", "report"}),
    "cli": frozenset({"root", "core", "zoo", "runners", "estimators", "config", "costtable",
                      "farm", "execute", "postsearch", "probes", "report", "campaign"}),
}

_PACKAGE_LAYERS = ("core", "zoo", "config", "costtable", "farm", "execute", "postsearch",
                   "probes", "report", "cli")


def layer_of(module: str) -> str:
    """The layer of a dotted module name of this project."""
    parts = module.split(".")
    if parts[0] in ("runners", "estimators"):
        return parts[0]
    if module == "collage_farm":
        return "root"
    if parts[1] == "campaign":
        return "campaign"
    if parts[1] in _PACKAGE_LAYERS:
        return parts[1]
    raise AssertionError(f"{module} is in no layer: add its package to test_layers.USES")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (first-party: resolved to a module or package)
    line: int
    in_function: bool
    type_checking: bool


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for top in FIRST_PARTY:
        for p in sorted((ROOT / top).rglob("*.py")):
            rel = p.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


MODULES = _modules()


def _resolve(name: str) -> str:
    """The longest prefix of ``name`` that is a module of this project."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str) -> Iterator[Import]:
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for a in child.names:
                    yield Import(module, a.name, child.lineno, in_function, type_checking)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*up, base] if base else up)
                for a in child.names:
                    full = f"{base}.{a.name}"
                    yield Import(module, full if full in MODULES else base, child.lineno,
                                 in_function, type_checking)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                                    ast.Lambda)):
                yield from visit(child, True, type_checking)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), in_function,
                                     True)
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), in_function,
                                     type_checking)
            else:
                yield from visit(child, in_function, type_checking)

    yield from visit(tree, False, False)


ALL_IMPORTS = [i for m in MODULES for i in imports_of(m)]


def _first_party(i: Import) -> bool:
    return i.target.split(".")[0] in FIRST_PARTY


def _where(i: Import) -> str:
    return f"{MODULES[i.module].relative_to(ROOT)}:{i.line} imports {i.target}"


def _own_package(a: str, b: str) -> bool:
    """Whether modules ``a`` and ``b`` are in one package of the project (its layer unit)."""
    return layer_of(a) == layer_of(b)


def test_every_module_has_a_layer() -> None:
    for m in MODULES:
        assert layer_of(m) in USES


def test_layers_are_acyclic() -> None:
    seen: dict[str, int] = {}

    def depth(layer: str, path: tuple[str, ...] = ()) -> int:
        assert layer not in path, f"USES has a cycle: {' -> '.join((*path, layer))}"
        if layer not in seen:
            seen[layer] = 1 + max((depth(u, (*path, layer)) for u in USES[layer]), default=0)
        return seen[layer]

    for layer in USES:
        depth(layer)


def test_imports_point_down() -> None:
    bad = []
    for i in ALL_IMPORTS:
        if not _first_party(i):
            continue
        target = _resolve(i.target)
        if _own_package(i.module, target):
            continue
        src, dst = layer_of(i.module), layer_of(target)
        if dst not in USES[src]:
            bad.append(f"{_where(i)}: layer {src} may not use {dst}")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_first_party_imports_are_at_module_top() -> None:
    bad = [_where(i) for i in ALL_IMPORTS if _first_party(i) and i.in_function]
    assert not bad, "first-party imports inside functions:\n" + "\n".join(bad)


def test_ray_only_in_the_farm() -> None:
    bad = [_where(i) for i in ALL_IMPORTS
           if i.target.split(".")[0] == "ray" and layer_of(i.module) != "farm"]
    assert not bad, "ray imported outside collage_farm/farm/:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in ALL_IMPORTS:
        if _first_party(i) and not i.type_checking:
            t = _resolve(i.target)
            if t != i.module and t in MODULES:
                graph[i.module].add(t)
    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)
    stack: list[str] = []
    cycles: list[str] = []

    def dfs(m: str) -> None:
        colour[m] = grey
        stack.append(m)
        for n in sorted(graph[m]):
            if colour[n] == grey:
                cycles.append(" -> ".join([*stack[stack.index(n):], n]))
            elif colour[n] == white:
                dfs(n)
        stack.pop()
        colour[m] = black

    for m in sorted(graph):
        if colour[m] == white:
            dfs(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("top", FIRST_PARTY)
def test_layer_rules_see_the_code(top: str) -> None:
    """The parser finds imports (a test that finds nothing would pass vacuously)."""
    assert any(i.module.split(".")[0] == top and _first_party(i) for i in ALL_IMPORTS)
