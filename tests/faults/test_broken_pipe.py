"""Issue #33: a command whose reader goes away (``… | head -1``) stops quietly with 141, as a pipe's
writer stops on SIGPIPE (``benchcore.cli``): no error paragraph, no traceback, no crash file in
``--out``. The reader here is gone before the command prints its first line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fault_checks import Place

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference-cpu"


def test_a_command_whose_reader_went_away_stops_quietly(place: Place) -> None:
    out = place.tmp / "report"
    argv = [sys.executable, "-m", "analysis.report", str(REFERENCE), "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=place.cwd)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader went away
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert err == ""
    assert (out / "report.md").is_file()  # it did its work before it had anything to print
    assert not (out / "crash-traceback.txt").exists()
