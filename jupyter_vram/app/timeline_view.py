"""Timeline panel: categories over the run, the peak marked, click a moment to see what was live."""

from __future__ import annotations

from typing import Any

import ipywidgets as w
from bokeh.models import ColumnDataSource
from jupyter_bokeh import BokehModel

from ..analysis.allocator import has_segments, reserved_at
from ..analysis.groups import group
from ..model import Profile
from ..render.figures import timeline_data, timeline_figure
from ..render.html import breakdown_table, groups_table
from ..render.text import format_bytes


class TimelineView(w.VBox):  # type: ignore[misc]
    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        t = profile.timeline
        data = timeline_data(t)
        self.source = ColumnDataSource(data)
        reserved = None
        if has_segments(profile):
            reserved = ColumnDataSource(
                {
                    "t": data["t"],
                    "reserved": (
                        reserved_at(profile, [t.seq_at(i) for i in data["index"]]) / 2**20
                    ).tolist(),
                }
            )
        peak_ms = float(t.time_ns[t.peak_index] / 1e6) if t.peak_index >= 0 else None
        self.figure = timeline_figure(self.source, peak_ms, reserved=reserved)
        self.plot = BokehModel(self.figure, combine_events=True)
        self.plot.add_class("jv-timeline")
        self.moment = w.HTML()
        self.moment.add_class("jv-moment")
        self.source.selected.on_change("indices", self._on_pick)
        super().__init__([self.plot, self.moment])
        self.add_class("jv-timeline-view")
        self.show_moment(t.peak_index, "the peak")

    def _on_pick(self, attr: str, old: Any, new: list[int]) -> None:
        if new:
            self.show_moment(int(self.source.data["index"][new[0]]), "the selected moment")

    def show_moment(self, index: int, label: str) -> None:
        """What was live right after event ``index``: by category and by module."""
        t = self.profile.timeline
        mask = t.live_mask(index)
        total = t.total_at(index)
        when = f"{t.time_ns[index] / 1e6:.3f} ms" if index >= 0 else "before the run"
        self.moment.value = (
            f"<div class='jv-moment-title'>Live at {label} ({when}): <b>{format_bytes(total)}</b>"
            "</div><div style='display:flex;gap:24px;flex-wrap:wrap'>"
            + breakdown_table(t.breakdown_at(index))
            + groups_table(group(self.profile, mask, "module"), total, title="by module")
            + groups_table(group(self.profile, mask, "site"), total, title="by allocation site")
            + "</div>"
        )
