"""The HTML templates (jupyter_vram/_render/templating.py): every value escaped as
``html.escape`` spells it, and the templates' own line breaks gone from what they render."""

from __future__ import annotations

import pandas as pd

from jupyter_vram._render.html import facts_html, sites_html


def test_values_are_escaped_as_html_escape_spells_them() -> None:
    shown = facts_html([("a<b>", 'it\'s "x" & y')])
    assert shown == (
        '<span class="jv-fact"><span class="jv-label">a&lt;b&gt;</span> '
        "<b>it&#x27;s &quot;x&quot; &amp; y</b></span>"
    )


def test_line_breaks_come_from_values_only() -> None:
    """A site's stack is its tooltip, a frame a line: that line break stays; the template's
    (one element a line in the source) do not reach the page."""
    frame = pd.DataFrame(
        [{"site": "train (nb.py:3)", "stack": "main > train", "op": "aten::mm",
          "live_at_peak_bytes": 2048, "allocated_bytes": 4096, "allocations": 2,
          "largest_bytes": 2048, "category": "activation"}]
    )  # fmt: skip
    shown = sites_html(frame, 4096)
    assert "<td class='jv-site' title='main\ntrain'>nb.py:3 train</td>" in shown
    assert shown.count("\n") == 1
    assert "<td class='jv-num'>50.0%</td>" in shown  # 2048 of a 4096 B peak
