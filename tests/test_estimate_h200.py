"""The estimator against the H200's own counters, on the CPU.

``tests/fixtures/h200/summary_estimate.json`` holds what ``bench/cuda_check.py`` measured on an
NVIDIA H200 with torch 2.11 (``summary.json``): ``max_memory_allocated`` and
``max_memory_reserved`` of the second of two training steps, for the three cases below (the
script's own models and inputs). The estimate runs here on fake tensors for that torch
version; it must come within 0.5 % (allocated) and 2 % (reserved) of the measured numbers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from jupyter_vram._estimator import estimate
from jupyter_vram._estimator.kernels import cuda_dropout

H200 = Path(__file__).parent / "fixtures" / "h200"
MEASURED = json.loads((H200 / "summary_estimate.json").read_text())
TORCH = json.loads((H200 / "summary.json").read_text())["mlp_step1"]["meta"]["torch"]


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1000))


def gpt2() -> nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=2, n_embd=256, n_head=4, vocab_size=8192,
                                     n_positions=256)  # fmt: skip
    model: nn.Module = transformers.GPT2LMHeadModel(config)
    return model


CASES: dict[str, tuple[Callable[[], nn.Module], str, str]] = {
    "mlp_adam": (mlp, "64x1024", "adam"),
    "gpt2_adamw": (gpt2, "8x128", "adamw"),
    "gpt2_sgd": (gpt2, "8x128", "sgd"),
}


def test_the_fixture_was_measured_with_torch_211() -> None:
    assert TORCH.startswith("2.11")


@pytest.mark.parametrize("name", list(CASES))
def test_estimate_is_within_half_a_percent_of_the_h200(name: str) -> None:
    build, inputs, optimizer = CASES[name]
    with torch.device("meta"):
        model = build()
    est = estimate(model, inputs, optimizer=optimizer, torch_version=TORCH)
    truth = MEASURED[f"estimate_{name}"]
    allocated = (est.peak_bytes - truth["measured"]) / truth["measured"]
    reserved = (est.reserved_bytes - truth["measured_reserved"]) / truth["measured_reserved"]
    assert abs(allocated) <= 0.005, f"allocated {allocated:+.3%}"
    assert abs(reserved) <= 0.02, f"reserved {reserved:+.3%}"


def test_the_mlp_estimate_is_exact_with_its_workspaces() -> None:
    """MLP, Adam on the H200: 236,294,144 B allocated, 241,172,480 B reserved. Of it, the
    workspaces torch 2.11 keeps: 32 MiB of cuBLAS per thread (forward, backward) and 1 MiB of
    cuBLASLt for the forward's ``addmm`` with a bias."""
    with torch.device("meta"):
        model = mlp()
    est = estimate(model, "64x1024", optimizer="adam", torch_version=TORCH)
    truth = MEASURED["estimate_mlp_adam"]
    assert (est.peak_bytes, est.reserved_bytes) == (truth["measured"], truth["measured_reserved"])
    assert est.cublas_workspace_total == 2 * 32 * 2**20 + 2**20
    ops = est.profile.to_dataframe().query("alloc_seq < 0")["op"].tolist()
    assert ops.count("cuBLAS workspace") == 2 and ops.count("cuBLASLt workspace") == 1


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, list[torch.dtype]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, tuple) else (out,)
        dtypes = [o.dtype for o in outs if isinstance(o, torch.Tensor)]
        self.seen.append((str(func.overloadpacket.__name__), dtypes))
        return out


def test_cuda_dropout_keeps_a_one_byte_mask() -> None:
    """On CUDA, training dropout takes the fused ``native_dropout`` (Dropout.cpp:
    ``is_fused_kernel_acceptable``), whose mask is bool: 1 byte per element, not 4."""
    x = torch.ones(64, 256)
    with cuda_dropout(), _Ops() as ops:
        F.dropout(x, 0.1, training=True)
    assert ("native_dropout", [torch.float32, torch.bool]) in ops.seen
    with cuda_dropout(), _Ops() as ops:
        F.dropout(x, 0.1, training=False)  # eval: no mask at all
    assert not any(name == "native_dropout" for name, _ in ops.seen)
