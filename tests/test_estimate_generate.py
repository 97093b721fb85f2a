"""``jv.estimate_generate``: ``model.generate()`` with a KV cache, estimated on fake tensors.

The truth is independent of the estimator: the same ``generate()`` call (greedy, exactly the
asked number of new tokens, after a warm-up call) runs on the real model in a fresh interpreter
and is measured by the CPU allocator's own events under torch.profiler
(``bench/estimate_vs_measured.py --measure``). The cache's bytes are hand arithmetic:
2 (K and V) x layers x kv_heads x head_dim x tokens x batch x 4 B.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import jupyter_vram as jv
from jupyter_vram._estimator import EstimateError
from jupyter_vram._estimator.generation import generate_step
from jupyter_vram._model import CATEGORIES

from .test_estimate_models import bench, measured_and_estimated

transformers = pytest.importorskip("transformers")

LAYERS, KV_HEADS, HEAD_DIM = 4, 2, 64  # bench's llama_long: 256 wide, 4 heads, 2 for K / V
PROMPT, NEW = 128, 64


def kv_bytes(tokens: int, batch: int) -> int:
    return 2 * LAYERS * KV_HEADS * HEAD_DIM * tokens * batch * 4


def _most(profile: jv.Profile, category: str) -> int:
    return int(profile.timeline.by_category()[:, CATEGORIES.index(category)].max())


def _within(measured: dict[str, Any], estimate: Any, share: float = 0.01) -> None:
    truth = int(measured["peak_bytes"])
    error = (estimate.peak_bytes - truth) / truth
    assert abs(error) <= share, (error, measured["breakdown"], estimate.peak_breakdown())


@pytest.mark.slow
@pytest.mark.parametrize("batch", [1, 4])
def test_generate_with_a_dynamic_cache(batch: int) -> None:
    """The cache grows by ``cat``: at the last step it holds prompt + new - 1 positions (the
    last token's keys are never computed), and while one layer's tensor is replaced the old
    one (a position shorter) is still alive."""
    measured, estimate = measured_and_estimated(f"llama-generate-b{batch}")
    _within(measured, estimate)
    final = PROMPT + NEW - 1
    one_tensor = kv_bytes(final - 1, batch) // (2 * LAYERS)
    assert _most(estimate.profile, "kv_cache") == kv_bytes(final, batch) + one_tensor
    assert estimate.peak_breakdown()["parameter"] == 4 * measured["parameters"]
    assert estimate.settings.generate == NEW and estimate.batch_size == batch


@pytest.mark.slow
def test_generate_with_a_static_cache() -> None:
    """A static cache is allocated whole before the first token (max_length - 1 positions),
    plus one int64 length counter per layer."""
    measured, estimate = measured_and_estimated("llama-generate-static")
    _within(measured, estimate)
    cache = kv_bytes(PROMPT + NEW - 1, 4) + LAYERS * 8
    assert _most(estimate.profile, "kv_cache") == cache
    assert estimate.peak_breakdown()["kv_cache"] == cache


@pytest.mark.slow
def test_encoder_decoder_generation_is_estimated() -> None:
    """T5: the encoder runs once, the decoder keeps a self-attention and a cross-attention
    cache."""
    measured, estimate = measured_and_estimated("t5-generate")
    _within(measured, estimate)


def test_refusals_name_the_reason() -> None:
    model = bench.build(bench.CASES["llama-generate-b1"], "meta")
    with pytest.raises(EstimateError, match="a quantised cache is cache='quantized'"):
        jv.estimate_generate(model, 16, 4, cache="quantised", device="cpu")
    for config, reason in [
        ({"backend": "hqq"}, "only the quanto backend"),
        ({"backend": "fp8"}, "only the quanto backend"),
        ({"nbits": 3}, "nbits=3: quanto takes 2 or 4"),
        ({"axis_key": 1}, "axis_key=1: quanto takes 0 or -1"),
        ({"residual_length": 0}, "residual_length=0 must be positive"),
        ({"q_group_size": "64"}, "must be a whole number"),
        ({"group_size": 64}, "unknown option"),
    ]:
        with pytest.raises(EstimateError, match=reason):
            jv.estimate_generate(model, 16, 4, cache="quantized", cache_config=config,
                                 device="cpu")  # fmt: skip
    with pytest.raises(EstimateError, match="cache_config is for cache='quantized'"):
        jv.estimate_generate(model, 16, 4, cache_config={"nbits": 4}, device="cpu")
    with pytest.raises(EstimateError, match="not simulated"):
        jv.estimate_generate(model, 16, 4, cache="offloaded", device="cpu")
    with pytest.raises(EstimateError, match="no transformers generate"):
        jv.estimate_generate(torch.nn.Linear(4, 4), 16, 4, device="cpu")
    with pytest.raises(EstimateError, match="positive"):
        jv.estimate_generate(model, 16, 0, device="cpu")


@pytest.mark.slow
def test_a_generate_that_reads_values_to_loop_is_refused() -> None:
    """Whisper's generate() loops over audio segments while a value says some remain: the
    estimate cannot know, and says so instead of reporting a run that decoded nothing."""
    model = bench.build(bench.CASES["whisper"], "meta")
    with pytest.raises(EstimateError, match="did not decode token by token"):
        jv.estimate_generate(model, "input_features=1x80x400", 4, device="cpu")


@pytest.mark.slow
def test_whisper_from_its_config_is_refused_with_the_read_it_cannot_make() -> None:
    """The same refusal for a Whisper config (the model built in the estimator process: with
    no architecture named, the speech sequence-to-sequence model, not the decoder alone),
    naming the value its loop reads."""
    config = bench.build(bench.CASES["whisper"], "meta").config
    assert config.architectures is None
    with pytest.raises(EstimateError, match=r"seek < max_frames\)\.any\(\)"):
        jv.estimate_generate(config, "input_features=1x80x400", 4, device="cpu")


def test_magic_generate(capsys: pytest.CaptureFixture[str]) -> None:
    """``%vram_estimate model --generate N``: ``--input`` is the prompt (a bare number is its
    length), ``--batch-size`` the sequences at once; the estimate is bound as usual."""
    from .conftest import ipython_shell

    shell = ipython_shell()
    assert shell is not None
    shell.run_line_magic("load_ext", "jupyter_vram")
    shell.run_cell(
        "import transformers, torch\n"
        "cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,"
        " num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,"
        " max_position_embeddings=128)\n"
        "with torch.device('meta'):\n    tiny = transformers.LlamaForCausalLM(cfg)"
    )
    capsys.readouterr()
    line = "%vram_estimate tiny --generate 8 --input 16 --batch-size 2 --device cpu --text"
    assert shell.run_cell(line).success
    out = capsys.readouterr().out
    assert "model.generate() of 8 new tokens after the prompt" in out, out
    assert "dynamic KV cache" in out
    modelled = next(t for t in out.splitlines() if t.startswith("modelled:"))
    assert modelled.startswith("modelled: every tensor of generate(): the prompt's forward and")
    assert "optimizer" not in modelled  # a generation has no training step to describe
    est = shell.user_ns["_vram_estimate"]
    assert est.settings.generate == 8 and est.batch_size == 2
    # 2 layers x 2 KV heads x 16 dims x (16 + 8 - 1) positions x 2 sequences x K, V x 4 B
    assert _most(est.profile, "kv_cache") >= 2 * 2 * 16 * 23 * 2 * 2 * 4
    # what-ifs of a generation: the same call with bf16 weights, autocast, the other cache
    assert shell.run_cell(f"{line} --what-if").success
    out = capsys.readouterr().out
    assert "static KV cache" in out and "bf16 weights" in out and "checkpointing" not in out


def test_prompt_forms() -> None:
    """A length, 1-D ids (one prompt, ``batch`` copies), 2-D ids and named shapes all become
    token-id batches of the right shape (no run needed)."""
    from jupyter_vram._estimator.entry import _prompt_spec

    model = bench.build(bench.CASES["llama-generate-b1"], "meta")
    vocab = model.config.vocab_size

    def ids(spec: Any) -> tuple[tuple[int, ...], torch.dtype | None, int]:
        t = spec.kwargs.get("input_ids") or spec.args[0]
        return t.shape, t.dtype, t.high

    assert ids(_prompt_spec(model, 512, 4)) == ((4, 512), torch.int64, vocab)
    assert ids(_prompt_spec(model, 512, None))[0] == (1, 512)
    assert ids(_prompt_spec(model, torch.tensor([1, 2, 3]), 2))[0] == (2, 3)
    assert ids(_prompt_spec(model, torch.ones(3, 7, dtype=torch.long), None))[0] == (3, 7)
    assert ids(_prompt_spec(model, "input_ids=2x64", None)) == ((2, 64), torch.int64, vocab)
    with pytest.raises(EstimateError, match="positive length"):
        _prompt_spec(model, 0, None)


def test_sliding_window_cache_keeps_the_window() -> None:
    """A Mistral-style ``sliding_window``: transformers' dynamic cache keeps the last window - 1
    positions as a view of each step's ``cat`` (window positions of storage). The prefill's
    cat holds the whole prompt until the first decoding step replaces it, layer by layer."""
    torch.manual_seed(0)
    window, prompt, new, batch, layers, kv_heads, head_dim = 16, 64, 32, 2, 2, 2, 16
    cfg = transformers.MistralConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=512,
        sliding_window=window,
    )  # fmt: skip
    model = transformers.MistralForCausalLM(cfg).eval()
    est = jv.estimate_generate(model, prompt=prompt, new_tokens=new, batch=batch, device="cpu")
    per_position = kv_heads * head_dim * batch * 4  # one K (or V) tensor, fp32
    prefill = layers * 2 * prompt * per_position  # every layer's K and V of the whole prompt
    first_step = 2 * window * per_position  # layer 0's new K and V, before the old ones go
    window_scalars = layers * 8  # each sliding layer's window size, an int64 tensor
    assert _most(est.profile, "kv_cache") == prefill + first_step + window_scalars == 73_744
    ids = torch.randint(0, 256, (batch, prompt))
    generate_step(model, (), {"input_ids": ids}, new, "dynamic")  # its first-call state
    with jv.record() as rec:
        generate_step(model, (), {"input_ids": ids}, new, "dynamic")
    assert _most(rec.profile, "kv_cache") == _most(est.profile, "kv_cache")
    error = (est.peak_bytes - rec.profile.peak_bytes) / rec.profile.peak_bytes
    assert abs(error) <= 0.01, error


def _tiny_llama() -> Any:
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
    )  # fmt: skip
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config)


def test_longest_context_that_fits() -> None:
    """``Estimate.max_context(gpu)``: the longest prompt + new tokens whose generate() fits.
    A card whose memory is the peak of a 40-token prompt (an estimate of its own) plus 511 B
    takes 40 + 4 tokens: one more prompt token caches 512 B more (K and V, 2 layers x 2 KV
    heads x 16 dims x 4 B); a card 1 B short of that peak takes fewer; a huge one takes the
    model's 128 positions; one below a 1-token prompt's peak takes none."""
    from jupyter_vram._estimator.gpus import Gpu

    model = _tiny_llama()
    estimate = jv.estimate_generate(model, 16, 4, device="cpu")
    assert estimate.prompt_length == 16
    at_40 = jv.estimate_generate(model, 40, 4, device="cpu").peak_bytes
    at_41 = jv.estimate_generate(model, 41, 4, device="cpu").peak_bytes
    assert at_41 - at_40 >= 2 * 2 * 2 * 16 * 4
    assert estimate.max_context(Gpu("fits 40", at_40 + 511)) == 44
    assert estimate.max_context(Gpu("short of 40", at_40 - 1)) < 44
    assert estimate.max_context(Gpu("huge", 1 << 40)) == 128
    at_1 = jv.estimate_generate(model, 1, 4, device="cpu").peak_bytes
    assert estimate.max_context(Gpu("tiny", at_1 - 1)) == 0
    # the search's own runs: settings of the asked prompt lengths, the estimate unchanged
    assert estimate.settings.prompt_length == 0 and estimate.prompt_length == 16


def test_gpu_table_has_the_longest_context() -> None:
    """``gpu_table()`` of a generation adds each card's longest context (``max_context``, the
    same searches: a card of a 40-token prompt's peak + 511 B takes 40 + 4 tokens, as in
    test_longest_context_that_fits; a huge one the model's 128 positions), in the text and
    HTML tables too; without the search there is no such column."""
    from jupyter_vram._app.estimate_view import gpu_table_html
    from jupyter_vram._estimator.gpus import Gpu
    from jupyter_vram._render.estimate_text import gpu_table_text

    model = _tiny_llama()
    estimate = jv.estimate_generate(model, 16, 4, device="cpu")
    at_40 = jv.estimate_generate(model, 40, 4, device="cpu").peak_bytes
    cards = [Gpu("fits 40", at_40 + 511), Gpu("huge", 1 << 40)]
    table = estimate.gpu_table(cards)
    assert table["max_context"].tolist() == [44, 128]
    assert "max_context" not in estimate.gpu_table(cards, search=False).columns
    text = gpu_table_text(table).splitlines()
    assert text[0].endswith("longest context") and text[1].endswith("  44 tokens"), text
    html = gpu_table_html(table, cards, estimate.batch_size)
    assert "longest context</th>" in html and ">128 tokens</td>" in html, html


@contextlib.contextmanager
def _shell_holding_tiny_llama() -> Iterator[Any]:
    """The test IPython shell with jupyter_vram loaded and ``tiny_llama`` in its namespace
    (removed after)."""
    from .conftest import ipython_shell

    shell = ipython_shell()
    assert shell is not None
    shell.run_line_magic("load_ext", "jupyter_vram")
    shell.user_ns["tiny_llama"] = _tiny_llama()
    try:
        yield shell
    finally:
        shell.user_ns.pop("tiny_llama", None)


def test_longest_context_in_the_magic(capsys: pytest.CaptureFixture[str]) -> None:
    """``%vram_estimate model --generate N --gpu T4``: the answer names the longest context
    too (a tiny model on a T4: the model's 128 positions)."""
    with _shell_holding_tiny_llama() as shell:
        capsys.readouterr()
        line = "%vram_estimate tiny_llama --generate 4 --input 16 --gpu T4 --text"
        assert shell.run_cell(line).success
        estimate = shell.user_ns["_vram_estimate"]
    out = capsys.readouterr().out
    said = "128 tokens (124 prompt + 4 new) = the model's position limit"
    assert f"T4: longest context that fits at batch 1: {said}" in out, out
    # the app's first line (the same searches, already made)
    from jupyter_vram._app.estimate_view import gpu_answer

    assert gpu_answer(estimate, "T4").endswith(f"longest context that fits: {said}")


# -- multi-head latent attention (DeepSeek-V2 / V3) -----------------------------------------


def test_latent_attention_caches_the_latent() -> None:
    """DeepSeek-V3's attention (transformers 5) caches, per layer and position, the compressed
    key / value latent (kv_lora_rank = 64) as its "keys" and the shared rotary key
    (qk_rope_head_dim = 16) as its "values", not per-head keys and values (4 heads x (32 + 16)
    and 4 x 32). Bench's model: 3 layers; 10 + 5 - 1 = 14 positions, 2 sequences, 4 B."""
    model = bench.build(bench.CASES["deepseek-generate"], "meta")
    static = jv.estimate_generate(model, 10, 5, batch=2, cache="static", device="cpu")
    frame = static.profile.to_dataframe()
    made = frame[(frame.category == "kv_cache") & (frame.op == "zeros")].bytes.tolist()
    assert sorted(made) == [2 * 14 * 16 * 4] * 3 + [2 * 14 * 64 * 4] * 3
    dynamic = jv.estimate_generate(model, 10, 5, batch=2, device="cpu")
    frame = dynamic.profile.to_dataframe()
    grown = frame[(frame.category == "kv_cache") & (frame.op == "cat")].bytes
    # the largest each layer's cache grows to: 14 positions of the latent and the rotary key
    assert sorted(grown.nlargest(6).tolist()) == [2 * 13 * 64 * 4] * 3 + [2 * 14 * 64 * 4] * 3
    assert grown[grown < 2 * 10 * 64 * 4].max() == 2 * 14 * 16 * 4


@pytest.mark.slow
@pytest.mark.parametrize("name", ["deepseek-generate", "deepseek-dense-generate"])
def test_latent_attention_generate_matches_a_measured_one(name: str) -> None:
    """With routed MoE experts past the first layer, and all dense (first_k_dense_replace)."""
    measured, estimate = measured_and_estimated(name)
    _within(measured, estimate)


# -- value reads: the attention mask of ones ------------------------------------------------


def test_a_mask_of_ones_reads_as_one() -> None:
    """transformers skips building a mask when the 2-D attention mask has no zero
    (``mask.sum() == mask.numel()``, ``mask.all()``): in the fake run a mask of ones, and what
    is cut or joined from it, reads as the real one does; a mask padded with zeros does not."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from jupyter_vram._estimator.generation import ordinary_prompt_reads

    with FakeTensorMode(), ordinary_prompt_reads():
        mask = torch.ones(4, 16, dtype=torch.long)
        grown = torch.cat([mask, mask.new_ones((4, 1))], dim=-1)
        assert bool(grown.sum() == grown.numel())
        assert bool(grown[:, 3:].bool().all())
        padded = torch.nn.functional.pad(grown, (0, 8))
        assert not bool(padded.sum() == padded.numel())
        grown[:, 0] = 0  # written in place: no longer known
        assert not bool(grown.sum() == grown.numel())


@pytest.mark.slow
def test_encoder_decoder_leaves_out_the_mask_the_real_call_leaves_out() -> None:
    """T5's encoder, given a prompt without padding, runs SDPA without a mask in the real call;
    the fake run used to build a 4 x 1 x 128 x 128 bool mask (64 KiB) alive at the peak (the
    encoder's feed-forward): +64 KiB, now within 64 B of the measured peak."""
    measured, estimate = measured_and_estimated("t5-generate")
    assert abs(estimate.peak_bytes - int(measured["peak_bytes"])) <= 64
    frame = estimate.profile.to_dataframe()
    masks = frame[frame.op == "bitwise_and"]  # how transformers combines mask conditions
    assert not (masks.bytes == 4 * 1 * 128 * 128).any(), masks.bytes.tolist()


# -- a quantised cache (optimum-quanto) -----------------------------------------------------


def _quanto(real_run: bool = False) -> Any:
    """optimum.quanto, or a skip saying why; ``real_run``: a real quantised generate() follows,
    whose first dequantisation builds quanto's CPU kernel (a C++ compiler is needed)."""
    import os
    import shutil

    quanto = pytest.importorskip(
        "optimum.quanto", reason="optimum-quanto is not installed: no quantised cache to run"
    )
    if real_run and shutil.which(os.environ.get("CXX", "c++")) is None:
        pytest.skip("quanto builds its CPU unpack kernel on first use: no C++ compiler here")
    return quanto


def test_quantized_cache_without_quanto_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where optimum-quanto is not installed the estimate says so before any run (the fake
    run executes quanto's own quantisation)."""
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if "quanto" in name else found(name)
    )
    model = bench.build(bench.CASES["llama-generate-b1"], "meta")
    with pytest.raises(EstimateError, match="needs optimum-quanto installed"):
        jv.estimate_generate(model, 16, 4, cache="quantized", device="cpu")


def test_quantized_cache_bytes_by_hand() -> None:
    """quanto's 4-bit cache, groups of 16 along axis 0, the newest 8 tokens unquantised: a
    tensor of T tokens (2 sequences x 2 KV heads x T x 16 dims = 64 T values, 4 T groups) is
    stored as 32 T bytes of packed data (two values a byte) plus a float32 scale and shift per
    group (16 T bytes each). The 40-token prompt is quantised at once (T = 40); 8 and 16
    decoding steps later the 8 unquantised tokens are quantised with the rest (T = 48, 56).

    The most the cache holds: at the 16th step, layer 0's new K and V (T = 56: 64 x 56 B
    each) exist before the old ones (T = 48) go, while every layer also holds 7 unquantised
    positions of K and V (7 x 256 B each); then layer 0 drops its residual positions:
    2 x (2 x 64 x 48 + 2 x 7 x 256) + 64 x 56 (new K) + 64 x 56 (new V) - 64 x 48 (old K)
    = 23,552 B, a quarter of a dynamic cache's 2 x 2 x 63 x 256 B = 64,512 B at the end."""
    _quanto()
    estimate = jv.estimate_generate(
        _tiny_llama(), prompt=40, new_tokens=24, batch=2, cache="quantized",
        cache_config={"nbits": 4, "q_group_size": 16, "residual_length": 8}, device="cpu",
    )  # fmt: skip
    frame = estimate.profile.to_dataframe()
    cache = frame[frame.category == "kv_cache"]
    per_tensor = [40] * 4 + [48] * 4 + [56] * 4  # 2 layers x K, V at each quantisation
    assert sorted(cache[cache.op == "zeros"].bytes) == [32 * t for t in per_tensor]  # packed
    assert sorted(cache[cache.op == "div"].bytes) == [16 * t for t in per_tensor]  # scales
    assert sorted(cache[cache.op == "neg"].bytes) == [16 * t for t in per_tensor]  # shifts
    residual = sorted(cache[cache.op == "cat"].bytes)  # 1..7 tokens, 3 runs x 2 layers x K, V
    assert residual == sorted([256 * t for t in range(1, 8)] * 12)
    assert _most(estimate.profile, "kv_cache") == 23_552
    assert "quanto 4-bit, groups of 16, the newest 8 tokens unquantised" in (
        estimate.settings.describe()
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "config",
    [
        {"nbits": 4, "q_group_size": 16, "residual_length": 8},
        {"nbits": 2, "q_group_size": 16, "residual_length": 8, "axis_key": -1, "axis_value": -1},
    ],
)
def test_quantized_generate_matches_a_measured_one(config: dict[str, int]) -> None:
    """A tiny Llama whose KV is wide (8 heads of 64 dims) and feed-forward narrow (16): the
    peak is a re-quantisation of the cache (quanto's ``round`` and ``clamp`` copies and the
    uint8 result of all 80 positions), not the prefill. The real call (the first of the
    process builds quanto's CPU extension) is recorded from the CPU allocator's reports."""
    _quanto(real_run=True)
    from jupyter_vram._estimator.generation import cache_options

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=16, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=8, head_dim=64, vocab_size=256, max_position_embeddings=128,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).eval()
    prompt, new, batch = 64, 24, 2
    estimate = jv.estimate_generate(model, prompt, new, batch=batch, cache="quantized",
                                    cache_config=config, device="cpu")  # fmt: skip
    ids = torch.randint(0, 256, (batch, prompt))
    options = cache_options("quantized", config)
    generate_step(model, (), {"input_ids": ids}, new, "quantized", options)  # warm-up
    with jv.record(namespace={"ids": ids}) as rec:  # the prompt is held, as the estimate's
        generate_step(model, (), {"input_ids": ids}, new, "quantized", options)
    assert _most(estimate.profile, "kv_cache") == _most(rec.profile, "kv_cache")
    frame = rec.profile.to_dataframe()
    at_peak = frame[frame.live_at_peak]
    # 2 sequences x 8 heads x 80 positions x 64 dims, float32: re-quantised keys of layer 0
    assert (at_peak.op == "round").any() and 2 * 8 * 80 * 64 * 4 in set(at_peak.bytes)
    assert abs(estimate.peak_bytes - rec.profile.peak_bytes) <= 64, (
        estimate.peak_bytes, rec.profile.peak_bytes,
    )  # fmt: skip


@pytest.mark.slow
def test_quantized_generate_bench_row() -> None:
    """The bench's row: Llama at batch 4, 4-bit quanto cache re-quantised every 16 tokens."""
    _quanto(real_run=True)
    measured, estimate = measured_and_estimated("llama-generate-quantized")
    _within(measured, estimate)
    assert abs(estimate.peak_bytes - int(measured["peak_bytes"])) <= 64


def test_magic_generate_with_a_quantized_cache(capsys: pytest.CaptureFixture[str]) -> None:
    """``%vram_estimate model --generate N --cache quantized --cache-config ...``."""
    _quanto()
    with _shell_holding_tiny_llama() as shell:
        capsys.readouterr()
        line = (
            "%vram_estimate tiny_llama --generate 24 --input 40 --batch-size 2 --device cpu"
            " --cache quantized --cache-config q_group_size=16,residual_length=8 --text"
        )
        assert shell.run_cell(line).success
        estimate = shell.user_ns["_vram_estimate"]
        assert shell.run_cell(line.replace("residual_length=8", "residual")).success
    out = capsys.readouterr().out
    assert "quantized KV cache (quanto 4-bit, groups of 16, the newest 8 tokens" in out, out
    assert _most(estimate.profile, "kv_cache") == 23_552  # as test_quantized_cache_bytes_by_hand
    assert "--cache-config takes name=value pairs" in out
