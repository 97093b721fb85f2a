"""The Profile's columns and tables: category and phase names, the allocation columns, the
segment events, the limits a saved profile is checked against.

The bottom of the package, below :class:`~jupyter_vram._model.profile.Profile` itself, so that
the timeline replay (:mod:`.timeline`) and the file checks (:mod:`.files`) read the same
columns without importing the Profile.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

#: Category names, strongest role first: an allocation that played several roles (a parameter
#: that autograd also saved) takes the first one here.
#: ``parameter`` is a parameter that trains (requires grad), ``frozen_parameter`` one that
#: does not (a LoRA / QLoRA base model's weights); ``quant_state`` the tensors a quantised
#: weight carries besides its data (bitsandbytes' QuantState absmax and code tables, a tensor
#: subclass's scales); ``kv_cache`` a cache kept between generation steps (after
#: ``activation``: in a training step, keys and values autograd saved are activations).
CATEGORIES: tuple[str, ...] = (
    "parameter",
    "frozen_parameter",
    "quant_state",
    "buffer",
    "gradient",
    "optimizer_state",
    "input",
    "activation",
    "kv_cache",
    "temporary",
    "other",
)
CATEGORY_INDEX: dict[str, int] = {name: i for i, name in enumerate(CATEGORIES)}
#: Parameters, trainable or not: what a model's weights are.
PARAMETER_CATEGORIES: tuple[str, ...] = ("parameter", "frozen_parameter")
#: The category table of files written before ``frozen_parameter``, ``quant_state`` and
#: ``kv_cache`` existed (their rows keep their meaning: :func:`category_remap`).
LEGACY_CATEGORIES: tuple[str, ...] = (
    "parameter", "buffer", "gradient", "optimizer_state", "input", "activation", "temporary",
    "other",
)  # fmt: skip


def category_remap(names: Sequence[str]) -> npt.NDArray[np.int8]:
    """Index in a file's category table -> index in :data:`CATEGORIES` (files written by an
    older version name fewer categories, in another order). Raises :class:`ProfileFileError`
    for a name this version does not know."""
    unknown = [n for n in names if n not in CATEGORY_INDEX]
    if unknown:
        raise ProfileFileError(f"profile uses unknown categories {unknown[:3]!r:.80}")
    return np.array([CATEGORY_INDEX[n] for n in names], dtype=np.int8)


PHASES: tuple[str, ...] = ("other", "forward", "backward", "optimizer")
PHASE_INDEX: dict[str, int] = {name: i for i, name in enumerate(PHASES)}

Int64Array = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]
Int8Array = npt.NDArray[np.int8]


class ProfileFileError(ValueError):
    """A saved profile that cannot be read: the message names the file and the problem."""


#: Default limit on a profile file's JSON text (decompressed). A recorded step of a million
#: allocations is about 100 MB of JSON; parsing takes several times the text's size in memory.
MAX_FILE_BYTES = 1 << 30
MAX_BYTES = 1 << 50  # no single allocation, segment or baseline is a petabyte
MAX_SEQ = 1 << 62  # sequence numbers, times and counts: far from int64 overflow

COLUMNS: dict[str, type[np.generic]] = {
    "size": np.int64,
    "alloc_seq": np.int64,
    "free_seq": np.int64,
    "alloc_ns": np.int64,
    "free_ns": np.int64,
    "device": np.int32,
    "op": np.int32,
    "module": np.int32,
    "stack": np.int32,
    "phase": np.int8,
    "category": np.int8,
}


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python frame of an allocation's stack."""

    filename: str
    line: int
    name: str

    def __str__(self) -> str:
        """``name (file:line)``; line 0 means "somewhere in this function" (an op reached
        through an operator, or a sampled stack whose neighbours' lines differ). The file's
        last part is cut from the string (``pathlib`` would intern every part of the path,
        growing the interpreter's table of interned strings with every stack shown)."""
        where = self.filename.rpartition("/")[2]
        return f"{self.name} ({where}:{self.line})" if self.line else f"{self.name} ({where})"


@dataclass(frozen=True)
class Allocations:
    """Column arrays, one entry per allocation (see the module docstring)."""

    size: Int64Array
    alloc_seq: Int64Array
    free_seq: Int64Array
    alloc_ns: Int64Array
    free_ns: Int64Array
    device: Int32Array
    op: Int32Array
    module: Int32Array
    stack: Int32Array
    phase: Int8Array
    category: Int8Array

    def __post_init__(self) -> None:
        lengths = {len(getattr(self, name)) for name in COLUMNS}
        if len(lengths) > 1:
            raise ValueError(f"allocation columns have different lengths: {sorted(lengths)}")

    def __len__(self) -> int:
        return len(self.size)

    @classmethod
    def from_columns(cls, columns: Mapping[str, Sequence[int] | npt.NDArray[Any]]) -> Allocations:
        missing = set(COLUMNS) - set(columns)
        if missing:
            raise ValueError(f"allocation columns missing: {sorted(missing)}")
        return cls(**{name: np.asarray(columns[name], dtype=dt) for name, dt in COLUMNS.items()})

    @classmethod
    def empty(cls) -> Allocations:
        return cls.from_columns({name: [] for name in COLUMNS})

    def to_columns(self) -> dict[str, list[int]]:
        return {name: getattr(self, name).tolist() for name in COLUMNS}


@dataclass(frozen=True)
class SegmentEvents:
    """Reserved memory over time (CUDA caching allocator segments): +size / -size at a seq."""

    seq: Int64Array = field(default_factory=lambda: np.zeros(0, np.int64))
    delta: Int64Array = field(default_factory=lambda: np.zeros(0, np.int64))
    baseline: int = 0  # bytes reserved before recording started
