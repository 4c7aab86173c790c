"""The fault tier (issue #22): each fault reproduced on the sim engine, and its outcome checked the same
way: the exit code, a clear error paragraph (never a traceback), every measured record intact, no
temporary file left, nothing written outside ``--out``, the run resumable (checks in ``fault_checks``).

Commands run in-process (``main(argv)``) from an empty working directory, so anything a command writes
outside ``--out`` shows up there. Every test here carries the ``faults`` marker.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from fault_checks import Outcome, Place


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/faults/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.faults)


@pytest.fixture
def place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Place:
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return Place(tmp_path, cwd)


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Callable[..., Outcome]:
    """``run(main, *argv)``: one command in-process, its exit code and what it printed."""

    def call(main: Callable[[list[str]], int], *argv: str | Path) -> Outcome:
        capsys.readouterr()
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse's own refusal of a flag: its message, exit 2
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return Outcome(code, captured.out, captured.err)

    return call
