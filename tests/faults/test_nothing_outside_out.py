"""Issue #33: nothing is written outside ``--out``. Each command runs as a user runs it (a subprocess, from
an empty working directory, its home and temporary folders inside the test's folder), and the file
system around it is compared before and after: the test's folder, the home and temporary folders and
the repository (``git status --ignored``). Only ``--out`` may differ: not even matplotlib's font cache
goes to the home folder (``benchcore.matplotlib_dir``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_checks import Place, start_sim

# The sweep and the load generator judge their clocks: the clock pass. It also compares the repository's
# status before and after; what runs beside it there (sim tests, each writing under its own tmp_path)
# writes nothing into the repository either, which this would catch.
pytestmark = pytest.mark.clock

REPO = Path(__file__).resolve().parents[2]


def _tree(root: Path, skip: Path) -> set[tuple[str, int]]:
    """Every file and folder under ``root`` (but ``skip``) with its size (folders: 0)."""
    out = set()
    for path in root.rglob("*"):
        if path == skip or skip in path.parents:
            continue
        out.add((str(path.relative_to(root)), path.stat().st_size if path.is_file() else 0))
    return out


def _repo() -> str:
    """The repository's status, every ignored file named, but Python's bytecode caches: the set-up installs
    without byte-compiling (scripts/setup-lib.sh), so a module's first import anywhere (.venv too) writes
    its ``__pycache__`` — the interpreter's doing, not the command's."""
    done = subprocess.run(
        ["git", "status", "--porcelain", "--ignored", "--untracked-files=all"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    return "\n".join(line for line in done.stdout.splitlines() if "/__pycache__/" not in line)


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    proc, url = start_sim()
    yield url
    proc.kill()
    proc.wait()


def _argv(command: str, place: Place, sim_url: str, finished: Path) -> list[str]:
    return {
        "sweep": ["microbench.sweep", "--config", str(place.sweep_yaml(repetitions=1, prefill_tokens=[256]))],
        "transfer": ["microbench.transfer", "--engine", "sim", "--connector", "sim-link", "--no-alone",
                     "--P", "256", "--reps", "1"],
        "loadgen": ["microbench.loadgen", "run", "--workload", "synthetic-uniform", "--rate", "20",
                    "--requests", "5", "--url", sim_url],
        "analysis.report": ["analysis.report", str(finished)],
    }[command]  # fmt: skip


@pytest.mark.parametrize("command", ["sweep", "transfer", "loadgen", "analysis.report"])
def test_a_command_writes_nothing_outside_out(place: Place, sim_url: str, command: str) -> None:
    finished = place.tmp / "finished"
    if command == "analysis.report":  # a finished run to report on, made before the snapshot
        argv = ["microbench.sweep", "--config", str(place.sweep_yaml(repetitions=1, prefill_tokens=[256]))]
        subprocess.run([sys.executable, "-m", *argv, "--out", str(finished)], check=True, capture_output=True)
    home, tmp = place.tmp / "home", place.tmp / "tmpdir"
    home.mkdir()
    tmp.mkdir()
    out = place.tmp / "out"
    env = {**os.environ, "HOME": str(home), "TMPDIR": str(tmp), "PYTHONPATH": str(REPO)}
    env.pop("MPLCONFIGDIR", None)  # as a user runs it: matplotlib's font cache would go to ~/.cache
    argv = [sys.executable, "-m", *_argv(command, place, sim_url, finished), "--out", str(out)]
    before, repo_before = _tree(place.tmp, out), _repo()
    done = subprocess.run(argv, cwd=place.cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert out.is_dir() and any(out.iterdir())  # it did write, into --out
    after = _tree(place.tmp, out)
    assert after - before == set() and before - after == set()
    assert _repo() == repo_before
