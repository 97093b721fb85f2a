"""What a cell's source says it does, read with ``ast`` before a rerun runs it again: the
names it reads and binds, autocast it sets itself, and what a rerun cannot undo (files it
writes, iterators it draws from, notebook containers it changes).

Apart from :mod:`jupyter_vram._rerun` because it is plain source reading: no torch, no state.
"""

from __future__ import annotations

import ast
import collections.abc
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "remove", "clear", "update", "setdefault", "add",
     "discard", "popitem", "sort", "reverse"}
)  # fmt: skip
_WRITE_CALLS = frozenset({"save", "save_pretrained", "to_csv", "write_text", "write_bytes"})


@dataclass(frozen=True)
class CellFacts:
    """What the source of a cell says it does, for warnings and refusals."""

    names: frozenset[str]  # every name the cell reads or binds
    bound: frozenset[str]  # names the cell binds (assignments, imports, definitions)
    autocast_line: int | None
    writes_files: tuple[str, ...]
    iterators: tuple[str, ...]
    mutated: tuple[str, ...]


def read_cell(source: str, namespace: Mapping[str, Any]) -> CellFacts:
    """Names, autocast, file writes, iterator draws and container mutations in a cell."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return CellFacts(frozenset(), frozenset(), None, (), (), ())
    names: set[str] = set()
    bound: set[str] = set()
    autocast_line = None
    writes: list[str] = []
    iterators: list[str] = []
    mutated: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
            if isinstance(node.ctx, ast.Store):
                bound.add(node.id)
            if node.id == "autocast" and autocast_line is None:
                autocast_line = node.lineno
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Attribute) and node.attr == "autocast":
            autocast_line = autocast_line or node.lineno
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        if called == "open" and _opens_for_writing(node):
            writes.append(f"open(..., write) on line {node.lineno}")
        elif called in _WRITE_CALLS:
            writes.append(f".{called}(...) on line {node.lineno}")
        elif called == "next":
            iterators.append(f"next(...) on line {node.lineno}")
        if (
            isinstance(func, ast.Attribute)
            and func.attr in _MUTATORS
            and isinstance(func.value, ast.Name)
            and isinstance(namespace.get(func.value.id), (list, dict, set, bytearray))
        ):
            mutated.append(f"{func.value.id}.{func.attr}(...)")
    for name in sorted(names):
        value = namespace.get(name)
        if isinstance(value, collections.abc.Iterator) and not isinstance(value, (str, bytes)):
            iterators.append(f"{name} (an iterator)")
    return CellFacts(
        frozenset(names),
        frozenset(bound),
        autocast_line,
        tuple(writes),
        tuple(iterators),
        tuple(mutated),
    )


def _opens_for_writing(call: ast.Call) -> bool:
    mode: ast.expr | None = call.args[1] if len(call.args) > 1 else None
    for keyword in call.keywords:
        if keyword.arg == "mode":
            mode = keyword.value
    if not isinstance(mode, ast.Constant) or not isinstance(mode.value, str):
        return mode is not None  # a computed mode: assume it may write
    return any(c in mode.value for c in "wax+")


def warnings_for(facts: CellFacts) -> list[str]:
    """One line per thing a rerun cannot undo (these become the variant's notes)."""
    notes: list[str] = []
    if facts.writes_files:
        notes.append(f"the cell writes files ({facts.writes_files[0]}): the rerun wrote them again")
    if facts.iterators:
        notes.append(
            f"the cell draws from an iterator ({facts.iterators[0]}): the rerun took the next "
            "item, so its inputs may differ"
        )
    if facts.mutated:
        notes.append(
            f"the cell changes a notebook container ({facts.mutated[0]}): the rerun's change stays"
        )
    return notes
