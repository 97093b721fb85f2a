"""The HTML the package shows comes from the Jinja2 templates in ``templates/``.

One template per module that shows HTML, a macro per fragment; Python picks the data, the
templates hold the markup. :func:`render` calls one macro.

Two choices keep the output what it was when the fragments were f-strings, byte for byte
(tests compare texts, saved notebooks compare outputs):

- every value is escaped (autoescape), spelled as :func:`html.escape` spells it (``&#x27;``,
  ``&quot;``); HTML made elsewhere (an SVG, another macro's result) comes in marked
  ``|safe`` where the template uses it;
- the sources are written one element a line for reading; a line break and the indentation
  after it are dropped when a template loads, so text that runs on is kept on one line.
"""

from __future__ import annotations

import functools
import html
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._units import format_bytes

if TYPE_CHECKING:
    import jinja2

TEMPLATES = Path(__file__).with_name("templates")


def render(template: str, macro: str, /, **values: Any) -> str:
    """The HTML of ``macro`` in ``templates/<template>``, called with ``values``."""
    function = getattr(_environment().get_template(template).module, macro)
    return str(function(**values))


def _lines_joined(loader: jinja2.BaseLoader) -> jinja2.BaseLoader:
    """``loader`` with each source's line breaks and the indentation after them dropped."""
    import jinja2

    class Joined(jinja2.BaseLoader):
        def get_source(
            self, environment: jinja2.Environment, template: str
        ) -> tuple[str, str | None, Callable[[], bool] | None]:
            source, filename, uptodate = loader.get_source(environment, template)
            return re.sub(r"\n[ \t]*", "", source), filename, uptodate

    return Joined()


#: Helpers the templates format numbers with.
FILTERS: dict[str, Callable[..., str]] = {
    "bytes": format_bytes,
    "thousands": lambda n: f"{int(n):,}",
    "percent": lambda part, whole: f"{100 * part / whole:.1f}%",
}


@functools.cache
def _environment() -> jinja2.Environment:
    """Made on first use: ``import jupyter_vram`` does not import Jinja2."""
    import jinja2
    from markupsafe import Markup

    def escaped(value: Any) -> Any:
        """What autoescape writes: :func:`html.escape`'s spelling; ``Markup`` as it is."""
        return value if isinstance(value, Markup) else Markup(html.escape(str(value)))

    environment = jinja2.Environment(
        loader=_lines_joined(jinja2.FileSystemLoader(TEMPLATES)),
        autoescape=True,
        finalize=escaped,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=False,
    )
    environment.filters.update(FILTERS)
    return environment
