"""Compact Python stacks for allocations: the user's frames, without torch or Jupyter plumbing."""

from __future__ import annotations

import os
import sys
from types import CodeType, FrameType

import torch

from ..model import Frame
from .builder import ProfileBuilder


def _package_dir(module: object) -> str:
    return os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or "")) + os.sep


def _hidden_prefixes() -> tuple[str, ...]:
    import IPython  # noqa: PLC0415 - optional at import time of this module

    import jupyter_vram

    prefixes = [_package_dir(torch), _package_dir(jupyter_vram), _package_dir(IPython)]
    for name in ("ipykernel", "tornado", "asyncio", "traitlets", "runpy", "contextlib"):
        module = sys.modules.get(name)
        if module is not None:
            prefixes.append(_package_dir(module) if name != "contextlib" else module.__file__ or "")
    return tuple(p for p in prefixes if p and p != os.sep)


class StackSampler:
    """Turns the current call stack into an interned stack id, outermost frame first.

    The walk keys its cache on (code object, line) pairs, so the filtering and interning cost
    is paid once per distinct stack; repeated allocations from one place cost one frame walk.
    """

    def __init__(self, builder: ProfileBuilder, max_depth: int = 48) -> None:
        self._builder = builder
        self._max_depth = max_depth
        self._hidden = _hidden_prefixes()
        self._keep: dict[CodeType, bool] = {}
        self._cache: dict[tuple[object, ...], int] = {}

    def _is_user_code(self, code: CodeType) -> bool:
        keep = self._keep.get(code)
        if keep is None:
            filename = code.co_filename
            keep = not (filename.startswith(self._hidden) or filename.startswith("<frozen"))
            self._keep[code] = keep
        return keep

    def sample(self, frame: FrameType | None) -> int:
        key: list[object] = []
        depth = 0
        is_user = self._is_user_code
        while frame is not None and depth < self._max_depth:
            code = frame.f_code
            if is_user(code):
                key.append(code)
                key.append(frame.f_lineno)
                depth += 1
            frame = frame.f_back
        tkey = tuple(key)
        sid = self._cache.get(tkey)
        if sid is None:
            pairs = [(tkey[i], tkey[i + 1]) for i in range(len(tkey) - 2, -1, -2)]
            frames = tuple(
                Frame(code.co_filename, int(line), code.co_name)  # type: ignore[attr-defined]
                for code, line in pairs
            )
            sid = self._cache[tkey] = self._builder.intern_stack(frames)
        return sid
