"""The committed transfer runs re-derive to what they store: the end of a run reads only its records."""

from __future__ import annotations

import io
import json
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


def _floats(tree: object) -> list[float]:
    """Every number of a JSON tree, in document order."""
    if isinstance(tree, dict):
        return [x for v in tree.values() for x in _floats(v)]
    if isinstance(tree, list):
        return [x for v in tree for x in _floats(v)]
    return [float(tree)] if isinstance(tree, int | float) and not isinstance(tree, bool) else []


def _skeleton(tree: object) -> object:
    """The JSON tree with every number replaced by its type: keys, strings and shapes compared exactly."""
    if isinstance(tree, dict):
        return {k: _skeleton(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_skeleton(v) for v in tree]
    return type(tree).__name__ if isinstance(tree, int | float) and not isinstance(tree, bool) else tree


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
    for part in ("transfer_table.csv", "breakdown.csv"):
        assert (run / part).read_text() == (stored / part).read_text(), part
    # The fits to 1e-9: another BLAS or numpy (Python 3.12, numpy 2.5.2 on an H100 box) moves a fit's last
    # digit; the tables above are rounded and stay exact.
    fit, want = (json.loads((d / "fit.json").read_text()) for d in (run, stored))
    assert _floats(fit) == pytest.approx(_floats(want), rel=1e-9, abs=1e-12)
    assert _skeleton(fit) == _skeleton(want)
    for file in ("link-measured-local.yaml", "link-measured-local-handoff.yaml"):
        link, want = (yaml.safe_load((d / file).read_text()) for d in (run, stored))
        assert link.pop("run") == str(run.resolve()) and want.pop("run") == f"results/{name}"
        assert link.pop("source").replace(str(run.resolve()), f"results/{name}") == want.pop("source")
        assert link == want, file
    assert len(folder.records()) >= 15
