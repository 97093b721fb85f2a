"""bench/real_cells.py's verdict on a bound: a distribution-free interval of the median ratio.

No kernel runs here: the rounds' ratios are made by hand, and the interval's ends come from
binomial tails worked out by hand below.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # real_cells imports its neighbour readme_section
    try:
        spec = importlib.util.spec_from_file_location("real_cells", BENCH / "real_cells.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while it runs
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


real_cells = _load()


def test_the_interval_of_the_median_is_the_order_statistics_the_binomial_tails_allow() -> None:
    # n = 11: P(X < 2) = (1 + 11) / 2048 = 0.006 <= 0.025, P(X < 3) = (1 + 11 + 55) / 2048 =
    # 0.033 > 0.025: the 2nd and the 10th value
    values = [0.5 + i / 10 for i in range(11)]  # 0.5 .. 1.5
    assert real_cells.median_interval(values[::-1]) == (values[1], values[9])
    # n = 33: the 11th and the 23rd (the textbook table's pair for 95 %)
    values = list(range(100, 133))
    assert real_cells.median_interval(values) == (110, 122)
    # n = 5: P(X < 1) = 1 / 32 = 0.031 > 0.025: no pair of order statistics is enough
    assert real_cells.median_interval([3, 1, 2, 5, 4]) == (1, 5)


def _result(paired: tuple[float, ...]) -> object:
    cell = real_cells.Cell("loop", "", "", "", 1.3)
    return real_cells.Result(cell, 0.1, 0.12, 0, 0, 0.11, 0.15, paired)


def test_the_table_says_where_the_interval_lies() -> None:
    # 33 rounds: the 11th..23rd values decide; shuffled, so the order of rounds does not matter
    under = [1.1] * 23 + [1.4] * 10  # the 23rd is 1.1: within
    across = [1.1] * 16 + [1.4] * 17  # the 11th is 1.1, the 23rd 1.4
    over = [1.1] * 10 + [1.4] * 23  # the 11th is 1.4
    texts = [
        real_cells.table([_result(tuple(v[::-1]))], None).split("\n")[-1]
        for v in (under, across, over)
    ]
    assert "95 % interval of the median 1.10-1.10x (within the bound)" in texts[0]
    assert "1.10-1.40x (across the bound: not resolved on this machine)" in texts[1]
    assert "1.40-1.40x (over the bound)" in texts[2]
    assert "middle half of the rounds" in texts[0]
