"""Does recording move the true CUDA peak? Run on a GPU machine: python bench/cuda_observer.py

The truth is ``torch.cuda.max_memory_allocated()`` of a step, unrecorded. The same step is
then recorded by the CUDA recorder with its op labels (a dispatch mode around every aten op)
and without them, and by a bare pass-through dispatch mode; a dispatch mode makes autograd
sum gradients from several branches out of place, which raises the peak of models whose
hidden state feeds several heads. Prints one line per variant (bytes above the start).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from jupyter_vram._capture.cuda_snapshot import CudaSnapshotRecorder


class ThreeHeads(nn.Module):
    def __init__(self, d: int = 256, wide: int = 2048) -> None:
        super().__init__()
        self.up = nn.Linear(d, wide)
        self.heads = nn.ModuleList(nn.Linear(wide, d) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        return sum(head(h) for head in self.heads)  # type: ignore[return-value]


class Passthrough(TorchDispatchMode):  # type: ignore[misc]
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def main() -> None:
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = ThreeHeads().to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(4096, 256, device=dev), torch.randn(4096, 256, device=dev)

    def step() -> None:
        F.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def peak(run: object) -> int:
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()  # type: ignore[operator]
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - start

    def under_mode() -> None:
        with Passthrough():
            step()

    def recorded(labels: str) -> object:
        def run() -> None:
            rec = CudaSnapshotRecorder(dev, labels=labels)
            rec.start(sys._getframe())
            try:
                step()
                torch.cuda.synchronize()
            finally:
                rec.stop()

        return run

    step()
    plain = peak(step)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    rows = {
        "unrecorded": plain,
        "pass-through dispatch mode": peak(under_mode),
        "CUDA recorder, labels from a dispatch mode": peak(recorded("mode")),
        "CUDA recorder, labels from the profiler": peak(recorded("profiler")),
        "CUDA recorder, no labels": peak(recorded("none")),
    }
    for label, value in rows.items():
        print(f"  {label:<42} {value / 2**20:9.2f} MiB  {100 * (value - plain) / plain:+6.1f} %")


if __name__ == "__main__":
    main()
