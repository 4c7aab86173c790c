"""One template library for every HTML report: Jinja2, one page layout, shared macros.

Every report page extends ``layout.html`` (title, style, an optional red banner for a report that found a
contradiction in itself) and draws its tables and figures with the macros of ``macros.html``
(``table``, ``figure``, ``bullets``). A report package keeps its own page template in a ``templates/``
folder next to its code (package data, so an installed suite finds it) and renders it with
``render_page(package, name, **context)``; the layout and macros are found here. Autoescaping is on and
an undefined name is an error, so a renamed field fails the render instead of printing an empty cell.
"""

from __future__ import annotations

import base64
from functools import cache

from jinja2 import ChoiceLoader, Environment, PackageLoader, StrictUndefined

__all__ = ["png_data_uri", "render_page"]


def png_data_uri(data: bytes) -> str:
    """A PNG as a ``data:`` URI, so a page embeds its figures and is one file to share."""
    return "data:image/png;base64," + base64.b64encode(data).decode()


@cache
def _environment(package: str) -> Environment:
    loaders = [PackageLoader(package, "templates")] if package != __name__ else []
    return Environment(
        loader=ChoiceLoader([*loaders, PackageLoader(__name__, "templates")]),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


def render_page(package: str, name: str, **context: object) -> str:
    """Render template ``name`` of ``package``'s ``templates/`` folder (it extends ``layout.html``)."""
    return _environment(package).get_template(name).render(**context)
