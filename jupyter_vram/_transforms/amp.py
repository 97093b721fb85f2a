"""Automatic mixed precision as a context: the autocast a training step runs under."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

AMP_DTYPES: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}


def amp_dtype(name: str | None) -> torch.dtype | None:
    """``"bf16"`` / ``"fp16"`` (also ``bfloat16`` / ``float16``) -> dtype; None -> None."""
    if name is None:
        return None
    key = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16"}.get(name.lower(), name.lower())
    if key not in AMP_DTYPES:
        raise ValueError(f"AMP dtype must be one of {', '.join(AMP_DTYPES)}, not {name!r}")
    return AMP_DTYPES[key]


@contextlib.contextmanager
def autocast(device_type: str, dtype: torch.dtype | None) -> Iterator[None]:
    """``torch.autocast`` for ``dtype``, or nothing when ``dtype`` is None."""
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device_type, dtype=dtype):
        yield
