"""The import graph keeps data flowing one way: capture -> Profile -> analysis -> render ->
app -> magics, with the estimator beside analysis.

The imports are read from the source with ``ast`` (nothing is imported), every one of them:
at module level, inside functions and methods (lazy imports run too, just later), and under
``if TYPE_CHECKING:`` (type-only: never run, but a lower layer naming an upper layer's
classes is still an arrow running back up).

Layers, bottom first (a module may import its own layer and the layers listed for it):

* leaves, which import nothing of the package and any layer may use: ``_allocator_rules.py``
  (the caching allocator's rules), ``_blas_workspaces.py`` (the cuBLAS / cuBLASLt workspaces
  PyTorch keeps, which the recorder names and the estimator adds), ``_units.py`` (byte
  sizes in words) and ``_display.py`` (the text view an upper layer registers for a lower
  layer's class, e.g. an Estimate's summary).
* ``_model.py``: the data. At run time it imports only ``_units``; under
  TYPE_CHECKING it may name the three result types its conveniences return
  (:data:`MODEL_TYPE_ONLY`). Its analysis conveniences are filled in from above at package
  import (see ``jupyter_vram/_profile_services.py``).
* ``capture/``: model only.
* ``analysis/``: model only.
* ``estimator/``: model, capture, analysis, transforms, recording. Never render, app or the
  magics: it returns data.
* ``render/``: model, analysis. Never the estimator: what it formats of an estimate it reads
  through the Protocols it declares itself (``_render/estimate_text.py``).
* ``app/``: anything but the magics.

Cycles: the graph of run-time imports (module level and function level; type-only imports
excluded, as they never run) has no cycle. A lazy import inside a function is still an
arrow: a cycle through one only hides until the function is called.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jupyter_vram"
ROOT = "jupyter_vram"

#: The only type-only imports _model.py makes: the return types of its conveniences
#: (``Profile.timeline``, ``Profile.oom``, ``Profile.variant``), and the Protocol of the
#: services that provide them.
MODEL_TYPE_ONLY = frozenset(
    {"jupyter_vram._analysis.timeline", "jupyter_vram._analysis.oom", "jupyter_vram._rerun"}
)

#: Layer -> the layers (module-name prefixes) it may import besides itself.
LEAF = "jupyter_vram._units"
LEAVES = (
    LEAF,
    "jupyter_vram._display",
    "jupyter_vram._allocator_rules",
    "jupyter_vram._blas_workspaces",
)
ALLOWED: dict[str, tuple[str, ...]] = {
    **{leaf: () for leaf in LEAVES},
    "jupyter_vram._model": (LEAF,),
    "jupyter_vram._capture": (*LEAVES, "jupyter_vram._model"),
    "jupyter_vram._analysis": (*LEAVES, "jupyter_vram._model"),
    "jupyter_vram._estimator": (
        *LEAVES,
        "jupyter_vram._model",
        "jupyter_vram._capture",
        "jupyter_vram._analysis",
        "jupyter_vram._transforms",
        "jupyter_vram._recording",
    ),
    "jupyter_vram._render": (*LEAVES, "jupyter_vram._model", "jupyter_vram._analysis"),
}
#: Layer -> what it must never import (for layers that may import most of the package).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "jupyter_vram._app": ("jupyter_vram._magics", "jupyter_vram._magics_estimate"),
}


@dataclass(frozen=True)
class Import:
    """One imported jupyter_vram module, where it is imported, and how."""

    source: str  # the importing module
    target: str  # the imported module (a submodule when ``from pkg import submodule``)
    line: int
    kind: str  # "module" (runs at import), "function" (runs when called), "typing"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool,
             modules: dict[str, Path]) -> Iterator[str]:  # fmt: skip
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    if node.level:
        base = name.split(".") if is_package else name.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        parent = ".".join(base + ([node.module] if node.module else []))
    else:
        parent = node.module or ""
    for alias in node.names:
        full = f"{parent}.{alias.name}"
        yield full if full in modules else parent


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """Every jupyter_vram import in one module, with its kind."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(child, name, is_package, modules):
                    if target == ROOT or target.startswith(ROOT + "."):
                        found.append(Import(name, target, child.lineno, kind))
                continue
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, "typing")
                for stmt in child.orelse:
                    visit_stmt(stmt, kind)
                continue
            inner = kind
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = "typing" if kind == "typing" else "function"
            visit(child, inner)

    def visit_stmt(stmt: ast.stmt, kind: str) -> None:
        wrapper = ast.Module(body=[stmt], type_ignores=[])
        visit(wrapper, kind)

    visit(tree, "module")
    return found


def import_graph() -> list[Import]:
    modules = all_modules()
    return [i for name, path in modules.items() for i in imports_of(name, path, modules)]


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_violations(graph: list[Import]) -> list[str]:
    """Each import that runs against the layers (see the module docstring)."""
    problems = []
    for imp in graph:
        where = f"{imp.source}:{imp.line} imports {imp.target} ({imp.kind})"
        if imp.source == "jupyter_vram._model" and imp.kind == "typing":
            if imp.target not in MODEL_TYPE_ONLY:
                problems.append(where)
            continue
        for layer, allowed in ALLOWED.items():
            inside = _within(imp.source, layer) and not _within(imp.target, layer)
            if inside and not any(_within(imp.target, ok) for ok in allowed):
                problems.append(where)
        for layer, forbidden in FORBIDDEN.items():
            if _within(imp.source, layer) and any(_within(imp.target, f) for f in forbidden):
                problems.append(where)
    return problems


def cycles(graph: list[Import]) -> list[list[str]]:
    """The strongly connected components (more than one module, or a module importing
    itself) of the run-time import graph."""
    edges: dict[str, set[str]] = {}
    for imp in graph:
        if imp.kind != "typing":
            edges.setdefault(imp.source, set()).add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def test_the_reader_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checks below are only as good as the reader: a hand-written module with one import
    of each kind comes back with each import and its kind."""
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from ._model import Profile\n"
        "from . import _render\n"
        "import jupyter_vram._analysis.timeline\n"
        "import numpy\n"
        "if TYPE_CHECKING:\n"
        "    from ._estimator.api import Estimate\n"
        "def f() -> None:\n"
        "    from ._app import profile_app\n"
        "class C:\n"
        "    from ._magics import VramMagics\n"
        "    def g(self) -> None:\n"
        "        from ._render.text import format_bytes\n"
    )
    path = tmp_path / "jupyter_vram" / "probe.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    modules = {m: Path() for m in ("jupyter_vram._render", "jupyter_vram._app.profile_app")}
    got = [(i.target, i.kind) for i in imports_of("jupyter_vram.probe", path, modules)]
    assert got == [
        ("jupyter_vram._model", "module"),
        ("jupyter_vram._render", "module"),
        ("jupyter_vram._analysis.timeline", "module"),
        ("jupyter_vram._estimator.api", "typing"),
        ("jupyter_vram._app.profile_app", "function"),
        ("jupyter_vram._magics", "module"),
        ("jupyter_vram._render.text", "function"),
    ]


def test_the_checks_catch_an_arrow_running_back_up() -> None:
    """A made-up graph with one upward import of each forbidden kind, and a cycle through a
    lazy import, is caught; the real graph without them is not."""
    fake = [
        Import("jupyter_vram._model", "jupyter_vram._render.text", 1, "function"),
        Import("jupyter_vram._analysis.oom", "jupyter_vram._render.text", 2, "module"),
        Import("jupyter_vram._capture.stacks", "jupyter_vram", 3, "function"),
        Import("jupyter_vram._render.mime", "jupyter_vram._estimator.api", 4, "typing"),
        Import("jupyter_vram._estimator.api", "jupyter_vram._render.estimate_text", 5, "function"),
        Import("jupyter_vram._app.profile_app", "jupyter_vram._magics", 6, "function"),
    ]
    assert len(layer_violations(fake)) == len(fake)
    loop = [
        Import("jupyter_vram.a", "jupyter_vram.b", 1, "module"),
        Import("jupyter_vram.b", "jupyter_vram.a", 2, "function"),
        Import("jupyter_vram.c", "jupyter_vram.a", 3, "typing"),
        Import("jupyter_vram.a", "jupyter_vram.c", 4, "module"),
    ]
    assert cycles(loop) == [["jupyter_vram.a", "jupyter_vram.b"]]


@pytest.fixture(scope="module")
def graph() -> list[Import]:
    found = import_graph()
    assert len(found) > 100  # the reader found the package's imports
    return found


def test_no_layer_imports_from_a_layer_above(graph: list[Import]) -> None:
    assert layer_violations(graph) == []


def test_model_imports_nothing_above_it_at_run_time(graph: list[Import]) -> None:
    run_time = {i.target for i in graph if i.source == "jupyter_vram._model" and i.kind != "typing"}
    assert run_time <= {LEAF}


def test_render_knows_no_estimator(graph: list[Import]) -> None:
    assert [
        i
        for i in graph
        if _within(i.source, "jupyter_vram._render")
        and _within(i.target, "jupyter_vram._estimator")
    ] == []


def test_no_import_cycles(graph: list[Import]) -> None:
    assert cycles(graph) == []
