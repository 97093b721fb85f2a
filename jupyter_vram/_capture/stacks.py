"""Compact Python stacks for allocations: the user's frames, without torch or Jupyter plumbing."""

from __future__ import annotations

import os
import re
import sys
from types import CodeType, FrameType
from typing import cast

import torch

from .._model import Frame
from .builder import ProfileBuilder


def _package_dir(module: object) -> str:
    return os.path.dirname(os.path.abspath(getattr(module, "__file__", "") or "")) + os.sep


# jupyter_vram's own folder (capture/'s parent: no import of the package, which sits above)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# The built-in example workload is user code as far as stacks are concerned.
_EXAMPLES = os.path.join(_PACKAGE_DIR, "examples.py")
_EXAMPLES_TAIL = "jupyter_vram/examples.py"
# Frames of torch, Jupyter plumbing and this package, recognised on any machine (a snapshot may
# be converted far from where it was recorded, so local install prefixes are not enough).
_PLUMBING = re.compile(
    r"[\\/](?:site|dist)-packages[\\/](?:torch|IPython|ipykernel|tornado|traitlets|zmq|"
    r"jupyter_client|jupyter_vram)[\\/]"
    r"|[\\/]jupyter_vram[\\/]_?(?:capture[\\/]|session\.py|recording\.py|magics\.py)"
    r"|[\\/]python3(?:\.\d+)?[\\/](?:asyncio[\\/]|runpy\.py|contextlib\.py|threading\.py)"
)


def _hidden_prefixes() -> tuple[str, ...]:
    prefixes = [_package_dir(torch), _PACKAGE_DIR]
    try:
        import IPython  # optional: capture also runs in plain Python (GPU benches, scripts)
    except ImportError:
        pass
    else:
        prefixes.append(_package_dir(IPython))
    for name in ("ipykernel", "tornado", "asyncio", "traitlets", "runpy", "contextlib"):
        module = sys.modules.get(name)
        if module is not None:
            prefixes.append(_package_dir(module) if name != "contextlib" else module.__file__ or "")
    return tuple(p for p in prefixes if p and p != os.sep)


def cell_name(filename: str) -> str:
    """'In[7]' for the code of a notebook cell (IPython knows its execution count), else the
    filename unchanged: a kernel's temporary cell file names mean nothing to a reader."""
    try:
        from IPython.core.getipython import get_ipython
    except ImportError:
        return filename
    shell = get_ipython()
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    number = names.get(filename) if isinstance(names, dict) else None
    return f"In[{number}]" if isinstance(number, int) else filename


class FrameFilter:
    """The one rule for which frames are the user's: not torch, jupyter_vram, IPython or kernel
    plumbing (the built-in example workload counts as user code). Cached per filename.

    Used for live stacks, torch.profiler stacks, CUDA snapshot frames (which may come from
    another machine, hence :data:`_PLUMBING`) and the estimator's error messages.
    """

    def __init__(self) -> None:
        self._hidden = _hidden_prefixes()
        # torch.profiler names files relative to their sys.path entry ("torch/nn/module.py")
        relative = {os.path.basename(p.rstrip(os.sep)) for p in self._hidden}
        self._hidden_relative = tuple(
            name + ("" if name.endswith(".py") else "/") for name in relative if name
        )
        self._keep: dict[str, bool] = {}

    def keep(self, filename: str) -> bool:
        keep = self._keep.get(filename)
        if keep is None:
            keep = self._keep[filename] = self._classify(filename)
        return keep

    def _classify(self, filename: str) -> bool:
        if filename == _EXAMPLES or filename.replace("\\", "/").endswith(_EXAMPLES_TAIL):
            return True
        if filename.startswith("<frozen"):
            return False
        if os.path.isabs(filename):
            if filename.startswith(self._hidden):
                return False
        elif filename.startswith(self._hidden_relative):
            return False
        return _PLUMBING.search(filename) is None


class StackSampler:
    """Turns the current call stack into an interned stack id, outermost frame first.

    The walk keys its cache on (code object, line) pairs, so the filtering and interning cost
    is paid once per distinct stack; repeated allocations from one place cost one frame walk.
    """

    def __init__(self, builder: ProfileBuilder, max_depth: int = 48) -> None:
        self._builder = builder
        self._max_depth = max_depth
        self._filter = FrameFilter()
        self._keep: dict[CodeType, bool] = {}
        self._cache: dict[tuple[object, ...], int] = {}
        self._boundary: FrameType | None = None

    def set_boundary(self, frame: FrameType | None) -> None:
        """Stop walks at ``frame`` (the code that started recording): what lies above it is the
        same for every allocation, and in a kernel it is twenty-odd frames of plumbing."""
        self._boundary = frame

    def _classify(self, code: CodeType) -> bool:
        keep = self._keep[code] = self._filter.keep(code.co_filename)
        return keep

    def sample(self, frame: FrameType | None) -> int:
        key: list[object] = []
        append = key.append
        keep = self._keep
        boundary = self._boundary
        budget = self._max_depth
        while frame is not None:
            code = frame.f_code
            user = keep.get(code)
            if user is None:
                user = self._classify(code)
            if user:
                append(code)
                append(frame.f_lineno)
                budget -= 1
                if not budget:
                    break
            if frame is boundary:
                break
            frame = frame.f_back
        tkey = tuple(key)
        sid = self._cache.get(tkey)
        if sid is None:
            pairs = [
                (cast(CodeType, tkey[i]), cast(int, tkey[i + 1]))
                for i in range(len(tkey) - 2, -1, -2)
            ]
            frames = tuple(
                Frame(cell_name(code.co_filename), line, code.co_name) for code, line in pairs
            )
            sid = self._cache[tkey] = self._builder.intern_stack(frames)
        return sid
