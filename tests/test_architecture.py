"""The import graph keeps data flowing one way, and every module of the package has a place in
it.

The imports are read from the source with ``ast`` (nothing is imported), every one of them:
at module level, inside functions and methods (lazy imports run too, just later), and under
``if TYPE_CHECKING:`` (type-only: never run, but a lower layer naming an upper layer's classes
is still an arrow running back up, and a cycle through one is still two modules that cannot be
read apart). All three kinds count alike, for the layers and for cycles.

Layers, bottom first (:data:`LAYERS`). A module belongs to the layer whose prefix names it most
closely (``jupyter_vram._distributed.files`` sits below the rest of ``_distributed``), and may
import its own layer and the layers below. Each module must be in a layer: a new file is given
its place here, or the test fails.

The checker is tested on small made-up packages written to a temporary folder: a planted
type-only cycle, an upward import from each layer and a module in no layer each fail it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "jupyter_vram"
ROOT = "jupyter_vram"


def _names(*names: str) -> tuple[str, ...]:
    return tuple(f"{ROOT}.{n}" if n else ROOT for n in names)


Layers = tuple[tuple[str, tuple[str, ...]], ...]

#: (layer, module-name prefixes), bottom first. Why each sits where it does:
LAYERS: Layers = (
    # import nothing of the package but each other: byte units, the caching allocator's rules
    # and its block bookkeeping (the recorder's and the estimator's replays), the cuBLAS
    # workspaces PyTorch keeps
    ("leaves", _names("_units", "_allocator_rules", "_allocator_blocks", "_blas_workspaces")),
    # the data every layer passes: the Profile's columns and tables, its timeline replay,
    # what a rerun changed (Variant)
    ("data", _names("_model")),
    # recorders: they build Profiles
    ("capture", _names("_capture")),
    # PyTorch snapshot files read and written, with the recorders' conversion
    ("snapshots", _names("_snapshots")),
    # numpy / pandas over a Profile: peaks, groups, flame tree, allocator model, compare
    ("analysis", _names("_analysis")),
    # what a rerun applies to a model (AMP, checkpointing, offload)
    ("transforms", _names("_transforms")),
    # text, figures, HTML, mime bundles
    ("render", _names("_render")),
    # reading what a run left behind: per-rank profile files, tensors still alive
    ("files", _names("_distributed.files", "_leaks")),
    # the user-facing Profile: the data plus its conveniences (compare, leaks, to_html ...)
    ("profile", _names("_profile")),
    # jv.record
    ("recording", _names("_recording")),
    # jv.estimate: a recording of a simulated run
    ("estimator", _names("_estimator")),
    # the views that read an Estimate (its tables and comparison in text, the saved mime
    # bundle and static report): render modules, above the estimator whose types they read
    ("estimate views", _names("_render.estimate_text", "_render.mime", "_render.static_report")),
    # the kernel's state: the last profile, the cell run under recording
    ("session", _names("_session", "_async_cells")),
    # what runs a cell again or elsewhere: reruns (and what a cell's source says it does),
    # ranks, devices
    ("reruns", _names("_rerun", "_cell_source", "_distributed", "_devices")),
    # make it fit: plans over estimates and reruns
    ("planning", _names("_planning", "_budgets")),
    # the widgets
    ("app", _names("_app")),
    # entry points: the package, magics, CLI, pytest plugin, server extension
    ("entry", _names("", "__main__", "_magics", "_magics_estimate", "_cli", "run",
                     "pytest_plugin", "_server", "examples")),
)  # fmt: skip


@dataclass(frozen=True)
class Import:
    """One imported package module, where it is imported, and how."""

    source: str  # the importing module
    target: str  # the imported module (a submodule when ``from pkg import submodule``)
    line: int
    kind: str  # "module" (runs at import), "function" (runs when called), "typing"


def read_modules(package: Path) -> dict[str, Path]:
    """Module name -> file, for every ``.py`` file under ``package`` (its folder name is the
    root of the names)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_package: bool,
             modules: Mapping[str, Path]) -> Iterator[str]:  # fmt: skip
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


def imports_of(
    name: str, path: Path, modules: Mapping[str, Path], root: str | None = None
) -> list[Import]:
    """Every import of the package (``root``: by default the one ``name`` is in) in one
    module, with its kind."""
    root = root or name.split(".", maxsplit=1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    found: list[Import] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in _targets(child, name, is_package, modules):
                    if target == root or target.startswith(root + "."):
                        found.append(Import(name, target, child.lineno, kind))
                continue
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), "typing")
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), kind)
                continue
            inner = kind
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                inner = "typing" if kind == "typing" else "function"
            visit(child, inner)

    visit(tree, "module")
    return found


def import_graph(modules: Mapping[str, Path]) -> list[Import]:
    return [i for name, path in modules.items() for i in imports_of(name, path, modules)]


def _within(module: str, prefix: str) -> bool:
    """``module`` is ``prefix`` or inside it (the root names only the package's own
    ``__init__``, not everything in it)."""
    return module == prefix or (prefix != ROOT and module.startswith(prefix + "."))


def layer_of(module: str, layers: Layers = LAYERS) -> int | None:
    """The index (bottom 0) of the layer whose prefix names ``module`` most closely."""
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            if _within(module, prefix) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def unplaced(modules: Mapping[str, Path], layers: Layers = LAYERS) -> list[str]:
    """The modules in no layer."""
    return [m for m in modules if layer_of(m, layers) is None]


def layer_violations(graph: list[Import], layers: Layers = LAYERS) -> list[str]:
    """Each import, of any kind, of a module in a higher layer than the importer's."""
    problems = []
    for imp in graph:
        source, target = layer_of(imp.source, layers), layer_of(imp.target, layers)
        if source is None or target is None or target > source:
            where = f"{imp.source}:{imp.line} imports {imp.target} ({imp.kind})"
            names = [layers[i][0] if i is not None else "no layer" for i in (source, target)]
            problems.append(f"{where}: {names[0]} -> {names[1]}")
    return problems


def cycles(graph: list[Import]) -> list[list[str]]:
    """The strongly connected components (more than one module, or a module importing itself)
    of the graph of every import, type-only and lazy ones included."""
    edges: dict[str, set[str]] = {}
    for imp in graph:
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


def problems(package: Path) -> list[str]:
    """Everything this test refuses in ``package``: modules in no layer, upward imports,
    cycles."""
    modules = read_modules(package)
    graph = import_graph(modules)
    return (
        [f"{m} is in no layer" for m in unplaced(modules)]
        + layer_violations(graph)
        + [f"import cycle: {' <-> '.join(c)}" for c in cycles(graph)]
    )


# -- the checker, on made-up packages ---------------------------------------------------------


def write_package(where: Path, files: Mapping[str, str]) -> Path:
    """A package named ``jupyter_vram`` under ``where``: module name -> source. Each module is
    written as ``name.py`` (the root as ``__init__.py``), every folder on the way gets an empty
    ``__init__.py``."""
    package = where / ROOT
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").touch()
    for name, source in files.items():
        parts = name.split(".")[1:]
        path = package.joinpath(*parts).with_suffix(".py") if parts else package / "__init__.py"
        folder = path.parent
        while folder != package:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").touch()
            folder = folder.parent
        path.write_text(source)
    return package


def test_the_reader_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The checks are only as good as the reader: a hand-written module with one import of each
    kind comes back with each import and its kind."""
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "from ._model import Profile\n"
        "from . import _render\n"
        "import jupyter_vram._analysis.timeline\n"
        "import numpy\n"
        "if TYPE_CHECKING:\n"
        "    from ._estimator.api import Estimate\n"
        "else:\n"
        "    from ._units import format_bytes\n"
        "def f() -> None:\n"
        "    from ._app import profile_app\n"
        "class C:\n"
        "    from ._magics import VramMagics\n"
        "    def g(self) -> None:\n"
        "        from ._render.text import format_bytes\n"
        "        if TYPE_CHECKING:\n"
        "            from ._session import Session\n"
    )
    path = tmp_path / ROOT / "probe.py"
    path.parent.mkdir(parents=True)
    path.write_text(source)
    modules = {m: Path() for m in ("jupyter_vram._render", "jupyter_vram._app.profile_app")}
    got = [(i.target, i.kind) for i in imports_of("jupyter_vram.probe", path, modules)]
    assert got == [
        ("jupyter_vram._model", "module"),
        ("jupyter_vram._render", "module"),
        ("jupyter_vram._analysis.timeline", "module"),
        ("jupyter_vram._estimator.api", "typing"),
        ("jupyter_vram._units", "module"),
        ("jupyter_vram._app.profile_app", "function"),
        ("jupyter_vram._magics", "module"),
        ("jupyter_vram._render.text", "function"),
        ("jupyter_vram._session", "typing"),
    ]


def test_a_planted_type_only_cycle_fails(tmp_path: Path) -> None:
    """Two modules of one layer, one naming the other only for type checking: still a cycle."""
    package = write_package(
        tmp_path,
        {
            "jupyter_vram._analysis.a": "from .b import g\n",
            "jupyter_vram._analysis.b": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from .a import A\n"
                "def g() -> None: ...\n"
            ),
        },
    )
    assert problems(package) == [
        "import cycle: jupyter_vram._analysis.a <-> jupyter_vram._analysis.b"
    ]


def test_a_lazy_cycle_fails(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {
            "jupyter_vram._capture.a": "def f():\n    from .b import g\n",
            "jupyter_vram._capture.b": "from .a import f\n",
        },
    )
    assert problems(package) == [
        "import cycle: jupyter_vram._capture.a <-> jupyter_vram._capture.b"
    ]


UPWARD_KINDS = {
    "module": "from {target} import x\n",
    "function": "def f():\n    from {target} import x\n",
    "typing": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from {target} import x\n",
}


@pytest.mark.parametrize("kind", sorted(UPWARD_KINDS))
@pytest.mark.parametrize("layer", [name for name, _ in LAYERS[:-1]])
def test_an_upward_import_from_any_layer_fails(tmp_path: Path, layer: str, kind: str) -> None:
    """A module of each layer (but the top) importing, in each way, a module of the layer
    above: one violation, naming both layers."""
    at = [name for name, _ in LAYERS].index(layer)
    below, above = LAYERS[at][1][0], LAYERS[at + 1][1][0]
    source_name = f"{below}.probe" if below != ROOT else f"{ROOT}.probe"
    target_name = f"{above}.target" if above != ROOT else ROOT
    files = {source_name: UPWARD_KINDS[kind].format(target=target_name)}
    if target_name != ROOT:
        files[target_name] = "x = 1\n"
    found = problems(write_package(tmp_path, files))
    assert len(found) == 1, found
    assert found[0].startswith(f"{source_name}:") and found[0].endswith(
        f"({kind}): {layer} -> {LAYERS[at + 1][0]}"
    )


def test_a_module_in_no_layer_fails(tmp_path: Path) -> None:
    package = write_package(
        tmp_path,
        {"jupyter_vram._units": "x = 1\n", "jupyter_vram._stray": "from ._units import x\n"},
    )
    assert problems(package) == [
        "jupyter_vram._stray is in no layer",
        "jupyter_vram._stray:1 imports jupyter_vram._units (module): no layer -> leaves",
    ]


def test_a_clean_made_up_package_passes(tmp_path: Path) -> None:
    """Downward imports of every kind, in a package where every module has a layer: nothing."""
    package = write_package(
        tmp_path,
        {
            "jupyter_vram": "def f():\n    from ._app import view\n",
            "jupyter_vram._units": "x = 1\n",
            "jupyter_vram._model": "from ._units import x\n",
            "jupyter_vram._app.view": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from .._model import x\n"
                "def g():\n"
                "    from .._units import x\n"
            ),
        },
    )
    assert problems(package) == []


# -- the package ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def modules() -> dict[str, Path]:
    return read_modules(PACKAGE)


@pytest.fixture(scope="module")
def graph(modules: dict[str, Path]) -> list[Import]:
    found = import_graph(modules)
    assert len(found) > 100  # the reader found the package's imports
    return found


def test_every_module_is_in_a_layer(modules: dict[str, Path]) -> None:
    assert len(modules) > 100
    assert unplaced(modules) == []


def test_no_layer_imports_from_a_layer_above(graph: list[Import]) -> None:
    assert layer_violations(graph) == []


def test_the_data_imports_only_leaves(graph: list[Import]) -> None:
    """The bottom holds what every layer passes around; it needs nothing but the leaves."""
    data = [name for name, _ in LAYERS].index("data")
    assert [
        i for i in graph if layer_of(i.source) == data and (layer_of(i.target) or 0) > data
    ] == []


def test_no_import_cycles(graph: list[Import]) -> None:
    assert cycles(graph) == []
