"""A model described only by its transformers config: ``jv.estimate(config)``,
``jv.estimate("path/config.json")`` and ``%vram_estimate "path"`` estimate the same step as the
model built here from that config; a config transformers cannot build is refused on one line;
``%load_ext`` in a real kernel starts a spare estimator that ends with the kernel."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

import jupyter_vram as jv
from jupyter_vram._estimator import EstimateError

from .conftest import ipython_shell
from .test_estimate import no_leftover_processes  # noqa: F401 - a fixture

transformers = pytest.importorskip("transformers")

SMALL_LLAMA = dict(
    vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
)  # fmt: skip


def built_here(model_class: Any, config: Any) -> Any:
    """The model as a user builds it from the config (on the meta device: no memory)."""
    with torch.device("meta"):
        return model_class(config)


def test_config_object_path_and_folder_estimate_the_model_built_from_it(
    tmp_path: Path,
    no_leftover_processes: None,  # noqa: F811 - the fixture
) -> None:
    config = transformers.LlamaConfig(**SMALL_LLAMA)
    config.save_pretrained(tmp_path)
    model = built_here(transformers.LlamaForCausalLM, config)
    expected = jv.estimate(model, "2x64")
    from_object = jv.estimate(config, "2x64")
    from_file = jv.estimate(str(tmp_path / "config.json"), "2x64")
    from_folder = jv.estimate(tmp_path, "2x64")
    assert expected.peak_bytes > 0
    for estimate in (from_object, from_file, from_folder):
        assert estimate.peak_bytes == expected.peak_bytes
        assert estimate.peak_breakdown() == expected.peak_breakdown()
    # the parameter count by hand: embedding and lm_head, per layer q/o (64x64), k/v (64x32:
    # two of four heads), gate/up/down (64x128) and two norms, and the final norm
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64
    parameters = 2 * 1000 * 64 + 2 * per_layer + 64
    assert from_file.profile.meta["estimate"]["parameters"] == parameters


def test_the_architecture_a_config_names_is_the_one_built(
    tmp_path: Path,
    no_leftover_processes: None,  # noqa: F811 - the fixture
) -> None:
    # a hand-written GPT-2 config.json naming a classification head: not the causal LM
    data = {"model_type": "gpt2", "architectures": ["GPT2ForSequenceClassification"],
            "vocab_size": 500, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64,
            "num_labels": 3, "pad_token_id": 0}  # fmt: skip
    path = tmp_path / "gpt2.json"
    path.write_text(json.dumps(data))
    config = transformers.GPT2Config(**{k: v for k, v in data.items() if k != "model_type"})
    classifier = built_here(transformers.GPT2ForSequenceClassification, config)
    causal = built_here(transformers.GPT2LMHeadModel, config)
    estimate = jv.estimate(path, "2x32", inference=True)
    assert estimate.profile.meta["estimate"]["model"] == "GPT2ForSequenceClassification"
    assert estimate.peak_bytes == jv.estimate(classifier, "2x32", inference=True).peak_bytes
    assert estimate.peak_bytes != jv.estimate(causal, "2x32", inference=True).peak_bytes


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ({"model_type": "no-such-model"}, "Unrecognized model identifier: no-such-model."),
        (
            {"model_type": "llama", "hidden_size": 65, "num_attention_heads": 4},
            "is not a multiple of the number of attention heads",
        ),
    ],
)
def test_a_config_transformers_cannot_build_is_refused_on_one_line(
    tmp_path: Path,
    content: dict[str, Any],
    reason: str,
    no_leftover_processes: None,  # noqa: F811 - the fixture
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(content))
    with pytest.raises(EstimateError) as caught:
        jv.estimate(path, "2x16")
    message = str(caught.value)
    assert "transformers cannot build a model from" in message
    assert reason in message
    assert "\n" not in message and len(message) < 400  # not transformers' list of every model


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "cannot read the config"),
        ("{not json", "is not a JSON config"),
        ({"hidden_size": 8}, "has no model_type"),
        ({"model_type": "llama", "auto_map": {"AutoModel": "x.Y"}}, "names its own model code"),
    ],
)
def test_a_config_that_cannot_be_read_is_refused_before_any_process(
    tmp_path: Path, content: Any, said: str
) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(EstimateError, match=said):
        jv.estimate(path, "2x16")


def test_magic_takes_a_config_path(tmp_path: Path) -> None:
    config = transformers.LlamaConfig(**SMALL_LLAMA)
    config.save_pretrained(tmp_path)
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_vram")
    shell.user_ns["llama_config"] = config
    try:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            shell.run_line_magic(
                "vram_estimate", f"'{tmp_path / 'config.json'}' --input 2x64 --device cpu --text"
            )
        from_path = shell.user_ns["_vram_estimate"]
        with contextlib.redirect_stdout(out):  # a path without quotes, as typed
            shell.run_line_magic("vram_estimate", f"{tmp_path} --input 2x64 --device cpu --text")
        from_folder = shell.user_ns["_vram_estimate"]
        with contextlib.redirect_stdout(out):
            shell.run_line_magic("vram_estimate", "llama_config --input 2x64 --device cpu --text")
        from_object = shell.user_ns["_vram_estimate"]
    finally:
        for name in ("llama_config", "_vram_estimate"):
            shell.user_ns.pop(name, None)
    model = built_here(transformers.LlamaForCausalLM, config)
    assert from_path.peak_bytes == jv.estimate(model, "2x64", device="cpu").peak_bytes
    assert from_object.peak_bytes == from_folder.peak_bytes == from_path.peak_bytes


@pytest.mark.parametrize(("delay_s", "notices"), [(0.0, 0), (1.6, 1)])
def test_waiting_for_a_starting_process_is_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], delay_s: float, notices: int
) -> None:
    from jupyter_vram._estimator import runner

    from .test_estimate import _SlowStartingWorker

    process = runner.EstimatorProcess(b"job", timeout_s=30)
    worker = _SlowStartingWorker(tmp_path, delay_s=delay_s)
    process._worker = worker  # type: ignore[assignment]
    process._load(worker)  # type: ignore[arg-type]
    assert worker.ready["model"] == "Slow"
    said = capsys.readouterr()
    assert said.err.count("waiting for the estimator process to finish starting") == notices
    assert said.out == ""


def test_a_spare_outlives_sigint_and_deletes_its_folder_on_sigterm(
    no_leftover_processes: None,  # noqa: F811 - the fixture
) -> None:
    import signal

    from jupyter_vram._estimator.runner import _Worker

    worker = _Worker()
    assert worker.spoke.wait(300)  # its imports are done: its signal handlers are set
    assert worker.dir.is_dir()
    worker.process.send_signal(signal.SIGINT)  # what ipykernel forwards on an interrupt
    time.sleep(1.0)
    assert worker.alive()
    worker.process.send_signal(signal.SIGTERM)  # what ipykernel sends at shutdown
    assert worker.process.wait(timeout=30) == 128 + signal.SIGTERM
    assert not worker.dir.exists()  # deleted by the process itself, not by this side


# -- the spare started at %load_ext, in a real kernel -------------------------------------------

jupyter_client = pytest.importorskip("jupyter_client")

FIND_SPARE = """
import os, time
from jupyter_vram._estimator.runner import WARM
deadline = time.monotonic() + 60
while not WARM.pids() and time.monotonic() < deadline:
    time.sleep(0.1)
print(os.getpid(), *WARM.pids(), WARM._spare.dir)
"""

GPT2_BY_PATH = """
import sys, jupyter_vram as jv
est = jv.estimate({path!r}, "2x32")
print(est.peak_bytes, "transformers.models.gpt2.modeling_gpt2" in sys.modules)
"""


def run_cell(client: Any, code: str, timeout: float = 120) -> str:
    """``code``'s printed output (the cell must succeed)."""
    printed: list[str] = []

    def collect(message: dict[str, Any]) -> None:
        if message["msg_type"] == "stream" and message["content"]["name"] == "stdout":
            printed.append(str(message["content"]["text"]))

    reply = client.execute_interactive(code, timeout=timeout, output_hook=collect)
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(printed)


@pytest.mark.slow
def test_load_ext_starts_a_spare_that_ends_with_the_kernel(tmp_path: Path) -> None:
    data = {"model_type": "gpt2", "vocab_size": 500, "n_embd": 32, "n_layer": 2, "n_head": 2,
            "n_positions": 64}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(data))
    manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        run_cell(client, "%load_ext jupyter_vram")
        kernel_pid, spare_pid, folder = run_cell(client, FIND_SPARE).split()
        spare = psutil.Process(int(spare_pid))
        assert spare.ppid() == int(kernel_pid)
        assert "jupyter_vram._estimator.worker" in spare.cmdline()
        peak, kernel_built_it = run_cell(client, GPT2_BY_PATH.format(path=str(tmp_path))).split()
        assert int(peak) > 0
        assert kernel_built_it == "False"  # the model's code ran in the estimator only
    finally:
        client.stop_channels()
        manager.shutdown_kernel()  # as a notebook's "shut down kernel" does
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and _running(spare):
        time.sleep(0.2)
    assert not _running(spare)
    assert not Path(folder).exists()


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# -- generation from a config ---------------------------------------------------------------

GENERATE_BY_PATH = """
import sys, jupyter_vram as jv
est = jv.estimate_generate({path!r}, 16, 8, batch=2, cache="static", device="cpu")
print(est.peak_bytes, "transformers.models.llama.modeling_llama" in sys.modules)
"""


def test_generate_from_a_config_object_path_and_folder_is_the_model_built_from_it(
    tmp_path: Path,
    no_leftover_processes: None,  # noqa: F811 - the fixture
) -> None:
    """``jv.estimate_generate`` takes a config as ``jv.estimate`` does: the same bytes as the
    model built here, and a static cache of 2 (K, V) x 2 layers x 2 KV heads x 16 dims (64
    wide, 4 heads) x 23 positions (16 + 8, less the last token, never fed back) x 2 sequences
    x 4 B; the kernel that asked never imports the model's code."""
    config = transformers.LlamaConfig(**SMALL_LLAMA)
    config.save_pretrained(tmp_path)
    model = built_here(transformers.LlamaForCausalLM, config)
    expected = jv.estimate_generate(model, 16, 8, batch=2, cache="static", device="cpu")
    for given in (config, str(tmp_path / "config.json"), tmp_path):
        estimate = jv.estimate_generate(given, 16, 8, batch=2, cache="static", device="cpu")
        assert estimate.peak_bytes == expected.peak_bytes
        assert estimate.peak_breakdown() == expected.peak_breakdown()
        assert estimate.settings.generate == 8 and estimate.batch_size == 2
    frame = expected.profile.to_dataframe()
    cache = frame[(frame.category == "kv_cache") & (frame.op == "zeros")]
    assert cache.bytes.tolist() == [2 * 16 * 23 * 2 * 4] * 4  # K, V of 2 layers: 2 heads x 16
    assert cache.bytes.sum() == 2 * 2 * 2 * 16 * 23 * 2 * 4
    code = GENERATE_BY_PATH.format(path=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, check=True)  # fmt: skip
    peak, kernel_built_it = done.stdout.split()
    assert int(peak) == expected.peak_bytes
    assert kernel_built_it == "False"  # the model's code ran in the estimator only


def test_generate_from_a_config_that_has_no_generate_is_refused(
    tmp_path: Path,
    no_leftover_processes: None,  # noqa: F811 - the fixture
) -> None:
    """A config of a model without a decoding loop (BERT's masked LM head) is refused with the
    reason, found where the model is built."""
    data = {"model_type": "bert", "architectures": ["BertForSequenceClassification"],
            "vocab_size": 500, "hidden_size": 32, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 64}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(EstimateError, match="no transformers generate"):
        jv.estimate_generate(tmp_path, 8, 4, device="cpu")


def test_magic_generate_takes_a_config_path(tmp_path: Path) -> None:
    config = transformers.LlamaConfig(**SMALL_LLAMA)
    config.save_pretrained(tmp_path)
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_vram")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            shell.run_line_magic(
                "vram_estimate",
                f"{tmp_path / 'config.json'} --generate 8 --input 16 --batch-size 2 "
                "--device cpu --text",
            )
        from_path = shell.user_ns["_vram_estimate"]
    finally:
        shell.user_ns.pop("_vram_estimate", None)
    assert "model.generate() of 8 new tokens after the prompt" in out.getvalue(), out.getvalue()
    model = built_here(transformers.LlamaForCausalLM, config)
    expected = jv.estimate_generate(model, 16, 8, batch=2, device="cpu")
    assert from_path.peak_bytes == expected.peak_bytes
    assert from_path.settings.generate == 8 and from_path.batch_size == 2


def test_generate_from_an_encoder_decoder_config_builds_its_generating_head(
    no_leftover_processes: None,  # noqa: F811 - the fixture
) -> None:
    """A T5 config that names no architecture: jv.estimate_generate builds
    T5ForConditionalGeneration (the base T5Model has no LM head, so no generate())."""
    config = transformers.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                   vocab_size=500, decoder_start_token_id=0)  # fmt: skip
    assert config.architectures is None
    model = built_here(transformers.T5ForConditionalGeneration, config)
    expected = jv.estimate_generate(model, 16, 4, batch=2, device="cpu")
    estimate = jv.estimate_generate(config, 16, 4, batch=2, device="cpu")
    assert estimate.profile.meta["estimate"]["model"] == "T5ForConditionalGeneration"
    assert estimate.peak_bytes == expected.peak_bytes
    assert estimate.peak_breakdown() == expected.peak_breakdown()
