"""One rank of :func:`jupyter_vram._distributed.launch` (run as ``python -m``).

Arguments: folder, backend, device ('' for the default), process-group timeout in seconds,
stacks (sampled / full / none). The environment carries RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT.
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

from .files import rank_path
from .rank import format_error, rank_meta, record_rank


def main(argv: list[str]) -> int:
    folder, backend, device, pg_timeout, stacks = argv
    for entry in reversed(os.environ.get("JUPYTER_VRAM_SYS_PATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    import cloudpickle
    import torch
    import torch.distributed as dist

    meta = rank_meta()
    rank = meta["rank"]
    out = Path(folder)
    try:
        fn, args, kwargs = cloudpickle.loads((out / "payload.pkl").read_bytes())
        if backend == "nccl":
            torch.cuda.set_device(meta["local_rank"])
            device = device or f"cuda:{meta['local_rank']}"
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=meta["world_size"],
            timeout=datetime.timedelta(seconds=float(pg_timeout)),
        )
    except BaseException as exc:  # noqa: BLE001 - reported to the launcher, not raised
        (out / f"rank{rank}.error").write_text(format_error(exc))
        return 1
    try:
        error = record_rank(
            lambda: fn(*args, **kwargs),
            rank_path(out, rank),
            device=device or None,
            stacks=stacks,
            namespace={"args": args, "kwargs": kwargs},
            meta=meta,
        )
    finally:
        dist.destroy_process_group()
    if error is not None:
        (out / f"rank{rank}.error").write_text(format_error(error))
        return 1
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no atexit work (a wedged process group) can hold the rank open
