"""Fine-tuning and generation as users run them, recorded: LoRA's frozen base vs trainable
adapters, QLoRA's 4-bit weights and their QuantState, 8-bit optimizer state, a generate() KV
cache. Every expected byte count is hand arithmetic from the model's shapes (NF4 = half a byte
per weight, absmax blocks of 64 / 256, K and V = kv_heads x head_dim x tokens x batch x 4 B),
not the recorder's own formula.

peft, bitsandbytes and transformers are optional: each test skips without them.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import jupyter_vram as jv
from jupyter_vram._model import Profile

transformers = pytest.importorskip("transformers")

#: a Llama small enough for a shared CPU: 2 layers, hidden 64, 4 heads of 16, 2 KV heads
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 2, 64, 4, 2, 128, 256
HEAD_DIM = HIDDEN // HEADS
#: weights per layer: q, k, v, o, gate, up, down
LAYER_LINEARS = [(HIDDEN, HIDDEN), (HIDDEN, KV_HEADS * HEAD_DIM), (HIDDEN, KV_HEADS * HEAD_DIM),
                 (HIDDEN, HIDDEN), (HIDDEN, FFN), (HIDDEN, FFN), (FFN, HIDDEN)]  # fmt: skip
#: fp32 bytes outside the linear layers: embedding, lm_head, 2 norms per layer, the final norm
OTHER_WEIGHT_BYTES = 4 * (VOCAB * HIDDEN * 2 + HIDDEN * (2 * LAYERS + 1))


def llama() -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=FFN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(cfg)


def lora(model: nn.Module) -> Any:
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=8, target_modules=["q_proj", "v_proj"])
    return peft.get_peft_model(model, config)


#: LoRA r=8 on q and v of every layer: A is r x in, B is out x r (fp32)
LORA_BYTES = 4 * LAYERS * (8 * HIDDEN + HIDDEN * 8 + 8 * HIDDEN + KV_HEADS * HEAD_DIM * 8)


def train_step(model: nn.Module, opt: torch.optim.Optimizer) -> Profile:
    ids = torch.randint(0, VOCAB, (2, 32))
    with jv.record() as rec:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return rec.profile


def total(profile: Profile, category: str) -> int:
    """Bytes of every allocation of a category over the whole run (not only at the peak)."""
    df = profile.to_dataframe()
    return int(df.loc[df.category == category, "bytes"].sum())


def test_lora_frozen_base_and_trainable_adapters_are_apart() -> None:
    model = lora(llama())
    linear_bytes = 4 * LAYERS * sum(i * o for i, o in LAYER_LINEARS)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    prof = train_step(model, opt)
    at_peak = prof.peak_breakdown()
    assert at_peak["parameter"] == LORA_BYTES == 14_336
    assert at_peak["frozen_parameter"] == linear_bytes + OTHER_WEIGHT_BYTES
    # only adapters train: their gradients and AdamW's two moments (+ a 4 B step each)
    assert total(prof, "gradient") == LORA_BYTES
    assert total(prof, "optimizer_state") == 2 * LORA_BYTES + 4 * 4 * LAYERS
    assert sum(at_peak.values()) == prof.peak_bytes


def nf4_llama() -> Any:
    """The Llama with every decoder linear layer a bitsandbytes NF4 ``Linear4bit`` (quantised
    on CPU when moved there, as QLoRA's base model is on a GPU)."""
    bnb = pytest.importorskip("bitsandbytes")
    model = llama()
    for layer in model.model.layers:
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
    return model


def quant_state_bytes(n: int) -> int:
    """One NF4 weight of ``n`` elements, nested statistics (bitsandbytes' default): absmax
    one uint8 per block of 64, re-quantised in blocks of 256 with one fp32 absmax each, an fp32
    offset, the 16-entry NF4 code and the 256-entry code of the nested quantisation (fp32)."""
    blocks = -(-n // 64)
    return blocks + 4 * -(-blocks // 256) + 4 + 4 * 16 + 4 * 256


def test_qlora_counts_nf4_weights_and_their_quant_state_in_the_peak() -> None:
    model = lora(nf4_llama())
    sizes = [i * o for i, o in LAYER_LINEARS] * LAYERS
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    prof = train_step(model, opt)
    at_peak = prof.peak_breakdown()
    assert at_peak["frozen_parameter"] == sum(n // 2 for n in sizes) + OTHER_WEIGHT_BYTES
    assert at_peak["quant_state"] == sum(quant_state_bytes(n) for n in sizes) == 16_496
    assert at_peak["parameter"] == LORA_BYTES
    # the truth bug: what the QuantState holds is inside the peak, not beside it
    assert sum(at_peak.values()) == prof.peak_bytes
    assert prof.timeline.baseline_bytes >= at_peak["quant_state"] + at_peak["frozen_parameter"]


def test_quant_state_of_a_wrapper_subclass_is_its_inner_tensors() -> None:
    """A torchao-style tensor subclass has no storage: its largest inner tensor is the
    weight's data (a parameter), the others its scales (quant_state)."""

    class Int8Weight(torch.Tensor):
        @staticmethod
        def __new__(cls, data: torch.Tensor, scale: torch.Tensor) -> Int8Weight:
            return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined,no-any-return]
                cls, data.shape, dtype=torch.float32, requires_grad=False
            )

        def __init__(self, data: torch.Tensor, scale: torch.Tensor) -> None:
            self.int_data = data
            self.scale = scale

        def __tensor_flatten__(self) -> tuple[list[str], None]:
            return ["int_data", "scale"], None

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None):  # type: ignore[no-untyped-def]
            if func is torch.ops.aten.detach.default:  # nn.Parameter(weight) detaches
                return Int8Weight(args[0].int_data, args[0].scale)
            raise NotImplementedError(func)

    layer = nn.Linear(256, 64, bias=False)
    weight = Int8Weight(torch.zeros(64, 256, dtype=torch.int8), torch.ones(64))
    layer.weight = nn.Parameter(weight, requires_grad=False)
    notebook = {"model": nn.Sequential(layer)}  # memory held before the recorded block
    with jv.record(namespace=notebook) as rec:
        torch.zeros(1)
    at_peak = rec.profile.peak_breakdown()
    assert at_peak["frozen_parameter"] == 64 * 256  # int8: one byte per weight
    assert at_peak["quant_state"] == 64 * 4  # one fp32 scale per row


def test_adamw8bit_state_is_optimizer_state() -> None:
    """bitsandbytes 8-bit AdamW: two uint8 moments per weight of 4096 elements or more, an fp32
    absmax per block of 256 for each, two 256-entry fp32 quantisation maps shared by all; a
    smaller weight keeps fp32 moments."""
    bnb = pytest.importorskip("bitsandbytes")
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(128, 256, bias=False), nn.ReLU(), nn.Linear(256, 128, bias=False),
        nn.Linear(128, 8),
    )  # fmt: skip
    opt = bnb.optim.AdamW8bit(model.parameters())
    with jv.record() as rec:
        model(torch.randn(4, 128)).sum().backward()
        opt.step()
        opt.zero_grad()
    big = 2 * (2 * 128 * 256 + 2 * 4 * (128 * 256 // 256))
    maps = 2 * 4 * 256
    small = 2 * 4 * (8 * 128 + 8)
    assert total(rec.profile, "optimizer_state") == big + maps + small == 143_424
    assert total(rec.profile, "parameter") == 4 * (2 * 128 * 256 + 8 * 128 + 8)


def kv_bytes(tokens: int, batch: int) -> int:
    """2 (K and V) x layers x kv_heads x head_dim x tokens x batch x 4 B (fp32)."""
    return 2 * LAYERS * KV_HEADS * HEAD_DIM * tokens * batch * 4


@pytest.mark.parametrize("batch", [1, 4])
def test_generate_kv_cache_is_its_own_category(batch: int) -> None:
    model = llama().eval()
    prompt, new = 16, 8
    ids = torch.randint(1, VOCAB, (batch, prompt))
    with jv.record() as rec, torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
            return_dict_in_generate=True,
        )  # fmt: skip
    df = rec.profile.to_dataframe()
    kv = df[df.category == "kv_cache"]
    # the cache generate() returns holds prompt + new - 1 positions (the last token's keys
    # are never computed); all four of its tensors are alive when the cell ends
    alive = kv[kv.free_seq < 0]
    assert int(alive.bytes.sum()) == kv_bytes(prompt + new - 1, batch)
    assert len(alive) == 2 * LAYERS
    # each step's keys and values, by `cat`, one tensor per layer and K / V
    per_tensor = kv_bytes(1, batch) // (2 * LAYERS)
    grown = sorted(set(kv.bytes.tolist()))
    assert grown == [per_tensor * t for t in range(prompt, prompt + new)]
    del out


class RingCache:
    """A user's own cache: keys a module keeps across calls (never a transformers Cache)."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []


class Remembers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(32, 32)
        self.cache = RingCache()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.cache.keys.append(self.proj(x))
        return torch.cat(self.cache.keys, dim=0).sum(0)


def test_a_registered_cache_kept_by_a_module_is_kv_cache() -> None:
    model = Remembers()
    steps, rows = 3, 5
    jv.register_cache(RingCache)
    try:
        with jv.record() as rec, torch.no_grad():
            for _ in range(steps):
                model(torch.randn(rows, 32))
    finally:
        jv.unregister_cache(RingCache)
    df = rec.profile.to_dataframe()
    assert int(df.loc[df.category == "kv_cache", "bytes"].sum()) == steps * rows * 32 * 4
    with pytest.raises(TypeError, match="takes a class"):
        jv.register_cache(RingCache())  # type: ignore[arg-type]


def test_the_header_says_trainable_frozen_and_quant_state() -> None:
    from jupyter_vram._render.html import header_facts

    model = lora(nf4_llama())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    facts = dict(header_facts(train_step(model, opt)))
    assert (
        facts["weights at the peak"] == "14.0 KiB trainable, 165.2 KiB frozen, 16.1 KiB quant state"
    )
    plain = nn.Linear(4, 4)
    with jv.record() as rec:
        plain(torch.ones(1, 4))
    assert "weights at the peak" not in dict(header_facts(rec.profile))
