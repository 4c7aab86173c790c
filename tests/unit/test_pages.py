"""The template library of every HTML report (``benchcore.pages``): layout, escaping, strictness."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from jinja2 import UndefinedError

from benchcore.pages import png_data_uri, render_page


def test_a_report_page_gets_the_shared_layout_and_escapes_its_text() -> None:
    page = render_page("benchcore.pages", "layout.html", title="<run & co>", banner=["bad", "a < b"])
    assert page.startswith("<!doctype html>") and "<title>&lt;run &amp; co&gt;</title>" in page
    assert '<div class="gate"><p>bad</p><ul><li>a &lt; b</li></ul></div>' in page


def test_an_undefined_name_fails_the_render_instead_of_printing_nothing() -> None:
    with pytest.raises(UndefinedError):
        render_page("benchcore.pages", "layout.html", banner=[])


def test_figures_are_embedded() -> None:
    assert png_data_uri(b"\x89PNG") == "data:image/png;base64,iVBORw=="


def test_templates_are_package_data() -> None:
    """Each report's template is declared package data, so an installed suite renders its pages."""
    repo = Path(__file__).resolve().parents[2]
    data = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    found = sorted(str(f.relative_to(repo)) for pkg in data for f in (repo / pkg).rglob("templates/*.html"))
    declared = {f"{pkg}/{pattern}" for pkg, patterns in data.items() for pattern in patterns}
    for path in found:
        assert any(Path(path).match(d) for d in declared), path
    assert len(found) >= 3  # layout, macros and the battery's page at least
