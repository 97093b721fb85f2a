"""Figures that follow the page's theme (JupyterLab light or dark).

Bokeh draws on a canvas, which cannot read CSS variables, so a figure is drawn with a
transparent background (the page shows through) and, once it is laid out in the page, a small
script copies the theme's colours (``--jp-ui-font-color1`` ...) into its axes, titles, grids
and legends, again whenever the user switches the theme. Outside JupyterLab (the standalone
report) the light fallbacks apply. The colours are written as a canvas spells them: they go
back to the kernel, whose bokeh rejects some CSS spellings (a failed validation there is an
error in the user's kernel, and the "last error" a debugger or leak search then sees).
"""

from __future__ import annotations

from typing import Any

from bokeh.models import CustomJS

#: Light-theme colours, used where the page defines no JupyterLab variables.
FALLBACK = {
    "--jp-ui-font-color1": "rgba(0,0,0,0.87)",
    "--jp-ui-font-color2": "rgba(0,0,0,0.54)",
    "--jp-border-color1": "#bdbdbd",
    "--jp-border-color2": "#e0e0e0",
    "--jp-layout-color1": "#ffffff",
}

_THEME_JS = """
const css = getComputedStyle(document.body);
// Colours go back to the kernel (jupyter_bokeh syncs every model change), where bokeh
// refuses CSS spellings such as JupyterLab's 'rgba(0,0,0,.54)': a canvas gives each in a
// form it accepts ('#rrggbb' or 'rgba(r, g, b, 0.54)'), the fallback where it is no colour.
const ctx = document.createElement('canvas').getContext('2d');
const v = (name) => {
  const raw = (css.getPropertyValue(name) || '').trim() || fallback[name];
  if (ctx == null) return raw;
  ctx.fillStyle = fallback[name];
  ctx.fillStyle = raw;
  return ctx.fillStyle;
};
const fg = v('--jp-ui-font-color1'), fg2 = v('--jp-ui-font-color2');
const line = v('--jp-border-color1'), grid = v('--jp-border-color2');
const panel = v('--jp-layout-color1');
const has = (m, p) => m != null && m.properties != null && p in m.properties;
const set = (m, attrs) => {
  const ok = {};
  for (const [k, val] of Object.entries(attrs)) if (has(m, k)) ok[k] = val;
  if (Object.keys(ok).length) m.setv(ok);
};
const parts = [...fig.left, ...fig.right, ...fig.above, ...fig.below, ...fig.center];
for (const m of parts) {
  set(m, {axis_label_text_color: fg, major_label_text_color: fg2, axis_line_color: line,
          major_tick_line_color: line, minor_tick_line_color: line, grid_line_color: grid});
  if (has(m, 'items')) {  // legends: a panel of the theme's colour behind themed labels
    set(m, {label_text_color: fg, title_text_color: fg, background_fill_color: panel,
            background_fill_alpha: 0.85, border_line_color: line});
  }
}
if (fig.title != null && has(fig.title, 'text_color')) fig.title.text_color = fg;
const key = '__jv_theme_observed';
if (!fig[key]) {
  fig[key] = true;
  const again = () => { for (const ms of [50, 400, 1500]) setTimeout(() => cb.execute(fig), ms); };
  new MutationObserver(again).observe(document.body, {attributes: true,
    attributeFilter: ['data-jp-theme-light', 'data-jp-theme-name']});
}
"""


def apply_theme(fig: Any) -> Any:
    """Make ``fig`` follow the page's theme: transparent background, themed text and lines."""
    fig.background_fill_color = None
    fig.border_fill_color = None
    fig.outline_line_color = None
    callback = CustomJS(code=_THEME_JS)
    callback.args = {"fig": fig, "fallback": FALLBACK, "cb": callback}
    fig.js_on_change("inner_width", callback)
    return fig
