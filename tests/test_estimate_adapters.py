"""LoRA / QLoRA as what-ifs on a plain model: ``jv.estimate(model, ..., lora=dict(...),
qlora=True)``, the what-if table's adapter rows and ``%vram_estimate --lora / --qlora``.

Every peak is held against a real model: the same Llama wrapped by peft itself (and for QLoRA
quantised by bitsandbytes itself on the CPU), its training step recorded. Bytes of the
adapters and the 4-bit weights are hand arithmetic from the shapes.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import jupyter_vram as jv
from jupyter_vram._estimator.runner import EstimateError

from .test_estimate_finetune import BATCH, SEQ, measured, within
from .test_finetune_recording import (
    HEAD_DIM,
    HIDDEN,
    KV_HEADS,
    LAYER_LINEARS,
    LAYERS,
    LORA_BYTES,
    OTHER_WEIGHT_BYTES,
    llama,
    lora,
    nf4_llama,
    quant_state_bytes,
)

peft = pytest.importorskip("peft")

Q_AND_V = dict(r=8, target_modules=["q_proj", "v_proj"])  # what tests' lora() adds


def test_lora_what_if_is_the_peft_model_measured() -> None:
    base = llama()
    est = jv.estimate(base, f"{BATCH}x{SEQ}", device="cpu", lora=Q_AND_V)
    at_peak = est.peak_breakdown()
    assert at_peak["parameter"] == LORA_BYTES == 14_336  # the adapters train
    linear_bytes = 4 * LAYERS * sum(i * o for i, o in LAYER_LINEARS)
    assert at_peak["frozen_parameter"] == linear_bytes + OTHER_WEIGHT_BYTES
    assert est.profile.meta["estimate"]["adapters"] == "LoRA r=8 on q_proj, v_proj"
    # the user's model is as it was: no adapters, every weight still trainable
    assert not any(type(m).__module__.startswith("peft") for m in base.modules())
    assert all(p.requires_grad and p.device.type == "cpu" for p in base.parameters())
    truth = measured(lora(llama()))
    assert within(est.peak_bytes, truth.peak_bytes, 0.01), (est.peak_bytes, truth.peak_bytes)


def test_qlora_what_if_is_the_bitsandbytes_model_measured() -> None:
    """NF4 weights at half a byte each, their QuantState (absmax per 64, nested per 256, the
    code tables), the embedding, norms and lm_head left fp32, LoRA on q and v."""
    pytest.importorskip("bitsandbytes")
    est = jv.estimate(llama(), f"{BATCH}x{SEQ}", device="cpu", lora=Q_AND_V, qlora=True)
    at_peak = est.peak_breakdown()
    sizes = [i * o for i, o in LAYER_LINEARS] * LAYERS
    assert at_peak["frozen_parameter"] == sum(n // 2 for n in sizes) + OTHER_WEIGHT_BYTES
    assert at_peak["quant_state"] == sum(quant_state_bytes(n) for n in sizes) == 16_496
    assert at_peak["parameter"] == LORA_BYTES
    assert "QLoRA r=8" in est.profile.meta["estimate"]["adapters"]
    truth = measured(lora(nf4_llama()))  # quantised on the CPU after the what-if: a real map
    assert truth.peak_breakdown()["quant_state"] == at_peak["quant_state"]
    assert within(est.peak_bytes, truth.peak_bytes, 0.01), (est.peak_bytes, truth.peak_bytes)


def test_lora_on_a_t4() -> None:
    """The question as asked: what if I fine-tuned this with LoRA r=16 on a T4? ``gpu=`` is a
    CUDA run with that card's attention kernel (no flash attention before Ampere)."""
    est = jv.estimate(llama(), f"{BATCH}x{SEQ}", lora=dict(r=16), gpu="T4")
    assert est.settings.device == "cuda" and not est.settings.flash_attention
    assert est.profile.meta["estimate"]["adapters"] == "LoRA r=16"
    # r=16 on q and v (peft's default layers for Llama), fp32, in 512 B allocator blocks:
    # A is 16 x 64 (4 KiB), B is 64 x 16 (q, 4 KiB) or 32 x 16 (v, 2 KiB), per layer
    assert est.peak_breakdown()["parameter"] == LAYERS * (4096 + 4096 + 4096 + 2048)
    assert est.fits("T4")


def test_qlora_in_bf16_keeps_the_quant_state_fp32() -> None:
    """``dtype="bf16"`` casts the weights, not a QuantState's tables: bitsandbytes' kernels
    take an fp32 absmax only (cast, the run failed: "absmax must be float32")."""
    pytest.importorskip("bitsandbytes")
    est = jv.estimate(llama(), f"{BATCH}x{SEQ}", device="cpu", dtype="bf16", lora=Q_AND_V,
                      qlora=True)  # fmt: skip
    at_peak = est.peak_breakdown()
    sizes = [i * o for i, o in LAYER_LINEARS] * LAYERS
    assert at_peak["quant_state"] == sum(quant_state_bytes(n) for n in sizes)
    nf4 = sum(n // 2 for n in sizes)
    assert at_peak["frozen_parameter"] == nf4 + OTHER_WEIGHT_BYTES // 2  # the rest in bf16
    assert at_peak["parameter"] == LORA_BYTES // 2


def rank16(model: Any) -> Any:
    """peft's own LoRA r=16 on the layers it targets in a Llama by default (q and v)."""
    return peft.get_peft_model(model, peft.LoraConfig(r=16))


def test_what_if_table_has_lora_and_qlora_rows() -> None:
    """A transformers model peft knows gets "LoRA r=16" rows (peft's default layers for the
    architecture: q_proj and v_proj for Llama), each its own simulated step."""
    pytest.importorskip("bitsandbytes")
    est = jv.estimate(llama(), f"{BATCH}x{SEQ}", device="cpu")
    table = est.what_ifs(gpus=2).set_index("what_if")
    lora_row = table.loc["LoRA r=16 on q_proj, v_proj"]
    qlora_row = table.loc["QLoRA r=16 on q_proj, v_proj (NF4 base, nested)"]
    assert lora_row["kind"] == "simulated" and not lora_row["note"]
    truth = measured(rank16(llama()))
    assert within(lora_row["peak_bytes"], truth.peak_bytes, 0.01)
    # r=16 on q (64 -> 64) and v (64 -> 32): A is 16 x in, B is out x 16, fp32, per layer
    adapters = 4 * LAYERS * 16 * (HIDDEN + HIDDEN + HIDDEN + KV_HEADS * HEAD_DIM)
    assert truth.peak_breakdown()["parameter"] == adapters
    nf4_truth = measured(rank16(nf4_llama()))
    assert within(qlora_row["peak_bytes"], nf4_truth.peak_bytes, 0.01)
    assert qlora_row["peak_bytes"] < lora_row["peak_bytes"] < table.iloc[0]["peak_bytes"]


def test_bad_what_ifs_are_refused_before_any_run() -> None:
    with pytest.raises(EstimateError, match="dict of peft LoraConfig"):
        jv.estimate(llama(), "2x8", lora="r=16")  # type: ignore[arg-type]
    with pytest.raises(EstimateError, match="quant_type must be"):
        jv.estimate(llama(), "2x8", qlora={"quant_type": "int3"})
    with pytest.raises(EstimateError, match="qlora takes"):
        jv.estimate(llama(), "2x8", qlora={"bits": 4})
    with pytest.raises(EstimateError, match="already has peft adapters"):
        jv.estimate(lora(llama()), "2x8", lora=Q_AND_V)
    with pytest.raises(EstimateError, match="peft cannot add"):
        jv.estimate(llama(), "2x8", lora=dict(r=8, target_modules=["no_such_layer"]))
    with pytest.raises(EstimateError, match=r"no nn\.Linear"):
        jv.estimate(torch.nn.Sequential(torch.nn.Embedding(8, 4)), "2x8", qlora=True,
                    lora=dict(target_modules=["0"]))  # fmt: skip


def test_magic_lora_and_qlora(capsys: pytest.CaptureFixture[str]) -> None:
    """``%vram_estimate model --lora r=8,target_modules=q_proj+v_proj --qlora``."""
    pytest.importorskip("bitsandbytes")
    from .conftest import ipython_shell

    shell = ipython_shell()
    assert shell is not None
    shell.run_line_magic("load_ext", "jupyter_vram")
    shell.user_ns["base"] = llama()
    capsys.readouterr()
    line = f"%vram_estimate base --input {BATCH}x{SEQ} --device cpu --text"
    assert shell.run_cell(f"{line} --lora r=8,target_modules=q_proj+v_proj --qlora").success
    out = capsys.readouterr().out
    assert "what if: the model with QLoRA r=8 on q_proj, v_proj (NF4 base, nested)" in out, out
    est = shell.user_ns["_vram_estimate"]
    sizes = [i * o for i, o in LAYER_LINEARS] * LAYERS
    assert est.peak_breakdown()["quant_state"] == sum(quant_state_bytes(n) for n in sizes)
    assert est.peak_breakdown()["parameter"] == LORA_BYTES
    assert shell.run_cell(f"{line} --lora r=8,target_modules=q_proj").success
    out = capsys.readouterr().out
    assert "LoRA r=8 on q_proj (peft" in out
    # q only: A is 8 x 64, B is 64 x 8, fp32, in each of the 2 layers
    assert shell.user_ns["_vram_estimate"].peak_breakdown()["parameter"] == 4 * 2 * 2 * 8 * 64
    assert shell.run_cell(f"{line} --lora r").success
    assert "expected key=value pairs" in capsys.readouterr().out
    assert shell.run_cell(f"{line} --qlora --generate 4").success
    assert "not of --generate" in capsys.readouterr().out
