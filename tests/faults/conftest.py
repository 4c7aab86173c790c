"""The fault tier (issue #22): each fault reproduced on the sim engine, and its outcome checked the same
way: the exit code, a clear error paragraph (never a traceback), every measured record intact, no
temporary file left, nothing written outside ``--out``, the run resumable (checks in ``fault_checks``).

Commands run in-process (``main(argv)``) from an empty working directory, so anything a command writes
outside ``--out`` shows up there. Every test here carries the ``faults`` marker.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
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


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """``small_fs(size="512k", ro=False)``: a real tmpfs of that size mounted in ``tmp_path`` (a disk that
    really fills up, or a really read-only one: root ignores chmod 0555); ``remount(mnt, opts)`` changes
    it. Skipped where this user may not mount."""
    mounts: list[Path] = []

    def mount(size: str = "512k", ro: bool = False) -> Path:
        mnt = tmp_path / f"fs{len(mounts)}"
        mnt.mkdir()
        opts = f"size={size}" + (",ro" if ro else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(mnt)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounts.append(mnt)
        return mnt

    yield mount
    for mnt in mounts:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
