"""What `%vram_estimate` does once its arguments are parsed (_magics.py stays a thin shell).

Display code (it prints, shows the app, binds ``_vram_estimate``), so it lives with the
magics, above the estimator it calls and the renderers it shows.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._estimator.api import Estimate
from ._estimator.configs import is_config, model_label
from ._estimator.entry import estimate
from ._estimator.gpus import Gpu, find_gpu
from ._estimator.inputs import InputError
from ._estimator.runner import EstimateError
from ._estimator.search import format_batch
from ._estimator.step import StepError
from ._estimator.whatif import check_gpus
from ._units import format_bytes

#: Failures that deserve a one-paragraph message, not a traceback.
EXPECTED_ERRORS = (EstimateError, InputError, StepError)


def resolve(expression: str, namespace: Mapping[str, Any], what: str) -> Any:
    """Evaluate a name or expression from the magic's line in the notebook's namespace."""
    try:
        return eval(expression, dict(namespace))  # the user's own expression, in their namespace
    except Exception as error:  # noqa: BLE001 - reported as a clear message
        raise InputError(f"cannot evaluate {what} {expression!r}: {error}") from None


def resolve_model(expression: str, namespace: Mapping[str, Any]) -> Any:
    """The model: a name or expression, or an unquoted path to a local transformers config
    (``%vram_estimate models/llama/config.json``)."""
    try:
        return resolve(expression, namespace, "the model")
    except InputError:
        if is_config(expression.strip()):
            return expression.strip()
        raise


def unquote(text: str) -> str:
    """The text without one pair of matching quotes around it (IPython's magic argument
    parser keeps the quotes of ``--input "a=4x128,b=4x128"``)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1].strip()
    return text


def resolve_inputs(text: str | None, namespace: Mapping[str, Any]) -> Any:
    """``--input``: a variable of the notebook if one has that name, else a shape spec."""
    if text is None:
        return None
    name = unquote(text)
    if name.isidentifier() and name in namespace:
        return namespace[name]
    return name


def lora_spec(text: str | None, namespace: Mapping[str, Any]) -> dict[str, Any] | None:
    """``--lora``: a notebook variable holding a dict, or ``key=value`` pairs separated by
    commas (a whole number is an int, a decimal a float, ``a+b`` a list of names; the
    target_modules / modules_to_save given are always a list)."""
    if text is None:
        return None
    spec = unquote(text)
    if spec.isidentifier() and spec in namespace:
        value = namespace[spec]
        if not isinstance(value, Mapping):
            raise InputError(f"--lora {spec}: a dict of LoraConfig arguments, not {value!r}")
        return dict(value)
    config: dict[str, Any] = {}
    for pair in filter(None, (p.strip() for p in spec.split(","))):
        key, equals, value = pair.partition("=")
        if not equals or not key.strip().isidentifier():
            raise InputError(f"--lora: expected key=value pairs (r=16,lora_alpha=32), not {pair!r}")
        config[key.strip()] = _lora_value(value.strip())
    for names in ("target_modules", "modules_to_save"):  # lists of names (a string: a regex)
        if isinstance(config.get(names), str):
            config[names] = [config[names]]
    return config


def _lora_value(text: str) -> Any:
    if "+" in text:
        return [name for name in text.split("+") if name]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@dataclass(frozen=True)
class _Answers:
    """What one ``%vram_estimate`` computed, for the text or the app to show."""

    result: Estimate
    gpu: Gpu | None
    largest: int | None  # largest batch on ``gpu``
    context: int | None  # longest context on ``gpu`` (a generation from token ids)
    what_ifs: Any


def run_estimate_magic(args: Namespace, namespace: dict[str, Any]) -> Estimate | None:
    """Run the estimate, show it, and bind it to ``_vram_estimate``; errors become messages."""
    progress = _progress_line()
    try:
        answers = _answer(args, namespace, progress)
    except (*EXPECTED_ERRORS, ValueError) as error:  # ValueError: an unknown GPU name
        progress("")
        print(f"%vram_estimate: {error}")
        return None
    progress("")
    if args.text:
        _print_answers(answers)
    else:
        _show_answers(answers)
    return answers.result


def _answer(
    args: Namespace, namespace: dict[str, Any], progress: Callable[[str], None]
) -> _Answers:
    """The estimate (bound to ``_vram_estimate``) and what the flags ask of it."""
    from ._session import remember_estimate

    check_gpus(args.gpus)  # before the run, not after it
    model = resolve_model(args.model, namespace)
    gpu = find_gpu(unquote(args.gpu)) if args.gpu else None
    progress(f"estimating {model_label(model)} on fake tensors ...")
    result = (
        _generate(args, model, namespace)
        if args.generate is not None
        else estimate(
            model,
            resolve_inputs(args.input, namespace),
            optimizer=unquote(args.optimizer),
            device=unquote(args.device),
            dtype=unquote(args.dtype) if args.dtype else None,
            amp=unquote(args.amp) if args.amp else None,
            checkpoint=args.checkpoint,
            batch_size=args.batch_size,
            inference=args.inference,
            loss_fn=resolve(args.loss, namespace, "the loss") if args.loss else None,
            timeout_s=args.timeout,
            lora=lora_spec(args.lora, namespace),
            qlora=args.qlora,
        )
    )
    namespace["_vram_estimate"] = result
    remember_estimate(result)
    largest = result.max_batch_size(gpu, progress=progress) if gpu is not None else None
    context = (
        result.max_context(gpu, progress=progress)
        if gpu is not None and result.settings.generate and result.prompt_length
        else None
    )
    what_ifs = result.what_ifs(gpus=args.gpus, progress=progress) if args.what_if else None
    return _Answers(result, gpu, largest, context, what_ifs)


def _print_answers(answers: _Answers) -> None:
    """``--text``: the estimate's summary and each answer as a line."""
    from ._estimator.api import estimate_summary
    from ._estimator.generation import cache_words
    from ._render.estimate_text import what_if_text

    result, gpu = answers.result, answers.gpu
    print(estimate_summary(result))
    if result.settings.generate:
        s = result.settings
        print(f"simulated: model.generate() of {s.generate} new tokens after the prompt "
              f"(greedy), {cache_words(s.cache, s.cache_config)} (category kv_cache)")  # fmt: skip
    adapters = result.profile.meta.get("estimate", {}).get("adapters")
    if adapters:
        print(f"what if: the model with {adapters} (peft; the step trains the adapters)")
    if result.paged_state_bytes:
        print(f"paged optimizer state: {format_bytes(result.paged_state_bytes)} in CUDA "
              "managed memory, not in the figures above (paged to the host when the GPU "
              "runs short)")  # fmt: skip
    if answers.what_ifs is not None:
        print(what_if_text(answers.what_ifs))
    if gpu is not None and answers.largest is not None:
        fits = "fits" if result.fits(gpu) else "does NOT fit"
        print(
            f"{gpu.name}: batch {result.batch_size} {fits}; "
            f"largest batch that fits: {format_batch(answers.largest)}"
        )
    if gpu is not None and answers.context is not None:
        from ._app.estimate_view import context_text

        print(f"{gpu.name}: longest context that fits at batch {result.batch_size}: "
              + context_text(result, answers.context))  # fmt: skip


def _show_answers(answers: _Answers) -> None:
    """The app: the answer to ``--gpu`` is its first line (and its row is highlighted)."""
    from IPython.display import display

    from ._app import ProfileApp

    app = ProfileApp(answers.result.profile, estimate=answers.result, gpu=answers.gpu,
                     largest_batch=answers.largest, longest_context=answers.context)  # fmt: skip
    display(app)  # type: ignore[no-untyped-call]
    if answers.what_ifs is not None:
        from ._render.estimate_text import what_if_text

        print(what_if_text(answers.what_ifs))


def _generate(args: Namespace, model: Any, namespace: Mapping[str, Any]) -> Estimate:
    """``--generate N``: ``estimate_generate`` with ``--input`` as the prompt (a bare number is
    its length in tokens, default 128)."""
    from ._estimator.entry import estimate_generate

    if args.lora is not None or args.qlora:
        raise InputError("--lora / --qlora are what-ifs of a training step, not of --generate")
    prompt = resolve_inputs(args.input, namespace)
    if prompt is None:
        prompt = 128
    elif isinstance(prompt, str) and prompt.isdigit():
        prompt = int(prompt)
    return estimate_generate(
        model,
        prompt,
        args.generate,
        batch=args.batch_size,
        cache=unquote(args.cache),
        cache_config=_cache_config(args.cache_config),
        device=unquote(args.device),
        dtype=unquote(args.dtype) if args.dtype else None,
        timeout_s=args.timeout,
    )


def _cache_config(text: str | None) -> dict[str, str | int] | None:
    """``--cache-config nbits=2,residual_length=64`` as transformers' ``cache_config`` (whole
    numbers as numbers; the estimate checks names and values)."""
    if text is None:
        return None
    config: dict[str, str | int] = {}
    for item in unquote(text).split(","):
        name, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not name:
            raise InputError(f"--cache-config takes name=value pairs separated by commas: {item!r}")
        config[name] = int(value) if value.lstrip("-").isdigit() else value
    return config


def _progress_line() -> Callable[[str], None]:
    """One output line that each progress message replaces."""
    from IPython.display import display

    handle = display("", display_id=True)  # type: ignore[no-untyped-call]

    def show(message: str) -> None:
        if handle is not None:
            handle.update({"text/plain": message.strip()}, raw=True)
        elif message.strip():
            print(message)

    return show
