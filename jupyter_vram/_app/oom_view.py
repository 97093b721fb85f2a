"""The app's OOM post-mortem: a header line and a tab (what failed, what was live, what would
have fitted). Shown only for a profile whose run ended in ``torch.OutOfMemoryError``."""

from __future__ import annotations

import ipywidgets as w

from .._model.oom import OomReport
from .._render.templating import render
from .._units import format_bytes

TITLE = "Out of memory"
TEMPLATE = "oom_view.html.j2"


def oom_header_html(oom: OomReport) -> str:
    """One line for the app's header: the request, and how far short it fell."""
    return render(TEMPLATE, "header_line", oom=oom, title=TITLE)


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
            facts.append((label, value))
    facts.append(("live then", format_bytes(oom.live_bytes)))
    if oom.capacity_bytes is not None:
        facts.append(("capacity", format_bytes(oom.capacity_bytes)))
    if oom.shortfall_bytes is not None:
        facts.append(("short by", format_bytes(oom.shortfall_bytes)))
    allocator = None
    if oom.allocator is not None:
        allocator = [(k.replace("_", " "), format_bytes(v)) for k, v in oom.allocator.items()
                     if k != "num_ooms"]  # fmt: skip
        if oom.expandable_would_serve is not None:
            verdict = "yes" if oom.expandable_would_serve else "no"
            allocator.append(("expandable segments would serve it", verdict))
    return render(
        TEMPLATE,
        "post_mortem",
        oom=oom,
        facts=facts,
        live=[(k, format_bytes(v)) for k, v in oom.live_by_category.items() if v],
        modules=[(name or "(no module)", format_bytes(n)) for name, n in oom.top_modules],
        allocator=allocator,
    )


class OomView(w.HTML):  # type: ignore[misc]
    """The post-mortem tab."""

    def __init__(self, oom: OomReport) -> None:
        super().__init__(oom_html(oom))
        self.add_class("jv-oom")
