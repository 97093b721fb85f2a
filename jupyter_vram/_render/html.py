"""HTML fragments (header, tables) and the standalone report."""

from __future__ import annotations

import html
import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .._analysis.allocator import has_segments, reserved_peak
from .._analysis.groups import Group
from .._model import CATEGORIES
from .._units import format_bytes
from .text import SOURCE_NAMES, run_word

if TYPE_CHECKING:
    from .._model import Profile


def header_facts(profile: Profile) -> list[tuple[str, str]]:
    """(label, value) pairs for the summary line; every number comes from the profile."""
    t = profile.timeline
    info = profile.device_info
    run = run_word(profile)
    facts = [
        ("peak allocated", format_bytes(profile.peak_bytes)),
        (f"before the {run}", before_the_cell(profile)),
        (f"added by the {run}", format_bytes(max(profile.peak_bytes - t.baseline_bytes, 0))),
    ]
    if t.peak_index >= 0:
        facts.append(("peak in", t.peak_phase))
    weights = weights_fact(profile)
    if weights:
        facts.append(("weights at the peak", weights))
    if has_segments(profile):
        facts.append(("peak reserved", format_bytes(reserved_peak(profile))))
    if info.get("device_used") is not None:
        facts.append(("device used", format_bytes(int(info["device_used"]))))
    if info.get("total") is not None:
        facts.append(("device total", format_bytes(int(info["total"]))))
    workspaces = workspaces_text(profile.meta)
    if workspaces:
        facts.append(("library workspaces", workspaces))
    capacity = capacity_text(profile.meta)
    if capacity:
        facts.append(("capacity", capacity))
    facts += [
        ("device", f"{profile.device} ({SOURCE_NAMES.get(profile.source, profile.source)})"),
        ("wall time", f"{profile.wall_ns / 1e9:.3f} s"),
        ("events", f"{profile.event_count:,}"),
    ]
    return facts


def workspaces_text(meta: dict[str, Any]) -> str | None:
    """The cuBLAS / cuBLASLt workspaces a CUDA run made (its first matmuls in this process):
    runtime state PyTorch keeps for the life of the process, not the cell's memory."""
    made = meta.get("blas_workspaces")
    if not isinstance(made, list) or not made:
        return None
    total = sum(int(w["bytes"]) for w in made if isinstance(w, dict) and "bytes" in w)
    return f"{format_bytes(total)} made by the first matmuls, kept across cells (category other)"


def capacity_text(meta: dict[str, Any]) -> str | None:
    """A ``--capacity`` run's capacity, and on CUDA how it was applied: the allocator's cache
    emptied first (cached blocks skip the fraction check) and what this process holds outside
    the allocator (counted against it where NVML reports it)."""
    nbytes = meta.get("capacity_bytes")
    if not isinstance(nbytes, int) or isinstance(nbytes, bool):
        return None
    text = format_bytes(nbytes)
    how = meta.get("capacity")
    if not isinstance(how, dict):
        return text
    notes = ["cache emptied first"] if how.get("cache_emptied") else []
    outside = how.get("outside_allocator")
    if isinstance(outside, int):
        notes.append(f"{format_bytes(outside)} outside the allocator counted")
    else:
        notes.append("context not counted (no NVML)")
    return f"{text} ({', '.join(notes)})"


def weights_fact(profile: Profile) -> str:
    """'14.0 KiB trainable, 165.2 KiB frozen, 16.1 KiB quant state': the split an adapter
    (LoRA / QLoRA) user asks about first. Empty when every weight trains and none is
    quantised: the breakdown's ``parameter`` says it all then."""
    at_peak = profile.peak_breakdown()
    frozen, state = at_peak.get("frozen_parameter", 0), at_peak.get("quant_state", 0)
    if not frozen and not state:
        return ""
    parts = [(at_peak.get("parameter", 0), "trainable"), (frozen, "frozen"), (state, "quant state")]
    return ", ".join(f"{format_bytes(n)} {what}" for n, what in parts if n or what == "trainable")


#: How many of the variables holding memory before the cell the header names.
HELD_NAMES = 3


def before_the_cell(profile: Profile) -> str:
    """Bytes alive when the cell started (inside the peak), and the variables holding the
    most of them: '1.2 GiB (kept_logits 1.0 GiB, model 180.0 MiB)'.

    The names come from ``meta["held_before"]`` (``[name, bytes]``, largest first), which
    older and CUDA profiles lack: then only the bytes are shown.
    """
    baseline = profile.timeline.baseline_bytes
    text = format_bytes(baseline)
    held = profile.meta.get("held_before")
    if not baseline or not isinstance(held, list):
        return text
    pairs = [
        (str(item[0]), int(item[1]))
        for item in held
        if isinstance(item, (list, tuple)) and len(item) == 2
        and isinstance(item[1], (int, float)) and item[1] > 0
    ]  # fmt: skip
    names = [f"{name} {format_bytes(size)}" for name, size in pairs[:HELD_NAMES]]
    return f"{text} ({', '.join(names)})" if names else text


def facts_html(facts: list[tuple[str, str]]) -> str:
    """(label, value) pairs as the app's header shows them."""
    return "".join(
        f'<span class="jv-fact"><span class="jv-label">{html.escape(k)}</span> '
        f"<b>{html.escape(v)}</b></span>"
        for k, v in facts
    )


def header_html(profile: Profile) -> str:
    items = facts_html(header_facts(profile))
    error = ""
    if profile.error:
        error = (
            f'<div class="jv-error">The cell raised {html.escape(profile.error)}; '
            "the profile covers the run up to the error.</div>"
        )
    return f'<div class="jv-header">{items}</div>{error}{warnings_html(profile)}'


def warnings_html(profile: Profile) -> str:
    """What the recorder degraded (stacks sampled, op names or the end of the cell left out):
    one line each, under the header."""
    return "".join(
        f'<div class="jv-warning">{html.escape(str(w))}</div>'
        for w in profile.meta.get("warnings", ())
    )


#: What each category holds, as the legends' tooltips and help lines say it.
CATEGORY_HELP: dict[str, str] = {
    "parameter": "weights and biases of a module that train (nn.Parameter, requires_grad)",
    "frozen_parameter": "weights that do not train (requires_grad=False): a LoRA / QLoRA "
    "base model, a frozen backbone",
    "quant_state": "what a quantised weight keeps besides its data: bitsandbytes' absmax and "
    "code tables (QuantState), a quantised tensor subclass's scales",
    "buffer": "module buffers that are not trained, e.g. BatchNorm running statistics",
    "gradient": "the .grad of parameters, written by backward",
    "optimizer_state": "what the optimizer keeps per parameter (Adam's moments, step counters; "
    "8-bit optimizers' quantised moments and their absmax)",
    "kv_cache": "keys and values a generate() or a forward with use_cache=True keeps between "
    "steps (transformers' Cache objects, caches registered with jv.register_cache)",
    "input": "tensors fed into the model: the batch, labels, masks",
    "activation": "forward results autograd saved for backward; freed as backward runs",
    "temporary": "every other tensor made during the cell: intermediate results, outputs "
    "nobody kept, gradients of activations; short-lived",
    "other": "tensors alive before the cell that are not the model's, or not classified",
}


def legend_html(categories: Sequence[str] = CATEGORIES) -> str:
    """The category colours, each with its meaning as a tooltip (hover a name)."""
    from .figures import CATEGORY_COLORS

    items = "".join(
        f"<span class='jv-legend-item' title='{html.escape(CATEGORY_HELP[c], quote=True)}'>"
        f"<span class='jv-swatch' style='background:{CATEGORY_COLORS[c]}'></span>{c}</span>"
        for c in categories
    )
    return f"<div class='jv-legend'>{items}<span class='jv-label'>(hover a name)</span></div>"


def category_help_html() -> str:
    """One line per category: what it holds."""
    rows = "".join(f"<li><b>{c}</b>: {html.escape(CATEGORY_HELP[c])}</li>" for c in CATEGORIES)
    return (
        "<details class='jv-help'><summary>What the categories mean</summary>"
        f"<ul>{rows}</ul></details>"
    )


_more_id = itertools.count()


def expandable_rows(rows: Sequence[str], shown: int, columns: int) -> tuple[str, str]:
    """(toggle, rows): the first ``shown`` rows, then the rest hidden behind a "… N more" row
    that shows them when clicked (a hidden checkbox before the table; no kernel needed).
    Put ``toggle`` right before the ``<table>`` holding ``rows``."""
    if len(rows) <= shown:
        return "", "".join(rows)
    ident = f"jv-more-{next(_more_id)}"
    hidden = "".join(
        r.replace("<tr", "<tr data-jv-extra='1' class='jv-extra'", 1) for r in rows[shown:]
    )
    more = (
        f"<tr class='jv-more-row'><td colspan={columns}><label for='{ident}' class='jv-more'>"
        f"\u2026 {len(rows) - shown} more (show)</label></td></tr>"
    )
    toggle = f"<input type='checkbox' id='{ident}' class='jv-more-toggle'>"
    return toggle, "".join(rows[:shown]) + hidden + more


def groups_table(
    groups: Sequence[Group],
    total: int,
    *,
    title: str,
    limit: int = 12,
    most: int = 200,
    note: str = "",
) -> str:
    """A small HTML table of groups: label, bytes, share of ``total``, count. The first
    ``limit`` rows show; the next ones (up to ``most``) open from a "… N more" row."""
    rows = [
        f"<tr><td class='jv-name' title='{html.escape(g.label, quote=True)}'><div class='jv-cut'>"
        f"{html.escape(g.label)}</div></td><td class='jv-num'>{format_bytes(g.bytes)}"
        f"</td><td class='jv-num'>{100 * g.bytes / total:.1f}%</td>"
        f"<td class='jv-num'>{g.count:,}</td></tr>"
        for g in groups[:most]
        if total
    ]
    toggle, body = expandable_rows(rows, limit, 4)
    if len(groups) > most:
        body += f"<tr><td colspan=4 class='jv-label'>and {len(groups) - most} smaller</td></tr>"
    caption = html.escape(title) + (
        f"<div class='jv-label jv-caption-note'>{note}</div>" if note else ""
    )
    return (
        f"<div class='jv-group-table'>{toggle}<table class='jv-table'><caption>{caption}</caption>"
        "<tr><th>name</th><th>bytes</th><th>share</th><th>allocations</th></tr>"
        f"{body}</table></div>"
    )


def breakdown_table(breakdown: dict[str, int]) -> str:
    total = sum(breakdown.values())
    rows = "".join(
        f"<tr><td title='{html.escape(CATEGORY_HELP[c], quote=True)}'>"
        f"<span class='jv-swatch' style='background:{_color(c)}'></span>{c}</td>"
        f"<td class='jv-num'>{format_bytes(breakdown[c])}</td>"
        f"<td class='jv-num'>{100 * breakdown[c] / total:.1f}%</td></tr>"
        for c in CATEGORIES
        if breakdown.get(c) and total
    )
    return (
        "<table class='jv-table'><tr><th>category</th><th>bytes</th><th>share</th></tr>"
        f"{rows}<tr><td><b>total</b></td><td class='jv-num'><b>{format_bytes(total)}"
        "</b></td><td></td></tr></table>"
    )


def _color(category: str) -> str:
    from .figures import CATEGORY_COLORS

    return CATEGORY_COLORS[category]


def write_report(
    profile: Profile, path: str | Path, *, resources: Literal["inline", "cdn"]
) -> Path:
    """A standalone HTML report with the app's figures (hover, click-to-zoom, sortable tables).

    ``resources="inline"`` embeds BokehJS so the file works offline (a few MB, once per file).
    """
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import TabPanel, Tabs
    from bokeh.models.widgets.markups import Div
    from bokeh.resources import CDN, INLINE

    from .figures import report_panels

    panels = [TabPanel(child=child, title=title) for title, child in report_panels(profile)]
    layout = column(
        Div(text=_REPORT_CSS + header_html(profile), sizing_mode="stretch_width"),
        Tabs(tabs=panels, sizing_mode="stretch_width"),
        sizing_mode="stretch_width",
    )
    page = file_html(
        layout, INLINE if resources == "inline" else CDN, title=f"jupyter_vram: {profile.device}"
    )
    path = Path(path)
    path.write_text(page, encoding="utf-8")
    return path


_REPORT_CSS = """<style>
.jv-header{display:flex;flex-wrap:wrap;gap:4px 18px;font-family:sans-serif;font-size:13px}
.jv-label{color:#666}.jv-error{color:#a00;font-family:sans-serif;margin:4px 0}
</style>"""


SITE_SORTS: dict[str, str] = {
    "live at peak": "live_at_peak_bytes",
    "allocated": "allocated_bytes",
    "allocations": "allocations",
    "largest": "largest_bytes",
    "site": "site",
    "op": "op",
    "category": "category",
}


def site_label(site: str) -> str:
    """'forward (examples.py:26)' as 'examples.py:26 forward': the line number first, so a
    narrow column cuts the function name, never the line."""
    name, _, where = site.rpartition(" (")
    if not name or not where.endswith(")"):
        return site
    return f"{where[:-1]} {name}"


def sites_html(frame: Any, peak_bytes: int, *, shown: int = 50) -> str:
    """Top allocation sites as an HTML table: bytes in KiB / MiB / GiB, the share of the peak,
    the full stack as the site's tooltip; rows past ``shown`` open from a "… N more" row."""
    rows = []
    for r in frame.to_dict("records"):
        live = int(r["live_at_peak_bytes"])
        share = f"{100 * live / peak_bytes:.1f}%" if peak_bytes else "-"
        tip = html.escape(str(r["stack"]).replace(" > ", "\n"), quote=True)
        rows.append(
            f"<tr><td class='jv-site' title='{tip}'>"
            f"{html.escape(site_label(str(r['site'])))}</td>"
            f"<td class='jv-op'>{html.escape(str(r['op']))}</td>"
            f"<td class='jv-num' title='{live:,} B'>{format_bytes(live)}</td>"
            f"<td class='jv-num'>{share}</td>"
            f"<td class='jv-num' title='{int(r['allocated_bytes']):,} B'>"
            f"{format_bytes(int(r['allocated_bytes']))}</td>"
            f"<td class='jv-num'>{int(r['allocations']):,}</td>"
            f"<td class='jv-num' title='{int(r['largest_bytes']):,} B'>"
            f"{format_bytes(int(r['largest_bytes']))}</td>"
            f"<td title='{html.escape(CATEGORY_HELP.get(str(r['category']), ''), quote=True)}'>"
            f"<span class='jv-swatch' style='background:{_color(str(r['category']))}'></span>"
            f"{html.escape(str(r['category']))}</td></tr>"
        )
    toggle, body = expandable_rows(rows, shown, 8)
    head = (
        "<tr><th>site (file:line function)</th><th>op</th>"
        "<th title='bytes of this site still live at the peak'>live at peak</th>"
        "<th title='live at peak / peak allocated'>of peak</th>"
        "<th title='every allocation during the cell, freed or not'>allocated</th>"
        "<th>count</th><th>largest</th>"
        "<th title='the category holding most of the site&#39;s bytes'>category</th></tr>"
    )
    if not rows:
        body = "<tr><td colspan=8 class='jv-label'>no allocations during the cell</td></tr>"
    return f"{toggle}<table class='jv-table jv-sites-table'>{head}{body}</table>"
