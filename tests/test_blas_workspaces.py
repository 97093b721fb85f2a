"""The cuBLAS / cuBLASLt workspaces PyTorch keeps, per torch version, GPU and environment.

Expected sizes come from PyTorch's source and docs, not from the module: the default
``CUBLAS_WORKSPACE_CONFIG`` is ``":4096:8"`` (4096 KiB x 8 = 33,554,432 B) on the GPUs that get
the large one and ``":4096:2:16:8"`` (4096 KiB x 2 + 16 KiB x 8 = 8,388,608 + 131,072 =
8,519,680 B) elsewhere; the reproducibility notes spell a config as ``:SIZE_KIB:COUNT`` pairs.
The cuBLASLt workspace of torch 2.11 on an H200 (compute capability 9.0) is the 1 MiB the
H200 recording shows beside the 32 MiB (see :func:`test_the_h200_recording_holds_...`).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from jupyter_vram._blas_workspaces import (
    CUBLAS_LABEL,
    CUBLASLT_LABEL,
    blas_workspaces,
    torch_version,
)

MIB = 1 << 20
LARGE = 4096 * 1024 * 8
SMALL = 4096 * 1024 * 2 + 16 * 1024 * 8
H200 = Path(__file__).parent / "fixtures" / "h200"


def test_the_default_sizes_are_the_ones_pytorch_spells() -> None:
    assert LARGE == 32 * MIB and SMALL == 8_519_680


@pytest.mark.parametrize(
    ("version", "capability", "cublas"),
    [
        ("2.11.0+cu130", (9, 0), LARGE),  # up to 2.11: major 9 and minor 0 only
        ("2.11.0", (10, 0), SMALL),
        ("2.9.1", (12, 0), SMALL),
        ("2.11.0", (8, 0), SMALL),
        ("2.12.0", (10, 0), LARGE),  # from 2.12: majors 9, 10 and 12
        ("2.13.0+cpu", (12, 0), LARGE),
        ("2.13.0", (9, 0), LARGE),
        ("2.13.0", (8, 6), SMALL),
        ("2.13.0", (7, 5), SMALL),
        ("2.13.0", None, LARGE),  # an unknown card is taken as a recent one
    ],
)
def test_cublas_workspace_by_torch_version_and_compute_capability(
    version: str, capability: tuple[int, int] | None, cublas: int
) -> None:
    assert blas_workspaces(version, capability).cublas_bytes == cublas


def test_torch_211_gives_cublaslt_a_1_mib_workspace_of_its_own() -> None:
    ws = blas_workspaces("2.11.0+cu130", (9, 0))
    assert ws.cublaslt_separate and ws.cublaslt_bytes == MIB
    assert ws.sizes == {LARGE: CUBLAS_LABEL, MIB: CUBLASLT_LABEL}


def test_from_torch_212_cublaslt_shares_the_cublas_workspace() -> None:
    ws = blas_workspaces("2.12.0", (9, 0))
    assert not ws.cublaslt_separate
    assert ws.sizes == {LARGE: CUBLAS_LABEL}


@pytest.mark.parametrize(
    ("config", "expected"),
    [(":4096:8", LARGE), (":4096:2:16:8", SMALL), (":16:8", 16 * 1024 * 8), ("junk", LARGE)],
)
def test_cublas_workspace_config_is_summed_pairs_of_kib_and_count(
    config: str, expected: int
) -> None:
    """An unparsable value leaves the default (PyTorch warns and keeps it)."""
    ws = blas_workspaces("2.13.0", (9, 0), {"CUBLAS_WORKSPACE_CONFIG": config})
    assert ws.cublas_bytes == expected


def test_cublaslt_workspace_size_is_read_in_kib() -> None:
    ws = blas_workspaces("2.11.0", (9, 0), {"CUBLASLT_WORKSPACE_SIZE": "4096"})
    assert ws.cublaslt_separate and ws.cublaslt_bytes == 4 * MIB


def test_torch_version_reads_major_and_minor() -> None:
    assert torch_version("2.11.0+cu130") == (2, 11)
    assert torch_version("2.9.1") == (2, 9)
    assert torch_version("nightly") == (0, 0)


def test_the_h200_recording_holds_two_32_mib_and_one_1_mib_workspace() -> None:
    """The first MLP step recorded on the H200 (torch 2.11): the first ``addmm`` (batch 64 x
    4096 outputs in fp32: 1 MiB) allocates its output, then cuBLAS's 32 MiB workspace, then
    cuBLASLt's 1 MiB one; backward (autograd's thread) makes another 32 MiB. None of the
    workspaces is freed in the step."""
    raw = json.loads(gzip.decompress((H200 / "mlp_step1.snapshot.json.gz").read_bytes()))
    trace = raw["snapshot"]["device_traces"][raw.get("device_index", 0)]
    freed = {e["addr"] for e in trace if e["action"] == "free_requested"}
    allocs = [e for e in trace if e["action"] == "alloc" and e["size"] > 1]
    first = allocs[:3]
    assert [e["size"] for e in first] == [MIB, LARGE, MIB]
    assert all(str(e["user_metadata"]).endswith("|addmm") for e in first)
    assert first[0]["addr"] in freed  # the activation
    assert first[1]["addr"] not in freed and first[2]["addr"] not in freed
    large = [e for e in allocs if e["size"] == LARGE]
    assert len(large) == 2 and not {e["addr"] for e in large} & freed
