"""The dispatch mode of the fake-tensor tracker and of the CUDA recorder's optional labels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class ObservingMode(TorchDispatchMode):  # type: ignore[misc]
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
