"""The app's OOM post-mortem: a header line and a tab (what failed, what was live, what would
have fitted). Shown only for a profile whose run ended in ``torch.OutOfMemoryError``."""

from __future__ import annotations

import html

import ipywidgets as w

from .._model.oom import OomReport
from .._units import format_bytes

TITLE = "Out of memory"


def oom_header_html(oom: OomReport) -> str:
    """One line for the app's header: the request, and how far short it fell."""
    asked = format_bytes(oom.requested_bytes) if oom.requested_bytes is not None else "memory"
    where = f" in {html.escape(oom.module)}" if oom.module else ""
    short = (
        f", {format_bytes(oom.shortfall_bytes)} short" if oom.shortfall_bytes is not None else ""
    )
    best = oom.suggestions[0] if oom.suggestions else None
    tip = (
        f" · best: {html.escape(best.action)} (saves {format_bytes(best.bytes_saved)})"
        if best is not None
        else ""
    )
    return (
        f"<div class='jv-error jv-oom-line'><b>Out of memory</b>: {asked} requested{where} "
        f"with {format_bytes(oom.live_bytes)} live{short}{tip}; see the "
        f"“{TITLE}” tab</div>"
    )


def _rows(pairs: list[tuple[str, str]]) -> str:
    return "".join(
        f"<tr><td>{html.escape(k)}</td><td class='jv-num'>{v}</td></tr>" for k, v in pairs
    )


def oom_html(oom: OomReport) -> str:
    """The whole post-mortem as HTML (the tab's content)."""
    facts: list[tuple[str, str]] = []
    if oom.requested_bytes is not None:
        facts.append(("requested", format_bytes(oom.requested_bytes)))
    if oom.segment_bytes is not None and oom.segment_bytes != oom.requested_bytes:
        facts.append(("new segment needed", format_bytes(oom.segment_bytes)))
    for label, value in (("op", oom.op), ("module", oom.module), ("phase", oom.phase),
                         ("line", oom.site)):  # fmt: skip
        if value:
            facts.append((label, html.escape(value)))
    facts.append(("live then", format_bytes(oom.live_bytes)))
    if oom.capacity_bytes is not None:
        facts.append(("capacity", format_bytes(oom.capacity_bytes)))
    if oom.shortfall_bytes is not None:
        facts.append(("short by", format_bytes(oom.shortfall_bytes)))
    live = [(k, format_bytes(v)) for k, v in oom.live_by_category.items() if v]
    modules = [(name or "(no module)", format_bytes(n)) for name, n in oom.top_modules]
    out = [
        f"<p class='jv-error'>{html.escape(oom.message[:300])}</p>",
        "<div class='jv-tables'>",
        f"<table class='jv-table jv-oom-facts'><caption>the failed request</caption>"
        f"{_rows(facts)}</table>",
        f"<table class='jv-table'><caption>live by category</caption>{_rows(live)}</table>",
        f"<table class='jv-table'><caption>live by module</caption>{_rows(modules)}</table>",
    ]
    if oom.allocator is not None:
        state = [(k.replace("_", " "), format_bytes(v)) for k, v in oom.allocator.items()
                 if k != "num_ooms"]  # fmt: skip
        if oom.expandable_would_serve is not None:
            verdict = "yes" if oom.expandable_would_serve else "no"
            state.append(("expandable segments would serve it", verdict))
        out.append(
            f"<table class='jv-table'><caption>allocator (CUDA)</caption>{_rows(state)}</table>"
        )
    out.append("</div>")
    rows = "".join(
        f"<tr class='{'jv-enough' if s.enough else ''}'><td>{html.escape(s.action)}</td>"
        f"<td class='jv-num'>{format_bytes(s.bytes_saved)}</td>"
        f"<td>{'yes' if s.enough else ''}</td>"
        f"<td>{html.escape(s.toggle or '')}</td><td class='jv-note'>{html.escape(s.reason)}</td>"
        "</tr>"
        for s in oom.suggestions
    )
    out.append(
        "<table class='jv-table jv-oom-suggestions'><caption>what would have fitted, most "
        "bytes saved first</caption><tr><th>change</th><th>saves</th><th>enough</th>"
        f"<th>toggle</th><th>why</th></tr>{rows}</table>"
    )
    return "".join(out)


class OomView(w.HTML):  # type: ignore[misc]
    """The post-mortem tab."""

    def __init__(self, oom: OomReport) -> None:
        super().__init__(oom_html(oom))
        self.add_class("jv-oom")
