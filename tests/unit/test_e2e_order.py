"""tests/conftest.py: the e2e tests on the shared vLLM engine run first among the real-engine tests, and
the engine is stopped after the last of them, so the tests that start engines of their own never run
beside it (an idle CPU vLLM engine keeps about a tenth of a core busy: results/*/idle_cpu.json, "alone")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

ROOT_CONFTEST = Path(__file__).resolve().parents[1] / "conftest.py"


def _item(name: str, *marks: str, shared: bool = False) -> Any:
    fixtures = ["tmp_path"] + (["vllm_engine"] if shared else [])
    added: list[str] = []
    keywords = dict.fromkeys(marks, True)

    def add_marker(mark: Any) -> None:  # as pytest's: the mark is a keyword from then on
        added.append(mark.name)
        keywords[mark.name] = True

    return SimpleNamespace(
        name=name,
        nodeid=f"tests/x.py::{name}",
        keywords=keywords,
        fixturenames=fixtures,
        added=added,
        add_marker=add_marker,
    )


def _root_conftest(request: pytest.FixtureRequest) -> Any:
    # the module pytest loaded (``import conftest`` may find tests/faults/conftest.py instead)
    (conftest,) = [
        p
        for p in request.config.pluginmanager.get_plugins()
        if getattr(p, "__file__", None) == str(ROOT_CONFTEST)
    ]
    return conftest


def test_shared_engine_tests_run_first_among_the_e2e_ones_and_the_engine_stops_after_them(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    conftest = _root_conftest(request)
    monkeypatch.setattr(conftest, "_has_gpu", lambda: True)  # no skip markers on these stand-ins
    items = [
        _item("sweep_e2e", "e2e"),
        _item("battery_e2e", "e2e", shared=True),
        _item("unit"),
        _item("dying_e2e", "e2e"),
        _item("stream_e2e", "e2e", shared=True),
        _item("sim", "integration"),
    ]
    conftest.pytest_collection_modifyitems(None, items)  # type: ignore[arg-type]
    assert [i.name for i in items] == ["unit", "sim", "battery_e2e", "stream_e2e", "sweep_e2e", "dying_e2e"]
    # every real-engine test runs in the serial pass (pytest -m serial), never beside another test
    assert {i.name for i in items if "serial" in i.added} == {
        "battery_e2e",
        "stream_e2e",
        "sweep_e2e",
        "dying_e2e",
    }

    stopped: list[str] = []
    monkeypatch.setattr(conftest, "_stop_shared", [lambda: stopped.append("engine")])
    for item, nextitem in zip(items, [*items[1:], None], strict=True):
        conftest.pytest_runtest_teardown(item, nextitem)  # type: ignore[arg-type]
        if item.name == "battery_e2e":
            assert stopped == []  # the next test uses it too
    assert stopped == ["engine"] and conftest._stop_shared == []  # once, after stream_e2e


def test_a_real_engine_test_marked_clock_is_refused(request: pytest.FixtureRequest) -> None:
    # it would run in the clock pass beside another test, and again in the serial pass
    conftest = _root_conftest(request)
    items = [_item("timed_e2e", "e2e", "clock"), _item("sim", "clock"), _item("stream_e2e", "e2e")]
    with pytest.raises(pytest.UsageError, match=r"both clock and serial .*: tests/x.py::timed_e2e$"):
        conftest.pytest_collection_modifyitems(None, items)


def test_a_solo_test_that_is_not_a_clock_test_is_refused(request: pytest.FixtureRequest) -> None:
    # the solo pass runs clock tests alone; a solo test outside the clock pass would run in two passes
    conftest = _root_conftest(request)
    items = [_item("fit", "clock", "solo"), _item("pure", "solo"), _item("sim", "clock")]
    with pytest.raises(pytest.UsageError, match=r"marked solo but not clock .*: tests/x.py::pure$"):
        conftest.pytest_collection_modifyitems(None, items)
