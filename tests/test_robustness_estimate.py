"""Estimator robustness: runs the real model would refuse, kernels the real run would pick,
what a comparison counts, and processes and files left behind."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from jupyter_vram.estimator import EstimateError, estimate

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def tiny_gpt2(positions: int = 128) -> Any:
    config = transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=2, vocab_size=100, n_positions=positions
    )
    return transformers.GPT2LMHeadModel(config)


# -- sequences longer than the position table ----------------------------------------------


def test_sequence_longer_than_gpt2_positions_fails_like_the_real_model() -> None:
    model = tiny_gpt2(128)
    with pytest.raises(IndexError, match="index out of range"):
        model(torch.zeros(1, 129, dtype=torch.long))  # the real model
    with pytest.raises(EstimateError) as info:
        estimate(model, "1x4096", device="cpu")
    message = str(info.value)
    assert message.startswith("the sequence is 4096 positions long, but the model's position")
    assert "transformer.wpe has 128" in message and "index out of range" in message
    assert len(message.splitlines()) <= 2  # the message and where
    # at the limit the step runs
    assert estimate(model, "1x128", device="cpu").peak_bytes > 0


class LearnedPositions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(50, 8)
        self.pos = nn.Embedding(16, 8)
        self.out = nn.Linear(8, 50)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.out(self.tok(ids) + self.pos(positions))


def test_sequence_longer_than_a_plain_position_table() -> None:
    model = LearnedPositions()
    with pytest.raises(IndexError):
        model(torch.zeros(2, 17, dtype=torch.long))
    with pytest.raises(EstimateError, match=r"17 positions long, .* table pos has 16"):
        estimate(model, "2x17", device="cpu")
    assert estimate(model, "2x16", device="cpu").peak_bytes > 0


def test_rotary_models_are_not_limited_by_max_position_embeddings() -> None:
    """Llama's rotary positions have no table: the real model runs past the config's limit."""
    from jupyter_vram.estimator.worker import position_tables

    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=100, max_position_embeddings=16,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    model(torch.zeros(1, 40, dtype=torch.long))  # runs
    assert position_tables(model) == []
    bert = transformers.BertModel(
        transformers.BertConfig(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
            vocab_size=100, max_position_embeddings=64,
        )
    )  # fmt: skip
    assert [name for name, _ in position_tables(bert)] == ["embeddings.position_embeddings"]
