"""The ranks of a distributed run together: one line on the imbalance, every rank's peak side
by side, a rank selector showing that rank's full profile app (flame graph, timeline, ...),
and the difference between any two ranks at their peaks."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ipywidgets as w

from .._distributed.summary import imbalance, rank_difference, rank_peaks, ranks_text
from .._model import Profile
from .._render.templating import render
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
TEMPLATE = "ranks_view.html.j2"


@dataclass(frozen=True)
class RankBar:
    """One rank's line: its peak, the bar's width (% of the highest), the role holding most."""

    rank: int
    peak_bytes: int
    width: float
    top: bool
    main_role: str
    main_bytes: int
    failed: bool


def peaks_html(profiles: Sequence[Profile]) -> str:
    """One bar per rank, widths proportional to its peak; the highest in red."""
    peaks = rank_peaks(profiles)
    highest = max((p.peak_bytes for p in peaks), default=0) or 1
    rows = []
    for p, profile in zip(peaks, profiles, strict=True):
        role, held = next(iter(p.roles.items()), ("", 0))
        width = max(1.0, 100.0 * p.peak_bytes / highest)
        top = p.peak_bytes == highest
        rows.append(RankBar(p.rank, p.peak_bytes, width, top, role, held, bool(profile.error)))
    return render(TEMPLATE, "peaks", rows=rows)


def difference_html(profiles: Sequence[Profile], a: int, b: int) -> str:
    """A table of what each of two ranks held at its peak, role by role."""
    return render(
        TEMPLATE,
        "difference",
        rank_a=profiles[a].meta.get("rank", a),
        rank_b=profiles[b].meta.get("rank", b),
        rows=[r for r in rank_difference(profiles[a], profiles[b]) if r[1] or r[2]],
        peak_a=profiles[a].peak_bytes,
        peak_b=profiles[b].peak_bytes,
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
