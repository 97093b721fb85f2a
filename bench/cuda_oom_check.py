"""OOM post-mortems on a real GPU. Run on a CUDA machine: python bench/cuda_oom_check.py

Not yet run on a GPU (written on a CPU-only machine, where the CUDA side is tested with
torch.cuda faked). Checks, printing one line each and exiting 1 if any fails:

1. ``jv.record(capacity=...)`` on CUDA: a request past the capacity raises the allocator's own
   ``torch.OutOfMemoryError``, the same object reaches the caller, and the memory fraction is
   back to what it was afterwards;
2. the post-mortem: source "cuda" (the allocator's OOM observer fired), requested bytes as the
   observer reported them (the request rounded to the allocator's 512 B blocks, or 2 MiB
   above 10 MiB), the failure placed in the profile by the history's ``oom`` event, allocator
   state present, and what was live then equal to ``torch.cuda.memory_allocated()`` taken just
   before the failing request;
3. leaks on CUDA: a tensor a recorded block keeps is listed with its storage's bytes and
   released.
"""

from __future__ import annotations

import gc
import sys
import weakref
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import jupyter_vram as jv

MIB = 1 << 20
failures: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}")
    if not ok:
        failures.append(name)


def main() -> None:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    before_fraction = torch.cuda.get_per_process_memory_fraction(0)
    ns: dict[str, Any] = {"held": torch.ones(64 * MIB // 4, device="cuda")}
    capacity = 512 * MIB
    caught: list[BaseException] = []
    live_before = -1
    try:
        with jv.record("cuda", namespace=ns, capacity=capacity) as rec:
            a = torch.empty(128 * MIB, dtype=torch.uint8, device="cuda")  # noqa: F841
            live_before = torch.cuda.memory_allocated()
            try:
                torch.empty(1024 * MIB, dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError as error:
                caught.append(error)
                raise
    except torch.OutOfMemoryError as error:
        check("the same OutOfMemoryError reaches the caller", bool(caught) and error is caught[0])
    else:
        check("a request past the capacity raises", False)
        return
    after = torch.cuda.get_per_process_memory_fraction(0)
    check("fraction restored", after == before_fraction, f"{before_fraction} -> {after}")
    oom = rec.profile.oom
    check("profile.oom present", oom is not None)
    if oom is None:
        return
    check("source is the allocator's observer", oom.source == "cuda", oom.source)
    check("requested = the 1 GiB request", oom.requested_bytes == 1024 * MIB,
          str(oom.requested_bytes))  # fmt: skip
    check("failure placed by the history's oom event", bool(rec.profile.meta.get("oom")))
    check("allocator state", oom.allocator is not None, str(oom.allocator))
    check("live at the failure = memory_allocated before it", oom.live_bytes == live_before,
          f"{oom.live_bytes} vs {live_before}")  # fmt: skip
    check("capacity = the allocator's limit", oom.capacity_bytes is not None
          and abs(oom.capacity_bytes - capacity) <= 2 * MIB, str(oom.capacity_bytes))  # fmt: skip
    print("suggestions:", [(s.action, s.bytes_saved) for s in oom.suggestions])
    print(f"device total {total / 2**30:.1f} GiB")
    del rec, caught
    gc.collect()

    ns2: dict[str, Any] = {}
    with jv.record("cuda", namespace=ns2) as rec2:
        ns2["kept"] = torch.ones(3 * MIB // 4 + 5, device="cuda")
    ref = weakref.ref(ns2["kept"])
    leaks = rec2.profile.leaks()
    check("leak on CUDA listed", list(leaks["holders"]) == ["kept"], str(leaks.to_dict("records")))
    jv.release_leaks(rec2.profile)
    check("leak on CUDA released", ref() is None and "kept" not in ns2)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
