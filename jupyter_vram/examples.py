"""A built-in workload for the quickstart and the docs: a small GPT trained for a step.

Plain torch (no downloads, no transformers), so the quickstart runs anywhere.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        out: torch.Tensor = x + self.mlp(self.ln2(x))
        return out


class TinyGPT(nn.Module):
    """A decoder-only transformer: embeddings, ``layers`` blocks, a tied output head."""

    def __init__(
        self,
        vocab: int = 4096,
        width: int = 256,
        layers: int = 4,
        heads: int = 4,
        context: int = 256,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(width)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids.shape[1]
        mask = torch.triu(torch.full((seq, seq), float("-inf"), device=ids.device), diagonal=1)
        x = self.embed(ids) + self.pos[:seq]
        for block in self.blocks:
            x = block(x, mask)
        logits: torch.Tensor = self.ln(x) @ self.embed.weight.T
        return logits


def training_step(
    batch: int = 8, seq: int = 128, device: str = "cpu", **model_args: int
) -> tuple[TinyGPT, torch.optim.Optimizer, Callable[[], float]]:
    """A model, its AdamW optimizer and a ``step()`` that trains on one random batch."""
    torch.manual_seed(0)
    model = TinyGPT(**model_args).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ids = torch.randint(0, model.embed.num_embeddings, (batch, seq + 1), device=device)

    def step() -> float:
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return model, opt, step
