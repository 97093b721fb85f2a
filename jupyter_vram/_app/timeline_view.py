"""Timeline panel: categories over the run, the peak marked; a click anywhere on the chart picks
that moment and shows what was live then."""

from __future__ import annotations

import bisect
from typing import Any, Literal

import ipywidgets as w
from bokeh.events import RangesUpdate
from bokeh.models import ColumnDataSource
from bokeh.models.annotations import Label, Span
from jupyter_bokeh import BokehModel

from .._analysis.allocator import has_segments, reserved_at
from .._analysis.groups import group
from .._model import Profile
from .._render.figures import byte_unit, timeline_data, timeline_figure
from .._render.html import breakdown_table, groups_table, legend_html
from .._render.templating import render
from .._render.text import format_moment
from .._render.theme import apply_theme
from .flame_view import on_click
from .holder import GONE, ProfileHandle, handle_of

AXES: dict[str, Literal["time", "event"]] = {"wall time": "time", "allocation events": "event"}


class TimelineView(w.VBox):  # type: ignore[misc]
    def __init__(self, profile: Profile | ProfileHandle) -> None:
        self._handle = handle_of(profile)
        prof = self._handle.get()
        assert prof is not None
        t = prof.timeline
        self.peak_bytes = t.peak_bytes
        self.axis = w.ToggleButtons(
            options=list(AXES),
            description="x axis",
            style={"button_width": "auto"},
            tooltip="wall time, or one step per allocation / free (short bursts get room)",
        )
        self.axis.add_class("jv-timeline-axis")
        self._reserved = has_segments(prof)
        self.source = ColumnDataSource(self._data(prof, "time"))
        self.figure = timeline_figure(
            self.source,
            self._peak_at(prof, "time"),
            peak_bytes=t.peak_bytes,
            reserved=self._reserved,
        )
        apply_theme(self.figure)
        on_click(self.figure, self._on_click)  # before the figure joins a document
        self.figure.on_event(RangesUpdate, self._on_range)
        self.plot = BokehModel(self.figure, combine_events=True)
        self.plot.add_class("jv-timeline")
        self.moment = w.HTML()
        self.moment.add_class("jv-moment")
        legend = w.HTML(legend_html())
        legend.add_class("jv-legend-box")
        self.axis.observe(self._on_axis, "value")
        super().__init__([self.axis, self.plot, legend, self.moment])
        self.add_class("jv-timeline-view")
        self.show_moment(t.peak_index, "the peak")

    def _data(
        self,
        profile: Profile,
        axis: Literal["time", "event"],
        start: float | None = None,
        end: float | None = None,
    ) -> dict[str, Any]:
        data = timeline_data(profile.timeline, axis=axis, start=start, end=end)
        if self._reserved:
            t = profile.timeline
            _, per = byte_unit(t.peak_bytes)
            data["reserved"] = (
                reserved_at(profile, [t.seq_at(i) for i in data["index"]]) / per
            ).tolist()
        return data

    @staticmethod
    def _peak_at(profile: Profile, axis: Literal["time", "event"]) -> tuple[float, int] | None:
        t = profile.timeline
        x = t.peak_x(axis)
        return (x, t.peak_bytes) if x is not None else None

    def _on_axis(self, change: Any) -> None:
        profile = self._handle.get()
        if profile is None:
            self.moment.value = f"<span class='jv-gone'>{GONE}</span>"
            return
        axis = AXES[change["new"]]
        data = self._data(profile, axis)
        end = float(data["x_end"][-1]) or 1.0
        xr = self.figure.x_range
        xr.update(bounds=(0, end), start=0, end=end, reset_start=0, reset_end=end)
        self.source.data = data
        peak = self._peak_at(profile, axis)
        for span in self.figure.select({"type": Span}):
            span.location = peak[0] if peak else None
        for label in self.figure.select({"type": Label}):
            label.x = peak[0] if peak else 0
        self.figure.xaxis.axis_label = (
            "time since the cell started (ms)" if axis == "time" else "allocation / free event #"
        )

    def _on_range(self, event: Any) -> None:
        """Zoomed or panned: draw each pixel's highest moment within the new range."""
        profile = self._handle.get()
        if profile is None or event.x0 is None or event.x1 is None:
            return
        axis = AXES[self.axis.value]
        self.source.data = self._data(profile, axis, float(event.x0), float(event.x1))

    def step_at(self, x: float) -> int:
        """The drawn step at ``x``: the last one starting at or before it."""
        xs = self.source.data["x"]
        return max(0, bisect.bisect_right(xs, x) - 1)

    def _on_click(self, x: float, y: float) -> None:
        """A click anywhere on the chart picks the moment drawn at that x."""
        self.pick(self.step_at(x))

    def pick(self, row: int) -> None:
        self.show_moment(int(self.source.data["index"][row]), "the selected moment")

    def show_moment(self, index: int, label: str) -> None:
        """What was live right after event ``index``: by category and by module."""
        profile = self._handle.get()
        if profile is None:
            self.moment.value = f"<span class='jv-gone'>{GONE}</span>"
            return
        t = profile.timeline
        mask = t.live_mask(index)
        total = t.total_at(index)
        # a fake run's time says nothing about a GPU's
        time_ns = int(t.time_ns[index]) if index >= 0 else 0
        when = format_moment(time_ns, index, timed=profile.source != "estimate")
        modules = groups_table(
            group(profile, mask, "module"),
            total,
            title="by module",
            note="self bytes: made in the module itself, not in its submodules",
        )
        sites = groups_table(group(profile, mask, "site"), total, title="by allocation site")
        self.moment.value = render(
            "timeline_view.html.j2",
            "moment",
            label=label,
            when=when,
            total=total,
            tables=[breakdown_table(t.breakdown_at(index)), modules, sites],
        )
