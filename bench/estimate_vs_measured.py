"""How close ``jv.estimate()`` comes to a measured CPU training step.

Cases cover transformers models (GPT-2, BERT, ViT, T5, Llama, ResNet, MobileNetV2, ConvNeXt,
DistilBERT, OPT, a Mixtral-style MoE, Whisper), recurrent nets (LSTM, bidirectional LSTM, GRU),
conv nets (depthwise separable, BatchNorm, channels_last), embeddings (Embedding,
EmbeddingBag; with sparse gradients under SGD and SparseAdam), a mixture of experts with
top-1 routing, torch's own TransformerEncoder;
fine-tuning (LoRA and QLoRA NF4 with peft and bitsandbytes, bitsandbytes' AdamW8bit); and
``generate()`` with a KV cache (``jv.estimate_generate``: Llama at batch 1 and 4, a static
cache, T5, DeepSeek-V3's latent attention with MoE layers and all dense), measured as one
``generate()`` call after a warm-up one.

The truth is independent of jupyter_vram's recorders: each measured step runs in a fresh Python
process (the real model, one warm-up step, then the measured one — the same ``training_step``
the estimator runs on fake tensors) under ``torch.profiler`` with ``profile_memory=True``. The
CPU allocator reports every allocation and free to the profiler, in-op workspaces included;
the peak is what existed before the warm-up step (the storages of parameters, buffers,
optimizer state and inputs, counted once each) plus the running maximum, during the measured
step, of allocated minus freed bytes since then: the warm-up runs under the profiler too, as
the profiler reports no free of a block allocated before it started (a step that frees what
the warm-up made, such as SGD's momentum for a sparse gradient, would count it still alive).
The estimate is made here, from the model built on the meta
device, with ``device="cpu"`` (a CUDA target adds allocator rounding a CPU run cannot show).

When torch-kitsune is installed (it is not a dependency), its prediction for each case it can
be asked about stands beside ours (``bench/kitsune_side.py``); without it the table is as
before.

Usage:
    python bench/estimate_vs_measured.py                 # every case, markdown table
    python bench/estimate_vs_measured.py gpt2 llama-sgd  # some cases
    python bench/estimate_vs_measured.py --readme        # ... and the table in bench/README.md
    python bench/estimate_vs_measured.py --measure gpt2  # one measured step, JSON on stdout
    python bench/estimate_vs_measured.py --list
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

MIB = 2**20
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SECTION = "## Estimate vs a measured CPU step"


@dataclass(frozen=True)
class Case:
    """One model, input and step settings (the arguments of ``estimate()`` after the model)."""

    name: str
    build: Callable[[], nn.Module]
    inputs: str
    optimizer: str = "adamw"
    dtype: str | None = None
    amp: str | None = None
    checkpoint: bool = False
    seed: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    generate: int = 0  # > 0: model.generate() of that many new tokens instead of a step
    cache: str = "dynamic"
    cache_config: dict[str, Any] = field(default_factory=dict)  # a quantised cache's options
    # where the estimated model is built: "meta" (shapes only), or "cpu" for a model that
    # needs values to exist (bitsandbytes quantises real weights)
    estimate_from: str = "meta"
    # fine-tuning: "lora" / "qlora" over the model ``base`` builds (what a LoRA estimator
    # that adds the adapters itself is given)
    fine_tune: str = ""
    base: Callable[[], nn.Module] | None = None
    # an optimizer no name stands for (``estimate(optimizer=factory)``); ``optimizer`` names it
    optimizer_factory: Callable[[list[nn.Parameter]], torch.optim.Optimizer] | None = None

    def variant_label(self) -> str:
        if self.generate:
            return f"generate {self.generate}, {self.cache} cache"
        parts = [self.optimizer]
        if self.dtype:
            parts.append(f"dtype={self.dtype}")
        if self.amp:
            parts.append(f"amp={self.amp}")
        if self.checkpoint:
            parts.append("checkpoint")
        return ", ".join(parts)


def _transformers() -> Any:
    import transformers

    module: Any = transformers
    module.logging.set_verbosity_error()
    return module


def gpt2() -> nn.Module:
    t = _transformers()
    config = t.GPT2Config(n_layer=4, n_embd=256, n_head=4, vocab_size=16384, n_positions=128)
    model: nn.Module = t.GPT2LMHeadModel(config)
    return model


def bert() -> nn.Module:
    t = _transformers()
    config = t.BertConfig(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        vocab_size=16384,
        max_position_embeddings=128,
    )
    model: nn.Module = t.BertForMaskedLM(config)
    return model


def vit() -> nn.Module:
    t = _transformers()
    config = t.ViTConfig(
        image_size=96,
        patch_size=8,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        num_labels=100,
    )
    model: nn.Module = t.ViTForImageClassification(config)
    return model


def t5() -> nn.Module:
    t = _transformers()
    config = t.T5Config(
        d_model=256,
        d_kv=64,
        d_ff=1024,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        vocab_size=16384,
        decoder_start_token_id=0,  # set in every released T5 config; required with labels
        pad_token_id=0,
    )
    model: nn.Module = t.T5ForConditionalGeneration(config)
    return model


def t5_gated() -> nn.Module:
    """A flan-T5-style config: gated-GELU feed-forward, untied output projection, six heads of
    64 (inner attention width 384 != d_model)."""
    t = _transformers()
    config = t.T5Config(
        d_model=256, d_kv=64, d_ff=768, num_layers=2, num_decoder_layers=2, num_heads=6,
        vocab_size=16384, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
        decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    model: nn.Module = t.T5ForConditionalGeneration(config)
    return model


def t5_wide() -> nn.Module:
    """T5 with a wide feed-forward (d_ff 2048), eight heads of 32, a deeper encoder than
    decoder (3 / 1), tied embeddings."""
    t = _transformers()
    config = t.T5Config(
        d_model=256, d_kv=32, d_ff=2048, num_layers=3, num_decoder_layers=1, num_heads=8,
        vocab_size=16384, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    model: nn.Module = t.T5ForConditionalGeneration(config)
    return model


def llama_long() -> nn.Module:
    """The llama case's model with room for a prompt and its continuation (1024 positions)."""
    t = _transformers()
    config = t.LlamaConfig(
        hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=16384, max_position_embeddings=1024,
    )  # fmt: skip
    model: nn.Module = t.LlamaForCausalLM(config)
    return model


def llama() -> nn.Module:
    t = _transformers()
    config = t.LlamaConfig(
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=16384,
        max_position_embeddings=128,
    )
    model: nn.Module = t.LlamaForCausalLM(config)
    return model


def resnet() -> nn.Module:
    t = _transformers()
    config = t.ResNetConfig(
        embedding_size=32,
        hidden_sizes=[32, 64, 128, 256],
        depths=[1, 1, 2, 1],
        layer_type="basic",
        num_labels=100,
    )
    model: nn.Module = t.ResNetForImageClassification(config)
    return model


def mobilenet() -> nn.Module:
    t = _transformers()
    config = t.MobileNetV2Config(image_size=64, depth_multiplier=0.35, num_labels=10)
    model: nn.Module = t.MobileNetV2ForImageClassification(config)
    return model


def convnext() -> nn.Module:
    t = _transformers()
    config = t.ConvNextConfig(
        hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1], image_size=64, num_labels=10
    )
    model: nn.Module = t.ConvNextForImageClassification(config)
    return model


def distilbert() -> nn.Module:
    t = _transformers()
    config = t.DistilBertConfig(
        dim=256, n_layers=3, n_heads=4, hidden_dim=1024, vocab_size=16384,
        max_position_embeddings=128,
    )  # fmt: skip
    model: nn.Module = t.DistilBertForMaskedLM(config)
    return model


def opt() -> nn.Module:
    t = _transformers()
    config = t.OPTConfig(
        hidden_size=256, num_hidden_layers=3, num_attention_heads=4, ffn_dim=1024,
        vocab_size=16384, max_position_embeddings=128, word_embed_proj_dim=256,
    )  # fmt: skip
    model: nn.Module = t.OPTForCausalLM(config)
    return model


def _lora(model: nn.Module, r: int = 16) -> nn.Module:
    import peft

    config = peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=["q_proj", "v_proj"])
    wrapped: nn.Module = peft.get_peft_model(model, config)
    return wrapped


def llama_lora() -> nn.Module:
    """The llama case with LoRA r=16 on q and v (peft): a frozen base, trainable adapters."""
    return _lora(llama())


def llama_qlora() -> nn.Module:
    """QLoRA: the llama case's decoder linear layers as bitsandbytes NF4 ``Linear4bit``
    (quantised on the CPU), then LoRA r=16 on q and v."""
    import bitsandbytes as bnb

    model = llama()
    for layer in model.model.layers:  # type: ignore[union-attr]
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    q = bnb.nn.Linear4bit(
                        child.in_features, child.out_features, bias=False,
                        compute_dtype=torch.float32, quant_type="nf4",
                    )  # fmt: skip
                    q.weight = bnb.nn.Params4bit(
                        child.weight.data, requires_grad=False, quant_type="nf4"
                    )
                    setattr(parent, name, q.to("cpu"))
    model.requires_grad_(False)
    return _lora(model)


def mixtral() -> nn.Module:
    """A Mixtral-style sparse MoE decoder: 4 experts, 2 per token (transformers' grouped_mm
    experts path, float32)."""
    t = _transformers()
    config = t.MixtralConfig(
        hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=8192,
        max_position_embeddings=128,
    )  # fmt: skip
    model: nn.Module = t.MixtralForCausalLM(config)
    return model


def deepseek(dense_layers: int = 1) -> nn.Module:
    """A DeepSeek-V3-style decoder: multi-head latent attention (the cache keeps the compressed
    key / value latent and the shared rotary key, not per-head keys and values) and, past the
    first ``dense_layers`` layers, routed MoE experts (4, 2 per token, one shared)."""
    t = _transformers()
    config = t.DeepseekV3Config(
        hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=96, kv_lora_rank=64,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, n_routed_experts=4,
        num_experts_per_tok=2, n_shared_experts=1, n_group=1, topk_group=1,
        first_k_dense_replace=dense_layers, vocab_size=8192, max_position_embeddings=1024,
    )  # fmt: skip
    model: nn.Module = t.DeepseekV3ForCausalLM(config)
    return model


def deepseek_dense() -> nn.Module:
    """:func:`deepseek` with every layer dense (``first_k_dense_replace`` = all of them)."""
    return deepseek(dense_layers=3)


def whisper() -> nn.Module:
    """A Whisper-style encoder-decoder: a conv front end over log-mel features, a
    non-causal encoder, a causal decoder with cross-attention."""
    t = _transformers()
    config = t.WhisperConfig(
        d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024, num_mel_bins=80,
        max_source_positions=200, max_target_positions=64, vocab_size=8192,
        decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    model: nn.Module = t.WhisperForConditionalGeneration(config)
    return model


def vit_base_patch() -> nn.Module:
    """ViT at its usual resolution and patch size (224 / 16: 197 tokens with the class
    token), narrow and shallow to stay small."""
    t = _transformers()
    config = t.ViTConfig(
        image_size=224, patch_size=16, hidden_size=192, num_hidden_layers=4,
        num_attention_heads=3, intermediate_size=768, num_labels=1000,
    )  # fmt: skip
    model: nn.Module = t.ViTForImageClassification(config)
    return model


class RecurrentClassifier(nn.Module):
    """A stacked LSTM / GRU over a sequence of feature vectors, classified from every step."""

    def __init__(self, cell: str = "lstm", bidirectional: bool = False) -> None:
        super().__init__()
        kind = {"lstm": nn.LSTM, "gru": nn.GRU}[cell]
        self.rnn = kind(64, 256, num_layers=2, batch_first=True, bidirectional=bidirectional)
        self.head = nn.Linear(256 * (2 if bidirectional else 1), 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out)


def lstm() -> nn.Module:
    return RecurrentClassifier("lstm")


def bilstm() -> nn.Module:
    return RecurrentClassifier("lstm", bidirectional=True)


def gru() -> nn.Module:
    return RecurrentClassifier("gru")


def _separable(c_in: int, c_out: int, stride: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(c_in, c_in, 3, stride, 1, groups=c_in, bias=False),  # depthwise
        nn.BatchNorm2d(c_in),
        nn.ReLU(),
        nn.Conv2d(c_in, c_out, 1, bias=False),  # pointwise
        nn.BatchNorm2d(c_out),
        nn.ReLU(),
    )


def depthwise() -> nn.Module:
    """A MobileNet-style stack of depthwise separable convolutions."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        _separable(32, 64, 1), _separable(64, 128, 2), _separable(128, 128, 1),
        _separable(128, 256, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10),
    )  # fmt: skip


def _conv_bn(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU()]


def batchnorm_cnn() -> nn.Module:
    """A VGG-style conv net with BatchNorm after every convolution."""
    return nn.Sequential(
        *_conv_bn(3, 32), *_conv_bn(32, 32), nn.MaxPool2d(2),
        *_conv_bn(32, 64), *_conv_bn(64, 64), nn.MaxPool2d(2),
        *_conv_bn(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10),
    )  # fmt: skip


def channels_last_cnn() -> nn.Module:
    """The BatchNorm conv net with its weights in channels_last memory format."""
    return batchnorm_cnn().to(memory_format=torch.channels_last)


class BagClassifier(nn.Module):
    """Bags of token ids pooled by an EmbeddingBag, then an MLP (a recommender's shape)."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(50_000, 64, mode="mean")
        self.mlp = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.bag(ids))


class EmbeddingMLP(nn.Module):
    """Token embeddings (a large table) flattened into an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(30_000, 64)
        self.mlp = nn.Sequential(nn.Linear(32 * 64, 512), nn.ReLU(), nn.Linear(512, 4))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(ids).flatten(1))


class SwitchMoE(nn.Module):
    """A transformer-style MoE layer with top-1 routing and a fixed expert capacity.

    Routing is dense arithmetic (one-hot, cumulative positions, einsum dispatch and combine),
    as GShard / Switch implementations do, so every shape is known without reading values.
    """

    def __init__(self, width: int = 128, experts: int = 8, hidden: int = 256) -> None:
        super().__init__()
        self.experts = experts
        self.router = nn.Linear(width, experts)
        self.w_in = nn.Parameter(torch.randn(experts, width, hidden) * 0.02)
        self.w_out = nn.Parameter(torch.randn(experts, hidden, width) * 0.02)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        tokens = self.norm(x).reshape(b * s, w)
        probs = self.router(tokens).softmax(-1)
        gate, expert = probs.max(-1)
        one_hot = nn.functional.one_hot(expert, self.experts).to(x.dtype)
        capacity = 2 * (b * s) // self.experts
        position = (one_hot.cumsum(0) - 1) * one_hot  # slot of each token in its expert
        slots = nn.functional.one_hot(position.sum(-1).long(), capacity).to(x.dtype)
        dispatch = one_hot[:, :, None] * slots[:, None, :]  # tokens x experts x capacity
        expert_in = torch.einsum("tec,tw->ecw", dispatch, tokens)
        hidden = torch.relu(torch.bmm(expert_in, self.w_in))
        expert_out = torch.bmm(hidden, self.w_out)
        combined = torch.einsum("tec,ecw->tw", dispatch * gate[:, None, None], expert_out)
        return self.head((tokens + combined).reshape(b, s, w))


class SparseEmbeddingMLP(nn.Module):
    """The embedding-mlp case with sparse gradients for its table (``sparse=True``): the
    gradient holds one row per looked-up id, not the whole table."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(30_000, 64, sparse=True)
        self.mlp = nn.Sequential(nn.Linear(32 * 64, 512), nn.ReLU(), nn.Linear(512, 4))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.embed(ids).flatten(1))


class SparseBagClassifier(BagClassifier):
    """The embedding-bag case with sparse gradients for its table."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(50_000, 64, mode="mean", sparse=True)


class Factorization(nn.Module):
    """Matrix factorisation: user and item tables (sparse gradients), scored by a dot product;
    every trainable weight is sparse, as ``torch.optim.SparseAdam`` requires."""

    def __init__(self) -> None:
        super().__init__()
        self.users = nn.Embedding(20_000, 64, sparse=True)
        self.items = nn.Embedding(30_000, 64, sparse=True)

    def forward(self, pairs: torch.Tensor) -> torch.Tensor:
        return (self.users(pairs[:, 0]) * self.items(pairs[:, 1])).sum(-1)


def sparse_adam(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SparseAdam(params, lr=1e-3)


def moe() -> nn.Module:
    return SwitchMoE()


def torch_encoder() -> nn.Module:
    """torch's own nn.TransformerEncoder (MultiheadAttention, not transformers)."""
    layer = nn.TransformerEncoderLayer(128, 4, 512, batch_first=True)
    return nn.Sequential(nn.TransformerEncoder(layer, 3, enable_nested_tensor=False),
                         nn.Linear(128, 10))  # fmt: skip


class ThreeHeads(nn.Module):
    """A wide hidden state read by three heads: its gradient arrives from three branches,
    which autograd sums in place (a fake run sums them out of place; the estimate corrects)."""

    def __init__(self, width: int = 256, wide: int = 2048) -> None:
        super().__init__()
        self.up = nn.Linear(width, wide)
        self.heads = nn.ModuleList(nn.Linear(wide, width) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.up(x)
        return self.heads[0](hidden) + self.heads[1](hidden) + self.heads[2](hidden)


def _variants(name: str, build: Callable[[], nn.Module], inputs: str) -> list[Case]:
    return [
        Case(name, build, inputs),
        Case(f"{name}-checkpoint", build, inputs, checkpoint=True),
        Case(f"{name}-sgd", build, inputs, optimizer="sgd"),
        Case(f"{name}-amp-bf16", build, inputs, amp="bf16"),
        Case(f"{name}-bf16", build, inputs, dtype="bf16"),
    ]


CASES: dict[str, Case] = {
    case.name: case
    for case in [
        *_variants("gpt2", gpt2, "8x128"),
        Case("bert", bert, "8x128"),
        Case("vit", vit, "8x3x96x96"),
        Case("vit-checkpoint", vit, "8x3x96x96", checkpoint=True),
        Case("t5", t5, "8x128"),
        Case("t5-gated", t5_gated, "8x128"),
        Case("t5-wide", t5_wide, "8x128"),
        *_variants("llama", llama, "8x128"),
        Case("resnet", resnet, "8x3x128x128"),
        Case("resnet-checkpoint", resnet, "8x3x128x128", checkpoint=True),
        Case("mobilenet-v2", mobilenet, "8x3x64x64"),
        Case("convnext", convnext, "8x3x64x64"),
        Case("distilbert", distilbert, "8x128"),
        Case("opt", opt, "8x128"),
        Case("opt-checkpoint", opt, "8x128", checkpoint=True),
        Case("lstm", lstm, "8x64x64"),
        Case("lstm-sgd", lstm, "8x64x64", optimizer="sgd"),
        Case("bilstm", bilstm, "8x64x64"),
        Case("gru", gru, "8x64x64"),
        Case("depthwise-cnn", depthwise, "16x3x64x64"),
        Case("batchnorm-cnn", batchnorm_cnn, "16x3x64x64"),
        Case("channels-last-cnn", channels_last_cnn, "16x3x64x64"),
        Case("embedding-bag", BagClassifier, "64x20"),
        Case("embedding-mlp", EmbeddingMLP, "64x32"),
        Case("embedding-sparse-sgd", SparseEmbeddingMLP, "64x32", optimizer="sgd"),
        Case("embedding-bag-sparse-sgd", SparseBagClassifier, "64x20", optimizer="sgd"),
        Case(
            "factorization-sparseadam",
            Factorization,
            "256x2",
            optimizer="sparseadam",
            optimizer_factory=sparse_adam,
        ),
        Case("moe", moe, "8x64x128"),
        Case("moe-amp-bf16", moe, "8x64x128", amp="bf16"),
        Case("torch-encoder", torch_encoder, "8x64x128"),
        Case("three-heads", ThreeHeads, "512x256"),
        Case("mixtral", mixtral, "4x128"),
        Case("whisper", whisper, "input_features=4x80x400,labels=4x32"),
        Case("vit-224", vit_base_patch, "8x3x224x224"),
        Case("llama-lora", llama_lora, "8x128", estimate_from="cpu", fine_tune="lora", base=llama),
        Case(
            "llama-qlora", llama_qlora, "8x128", estimate_from="cpu", fine_tune="qlora", base=llama
        ),
        Case("llama-adamw8bit", llama, "8x128", optimizer="adamw8bit"),
        Case("llama-generate-b1", llama_long, "input_ids=1x128", generate=64),
        Case("llama-generate-b4", llama_long, "input_ids=4x128", generate=64),
        Case("llama-generate-static", llama_long, "input_ids=4x128", generate=64, cache="static"),
        Case(
            "llama-generate-quantized",
            llama_long,
            "input_ids=4x128",
            generate=64,
            cache="quantized",
            cache_config={
                "backend": "quanto",
                "nbits": 4,
                "q_group_size": 64,
                "residual_length": 16,
            },
        ),
        Case("t5-generate", t5, "input_ids=4x128", generate=32),
        Case("deepseek-generate", deepseek, "input_ids=4x128", generate=32),
        Case("deepseek-dense-generate", deepseek_dense, "input_ids=4x128", generate=32),
    ]
}


#: Why a case differs, for the README (the causes were found by comparing the allocator's
#: events per op with the estimate's rows).
KNOWN_DIFFERENCES: dict[str, str] = {
    "convnext": (
        "ConvNeXt's depthwise 7x7 convolutions receive channels_last activations; on the "
        "CPU, oneDNN's backward for those allocates and frees a buffer of channels x 49 x 256 "
        "x 4 bytes inside `convolution_backward`, whatever the batch. The estimate models it "
        "(_estimator/kernels.py, `depthwise_backward_workspace`): -33.6 % before, "
        "the small rest is other in-op buffers, as for resnet."
    ),
    "resnet": (
        "oneDNN's convolution backward allocates and frees buffers inside the op (reorders, "
        "scratchpads) that a fake run does not see; the allocator's events count them. The "
        "same holds, smaller, for mobilenet-v2 and depthwise-cnn."
    ),
    "three-heads": (
        "a hidden state read by three heads gets its gradient from three branches. Outside a "
        "dispatch mode autograd sums them in place into a buffer it holds the only reference "
        "to; a fake run sums them out of place (one more hidden-sized buffer per branch). The "
        "estimate rewrites those sums (_estimator/accumulation.py) where the first operand is "
        "a whole buffer, not a view, freed right after the sum: +3.5 % before, 0.00 % now "
        "(+10.7 % with `pow(2).mean()` as the loss). Its `sum()` loss also shows CPU matrix "
        "products copying a broadcast operand to a contiguous buffer inside the op, modelled."
    ),
    "gru": (
        "-0.18 % before, 0.00 % now: among its chained gradient sums, those whose first "
        "operand is a view (which keeps its base alive) are summed out of place by autograd "
        "too; the estimate used to sum into them."
    ),
    "whisper": (
        "its output projection shares the decoder's token embedding; the projection's weight "
        "gradient arrives as a transposed view of a matmul result, so autograd sums the two "
        "out of place (one more 8 MiB buffer): -5.87 % while the estimate summed into views, "
        "0.00 % now. Its encoder's sinusoidal positions are a frozen weight."
    ),
    "mixtral": (
        "transformers runs the experts through `aten._grouped_mm`, whose fake implementation "
        "accepted only bf16: the fp32 model could not be estimated before "
        "(_estimator/kernels.py, `grouped_mm_any_dtype`)."
    ),
    "llama-generate-quantized": (
        "+256 KiB (+0.50 %) before, -24 B now: quanto packs a cache tensor's 4-bit values two a "
        "byte only when handed a plain `torch.Tensor`, so the fake run kept them a byte a value "
        "(8 tensors x 32 KiB more at the prefill's peak); the fake run now packs them, runs "
        "quanto's Python ops (`quantize_affine`: its `round`, `clamp` and uint8 copies) op by op "
        "and the CPU unpack kernel's operands as the C++ kernel holds them "
        "(_estimator/quantized_cache.py)."
    ),
    "t5-generate": (
        "+64 KiB before, -24 B now: transformers' mask code took the fake prompt mask for a "
        "trace and built the encoder's 4 x 1 x 128 x 128 bool mask, which the real call (a "
        "prompt without padding: SDPA's own attention) leaves out; the fake run now reads the "
        "mask of ones as the real one does (_estimator/generation.py, ordinary_prompt_reads)."
    ),
    "deepseek-dense-generate": (
        "its keys (48 dims: 32 + 16 rotary) and values (32) differ in size, so CPU attention "
        "takes the math path, whose `_safe_softmax` makes and frees a bool mask the size of "
        "the attention weights (`isneginf`, 256 KiB) and its per-row `all` inside the op, "
        "unseen by a fake run (CUDA runs the memory-efficient kernel). With the MoE layers "
        "the peak is elsewhere (-0.15 %)."
    ),
    "embedding-sparse-sgd": (
        "the table's gradient is sparse: one row of 64 values and one int64 index per looked-up "
        "id (2,048 ids: 512 KiB + 16 KiB), not the 7.3 MiB table; SGD's momentum for it is "
        "sparse too and gets new buffers each step (room for both operands' entries in "
        "`add_`). A fake run made these empty, and the estimate failed on the sparse momentum "
        "(no storage to read). The measurement profiles the "
        "warm-up step too, since the step frees the momentum the warm-up made (the profiler "
        "reports no free of a block allocated before it started)."
    ),
    "factorization-sparseadam": (
        "SparseAdam coalesces each sparse gradient; the estimate keeps every entry (as if no id "
        "repeats, what a fake run cannot know), and misses a few small in-kernel buffers."
    ),
    "lstm": (
        "oneDNN's LSTM workspace is exact (its formula, checked against the real kernel); the "
        "in-call scratchpad is modelled within a few tens of KB per layer call."
    ),
}


def settings_of(case: Case, device: str = "cpu") -> Any:
    from jupyter_vram._estimator.step import StepSettings

    optimizer = "custom" if case.optimizer_factory else case.optimizer
    return StepSettings(device=device, dtype=case.dtype, amp=case.amp,
                        checkpoint=case.checkpoint, optimizer=optimizer,
                        inference=bool(case.generate), generate=case.generate,
                        cache=case.cache, cache_config=cache_options_of(case))  # fmt: skip


def cache_options_of(case: Case) -> str:
    """The case's quantised-cache options as the estimator's settings keep them."""
    from jupyter_vram._estimator.generation import cache_options

    return cache_options(case.cache, case.cache_config)


def build(case: Case, device: str = "cpu") -> nn.Module:
    """The case's model on ``device`` ("cpu": real weights, "meta": shapes only)."""
    torch.manual_seed(case.seed)
    with torch.device(device):
        return case.build()


def measure(case: Case) -> dict[str, Any]:
    """One real steady-state step on the CPU, measured by the allocator's own events under
    torch.profiler (not jupyter_vram's recorders). Call in a fresh process only."""
    from jupyter_vram._estimator.inputs import make_batch_spec, parse_dtype, with_default_labels
    from jupyter_vram._estimator.step import make_optimizer, training_step
    from jupyter_vram._transforms.checkpointing import enable_checkpointing

    if case.generate:
        return measure_generation(case)
    settings = settings_of(case)
    model = build(case)
    if case.dtype:
        model.to(parse_dtype(case.dtype))
    if case.checkpoint:
        enable_checkpointing(model)
    model.train()
    spec = with_default_labels(model, make_batch_spec(model, case.inputs))
    float_dtype = parse_dtype(case.dtype) if case.dtype else torch.float32
    args, kwargs = spec.build("cpu", float_dtype)
    opt = make_optimizer(settings, model, case.optimizer_factory)
    started = time.perf_counter()
    before_warm_up = sum(before_step(model, opt, (args, kwargs)).values())
    rise = allocator_peak_rise(
        lambda: training_step(model, opt, args, kwargs, settings, "cpu"),
        warm_up=lambda: training_step(model, opt, args, kwargs, settings, "cpu"),
    )
    before = before_step(model, opt, (args, kwargs))
    seconds = time.perf_counter() - started
    return {
        "case": case.name,
        "peak_bytes": before_warm_up + rise,
        "breakdown": before,
        "rise_bytes": rise,
        "parameters": sum(p.numel() for p in model.parameters()),
        "input": spec.describe(),
        "seconds": round(seconds, 3),
    }


def measure_generation(case: Case) -> dict[str, Any]:
    """One real ``generate()`` call (after a warm-up one) measured as :func:`measure` measures a
    step: the estimator's own call (greedy, exactly ``case.generate`` new tokens)."""
    from jupyter_vram._estimator.generation import generate_step
    from jupyter_vram._estimator.inputs import make_batch_spec

    model = build(case).eval()
    spec = make_batch_spec(model, case.inputs)
    args, kwargs = spec.build("cpu", torch.float32)
    started = time.perf_counter()
    options = cache_options_of(case)
    generate_step(model, args, kwargs, case.generate, case.cache, options)
    before = before_step(model, None, (args, kwargs))
    rise = allocator_peak_rise(lambda: generate_step(model, args, kwargs, case.generate,
                                                     case.cache, options))  # fmt: skip
    return {
        "case": case.name,
        "peak_bytes": sum(before.values()) + rise,
        "breakdown": before,
        "rise_bytes": rise,
        "parameters": sum(p.numel() for p in model.parameters()),
        "input": spec.describe(),
        "seconds": round(time.perf_counter() - started, 3),
    }


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def before_step(model: nn.Module, optimizer: Any, batch: Any) -> dict[str, int]:
    """Bytes of the storages alive before the measured step, by role (each storage once)."""
    seen: set[int] = set()
    out: dict[str, int] = {}
    state = [] if optimizer is None else [optimizer.state[p] for p in optimizer.state]
    groups = {
        "parameter": list(model.parameters()),
        "quant_state": [t for p in model.parameters() for t in _quant_state(p)],
        "buffer": list(model.buffers()),
        "optimizer_state": _tensors(state),
        "input": _tensors(batch),
    }
    for name, tensors in groups.items():
        total = 0
        for tensor in (part for t in tensors for part in _dense_parts(t)):
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in seen and storage.nbytes():
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        out[name] = total
    return out


def _dense_parts(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The tensors that hold a tensor's memory: a sparse COO tensor (SGD's momentum for a
    sparse gradient) keeps its indices and values, each with a storage of its own."""
    if tensor.layout == torch.sparse_coo:
        return [tensor._indices(), tensor._values()]
    return [tensor]


def _quant_state(param: Any) -> list[torch.Tensor]:
    """The tensors a bitsandbytes 4-bit weight keeps beside its packed data (its QuantState:
    absmax, code table, the nested state of double quantisation), read from its attributes."""
    state = getattr(param, "quant_state", None)
    found: list[torch.Tensor] = []
    while state is not None:
        found += [v for v in vars(state).values() if isinstance(v, torch.Tensor)]
        state = getattr(state, "state2", None)
    return found


def allocator_peak_rise(step: Callable[[], None], warm_up: Callable[[], None] | None = None) -> int:
    """Highest allocated-minus-freed bytes during ``step()``, from the CPU allocator's events
    as torch.profiler records them (``profile_memory=True``), counted from before
    ``warm_up()`` when given (run first, under the same profiler).

    The profiler reports no free of a block allocated before it started, so a step that frees
    what an earlier step made (SGD's momentum for a sparse gradient is replaced each step)
    must have that step profiled too: then the rise is over the state before the warm-up."""
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if warm_up is not None:
            warm_up()
        with record_function(_MEASURED_STEP):
            step()
    events: list[tuple[int, int]] = []
    window = (0, 0)
    pending = list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        if event.tag == torch._C._profiler._EventType.Allocation:
            events.append((event.start_time_ns, int(event.extra_fields.alloc_size)))
        elif event.name == _MEASURED_STEP:
            window = (event.start_time_ns, event.end_time_ns)
        pending.extend(event.children)
    live = 0
    peak: int | None = None
    for time_ns, size in sorted(events, key=lambda e: e[0]):
        if time_ns >= window[0] and peak is None:
            peak = live  # what the step starts with
        live += size
        if window[0] <= time_ns <= window[1]:
            peak = max(peak or 0, live)
    return live if peak is None else peak


#: The profiler range around the measured step (see :func:`allocator_peak_rise`).
_MEASURED_STEP = "estimate_vs_measured: measured step"


def start_measurement(name: str) -> subprocess.Popen[str]:
    """Start :func:`measure` of case ``name`` in a fresh interpreter."""
    return subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--measure", name],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def finish_measurement(process: subprocess.Popen[str], timeout_s: float = 600) -> dict[str, Any]:
    """Wait for a measurement started by :func:`start_measurement`; its JSON result."""
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"the measurement failed ({process.returncode}):\n{err[-3000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def measure_in_subprocess(name: str, timeout_s: float = 600) -> dict[str, Any]:
    """:func:`measure` of case ``name`` in a fresh interpreter; returns its JSON."""
    return finish_measurement(start_measurement(name), timeout_s)


def run_estimate(case: Case, device: str = "cpu") -> tuple[Any, float]:
    """The estimate of ``case`` from a meta-device model, and its wall time in seconds."""
    from jupyter_vram._estimator import estimate

    model = build(case, case.estimate_from)
    started = time.perf_counter()
    if case.generate:
        from jupyter_vram._estimator import estimate_generate

        result = estimate_generate(model, case.inputs, case.generate, cache=case.cache,
                                   cache_config=case.cache_config, device=device,
                                   dtype=case.dtype)  # fmt: skip
        return result, time.perf_counter() - started
    optimizer = case.optimizer_factory or case.optimizer
    result = estimate(model, case.inputs, optimizer=optimizer, device=device, dtype=case.dtype,
                      amp=case.amp, checkpoint=case.checkpoint)  # fmt: skip
    return result, time.perf_counter() - started


@dataclass
class Row:
    case: Case
    parameters: int
    input: str
    measured: int
    estimated: int
    seconds: float
    measured_breakdown: dict[str, int]
    estimated_breakdown: dict[str, int]
    # torch-kitsune's prediction (a kitsune_side.Prediction); None: kitsune is not installed
    kitsune: Any = None

    @property
    def difference(self) -> float:
        """(estimated - measured) / measured."""
        return (self.estimated - self.measured) / self.measured


def kitsune_prediction(case: Case, kitsune: Any) -> Any:
    """torch-kitsune's prediction for ``case`` (a kitsune_side.Prediction), given the model it
    documents: real weights on the CPU in the case's dtype, the base model for LoRA."""
    from kitsune_side import predict  # bench/ is on sys.path when run as a script

    from jupyter_vram._estimator.inputs import parse_dtype

    torch.manual_seed(case.seed)
    with torch.device("cpu"):
        model = (case.base or case.build)()
    if case.dtype:
        model.to(parse_dtype(case.dtype))
    return predict(case, kitsune, model)


def compare(case: Case, kitsune: Any = None) -> Row:
    """Measure and estimate ``case``; with ``kitsune`` (its ``kitsune.predict`` module), its
    prediction too."""
    measured = measure_in_subprocess(case.name)
    est, seconds = run_estimate(case)
    before = est.profile.timeline.baseline_by_category()
    from jupyter_vram._model import CATEGORIES

    estimated_before = {name: int(before[CATEGORIES.index(name)]) for name in measured["breakdown"]}
    # the measurement's parameters are all of model.parameters(), frozen or not
    estimated_before["parameter"] += int(before[CATEGORIES.index("frozen_parameter")])
    return Row(case, int(measured["parameters"]), est.input, int(measured["peak_bytes"]),
               est.peak_bytes, seconds, measured["breakdown"], estimated_before,
               None if kitsune is None else kitsune_prediction(case, kitsune))  # fmt: skip


def _params(n: int) -> str:
    return f"{n / 1e6:.1f}M"


def table(rows: list[Row]) -> str:
    """The markdown table and its summary; torch-kitsune's columns when a row has its
    prediction (kitsune installed)."""
    with_kitsune = any(r.kitsune is not None for r in rows)
    reasons: list[str] = []  # why kitsune has no prediction, footnote n is reasons[n - 1]
    lines = [
        "| case | model | params | input | step | measured peak (MiB) | estimated peak (MiB) "
        "| difference (KiB) | vs measured | estimate time (s) |"
        + (" kitsune (MiB) | kitsune vs measured |" if with_kitsune else ""),
        "|---|---|---|---|---|--:|--:|--:|--:|--:|" + ("--:|--:|" if with_kitsune else ""),
    ]
    for r in rows:
        model = type(build(r.case, r.case.estimate_from)).__name__
        lines.append(
            f"| {r.case.name} | {model} | {_params(r.parameters)} | {r.input} "
            f"| {r.case.variant_label()} | {r.measured / MIB:.1f} | {r.estimated / MIB:.1f} "
            f"| {(r.estimated - r.measured) / 1024:+,.0f} | {100 * r.difference:+.2f} % "
            f"| {r.seconds:.1f} |" + (_kitsune_cells(r, reasons) if with_kitsune else "")
        )
    differences = [abs(r.difference) * 100 for r in rows]
    if differences:
        lines += [
            "",
            f"Median absolute difference from the measurement "
            f"{statistics.median(differences):.2f} %, max {max(differences):.2f} % "
            f"over {len(rows)} cases (targets: median <= 3 %, max <= 10 %).",
        ]
    if with_kitsune:
        lines += _kitsune_summary(rows, reasons)
    return "\n".join(lines)


def _kitsune_cells(row: Row, reasons: list[str]) -> str:
    """kitsune's two cells of ``row``: its peak and its difference from the measurement, or
    a footnote number (``reasons`` gains the reason when it is new)."""
    prediction = row.kitsune
    if prediction is None:
        return " | |"
    if not prediction.answered:
        if prediction.reason not in reasons:
            reasons.append(prediction.reason)
        return f" n/a ({reasons.index(prediction.reason) + 1}) | |"
    difference = (prediction.total_bytes - row.measured) / row.measured
    return f" {prediction.total_bytes / MIB:.1f} | {100 * difference:+.2f} % |"


def _kitsune_version() -> str:
    """The installed torch-kitsune's version after a space, "" when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f" {version('torch-kitsune')}"
    except PackageNotFoundError:
        return ""


def _kitsune_summary(rows: list[Row], reasons: list[str]) -> list[str]:
    """kitsune's median / max absolute difference over the cases it answered, without its
    safety margin too, beside ours over the same cases; then the footnotes."""
    answered = [r for r in rows if r.kitsune is not None and r.kitsune.answered]

    def spread(errors: list[float]) -> str:
        return f"median {statistics.median(errors):.2f} %, max {max(errors):.2f} %"

    lines = [""]
    if answered:
        total = [100 * abs(r.kitsune.total_bytes - r.measured) / r.measured for r in answered]
        bare = [100 * abs(r.kitsune.total_bytes - r.kitsune.margin_bytes - r.measured)
                / r.measured for r in answered]  # fmt: skip
        ours = [100 * abs(r.difference) for r in answered]
        lines.append(
            f"torch-kitsune{_kitsune_version()} (installed beside the bench, not a "
            f"dependency) answered {len(answered)} of {len(rows)} cases: absolute difference "
            f"from the measurement {spread(total)} ({spread(bare)} without the 15 % it adds "
            f"for allocator overhead); jupyter_vram over the same cases {spread(ours)}."
        )
    else:
        lines.append(f"torch-kitsune answered none of the {len(rows)} cases.")
    for number, reason in enumerate(reasons, 1):
        cases = ", ".join(r.case.name for r in rows if r.kitsune and r.kitsune.reason == reason)
        lines.append(f"\n({number}) {reason}: {cases}.")
    return lines


def breakdowns(rows: list[Row]) -> str:
    """Where estimate and measurement differ in what exists before the step, per role."""
    out = []
    for r in rows:
        cats = dict.fromkeys([*r.measured_breakdown, *r.estimated_breakdown])
        diffs = {c: r.estimated_breakdown.get(c, 0) - r.measured_breakdown.get(c, 0) for c in cats}
        parts = [f"{c} {d / 1024:+,.0f} KiB" for c, d in diffs.items() if d]
        if parts:
            out.append(f"- {r.case.name}: " + ", ".join(parts))
    return "\n".join(out)


def intro() -> str:
    """How the table was made, for the README."""
    import platform

    import transformers

    return (
        '`jv.estimate(..., device="cpu")` against the same training step measured in a fresh '
        "process (one warm-up step, then the measured one) by the CPU allocator's own events "
        "under `torch.profiler` (`profile_memory=True`), not by jupyter_vram's recorders: the "
        "measured peak is the storages alive before the warm-up (parameters, buffers, "
        "optimizer state, inputs) plus the running maximum during the measured step of "
        "allocated minus freed bytes since then (the warm-up runs under the profiler too: it "
        "reports no free of a block allocated before it started). "
        f"Made by `python bench/estimate_vs_measured.py --readme` with torch {torch.__version__}, "
        f"transformers {transformers.__version__}, Python {platform.python_version()}, on "
        f"{os.cpu_count()} CPU cores, shared with other jobs (times are inflated). Estimate "
        "time is the wall time of the whole `estimate()` call; the estimator process is kept "
        "warm between estimates (the first case pays for starting it, a case after another of "
        "the same model reuses it). The model is built on the meta device "
        "(QLoRA and LoRA on the CPU: bitsandbytes quantises real weights). Generation rows "
        '(step "generate N") are `jv.estimate_generate(model, prompt, N, device="cpu")` '
        "against one real `generate()` call of N greedy tokens, measured the same way (the "
        'quantized row: `cache="quantized"`, optimum-quanto 4-bit in groups of 64, the newest 16 '
        "tokens unquantised). Peaks of "
        "the fine-tuning rows include the frozen base weights and QuantState tensors."
        + (KITSUNE_INTRO if kitsune_installed() else "")
    )


KITSUNE_INTRO = (
    " torch-kitsune (not a dependency of jupyter_vram; its columns appear when it is "
    "installed) is asked each case the way its documentation shows: `predict_memory` for a "
    "training step (the model with real weights on the CPU in the case's dtype, the first "
    "input's shape without the batch dimension, the batch size, the optimizer), "
    "`estimate_lora_memory` for LoRA / QLoRA (the base model, rank 16 on q_proj and v_proj) "
    "and `estimate_kv_cache` for generation (prompt plus new tokens, float32). Its peaks "
    "include the 15 % it adds for allocator overhead; the summary gives its error without "
    "that margin too. Its activation estimate feeds the model a float tensor of the input's "
    "shape: where the model takes token ids both its tracing paths fail and its per-layer "
    "formulas remain (0.5 MiB of activations for gpt2, 0.8 MiB for llama), which is why its "
    "language-model training rows, LoRA and QLoRA included, are far below the measurement."
)


def kitsune_installed() -> bool:
    """Whether torch-kitsune can be imported (its columns and intro sentence come with it)."""
    from importlib.util import find_spec

    return find_spec("kitsune") is not None


def write_readme(text: str) -> None:
    from readme_section import write_section  # bench/ is on sys.path when run as a script

    write_section(SECTION, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--measure", metavar="CASE", help="measure one case, print JSON")
    parser.add_argument("--list", action="store_true", help="list the cases")
    parser.add_argument("--readme", action="store_true", help="write the table to README.md")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(CASES))
        return 0
    if args.measure:
        print(json.dumps(measure(CASES[args.measure])))
        return 0
    names = args.cases or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; see --list")
    from kitsune_side import load_kitsune  # bench/ is on sys.path when run as a script

    kitsune = load_kitsune()
    rows: list[Row] = []
    failures: list[str] = []
    for name in names:
        print(f"{name} ...", file=sys.stderr, flush=True)
        try:
            rows.append(compare(CASES[name], kitsune))
        except Exception as error:  # noqa: BLE001 - report the case and go on
            failures.append(f"- {name}: {type(error).__name__}: {str(error).strip()[:500]}")
    text = table(rows)
    details = breakdowns(rows)
    if details:
        text += "\n\nEstimated minus measured, alive before the step, per role:\n\n" + details
    known = [f"- {r.case.name}: {KNOWN_DIFFERENCES[r.case.name]}" for r in rows
             if r.case.name in KNOWN_DIFFERENCES]  # fmt: skip
    if known:
        text += "\n\nKnown differences:\n\n" + "\n".join(known)
    if failures:
        text += "\n\nFailed:\n\n" + "\n".join(failures)
    print(text)
    if args.readme:
        write_readme(f"{intro()}\n\n{text}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
