"""The GPU table and name lookup."""

from __future__ import annotations

import pytest

from jupyter_vram._estimator.gpus import GPUS, Gpu, find_gpu, gpu_from_bytes

MIB = 1 << 20


def test_table_is_ascending_and_names_are_unique() -> None:
    sizes = [g.memory_bytes for g in GPUS]
    assert sizes == sorted(sizes)
    assert len({g.name for g in GPUS}) == len(GPUS)
    assert all(g.memory_bytes % MIB == 0 for g in GPUS)  # nvidia-smi reports whole MiB


@pytest.mark.parametrize(
    ("name", "expected", "mib"),
    [
        ("t4", "T4", 15360),
        ("Tesla T4", "T4", 15360),
        ("a100", "A100 80GB", 81920),
        ("A100-80GB", "A100 80GB", 81920),
        ("a100 80gb", "A100 80GB", 81920),
        ("A100 80G", "A100 80GB", 81920),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB", 81920),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB", 40960),
        ("a10", "A10", 23028),
        ("h100", "H100 80GB", 81559),
        ("NVIDIA H100 80GB HBM3", "H100 80GB", 81559),
        ("NVIDIA H200", "H200", 143771),
        ("4090", "RTX 4090", 24564),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 24564),
        ("rtx-3090", "RTX 3090", 24576),
        ("RTX 3060", "RTX 3060 12GB", 12288),
        ("NVIDIA GeForce GTX 1060 6GB", "GTX 1060 6GB", 6144),
        ("L4", "L4", 23034),
        ("l40s", "L40S", 46068),
        ("Tesla V100-SXM2-16GB", "V100 16GB", 16384),
        ("v100", "V100 32GB", 32768),
    ],
)
def test_find_gpu(name: str, expected: str, mib: int) -> None:
    gpu = find_gpu(name)
    assert gpu.name == expected
    assert gpu.memory_bytes == mib * MIB


def test_marketing_sizes_are_marked_approximate() -> None:
    assert find_gpu("v100 32gb").approximate
    assert not find_gpu("h200").approximate
    assert find_gpu("h200").memory_gib == pytest.approx(140.4, abs=0.05)


@pytest.mark.parametrize("name", ["a1000", "H100 NVL", "RTX 3060 8GB", ""])
def test_unknown_gpu(name: str) -> None:
    with pytest.raises(ValueError, match="known GPUs: GTX 1060 6GB, RTX 3060 12GB, T4"):
        find_gpu(name)


def test_gpu_from_bytes() -> None:
    gpu = gpu_from_bytes("NVIDIA H200", 150_000_000_000)
    assert gpu == Gpu("NVIDIA H200", 150_000_000_000, False, ())
    with pytest.raises(ValueError, match="positive"):
        gpu_from_bytes("broken", 0)
