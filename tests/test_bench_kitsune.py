"""The bench's torch-kitsune column: absent without kitsune, its figures and footnotes with it.

``bench/estimate_vs_measured.py`` adds kitsune's predictions beside ours when torch-kitsune is
installed (it is not a dependency). These tests need neither kitsune nor a measurement: rows
are made by hand, their expected cells and medians worked out by hand below.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import torch
from torch import nn

BENCH = Path(__file__).resolve().parents[1] / "bench"
MIB = 2**20


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)
    return module


bench = _load("estimate_vs_measured")
side = _load("kitsune_side")


def _tiny() -> nn.Module:
    return nn.Linear(2, 2)


def _row(name: str, measured_mib: int, estimated_mib: int, kitsune: Any, **settings: Any) -> Any:
    case = bench.Case(name, _tiny, "4x2", **settings)
    return bench.Row(case, 6, "4x2", measured_mib * MIB, estimated_mib * MIB, 0.5, {}, {}, kitsune)


def test_without_kitsune_the_table_has_no_kitsune_column() -> None:
    text = bench.table([_row("a", 100, 100, None), _row("b", 200, 202, None)])
    assert "kitsune" not in text
    header, rule = text.splitlines()[:2]
    assert header.count("|") == 11 and rule.count("|") == 11  # ten columns


def test_kitsune_cells_summary_and_footnote_by_hand() -> None:
    amp = "kitsune has no autocast (AMP) setting"
    rows = [
        # kitsune 150 MiB (15 of them its margin) against 100 measured: +50 %, bare +35 %
        _row("a", 100, 100, side.Prediction(150 * MIB, 15 * MIB)),
        # 180 (20 margin) against 200: -10 %, bare 160: -20 %; ours 202: +1 %
        _row("b", 200, 202, side.Prediction(180 * MIB, 20 * MIB)),
        # no kitsune answer: a footnote; ours 104 against 100 (+4 %) stays out of the comparison
        _row("c", 100, 104, side.Prediction(reason=amp), amp="bf16"),
    ]
    lines = bench.table(rows).splitlines()
    assert lines[0].endswith("| kitsune (MiB) | kitsune vs measured |")
    assert lines[2].endswith("| 150.0 | +50.00 % |")
    assert lines[3].endswith("| 180.0 | -10.00 % |")
    assert lines[4].endswith("| n/a (1) | |")
    summary = next(line for line in lines if line.startswith("torch-kitsune"))
    assert "answered 2 of 3 cases" in summary
    # kitsune |50|, |10|: median 30, max 50; bare |35|, |20|: median 27.5, max 35
    assert "median 30.00 %, max 50.00 % (median 27.50 %, max 35.00 % without" in summary
    # ours over a and b only: |0|, |1|
    assert summary.endswith("jupyter_vram over the same cases median 0.50 %, max 1.00 %.")
    assert lines[-1] == f"({1}) {amp}: c."
    # our own summary still covers every case: |0|, |1|, |4| -> median 1, max 4
    assert any("1.00 %, max 4.00 % over 3 cases" in line for line in lines)


def test_first_input_is_batch_and_per_sample_shape() -> None:
    assert side.first_input("8x128") == (8, (128,))
    assert side.first_input("input_ids=1x128:int64") == (1, (128,))
    assert side.first_input("input_features=4x80x400,labels=4x32") == (4, (80, 400))


def test_settings_kitsune_has_no_parameter_for_are_not_asked() -> None:
    # kitsune=None would raise if asked (then the reason would read "kitsune raised ...")
    amp = bench.Case("amp", _tiny, "4x2", amp="bf16")
    checkpointed = bench.Case("ckpt", _tiny, "4x2", checkpoint=True)
    assert side.predict(amp, None, _tiny()).reason == "kitsune has no autocast (AMP) setting"
    assert "checkpointing" in side.predict(checkpointed, None, _tiny()).reason


def test_a_training_step_is_put_to_predict_memory_in_kitsunes_terms() -> None:
    asked: list[tuple[Any, ...]] = []

    def predict_memory(*args: Any, **kwargs: Any) -> Any:
        asked.append((*args, kwargs))
        return SimpleNamespace(total_bytes=1000, overhead_bytes=130)

    case = bench.Case("sgd", _tiny, "16x3x64x64", optimizer="sgd", dtype="bf16")
    model = _tiny()
    answer = side.predict(case, SimpleNamespace(predict_memory=predict_memory), model)
    assert answer == side.Prediction(1000, 130)
    # the bench's SGD has momentum 0.9: kitsune's "sgd_momentum" (one state per parameter)
    assert asked == [(model, (3, 64, 64), 16, torch.bfloat16, "sgd_momentum", {"training": True})]
