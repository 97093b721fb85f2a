"""HTML fragments (header, tables) and the standalone report."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .._analysis.allocator import has_segments, reserved_peak
from .._analysis.groups import Group
from .._model import CATEGORIES
from .._units import format_bytes
from .templating import render
from .text import SOURCE_NAMES, run_word

if TYPE_CHECKING:
    from .._model import Profile

TEMPLATE = "html.html.j2"


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
    return render(TEMPLATE, "fact_items", facts=facts)


def header_html(profile: Profile) -> str:
    return render(
        TEMPLATE,
        "header",
        facts=header_facts(profile),
        error=profile.error,
        warnings=profile.meta.get("warnings", ()),
    )


def warnings_html(profile: Profile) -> str:
    """What the recorder degraded (stacks sampled, op names or the end of the cell left out):
    one line each, under the header."""
    return render(TEMPLATE, "warning_lines", warnings=profile.meta.get("warnings", ()))


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

    return render(
        TEMPLATE, "legend", categories=categories, colors=CATEGORY_COLORS, help=CATEGORY_HELP
    )


def category_help_html() -> str:
    """One line per category: what it holds."""
    return render(TEMPLATE, "category_help", categories=CATEGORIES, help=CATEGORY_HELP)


_more_id = itertools.count()


@dataclass(frozen=True)
class MoreRows:
    """How a table shows its first ``shown`` rows, the rest behind a "… N more" row that
    opens them (a hidden checkbox named ``ident`` before the table; no kernel needed)."""

    ident: str  # "" when every row shows
    shown: int
    hidden: int


def more_rows(count: int, shown: int) -> MoreRows:
    """The first ``shown`` of ``count`` rows shown; a page-unique checkbox for the rest."""
    if count <= shown:
        return MoreRows("", shown, 0)
    return MoreRows(f"jv-more-{next(_more_id)}", shown, count - shown)


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
    shown = list(groups[:most]) if total else []
    return render(
        TEMPLATE,
        "groups_table",
        groups=shown,
        total=total,
        title=title,
        more=more_rows(len(shown), limit),
        smaller=max(len(groups) - most, 0),
        note=note,
    )


def breakdown_table(breakdown: dict[str, int]) -> str:
    total = sum(breakdown.values())
    rows = [(c, breakdown[c]) for c in CATEGORIES if breakdown.get(c) and total]
    return render(
        TEMPLATE, "breakdown_table", breakdown=rows, total=total, colors=_colors(),
        help=CATEGORY_HELP,
    )  # fmt: skip


def _colors() -> dict[str, str]:
    from .figures import CATEGORY_COLORS

    return CATEGORY_COLORS


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
    sites = [
        {
            "label": site_label(str(r["site"])),
            "stack": str(r["stack"]).replace(" > ", "\n"),
            "op": str(r["op"]),
            "live": int(r["live_at_peak_bytes"]),
            "share": f"{100 * int(r['live_at_peak_bytes']) / peak_bytes:.1f}%"
            if peak_bytes else "-",
            "allocated": int(r["allocated_bytes"]),
            "allocations": int(r["allocations"]),
            "largest": int(r["largest_bytes"]),
            "category": str(r["category"]),
        }
        for r in frame.to_dict("records")
    ]  # fmt: skip
    return render(
        TEMPLATE, "sites_table", sites=sites, more=more_rows(len(sites), shown),
        colors=_colors(), help=CATEGORY_HELP,
    )  # fmt: skip
