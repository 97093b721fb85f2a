"""The profile app: summary header and tabs. Tabs are built when first opened, so displaying
a profile sends only what is on screen."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import ipywidgets as w
import pandas as pd
from ipywidgets.widgets.widget_string import HTMLStyle
from jupyter_bokeh import BokehModel

from .._analysis.allocator import (
    AllocatorState,
    allocator_state,
    capture_words,
    has_segments,
)
from .._analysis.groups import allocated_during_run, live_at_peak
from .._analysis.tables import top_sites
from .._model import Profile
from .._render.figures import breakdown_figure
from .._render.html import (
    SITE_SORTS,
    breakdown_table,
    category_help_html,
    groups_table,
    header_html,
    legend_html,
    sites_html,
)
from .._render.templating import render
from .._render.text import run_word, summary
from .._render.theme import apply_theme
from .._units import format_bytes
from .comms import opens_outside_the_cell
from .export import CsvLink
from .flame_view import FlameView
from .holder import GONE, ProfileHandle, close_tree, displayed_in_this_cell
from .rerun_view import rerun_bar
from .shared import kept
from .timeline_view import AXES, TimelineView

if TYPE_CHECKING:
    from .._estimator.api import Comparison, Estimate
    from .._estimator.gpus import Gpu
    from .compare_view import CompareView

#: The timeline's allocation-event axis (an estimate's default).
EVENT_AXIS = next(name for name, axis in AXES.items() if axis == "event")
TEMPLATE = "profile_app.html.j2"
TABS = ("Flame graph", "Breakdown", "Timeline", "Top sites", "Allocator")
# Colours come from JupyterLab's theme variables (light and dark); the fallbacks are light.
# Bokeh draws its hover tooltips white, in a box it appends to the page's body (outside the
# app, so the rule cannot be scoped to it): in a dark theme they take the theme's colours.
STYLE = """<style>
.jv-app{color:var(--jp-ui-font-color1,#222)}
body[data-jp-theme-light="false"] .bk-Tooltip{--tooltip-color:var(--jp-layout-color1);
--tooltip-text:var(--jp-ui-font-color1);--tooltip-border:var(--jp-border-color1);
--tooltip-arrow-color:var(--jp-border-color1)}
.jv-header{display:flex;flex-wrap:wrap;gap:4px 18px;font-size:13px;padding:4px 0;line-height:1.6}
.jv-label{color:var(--jp-ui-font-color2,#666)}
.jv-error,.jv-gone{color:var(--jp-error-color1,#a00);margin:2px 0}
.jv-warning{color:var(--jp-warn-color1,#8a5a00);font-size:12px;margin:2px 0;line-height:1.4}
.jv-app .jupyter-button:disabled{filter:grayscale(0.8)}
.jv-table{border-collapse:collapse;font-size:12px;margin:4px 0;line-height:1.5;
color:var(--jp-ui-font-color1,#222);background:transparent}
.jv-table td,.jv-table th{padding:1px 8px;border-bottom:1px solid var(--jp-border-color2,#ddd);
vertical-align:top}
.jv-table th{text-align:left;font-weight:600;color:var(--jp-ui-font-color1,#222)}
.jv-table caption{text-align:left;font-weight:bold;color:var(--jp-ui-font-color1,#222)}
.jv-table td.jv-num{text-align:right;white-space:nowrap}
.jv-table td.jv-name .jv-cut{max-width:360px}
.jv-caption-note{font-weight:normal;font-size:11px}
.jv-swatch{display:inline-block;width:10px;height:10px;margin-right:5px;border-radius:2px;
vertical-align:baseline}
.jv-legend{display:flex;flex-wrap:wrap;gap:2px 14px;font-size:12px;margin:2px 0 4px}
.jv-legend-item{cursor:help;white-space:nowrap}
.jv-help{font-size:12px;margin:4px 0}.jv-help summary{cursor:pointer}
.jv-help ul{margin:2px 0;padding-left:20px}
.jv-tables{display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start}
.jv-more-toggle{display:none}
.jv-more-toggle:not(:checked)+table tr.jv-extra{display:none}
.jv-more-toggle:checked+table tr.jv-more-row{display:none}
.jv-more{cursor:pointer;color:var(--jp-content-link-color,#1976d2);text-decoration:underline}
.jv-sites-table{width:100%;max-width:1200px}
.jv-sites-table th{white-space:nowrap}
.jv-sites-table td.jv-site,.jv-sites-table td.jv-op{white-space:normal;overflow-wrap:anywhere;
min-width:90px}
.jv-cut{overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.jv-sites-table td{white-space:nowrap}
.jv-estimate-badge{display:inline-block;margin:2px 0;padding:1px 8px;border-radius:3px;
font-weight:bold;font-size:13px;background:#fff3cd;color:#6b4e00;border:1px solid #e0c36a}
.jv-estimate-note{font-size:12px;line-height:1.6;color:var(--jp-ui-font-color2,#666);margin:2px 0}
.jv-estimate-note summary{cursor:pointer}
.jv-comparison{font-size:13px;line-height:1.6;margin:4px 0;padding:2px 8px;
border-left:4px solid #4C72B0}
.jv-fit-no td{color:var(--jp-error-color1,#a00)}
.jv-gpus tr.jv-chosen td{font-weight:bold;background:var(--jp-layout-color2,#eef3fb)}
.jv-gpu-answer{font-size:15px;font-weight:bold;margin:2px 0 4px;padding:2px 8px;
border-left:4px solid var(--jp-success-color1,#2a7a2a)}
.jv-gpu-answer.jv-gpu-no{border-left-color:var(--jp-error-color1,#a00)}
.jv-up{color:var(--jp-error-color1,#a00)}.jv-down{color:var(--jp-success-color1,#2a7a2a)}
.jv-whatifs td,.jv-whatifs th{white-space:nowrap}
.jv-whatifs td:first-child{white-space:normal;min-width:160px}
.jv-whatifs td.jv-whatif-note{white-space:normal;max-width:480px;
color:var(--jp-warn-color1,#8a5a00);font-style:italic}
.jv-note{font-size:12px;line-height:1.5;max-width:900px}
.jv-csv{font-size:12px;margin:0 10px;color:var(--jp-content-link-color,#1976d2);
text-decoration:underline;line-height:28px}
.jv-allocator{font-size:13px;line-height:1.6;max-width:980px}
.jv-allocator h4{margin:8px 0 2px;font-size:13px}
</style>"""


class ProfileApp(w.VBox):  # type: ignore[misc]
    """Header + tabs for one Profile. Without a widget frontend it shows the text summary.

    An estimate's profile (``source == "estimate"``) gets a header that says so. With
    ``estimate`` (the :class:`Estimate` behind it) a "Fit & what-ifs" tab is added; with
    ``comparison`` (a measured profile against an earlier estimate) the header shows the error.
    With ``gpu`` (``%vram_estimate --gpu``) an estimate's app answers first whether the step
    fits that GPU and its largest batch there (``largest_batch``: the search's result when the
    caller has it, else searched here; for a generation also its longest context,
    ``longest_context``), highlights its row and picks it for the what-ifs.
    An estimate's timeline starts on the allocation-event axis: the fake run's wall time is
    not a prediction of GPU time.

    The app holds its profile weakly (see :mod:`.holder`): what it shows is computed when a
    tab opens and kept; a tab opened after the profile is gone says so.
    """

    @opens_outside_the_cell
    def __init__(
        self,
        profile: Profile,
        *,
        estimate: Estimate | None = None,
        comparison: Comparison | None = None,
        gpu: str | Gpu | None = None,
        largest_batch: int | None = None,
        longest_context: int | None = None,
    ) -> None:
        self._handle = ProfileHandle(profile, *([estimate] if estimate is not None else []))
        self._estimate = weakref.ref(estimate) if estimate is not None else None
        self.comparison = comparison
        self.gpu_answer = ""
        answer = ""
        if estimate is not None and gpu is not None:
            from .estimate_view import gpu_answer, gpu_answer_html

            self.gpu_answer = gpu_answer(estimate, gpu, largest_batch, longest_context)
            answer = gpu_answer_html(self.gpu_answer, estimate.fits(gpu))
        self._text = self._summary_text(profile, estimate)
        handle = self._handle
        self._builders: dict[int, Callable[[Profile], w.Widget]] = {
            0: self._flame_with_picks,
            1: self._breakdown,
            2: self._timeline,
            3: self._sites,
            4: self._allocator,
        }
        titles = list(TABS)
        if estimate is not None:
            from .estimate_view import TITLE, EstimateView

            def estimate_tab(p: Profile) -> w.Widget:
                kept = self.estimate
                if kept is None:
                    return w.HTML(f"<p>{GONE}</p>")
                return EstimateView(kept, gpu=gpu)

            self._builders[len(titles)] = estimate_tab
            titles.append(TITLE)
        self._add_fit(profile, titles, estimate, gpu)
        oom_tab, oom_line = self._add_oom_and_leaks(profile, titles, estimate is None)
        # Each widget is a comm the page opens, and each change after it is made one more
        # message: widgets are made with their final state (classes, titles, first tab), and
        # the header's and tabs' style and layout are the kernel's shared ones.
        plain = kept(w.Layout)
        self.header = w.HTML(
            STYLE + answer + self._header_html(profile) + oom_line,
            style=kept(HTMLStyle),
            layout=plain,
            _dom_classes=("jv-header-box",),
        )
        # reruns: a toggle row above the tabs; each rerun adds a column to a Compare tab
        self.compare_view: CompareView | None = None
        self.reruns = None if estimate is not None else rerun_bar(handle, self._on_rerun)
        self.tabs = self._tabs(profile, titles, 0 if oom_tab is None else oom_tab, plain)
        self.tabs.observe(self._on_tab, "selected_index")
        bar = [self.reruns] if self.reruns is not None else []
        # the app's own layout: one a user may change
        super().__init__([self.header, *bar, self.tabs], _dom_classes=("jv-app",))
        displayed_in_this_cell(self)

    def _tabs(self, profile: Profile, titles: list[str], first: int, layout: w.Layout) -> w.Tab:
        """The tabs, ``first`` built and selected; the others show one shared placeholder
        until they are opened."""
        children = [_placeholder()] * (len(titles) - 1) if len(titles) > 1 else []
        children.insert(first, self._builders.pop(first)(profile))
        return w.Tab(
            children=children,
            titles=titles,
            selected_index=first,
            layout=layout,
            _dom_classes=("jv-tabs",),
        )

    def _add_fit(
        self, profile: Profile, titles: list[str], estimate: Estimate | None, gpu: Any
    ) -> None:
        """The Make-it-fit tab, for a measured run and for an estimate (planned at once for
        a GPU it does not fit)."""
        if profile.source == "estimate" and estimate is None:
            return
        from .fit_view import TITLE, fit_tab

        budget = ""
        if estimate is not None and gpu is not None and not estimate.fits(gpu):
            budget = gpu if isinstance(gpu, str) else gpu.name
        handle = self._handle
        self._builders[len(titles)] = lambda p: fit_tab(handle, self.estimate, budget)
        titles.append(TITLE)

    def _add_oom_and_leaks(
        self, profile: Profile, titles: list[str], leaks: bool
    ) -> tuple[int | None, str]:
        """An OOM post-mortem's tab, and the Leaks tab (built when opened); returns the OOM
        tab's index and its header line."""
        from .._analysis.oom import oom_report
        from .leaks_view import LeaksView
        from .oom_view import TITLE as OOM_TITLE
        from .oom_view import OomView, oom_header_html

        measured = profile.source != "estimate"  # an estimate allocated nothing to leak
        oom = oom_report(profile) if measured else None
        index = None
        line = ""
        if oom is not None:
            line = oom_header_html(oom)
            index = len(titles)
            self._builders[index] = lambda p: OomView(oom)
            titles.append(OOM_TITLE)
        if leaks and measured:
            handle = self._handle
            self._builders[len(titles)] = lambda p: LeaksView(handle)
            titles.append("Leaks")
        return index, line

    @property
    def estimate(self) -> Estimate | None:
        """The estimate behind an estimate's app, while something else still holds it."""
        return self._estimate() if self._estimate is not None else None

    @property
    def profile(self) -> Profile | None:
        """The profile, while something else (``_vram``, the latest app) still holds it."""
        return self._handle.get()

    def open_tab(self, index: int) -> w.Widget:
        """Build the tab's content if needed and select it."""
        children = list(self.tabs.children)
        builder = self._builders.get(index)
        if builder is not None:
            profile = self._handle.get()
            placeholder = children[index]
            if profile is not None:
                del self._builders[index]
                children[index] = builder(profile)
            else:
                children[index] = w.HTML(f"<p class='jv-gone'>{GONE}</p>")
            self.tabs.children = children
            if placeholder not in children:  # the last unopened tab: ipywidgets would keep it
                close_tree(placeholder)
        if self.tabs.selected_index != index:
            self.tabs.selected_index = index
        return self.tabs.children[index]

    def add_variant(self, variant: Profile, baseline: Profile | None = None) -> CompareView:
        """Show ``variant`` (a rerun of the app's profile, or of ``baseline``) next to it in
        the Compare tab, made on the first variant, and select that tab."""
        from .compare_view import TITLE, CompareView

        base = baseline if baseline is not None else self._handle.get()
        if base is None:
            raise ValueError("the app's profile is gone; pass the baseline")
        if self.compare_view is None:
            self.compare_view = CompareView()
            self.tabs.children = [*self.tabs.children, self.compare_view]
            self.tabs.set_title(len(self.tabs.children) - 1, TITLE)
        self.compare_view.add(base, variant)
        self.tabs.selected_index = len(self.tabs.children) - 1
        return self.compare_view

    def _flame_with_picks(self, profile: Profile) -> w.Widget:
        """The flame graph; a block zoomed to in it is offered in the rerun row."""
        from .rerun_view import RerunBar, link_flame

        view = FlameView(self._handle)
        if isinstance(self.reruns, RerunBar):
            link_flame(self.reruns, view)
        return view

    def _on_rerun(self, baseline: Profile, variant: Profile) -> None:
        self.add_variant(variant, baseline)

    def _on_tab(self, change: dict[str, Any]) -> None:
        if change["new"] is not None and change["new"] in self._builders:
            self.open_tab(change["new"])

    def _header_html(self, profile: Profile) -> str:
        if profile.source == "estimate":
            from .estimate_view import estimate_header_html

            text = estimate_header_html(profile)
        else:
            text = header_html(profile)
        if self.comparison is not None:
            from .estimate_view import comparison_html

            text += comparison_html(self.comparison)
        return text

    def _timeline(self, profile: Profile) -> w.Widget:
        view = TimelineView(self._handle)
        if profile.source == "estimate":  # event numbers: the fake run's time is no GPU time
            view.axis.value = EVENT_AXIS
        return view

    def _breakdown(self, profile: Profile) -> w.Widget:
        breakdown = profile.peak_breakdown()
        fig = breakdown_figure(breakdown)
        apply_theme(fig)
        bar = BokehModel(fig, combine_events=True)
        bar.add_class("jv-breakdown")
        peak = profile.peak_bytes
        modules = groups_table(
            live_at_peak(profile, "module"),
            peak,
            title="modules at the peak",
            note="self bytes: allocations made in the module itself, not in its submodules "
            "(the flame graph adds children up)",
        )
        ops = groups_table(live_at_peak(profile, "op"), peak, title="ops at the peak")
        tables = w.HTML(
            render(
                TEMPLATE,
                "breakdown_tab",
                legend=legend_html([c for c in breakdown if breakdown[c]]),
                help=category_help_html(),
                tables=[breakdown_table(breakdown), modules, ops],
            )
        )
        box = w.VBox([bar, tables])
        box.add_class("jv-breakdown-view")
        return box

    def _sites(self, profile: Profile) -> w.Widget:
        peak = profile.peak_bytes
        frames = {
            "peak": top_sites(profile, limit=200, by="peak"),
            "allocated": top_sites(profile, limit=200, by="allocated"),
        }
        sort = w.Dropdown(
            options=list(SITE_SORTS), value="live at peak", description="sort by",
            layout=w.Layout(width="240px"),
        )  # fmt: skip
        sort.add_class("jv-sites-sort")
        table = w.HTML(sites_html(frames["peak"], peak))
        table.add_class("jv-sites")
        export = CsvLink("top_sites.csv")
        export.show(frames["peak"])
        help_line = w.HTML(render(TEMPLATE, "sites_help", help=category_help_html()))

        def resort(change: dict[str, Any]) -> None:
            column = SITE_SORTS[change["new"]]
            if column == "allocated_bytes":
                frame = frames["allocated"]
            elif column == "live_at_peak_bytes":
                frame = frames["peak"]
            else:
                both = pd.concat([frames["peak"], frames["allocated"]])
                frame = both.drop_duplicates(["site", "op", "stack"]).sort_values(
                    column, ascending=column in ("site", "op", "category"), kind="stable"
                )
            table.value = sites_html(frame, peak)
            export.show(frame)

        sort.observe(resort, "value")
        box = w.VBox([w.HBox([sort, export]), help_line, table])
        box.add_class("jv-sites-view")
        return box

    def _allocator(self, profile: Profile) -> w.Widget:
        state = allocator_state(profile)
        if has_segments(profile):
            text = allocator_html(state)
        else:  # what the tracker saw, what a GPU would make of it, then the notes
            text = simulated_html(profile) + notes_html(state)
        box = w.HTML(text)
        box.add_class("jv-allocator")
        return box

    @staticmethod
    def _summary_text(profile: Profile, estimate: Estimate | None) -> str:
        if estimate is not None:
            from .._estimator.api import estimate_summary

            return estimate_summary(estimate)
        return summary(profile)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        """The widget, and what frontends without a live kernel show: the static report
        (``text/html``, no JavaScript), the saved profile (``PROFILE_MIME``, the lab
        extension's renderer) and the text summary. Made when displayed, never kept here.
        JupyterLab and Notebook 7 rank the widget view (-10) before text/html (50), so a
        live kernel still shows the app."""
        bundle = super()._repr_mimebundle_(**kwargs)
        if isinstance(bundle, dict):
            bundle["text/plain"] = self.text()
            profile = self._handle.get()
            if profile is not None:
                from .._render.static_report import saved_views

                notes = [self.gpu_answer] if self.gpu_answer else []
                if self.comparison is not None:
                    from .._render.estimate_text import comparison_text

                    notes.append(comparison_text(self.comparison))
                try:
                    bundle.update(saved_views(profile, self.estimate, notes=notes))
                except Exception as exc:  # noqa: BLE001 (the widget and the text still show)
                    bundle["text/plain"] += f"\n(the static report failed: {exc!r})"
        return bundle

    def __repr__(self) -> str:
        """The summary's first line. ipywidgets' repr lists every trait of every widget the
        app holds, recursively, and is cut to 110 characters where a display uses it."""
        first = getattr(self, "_text", "").partition("\n")[0]  # (also while being made)
        return f"<{type(self).__name__}: {first}>"

    def text(self) -> str:
        """What a frontend without widgets shows: the text summary (and comparison); an
        estimate's answer for the GPU asked about first."""
        text = f"{self.gpu_answer}\n{self._text}" if self.gpu_answer else self._text
        if self.comparison is not None:
            from .._render.estimate_text import comparison_text

            text += "\n" + comparison_text(self.comparison)
        if self.compare_view is not None:
            text += "\n" + self.compare_view.text()
        return text


def _placeholder() -> w.Widget:
    return w.HTML("<i>loading…</i>", style=kept(HTMLStyle), layout=kept(w.Layout))


def allocator_html(state: AllocatorState) -> str:
    """Levels, what fills each gap, and advice."""
    rows = [("allocated (peak)", format_bytes(state.peak_allocated), "")]
    if state.peak_reserved is not None:
        rows.append(("reserved (peak)", format_bytes(state.peak_reserved), ""))
    if state.reserved_at_allocated_peak is not None:
        rows.append(("reserved at the allocated peak",
                     format_bytes(state.reserved_at_allocated_peak),
                     "reserved memory when allocated memory peaked"))  # fmt: skip
    if state.device_used is not None:
        rows.append(("device used", format_bytes(state.device_used), ""))
    if state.device_total is not None:
        rows.append(("device total", format_bytes(state.device_total), ""))
    cached = None
    if state.cached_free_share is not None and state.reserved_at_allocated_peak is not None:
        cached = max(state.reserved_at_allocated_peak - state.peak_allocated, 0)
    return render(TEMPLATE, "allocator", state=state, rows=rows, cached=cached)


def device_split_html(state: AllocatorState) -> str:
    """Device used (what nvidia-smi shows) split into what it is, the parts named."""
    return render(TEMPLATE, "device_split", state=state)


def notes_html(state: AllocatorState) -> str:
    """What each gap between levels is, and the advice."""
    return render(TEMPLATE, "notes", state=state)


def tracker_facts(profile: Profile) -> list[tuple[str, str, str]]:
    """(label, value, explanation) of what the CPU recording saw."""
    a = profile.allocations
    t = profile.timeline
    during = allocated_during_run(profile)
    sizes = a.size[during]
    live_at_peak = int(t.live_mask(t.peak_index).sum())
    end = t.total_at(len(t) - 1)
    made = capture_words(profile)[1]
    run = run_word(profile)
    facts = [
        (f"allocations during the {run}", f"{int(during.sum()):,}", made),
        (f"bytes allocated during the {run}", format_bytes(int(sizes.sum())),
         "every allocation, freed or not"),
        ("largest single allocation", format_bytes(int(sizes.max(initial=0))), ""),
        (f"alive before the {run}", format_bytes(t.baseline_bytes),
         "tensors that existed when recording started"),
        ("peak allocated", format_bytes(t.peak_bytes), f"{live_at_peak:,} tensors live then"),
        (f"live after the {run}", format_bytes(end), f"what the {run} left allocated"),
    ]  # fmt: skip
    return facts


def simulated_html(profile: Profile) -> str:
    """The tracker's facts, and the CUDA caching allocator model applied to the recorded
    requests: what a GPU would reserve for the same run."""
    who, _, unseen = capture_words(profile)
    shown = {"who": who, "facts": tracker_facts(profile), "unseen": unseen}
    try:
        from .._estimator.api import RUNTIME_OVERHEAD_BYTES
        from .._estimator.cuda_model import simulate, to_cuda_profile

        sim = simulate(profile)
        state = allocator_state(to_cuda_profile(profile, sim))
    except Exception as exc:  # noqa: BLE001 (a model failure must not take the tab down)
        return render(TEMPLATE, "simulated", **shown, failure=str(exc), sim=None, rows=[],
                      share=0.0, stranded=0)  # fmt: skip
    used = sim.peak_reserved + RUNTIME_OVERHEAD_BYTES  # the estimator's device-used rule
    rows = [
        ("allocated (peak)", format_bytes(sim.peak_allocated),
         "requests rounded up to the allocator's 512 B blocks"),
        ("reserved (peak)", format_bytes(sim.peak_reserved),
         "segments cudaMalloc'd: 2 MiB for small requests, 20 MiB or the request "
         "rounded to 2 MiB for large ones"),
        ("segments", f"{sim.segment_count:,}", ""),
        ("device used (about)", format_bytes(used),
         "reserved + about 1 GiB for the CUDA context and libraries"),
    ]  # fmt: skip
    return render(
        TEMPLATE,
        "simulated",
        **shown,
        failure=None,
        sim=sim,
        rows=rows,
        share=state.cached_free_share or 0.0,
        stranded=len(state.stranded),
    )
