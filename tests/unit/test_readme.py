"""The README's first screen holds the two commands a fresh machine needs, and CI runs the second."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def _commands() -> list[str]:
    first_screen = (ROOT / "README.md").read_text().splitlines()[:30]
    return [line.strip() for line in first_screen if line.startswith("    bash scripts/setup.sh && ")]


def test_first_screen_has_the_main_job_and_the_test_command() -> None:
    assert _commands() == [
        "bash scripts/setup.sh && .venv/bin/python -m microbench.sweep --chunk 8192",
        "bash scripts/setup.sh && bash scripts/test.sh",
    ]
    passes = (ROOT / "scripts" / "test.sh").read_text()
    # the four passes together run every test once; tests/conftest.py refuses one marked clock and serial,
    # and one marked solo but not clock
    assert '-m "clock and not solo" -n 2 "$@"' in passes and '-m solo "$@"' in passes
    assert '-m serial "$@"' in passes
    assert '-m "not clock and not serial" -n 2 "$@"' in passes


def test_ci_runs_the_readme_test_command() -> None:
    script = (ROOT / ".ci" / "run").read_text()
    pattern = script.split("sed -n '", 1)[1].split("'", 1)[0]
    found = subprocess.run(
        ["sed", "-n", pattern, str(ROOT / "README.md")], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    assert found[0] == _commands()[1]
