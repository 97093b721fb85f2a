"""`jv.estimate()` and `jv.estimate_generate()`: what the user calls, apart from the
:class:`~.api.Estimate` they return (which answers everything after: fits, the largest batch,
what-ifs, the comparison with a measurement).

Each builds a job (the model, or its transformers config, and its inputs), runs it in an
estimator process (:mod:`.runner`) and wraps the profile the process returns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch import nn

from .._model import Profile
from .adapters import check_adapters, with_adapters
from .api import Estimate, _gpu, _probe
from .configs import ConfigError, ConfigModel, is_config
from .gpus import Gpu
from .inputs import BatchSpec, PendingInputs, make_batch_spec
from .job import Job
from .runner import DEFAULT_TIMEOUT_S, EstimateError, EstimatorProcess, pack_job
from .step import LossFn, OptimizerFactory, StepSettings, check_optimizer


def estimate(
    model: nn.Module | Callable[[], nn.Module] | Any,
    inputs: Any = None,
    optimizer: str | OptimizerFactory = "adamw",
    device: str = "cuda",
    dtype: str | None = None,
    amp: str | None = None,
    checkpoint: bool = False,
    *,
    batch_size: int | None = None,
    inference: bool = False,
    loss_fn: LossFn | None = None,
    stacks: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    torch_version: str | None = None,
    lora: Mapping[str, Any] | None = None,
    qlora: bool | Mapping[str, Any] = False,
    gpu: str | Gpu | None = None,
) -> Estimate:
    """Predict the memory of one training step of ``model`` on ``inputs``.

    ``model`` may live anywhere, the meta device included (only shapes are read), or be a
    function that builds it, or a transformers config (a config object, a local
    ``config.json`` or a folder holding one): the estimator process builds that model on the
    meta device (no weights, no network; see :mod:`.configs`). ``inputs``: a shape
    (``"8x3x224x224"``; ``"8x512"`` is token ids for a language model), named shapes
    (``"input_ids=8x512,attention_mask=8x512"``), example tensors, a dict of them, or
    ``f(batch_size) -> batch``; None reads a transformers config.
    ``optimizer``: a name (adamw, adam, sgd, adafactor, adagrad, rmsprop, adamw8bit, none;
    bitsandbytes' pagedadamw8bit, pagedadamw: see :attr:`Estimate.paged_state_bytes`) or
    ``f(params) -> optimizer``. ``device``: the device predicted, "cuda" (default) or "cpu".
    ``torch_version``: the torch the step will run under, when not this one (``"2.11"``): the
    cuBLAS / cuBLASLt workspaces it keeps differ by version. ``gpu``: a GPU name, which
    implies ``device="cuda"`` with that card's attention kernel (as in
    :func:`estimate_generate`).

    What-ifs on a plain model (``model`` as peft would make it, see :mod:`.adapters`):
    ``lora``: peft ``LoraConfig`` arguments (``dict(r=16, target_modules=["q_proj",
    "v_proj"])``; peft's defaults for what is left out). ``qlora``: True, or a dict of
    ``quant_type`` ("nf4" / "fp4"), ``double_quant`` and ``compute_dtype``: every linear layer
    but the output one a bitsandbytes 4-bit layer (NF4, nested statistics by default) under
    the LoRA adapters.
    """
    from_config = is_config(model)
    model = _checked_model(model, from_config)
    factory = optimizer if callable(optimizer) else None
    name = "custom" if factory is not None else check_optimizer(str(optimizer))
    flash = True
    if gpu is not None:
        device, flash = "cuda", _gpu(gpu).flash_attention
    _check_numerics(device, dtype, amp)
    adapters = check_adapters(lora, qlora)
    spec: BatchSpec | PendingInputs
    if from_config and adapters is None:  # built and fed in the estimator process only
        spec = PendingInputs(inputs, batch_size)
    else:
        probe = _probe(model)
        if adapters is not None:
            model = probe = with_adapters(probe, adapters, dtype)
        spec = make_batch_spec(probe, inputs, batch_size)
    settings = StepSettings(device=device, dtype=dtype, amp=amp, checkpoint=checkpoint,
                            optimizer=name, inference=inference, stacks=stacks,
                            flash_attention=flash, torch_version=torch_version)  # fmt: skip
    payload = pack_job(Job(model, spec, loss_fn, factory))
    with EstimatorProcess(payload, timeout_s=timeout_s) as process:
        profile = process.run(settings, None)
    if adapters is not None:
        profile = _with_what_if(profile, adapters.describe())
    return Estimate(profile, settings, payload, timeout_s=timeout_s)


def _checked_model(model: Any, from_config: bool, *, generates: bool = False) -> Any:
    """The model to estimate (a config read into what the estimator process builds: one that
    generates, with ``generates``), or EstimateError saying why it cannot be."""
    if from_config:
        try:
            model = ConfigModel.of(model, generates=generates)
        except ConfigError as error:
            raise EstimateError(str(error)) from None
    if not isinstance(model, nn.Module) and not callable(model):
        raise EstimateError(
            f"model must be a torch.nn.Module (or a function that builds one, or a "
            f"transformers config), not {type(model).__name__}"
        )
    return model


def _check_numerics(device: str, dtype: str | None, amp: str | None) -> None:
    """A device, dtype and AMP dtype the estimator knows (one clear error each)."""
    if device not in ("cuda", "cpu") and not device.startswith("cuda:"):
        raise EstimateError(f"device must be 'cuda' or 'cpu', not {device!r}")
    if dtype is not None:
        from .inputs import parse_dtype

        if not parse_dtype(dtype).is_floating_point:
            raise EstimateError(f"dtype must be a floating type, not {dtype!r}")
    if amp is not None:
        from .._transforms.amp import amp_dtype

        amp_dtype(amp)


def _with_what_if(profile: Profile, what_if: str) -> Profile:
    """``profile`` saying which adapters the estimated model was given (meta "adapters")."""
    info = {**profile.meta.get("estimate", {}), "adapters": what_if}
    return profile.replace(meta={**profile.meta, "estimate": info})


def estimate_generate(
    model: nn.Module | Callable[[], nn.Module] | Any,
    prompt: Any = 128,
    new_tokens: int = 128,
    batch: int | None = None,
    cache: str = "dynamic",
    device: str = "cuda",
    dtype: str | None = None,
    gpu: str | Gpu | None = None,
    *,
    cache_config: Mapping[str, Any] | None = None,
    stacks: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    torch_version: str | None = None,
) -> Estimate:
    """Predict the memory of ``model.generate()``: greedy decoding of ``new_tokens`` tokens
    after ``prompt``, with a KV cache (the weights, the cache as it grows, each step's
    temporaries; the cache is category ``kv_cache``).

    ``model``: a transformers model with ``generate()`` (anywhere, the meta device included),
    a function that builds one, or a transformers config (a config object, a local
    ``config.json`` or a folder holding one), as :func:`estimate` takes it: the model is built
    on the meta device in the estimator process only. ``prompt``: a length in tokens, token
    ids (a tensor), or named shapes as in :func:`estimate` (``"input_features=1x80x3000"``).
    ``batch``: sequences generated at once (default 1; with a length or 1-D ids).
    ``cache``: "dynamic" (grows by concatenation), "static" (allocated for the whole
    length at once) or "quantized" (optimum-quanto's packed integers, the newest tokens kept
    unquantised); ``cache_config``: a quantised cache's options as transformers takes them
    (backend "quanto", nbits, axis_key, axis_value, q_group_size, residual_length; the HQQ and
    fp8 backends are refused). ``gpu``: a GPU name, which implies ``device="cuda"`` with that
    card's attention kernel.
    """
    from .generation import GenerationError, cache_options, check_generates, check_quantizer

    if not isinstance(new_tokens, int) or new_tokens < 1:
        raise EstimateError(f"new_tokens must be a positive number of tokens, not {new_tokens!r}")
    from_config = is_config(model)
    model = _checked_model(model, from_config, generates=True)
    inputs, batch_size = _prompt_inputs(prompt, batch)
    spec: BatchSpec | PendingInputs
    try:
        options = cache_options(cache, cache_config)
        check_quantizer(options)
        if from_config:  # built, checked and fed in the estimator process only
            spec = PendingInputs(inputs, batch_size)
        else:
            probe = _probe(model)
            check_generates(probe)
            spec = make_batch_spec(probe, inputs, batch_size)
    except GenerationError as error:
        raise EstimateError(str(error)) from None
    flash = True
    if gpu is not None:
        device, flash = "cuda", _gpu(gpu).flash_attention
    if device not in ("cuda", "cpu") and not device.startswith("cuda:"):
        raise EstimateError(f"device must be 'cuda' or 'cpu', not {device!r}")
    settings = StepSettings(device=device, dtype=dtype, optimizer="none", inference=True,
                            stacks=stacks, flash_attention=flash, torch_version=torch_version,
                            generate=new_tokens, cache=cache,
                            cache_config=options)  # fmt: skip
    payload = pack_job(Job(model, spec))
    with EstimatorProcess(payload, timeout_s=timeout_s) as process:
        profile = process.run(settings, None)
    return Estimate(profile, settings, payload, timeout_s=timeout_s)


def _prompt_inputs(prompt: Any, batch: int | None) -> tuple[Any, int | None]:
    """The prompt as :func:`make_batch_spec` reads inputs, and the batch size it sets: a
    length -> ``batch`` rows of token ids; 1-D ids -> ``batch`` copies; 2-D ids as they are;
    anything else as :func:`estimate` reads inputs (``batch`` sets dim 0). Needs no model, so
    a model sent as its config is read in the estimator process."""
    import torch

    if isinstance(prompt, bool) or (isinstance(prompt, int) and prompt < 1):
        raise EstimateError(f"prompt must be a positive length, token ids or shapes: {prompt!r}")
    if isinstance(prompt, int):
        return {"input_ids": (batch or 1, prompt)}, None
    if isinstance(prompt, torch.Tensor) and prompt.dim() == 1:
        return {"input_ids": (batch or 1, int(prompt.shape[0]))}, None
    if isinstance(prompt, torch.Tensor):
        return {"input_ids": prompt}, batch
    return prompt, batch


def _prompt_spec(model: nn.Module, prompt: Any, batch: int | None) -> Any:
    """The prompt as a batch of ``model``'s inputs (:func:`_prompt_inputs`)."""
    return make_batch_spec(model, *_prompt_inputs(prompt, batch))
