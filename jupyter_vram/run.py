"""Record every rank of a torch.distributed script:
``torchrun --nproc-per-node N -m jupyter_vram.run [--out DIR] train.py args...``.

Each rank writes ``DIR/rank<RANK>.json.gz``; ``jv.Profile.load_ranks(DIR)`` reads them back
(docs/distributed.md).
"""

from __future__ import annotations

import sys

from ._distributed.run import main

if __name__ == "__main__":
    sys.exit(main())
