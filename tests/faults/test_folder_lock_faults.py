"""Issue #33: one writer per run folder, for every command that writes one. A second run into an ``--out``
another process is writing (the sweep, the transfer benchmark, the battery, the load generator) is
refused at once with exit 2 and a clear message, and writes nothing into that folder."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fault_checks import Place, assert_clear_error, start_sim

from microbench.battery.cli import main as battery
from microbench.loadgen.cli import main as loadgen
from microbench.sweep.cli import main as sweep
from microbench.transfer.cli import main as transfer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sim_url() -> Iterator[str]:
    """A sim engine started by hand: the battery and the load generator have an engine to reach."""
    proc, url = start_sim()
    yield url
    proc.kill()
    proc.wait()


def _holder(out: Path) -> subprocess.Popen[str]:
    """Another process holding ``out``'s writer lock (as a run writing it does), until killed."""
    code = (
        "import sys, time; from pathlib import Path; from microbench.results.layout import hold_folder\n"
        "with hold_folder(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(600)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(out)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


COMMANDS: dict[str, tuple[Callable[[list[str]], int], Callable[[Place, str], list[str]]]] = {
    "sweep": (sweep, lambda p, url: ["--config", str(p.sweep_yaml())]),
    "transfer": (transfer, lambda p, url: ["--config", str(REPO / "sweeps" / "transfer-smoke.yaml")]),
    "battery": (battery, lambda p, url: ["run", "--engine", "external", "--url", url, "--tests", "ttft"]),
    "loadgen": (
        loadgen,
        lambda p, url: [
            "run",
            "--workload",
            "synthetic-uniform",
            "--rate",
            "5",
            "--requests",
            "3",
            "--url",
            url,
        ],
    ),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_second_writer_into_one_out_is_refused_with_exit_2(
    place: Place, run, sim_url: str, command: str
) -> None:
    main, argv = COMMANDS[command]
    out = place.tmp / "out"
    holder = _holder(out)
    try:
        t0 = time.monotonic()
        outcome = run(main, *argv(place, sim_url), "--out", out)
        assert outcome.code == 2, outcome.text[-3000:]
        assert time.monotonic() - t0 < 30
        assert_clear_error(outcome, f"{out} is being written by another process")
        assert [p.name for p in out.iterdir()] == [".lock"]  # nothing of the second run
    finally:
        holder.kill()
        holder.wait()
