"""Checkpointing a model the cell builds itself: the rerun runs new instances, so the blocks
are found by their top-level module's class and path, not by the first run's instances; and
a rerun never claims checkpointing that did not happen."""

from __future__ import annotations

import contextlib
import io
from typing import Any

import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._rerun import RerunError, rerun
from jupyter_vram._session import run_code

from .conftest import ipython_shell

KiB = 1024

# Four blocks Linear(256, 1024) -> ReLU -> Linear(1024, 256) on a 64 x 256 float32 batch.
BUILDS = """\
torch.manual_seed(0)
model = nn.Sequential(
    *[nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256)) for _ in range(4)]
)
x = torch.randn(64, 256)
model(x).sum().backward()
"""

# Without checkpointing autograd keeps, per block, the ReLU's output (64 x 1024 x 4 B =
# 256 KiB; the second Linear saves the same tensor), and each later block's input (the
# previous block's output, 64 x 256 x 4 B = 64 KiB; the first block's input is the cell's
# input): 4 x 256 + 3 x 64 KiB.
PLAIN_ACTIVATIONS = 4 * 256 * KiB + 3 * 64 * KiB
# Checkpointed, the forward keeps only each later block's input (3 x 64 KiB) and, per block,
# the CPU random state the checkpoint saves to replay it (torch.get_rng_state(): 5056 B);
# backward then recomputes the last block, holding its first Linear's output and the ReLU's
# output (2 x 256 KiB) at once.
CHECKPOINTED_ACTIVATIONS = 3 * 64 * KiB + 4 * 5056 + 2 * 256 * KiB


@pytest.fixture(autouse=True)
def forget_cells() -> Any:
    """The kernel's latest profile keeps its cell's namespace: let go of this test's models."""
    yield
    from jupyter_vram import _session as session

    session._last_profile = None


def activations(baseline: jv.Profile, variant: jv.Profile) -> tuple[int, int]:
    row = baseline.compare(variant).loc["activation"]
    return int(row["baseline_bytes"]), int(row["variant_bytes"])


def test_rerun_checkpoints_the_blocks_of_a_model_the_cell_builds() -> None:
    ns: dict[str, Any] = {"torch": torch, "nn": nn}
    baseline = run_code(BUILDS, ns).profile
    assert baseline is not None
    first_model = ns["model"]
    variant = rerun(baseline, checkpoint="auto")
    assert variant.variant is not None
    assert variant.variant.checkpointed == tuple(f"Sequential.{i}" for i in range(4))
    assert activations(baseline, variant) == (PLAIN_ACTIVATIONS, CHECKPOINTED_ACTIVATIONS)
    assert (
        "the cell builds its model: checkpointed the blocks it built "
        "(Sequential.0 ... Sequential.3)"
    ) in variant.variant.notes
    assert ns["model"] is first_model  # the rerun's model stayed in its own namespace
    assert all("forward" not in m.__dict__ for m in first_model.modules())
    assert "activations 1.2 MiB -> 723.8 KiB" in jv.verdict(baseline, variant)


def test_a_class_the_cell_defines_again_is_matched_by_name() -> None:
    """Each run of the cell makes a new class object: same module and qualified name."""
    source = (
        "class Block(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.a, self.b = nn.Linear(256, 1024), nn.Linear(1024, 256)\n"
        "    def forward(self, h):\n"
        "        return self.b(torch.relu(self.a(h)))\n"
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.blocks = nn.ModuleList(Block() for _ in range(4))\n"
        "    def forward(self, h):\n"
        "        for block in self.blocks:\n"
        "            h = block(h)\n"
        "        return h\n"
        "torch.manual_seed(0)\n"
        "net = Net()\n"
        "net(x).sum().backward()\n"
    )
    ns: dict[str, Any] = {"torch": torch, "nn": nn, "x": torch.randn(64, 256)}
    baseline = run_code(source, ns).profile
    assert baseline is not None
    variant = rerun(baseline, checkpoint=["net.blocks.1", "net.blocks.2"])
    assert variant.variant is not None
    assert variant.variant.checkpointed == ("Net.blocks.1", "Net.blocks.2")
    # checkpointed, the most is held while backward recomputes block 2 (block 3 is done):
    # block 0's ReLU output (256 KiB), the inputs of blocks 1 and 2 (2 x 64 KiB), their two
    # random states (2 x 5056 B) and the recompute's Linear and ReLU outputs (2 x 256 KiB)
    expected = 256 * KiB + 2 * 64 * KiB + 2 * 5056 + 2 * 256 * KiB
    assert activations(baseline, variant) == (PLAIN_ACTIVATIONS, expected)


def test_blocks_that_never_run_checkpointed_are_refused_not_claimed() -> None:
    """In eval mode checkpointing does not apply (the wrapper, like transformers', runs the
    block as is): the rerun says so instead of reporting 'checkpointed 4 blocks'."""
    ns: dict[str, Any] = {"torch": torch, "nn": nn}
    source = BUILDS.replace("model(x)", "model.eval()\nmodel(x)")
    baseline = run_code(source, ns).profile
    assert baseline is not None
    with pytest.raises(RerunError) as error:
        rerun(baseline, checkpoint="auto")
    assert str(error.value) == (
        "checkpointing did not apply: none of the chosen blocks ran in training mode with "
        "gradients on during the rerun (the cell ran other modules than the ones chosen, in "
        "eval mode or without gradients)"
    )


@pytest.fixture
def shell() -> Any:
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_vram")
    before = set(shell.user_ns)
    yield shell
    for name in set(shell.user_ns) - before:
        del shell.user_ns[name]
    shell.user_ns.pop("_vram", None)
    shell.user_ns.pop("_vram_variants", None)


def test_magic_compare_and_checkpoint_flag_on_a_cell_that_builds_its_model(shell: Any) -> None:
    shell.user_ns.update(torch=torch, nn=nn)
    # before the cell ever ran there is no model to choose blocks from: said, not guessed
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        shell.run_cell("%%vram --checkpoint auto -q\n" + BUILDS)
    assert "a model the cell builds exists only once it ran" in err.getvalue()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = shell.run_cell("%%vram --compare checkpoint --text\n" + BUILDS)
    assert result.success
    assert "checkpointing 4 blocks: activations 1.2 MiB -> 723.8 KiB" in out.getvalue()
    # a first run with --checkpoint: the cell builds a new model, whose blocks are wrapped
    with contextlib.redirect_stdout(io.StringIO()):
        assert shell.run_cell("%%vram --checkpoint auto -q\n" + BUILDS).success
    variant = shell.user_ns["_vram"].variant
    assert variant.checkpointed == tuple(f"Sequential.{i}" for i in range(4))
    activation_max = shell.user_ns["_vram"].compare(shell.user_ns["_vram"]).loc["activation"]
    assert int(activation_max["baseline_bytes"]) == CHECKPOINTED_ACTIVATIONS
    assert all("forward" not in m.__dict__ for m in shell.user_ns["model"].modules())
    # in eval mode nothing is checkpointed: the variant claims nothing and says why
    with contextlib.redirect_stdout(io.StringIO()):
        source = BUILDS.replace("model(x)", "model.eval()\nmodel(x)")
        assert shell.run_cell("%%vram --checkpoint auto -q\n" + source).success
    variant = shell.user_ns["_vram"].variant
    assert variant.checkpointed == ()
    assert variant.notes[-1].startswith("checkpointing did not apply: none of the chosen blocks")
