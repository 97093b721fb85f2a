"""Dispatch modes (torch's private ``TorchDispatchMode``), kept here so that no code outside
capture/ touches the private API: the tracker's and the CUDA recorder's observing mode, and a
rewriting mode for the estimator's kernel buffers."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class ObservingMode(TorchDispatchMode):
    """Calls ``before(func)`` ahead of each aten op and ``after(func, out)`` once it returns.

    Hooks must never raise (an exception inside a dispatch mode can abort the process when it
    is stacked on a FakeTensorMode): callers wrap their bodies accordingly.
    """

    def __init__(
        self,
        before: Callable[[Any], None] | None = None,
        after: Callable[[Any, Any], None] | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._before = before
        self._after = after
        #: optional ``inspect(func, args, out)`` after ``after``, for callers that need the
        #: arguments too (set only while they watch, so the usual path pays nothing for it)
        self.inspect: Callable[[Any, tuple[Any, ...], Any], None] | None = None

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        if self._before is not None:
            self._before(func)
        out = func(*args, **kwargs) if kwargs else func(*args)
        if self._after is not None:
            self._after(func, out)
        if self.inspect is not None:
            self.inspect(func, args, out)
        return out


#: ``rewrite(func, args, kwargs, out)``: what an aten op returns, given what it computed.
Rewrite = Callable[[Any, tuple[Any, ...], dict[str, Any], Any], Any]


class RewritingMode(TorchDispatchMode):
    """Runs each aten op, then returns ``rewrite(func, args, kwargs, out)`` in its place: for
    code that adds to what ops allocate or return (the estimator's kernel-made buffers)."""

    def __init__(self, rewrite: Rewrite) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._rewrite = rewrite

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        return self._rewrite(func, args, kwargs, func(*args, **kwargs))


@contextlib.contextmanager
def rewriting_ops(rewrite: Rewrite) -> Iterator[None]:
    """Within the block, every aten op's result goes through ``rewrite`` (see
    :class:`RewritingMode`); modes entered later see the rewritten results."""
    with RewritingMode(rewrite):
        yield
