"""The ranks of a distributed run together: one line on the imbalance, every rank's peak side
by side, a rank selector showing that rank's full profile app (flame graph, timeline, ...),
and the difference between any two ranks at their peaks."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import ipywidgets as w

from .._distributed.summary import imbalance, rank_difference, rank_peaks, ranks_text
from .._model import Profile
from .._units import format_bytes
from .comms import opens_outside_the_cell
from .holder import displayed_in_this_cell
from .profile_app import STYLE, ProfileApp

RANKS_STYLE = """<style>
.jv-rank-peaks{font-size:12px;margin:4px 0;line-height:1.7}
.jv-rank-peak{display:flex;align-items:center;gap:8px}
.jv-rank-name{width:56px;color:var(--jp-ui-font-color2,#666)}
.jv-rank-bar{height:12px;background:#4c78a8;border-radius:2px}
.jv-rank-peak.jv-rank-top .jv-rank-bar{background:#e45756}
.jv-rank-value{white-space:nowrap}
.jv-ranks-summary{font-size:13px;font-weight:600;margin:2px 0}
</style>"""


def peaks_html(profiles: Sequence[Profile]) -> str:
    """One bar per rank, widths proportional to its peak; the highest in red."""
    peaks = rank_peaks(profiles)
    highest = max((p.peak_bytes for p in peaks), default=0) or 1
    rows = []
    for p, profile in zip(peaks, profiles, strict=True):
        top = " jv-rank-top" if p.peak_bytes == highest else ""
        width = max(1.0, 100.0 * p.peak_bytes / highest)
        main = next(iter(p.roles.items()), ("", 0))
        note = f" — most in {html.escape(main[0])} {format_bytes(main[1])}" if main[1] else ""
        error = ' <span class="jv-error">(failed)</span>' if profile.error else ""
        rows.append(
            f'<div class="jv-rank-peak{top}" data-rank="{p.rank}" '
            f'data-peak-bytes="{p.peak_bytes}"><span class="jv-rank-name">rank {p.rank}</span>'
            f'<span style="flex:0 0 240px"><div class="jv-rank-bar" style="width:{width:.1f}%">'
            f'</div></span><span class="jv-rank-value">{format_bytes(p.peak_bytes)}{note}'
            f"{error}</span></div>"
        )
    return f'<div class="jv-rank-peaks">{"".join(rows)}</div>'


def difference_html(profiles: Sequence[Profile], a: int, b: int) -> str:
    """A table of what each of two ranks held at its peak, role by role."""
    ra = profiles[a].meta.get("rank", a)
    rb = profiles[b].meta.get("rank", b)
    rows = "".join(
        f"<tr><td>{html.escape(role)}</td><td class='jv-num'>{format_bytes(x)}</td>"
        f"<td class='jv-num'>{format_bytes(y)}</td><td class='jv-num'>{format_bytes(x - y)}</td>"
        "</tr>"
        for role, x, y in rank_difference(profiles[a], profiles[b])
        if x or y
    )
    pa, pb = profiles[a].peak_bytes, profiles[b].peak_bytes
    return (
        f"<table class='jv-table jv-rank-diff'><caption>At each rank's peak</caption>"
        f"<tr><th>role</th><th>rank {ra}</th><th>rank {rb}</th><th>difference</th></tr>{rows}"
        f"<tr><th>peak</th><th class='jv-num'>{format_bytes(pa)}</th>"
        f"<th class='jv-num'>{format_bytes(pb)}</th><th class='jv-num'>{format_bytes(pa - pb)}"
        "</th></tr></table>"
    )


class RanksApp(w.VBox):  # type: ignore[misc]
    """Every rank of a distributed run (``jv.show(profiles)``, ``%%vram --nproc N``)."""

    @opens_outside_the_cell
    def __init__(self, profiles: Sequence[Profile]) -> None:
        if not profiles:
            raise ValueError("RanksApp needs at least one rank's profile")
        self.profiles = list(profiles)
        self._text = ranks_text(self.profiles)
        labels = [(f"rank {p.meta.get('rank', i)}", i) for i, p in enumerate(self.profiles)]
        self.summary = w.HTML(STYLE + RANKS_STYLE + html.escape(imbalance(rank_peaks(profiles))))
        self.summary.add_class("jv-ranks-summary")
        self.peaks = w.HTML(peaks_html(self.profiles))
        self.peaks.add_class("jv-rank-peaks-box")
        self.selector = w.ToggleButtons(options=labels, value=0, description="Show")
        self.selector.add_class("jv-rank-select")
        self.detail = w.Box()
        self.detail.add_class("jv-rank-detail")
        self._apps: dict[int, ProfileApp] = {}
        other = max(range(len(labels)), key=lambda i: self.profiles[i].peak_bytes)
        low = min(range(len(labels)), key=lambda i: self.profiles[i].peak_bytes)
        self.diff_a = w.Dropdown(options=labels, value=other, description="Compare")
        self.diff_b = w.Dropdown(options=labels, value=low, description="with")
        self.diff_a.add_class("jv-rank-diff-a")
        self.diff_b.add_class("jv-rank-diff-b")
        self.difference = w.HTML()
        self.difference.add_class("jv-rank-diff-box")
        self.selector.observe(self._show_rank, names="value")
        self.diff_a.observe(self._show_difference, names="value")
        self.diff_b.observe(self._show_difference, names="value")
        self._show_rank({"new": 0})
        self._show_difference({})
        super().__init__(
            [
                self.summary,
                self.peaks,
                w.HBox([self.diff_a, self.diff_b]),
                self.difference,
                self.selector,
                self.detail,
            ]
        )
        self.add_class("jv-ranks-app")
        displayed_in_this_cell(self)

    def _show_rank(self, change: dict[str, Any]) -> None:
        index = int(change["new"])
        app = self._apps.get(index)
        if app is None:
            app = self._apps[index] = ProfileApp(self.profiles[index])
        self.detail.children = (app,)

    def _show_difference(self, change: dict[str, Any]) -> None:
        self.difference.value = difference_html(
            self.profiles, int(self.diff_a.value), int(self.diff_b.value)
        )

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget, plus the highest rank's saved profile and static report (as a
        profile app's output carries them): frontends without a kernel show that rank, and
        the lab extension loads BokehJS for the rank apps' figures before the widget draws."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):
            bundle["text/plain"] = self._text
            top = max(self.profiles, key=lambda p: p.peak_bytes)
            from .._render.mime import PROFILE_MIME, profile_payload
            from .._render.static_report import report_html

            try:
                payload = profile_payload(top, None)
                bundle[PROFILE_MIME] = payload
                bundle["text/html"] = report_html(payload, notes=self._text.splitlines())
            except Exception as exc:  # noqa: BLE001 (the widget and the text still show)
                bundle["text/plain"] += f"\n(the static report failed: {exc!r})"
        return bundle

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self._text)
