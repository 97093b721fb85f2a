"""optimum-quanto's quantised KV cache on fake tensors, allocating what the real one does.

transformers' ``QuantizedCache`` (quanto backend) runs quanto's own code in the fake run: its
scales and shifts (``MaxOptimizer``), ``quantize_weight`` and ``dequantize()``. Three things
differ from a real run unless corrected here:

- **Packing.** ``WeightQBitsTensor`` packs its integers (two 4-bit or four 2-bit values a byte)
  only when handed a plain ``torch.Tensor`` (``type(data) is torch.Tensor``): a fake tensor
  is kept unpacked, a byte a value. :func:`quanto_as_run` packs it as a real tensor is packed.
- **quanto's custom ops** (``quanto::quantize_affine``, ``quanto::quantize_symmetric``) are
  Python functions the real run executes op by op (their temporaries: the shifted and scaled
  copy, ``round``, ``clamp``); a fake tensor runs them as one op on the meta device, unseen. Here
  they run op by op on the fake tensors too.
- **Unpacking** (``quanto::unpack``, every step, to dequantise) is a C++ kernel on the CPU
  made of ``&``, ``>>`` and ``cat`` whose operands live until it returns; on CUDA one kernel
  that allocates only its output (what a fake run of the op allocates as it is).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def _unpack_as_cpu_kernel(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """quanto's CPU ``unpack`` (library/extensions/cpp/unpack.cpp) op by op: every masked and
    shifted operand is alive when ``cat`` allocates the result (C++ temporaries end with the
    statement). Lowest bits first, as the kernel stacks them."""
    if bits not in (2, 4):
        raise ValueError(f"quanto unpacks 2-bit or 4-bit values, not {bits}-bit")
    operands: list[torch.Tensor] = []  # what the kernel's expression holds until it returns
    parts = []
    for i in range(8 // bits):
        mask = ((1 << bits) - 1) << (bits * i)
        masked = packed & mask
        operands.append(masked)
        parts.append(masked.__rshift__(bits * i) if i else masked)
    unpacked = torch.cat(parts, 0)
    del operands, parts  # the kernel's temporaries end once its result exists
    return unpacked


#: quanto's ops whose implementation is Python (its "default" kernel, for every device)
_PYTHON_OPS = ("quantize_affine", "quantize_symmetric")


class _QuantoOpsAsRun(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Runs quanto's custom ops on fake tensors op by op, as the real run executes them (see
    the module docstring): the Python ops through their own kernel (redispatched past this
    mode and the fake mode's single-op handling), on the CPU the unpack kernel's ``&`` /
    ``>>`` / ``cat``."""

    def __init__(self, cpu: bool) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        ops = torch.ops.quanto
        self._python_ops = {getattr(ops, n).default for n in _PYTHON_OPS if hasattr(ops, n)}
        self._unpack = ops.unpack.default if cpu and hasattr(ops, "unpack") else None
        self._own_kernel = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func is self._unpack:
            return _unpack_as_cpu_kernel(*args, **kwargs)
        if func in self._python_ops:
            with _ComposedOpsDecomposed():  # type: ignore[no-untyped-call]
                return func.redispatch(self._own_kernel, *args, **kwargs)
        return func(*args, **kwargs)


class _ComposedOpsDecomposed(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Ops made of other ops (``to``, ``reshape``: CompositeImplicitAutograd) run as those ops.

    A kernel called from a dispatch mode runs below autograd, where such ops are not taken
    apart as they are in a real run: they would reach the recording whole, and ``to``'s copy
    would not be seen."""

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        out = func.decompose(*args, **kwargs)
        return func(*args, **kwargs) if out is NotImplemented else out


def _packing_fakes(qbits: Any, packed: Any) -> Callable[..., None]:
    """``WeightQBitsTensor.__init__`` that packs fake integer data, as it packs real data."""
    from torch._subclasses.fake_tensor import FakeTensor

    original: Callable[..., None] = qbits.__init__

    def init(self: Any, qtype: Any, axis: Any, group_size: Any, size: Any, stride: Any,
             data: Any, *rest: Any, **kwargs: Any) -> None:  # fmt: skip
        if type(data) is FakeTensor:
            data = packed.pack(data, qtype.bits)
        original(self, qtype, axis, group_size, size, stride, data, *rest, **kwargs)

    return init


@contextlib.contextmanager
def quanto_as_run(cache_options: str, target_type: str) -> Iterator[None]:
    """Within the block (a fake run predicting ``target_type`` "cpu" or "cuda"), quanto's
    quantised tensors allocate what they allocate in a real run: packed data, their ops'
    temporaries, the CPU unpack kernel's operands. Nothing changes for a run without a
    quantised cache (``cache_options`` "", :func:`~.generation.cache_options`)."""
    if not cache_options:
        yield
        return
    qbits: Any = importlib.import_module("optimum.quanto.tensor.weights.qbits")
    packed: Any = importlib.import_module("optimum.quanto.tensor.packed")
    cls = qbits.WeightQBitsTensor
    original = cls.__init__
    cls.__init__ = _packing_fakes(cls, packed.PackedTensor)
    try:
        with _QuantoOpsAsRun(cpu=target_type == "cpu"):
            yield
    finally:
        cls.__init__ = original


__all__ = ["quanto_as_run"]
