"""The committed transfer runs re-derive to what they store: the end of a run reads only its records."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from microbench.results.layout import TransferFolder
from microbench.transfer.config import TransferConfig
from microbench.transfer.report import finish_run

RESULTS = Path(__file__).resolve().parents[2] / "results"
RUNS = ["transfer-cpu-reference", "transfer-cpu-push", "transfer-cpu-sched-idle"]


@pytest.mark.parametrize("name", RUNS)
def test_a_committed_transfer_run_re_derives_its_tables_fits_and_link_exactly(
    name: str, tmp_path: Path
) -> None:
    stored = RESULTS / name
    run = tmp_path / name
    run.mkdir()
    shutil.copytree(stored / "runs", run / "runs")
    for part in ("manifest.json", "idle_cpu.json"):
        shutil.copy(stored / part, run / part)
    folder = TransferFolder(run)
    finish_run(
        folder, TransferConfig.model_validate(folder.read_manifest().sweep), Console(file=io.StringIO())
    )
    for part in ("transfer_table.csv", "breakdown.csv", "fit.json"):
        assert (run / part).read_text() == (stored / part).read_text(), part
    for file in ("link-measured-local.yaml", "link-measured-local-handoff.yaml"):
        link, want = (yaml.safe_load((d / file).read_text()) for d in (run, stored))
        assert link.pop("run") == str(run.resolve()) and want.pop("run") == f"results/{name}"
        assert link.pop("source").replace(str(run.resolve()), f"results/{name}") == want.pop("source")
        assert link == want, file
    assert len(folder.records()) >= 15
