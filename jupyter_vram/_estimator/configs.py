"""A model described only by its transformers config: built in the estimator, never here.

``jv.estimate(config)`` or ``jv.estimate("path/to/config.json")`` (or a folder holding one):
the kernel reads the config (a small JSON or the config object itself) and sends it; the
estimator process builds the model from it on the meta device. Nothing is downloaded and no
weights are read, and the kernel does not import the model's code, so a first estimate costs
only the estimator's own run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG_FILE = "config.json"


class ConfigError(ValueError):
    """The config cannot be read, or transformers cannot build a model from it."""


def is_config(model: Any) -> bool:
    """Whether ``model`` is a transformers config object or a path to a local config."""
    if isinstance(model, (str, Path)):
        path = Path(model)
        return path.name.endswith(".json") or (path / CONFIG_FILE).is_file()
    return any(
        cls.__name__ in ("PreTrainedConfig", "PretrainedConfig")  # transformers 5 / 4
        and cls.__module__.startswith("transformers")
        for cls in type(model).__mro__
    )


def model_label(model: Any) -> str:
    """What to call ``model`` while it is estimated: its class, or the architecture its
    config names."""
    if not is_config(model):
        return type(model).__name__
    try:
        return ConfigModel.of(model).name
    except ConfigError:
        return str(model)


@dataclass(frozen=True)
class ConfigModel:
    """A picklable factory: the model a transformers config describes.

    ``config``: the config object, or the dict of a ``config.json``; ``source``: where it came
    from, for messages.
    """

    config: Any
    source: str = field(default="the config")
    # build a model that generates: an encoder-decoder config without ``architectures`` gets
    # its sequence-to-sequence head (not the decoder alone as a causal LM, nor no head)
    generates: bool = False

    @classmethod
    def of(cls, model: Any, *, generates: bool = False) -> ConfigModel:
        """The factory for a config object or a path to one (read now, in the kernel)."""
        if not isinstance(model, (str, Path)):
            return cls(model, f"{type(model).__name__} object", generates)
        path = Path(model).expanduser()
        if path.is_dir():
            path = path / CONFIG_FILE
        try:
            data = json.loads(path.read_text())
        except OSError as error:
            raise ConfigError(f"cannot read the config {str(path)!r}: {error.strerror}") from None
        except ValueError as error:
            raise ConfigError(f"{str(path)!r} is not a JSON config: {error}") from None
        if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
            raise ConfigError(
                f"{str(path)!r} has no model_type, so transformers cannot tell which model "
                "it describes"
            )
        if "auto_map" in data:
            raise ConfigError(
                f"{str(path)!r} names its own model code (auto_map), which is not run: "
                "build the model yourself and pass it (on the meta device)"
            )
        return cls(data, repr(str(path)), generates)

    @property
    def name(self) -> str:
        """The architecture the config names, else its model_type."""
        architectures = self._field("architectures") or []
        return str(architectures[0]) if architectures else str(self._field("model_type") or "model")

    def _field(self, key: str) -> Any:
        if isinstance(self.config, dict):
            return self.config.get(key)
        return getattr(self.config, key, None)

    def __call__(self) -> Any:
        """Build the model (the caller chooses the device: the meta device in the estimator)."""
        try:
            return self._build(self._config_object())
        except ConfigError:
            raise
        except Exception as error:  # noqa: BLE001 - transformers' reason, on one line
            raise ConfigError(
                f"transformers cannot build a model from {self.source} "
                f"({type(error).__name__}: {_one_line(str(error))})"
            ) from None

    def _config_object(self) -> Any:
        if not isinstance(self.config, dict):
            return self.config
        from transformers import AutoConfig

        data = dict(self.config)
        return AutoConfig.for_model(data.pop("model_type"), **data)

    def _build(self, config: Any) -> Any:
        """The class ``config.architectures`` names; else a causal LM, else the base model
        (for :attr:`generates`, an encoder-decoder's sequence-to-sequence head first).

        As ``from_config`` builds it (and ``from_pretrained``): in the config's dtype, with
        the attention implementation transformers picks."""
        import transformers

        for name in getattr(config, "architectures", None) or []:
            model_class = getattr(transformers, str(name), None)
            if model_class is not None and hasattr(model_class, "_from_config"):
                return model_class._from_config(config)
        auto_classes = [transformers.AutoModelForCausalLM, transformers.AutoModel]
        if self.generates and getattr(config, "is_encoder_decoder", False):
            auto_classes[:0] = [transformers.AutoModelForSeq2SeqLM,
                                transformers.AutoModelForSpeechSeq2Seq]  # fmt: skip
        for auto_class in auto_classes[:-1]:
            try:
                return auto_class.from_config(config)  # type: ignore[no-untyped-call]
            except ValueError:  # no such head for this kind of model
                continue
        return auto_classes[-1].from_config(config)  # type: ignore[no-untyped-call]


#: the most of transformers' own message kept (its unknown-model message lists every model)
MESSAGE_CHARS = 240


def _one_line(text: str) -> str:
    """``text`` on one line, cut after its first sentence when it is long."""
    line = " ".join(part.strip() for part in text.splitlines() if part.strip())
    if len(line) <= MESSAGE_CHARS:
        return line
    end = line.find(". ", 0, MESSAGE_CHARS)
    return line[: end + 1] if end > 0 else line[:MESSAGE_CHARS] + " ..."
