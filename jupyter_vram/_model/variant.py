"""What a rerun changed (``Profile.variant``): plain data saved in the profile's meta.

It sits with the data, below the rerun machinery that fills it (``jupyter_vram/_rerun.py``),
so that a Profile read from a file says what it is a variant of without importing torch or
the rerun code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Variant:
    """What a rerun changed (``Profile.variant``): saved with the profile.

    ``amp``: the autocast dtype ("bf16" / "fp16") or None; ``checkpointed``: the module paths
    (as the profile names them) whose forward was checkpointed; ``offload``: activations saved
    to host memory; ``notes``: what the rerun could not keep equal (warnings) and what it cost;
    ``baseline_cell``: the cell it reran (``In [5]``, or the cell's file name);
    ``micro_batch``: the run took 1 / this of the batch (1: all of it).
    """

    amp: str | None
    checkpointed: tuple[str, ...]
    offload: bool
    notes: tuple[str, ...]
    baseline_cell: str | None
    micro_batch: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "amp": self.amp,
            "checkpointed": list(self.checkpointed),
            "offload": self.offload,
            "notes": list(self.notes),
            "baseline_cell": self.baseline_cell,
            "micro_batch": self.micro_batch,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Variant:
        amp = data.get("amp")
        cell = data.get("baseline_cell")
        return cls(
            amp=str(amp) if amp is not None else None,
            checkpointed=tuple(str(p) for p in data.get("checkpointed") or ()),
            offload=bool(data.get("offload", False)),
            notes=tuple(str(n) for n in data.get("notes") or ()),
            baseline_cell=str(cell) if cell is not None else None,
            micro_batch=max(1, int(data.get("micro_batch") or 1)),
        )
