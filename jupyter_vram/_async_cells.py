"""`%%vram` cells with top-level ``await``: IPython itself runs them.

A cell magic is called synchronously from inside the running cell, and in a kernel the event
loop that would run ``await`` is already busy running that cell, so the magic cannot run an
async body itself. Instead, two hooks IPython offers for this rewrite such a cell before it is
compiled (as profilers that wrap cells do):

* an input transformer replaces the ``%%vram ...`` line by a marker call (the body keeps its
  lines, so tracebacks point where the user looks);
* an AST transformer turns the marker into ``begin(args)``, the body into
  ``try: ... except BaseException as e: end(e); raise`` / ``else: end(None)``, and keeps the
  body's last expression as the cell's value, so IPython displays it.

IPython then compiles and awaits the cell as it would any other. Cells without top-level
``await`` keep the ordinary magic path.
"""

from __future__ import annotations

import ast
import inspect
from typing import Any

MARKER = "__jupyter_vram_async_cell__"
VALUE = "__jupyter_vram_value__"
#: The magics object IPython keeps (``%reset`` clears the namespace, not this).
_MAGICS = 'get_ipython().magics_manager.registry["VramMagics"]'
BEGIN = f"{_MAGICS}._async_begin"
END = f"{_MAGICS}._async_end"


def has_top_level_await(body: str) -> bool:
    """The body only compiles as a coroutine (it awaits at the top level)."""
    if "await" not in body and "async" not in body:
        return False
    try:
        code = compile(
            body, "<cell>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT, dont_inherit=True
        )
    except (SyntaxError, ValueError):
        return False  # IPython syntax in the body: the magic path handles it
    return bool(code.co_flags & inspect.CO_COROUTINE)


def rewrite_lines(lines: list[str]) -> list[str]:
    """Input transformer: a ``%%vram`` cell that awaits gets a marker call for its first line."""
    if not lines or not lines[0].startswith("%%vram"):
        return lines
    head = lines[0].rstrip("\n")
    if head[len("%%vram") :][:1] not in ("", " ", "\t"):
        return lines  # another magic whose name starts with vram
    if not has_top_level_await("".join(lines[1:])):
        return lines
    return [f"{MARKER}({head[len('%%vram') :].strip()!r})\n", *lines[1:]]


class AsyncCellTransformer(ast.NodeTransformer):
    """AST transformer: marker + body -> begin, try/except/else around the body, value."""

    def visit_Module(self, node: ast.Module) -> ast.Module:
        first = node.body[0] if node.body else None
        if not (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Call)
            and isinstance(first.value.func, ast.Name)
            and first.value.func.id == MARKER
        ):
            return node
        body = node.body[1:]
        last = body[-1] if body and isinstance(body[-1], ast.Expr) else None
        if last is not None:
            keep = ast.Assign(targets=[ast.Name(VALUE, ast.Store())], value=last.value)
            body = [*body[:-1], ast.copy_location(keep, last)]
        begin = ast.parse(f"{BEGIN}()").body[0]
        assert isinstance(begin, ast.Expr) and isinstance(begin.value, ast.Call)
        begin.value.args = first.value.args
        failed = ast.parse(f"{END}(__jupyter_vram_error__)\nraise").body
        handler = ast.ExceptHandler(
            type=ast.Name("BaseException", ast.Load()), name="__jupyter_vram_error__", body=failed
        )
        wrapped = ast.Try(
            body=body or [ast.Pass()],
            handlers=[handler],
            orelse=ast.parse(f"{END}(None)").body,
            finalbody=[],
        )
        new: list[ast.stmt] = [ast.copy_location(begin, first), ast.copy_location(wrapped, first)]
        if last is not None:
            new.append(ast.copy_location(ast.Expr(ast.Name(VALUE, ast.Load())), last))
        node.body = new
        return ast.fix_missing_locations(node)


def install(shell: Any) -> None:
    """Register the two transformers (once per shell)."""
    if rewrite_lines not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(rewrite_lines)
    if not any(isinstance(t, AsyncCellTransformer) for t in shell.ast_transformers):
        shell.ast_transformers.append(AsyncCellTransformer())
