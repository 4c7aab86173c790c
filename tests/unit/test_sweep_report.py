"""The sweep's one typed report (``analysis.sweep_report``) on a synthesised run: built once, rendered
by the console summary, and refused when it contradicts itself."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError
from rich.console import Console

from analysis.sweep_report import DataTable, SweepReport, analyse_run, sweep_report
from analysis.synthetic import synthesize_run
from analysis.table import interference_table
from microbench.sweep.summary import print_summary


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_run(
        tmp_path_factory.mktemp("sr") / "syn", chunks=(2048, 8192), decode_batches=(0, 2, 4),
        prefill_tokens=(512, 4096, 16384), repetitions=2,
    )  # fmt: skip


@pytest.fixture(scope="module")
def report(run: Path) -> SweepReport:
    return sweep_report(analyse_run(run, links=["seed-layerwise-50ms"]))


def test_the_report_carries_the_runs_table_and_judged_criteria(run: Path, report: SweepReport) -> None:
    table = interference_table(run)
    assert report.table == DataTable.of(table)
    numeric = table.select_dtypes("number").columns
    pd.testing.assert_frame_equal(report.table.frame()[numeric], table[numeric], check_dtype=False)
    assert report.points == 3 * 3 * 2 * 2 and report.cells == 2 * 3 * 3
    fits = report.criteria[1]
    judged = next(f for f in report.fits if f.name == fits.model)
    assert fits.value == judged.r2 == max(f.r2 for f in report.fits if f.r2 is not None)
    assert report.break_even is not None and report.break_even.links[0].name == "seed-layerwise-50ms"
    assert SweepReport.model_validate_json(report.model_dump_json()) == report


def test_a_report_that_contradicts_itself_is_refused(report: SweepReport) -> None:
    body = json.loads(report.model_dump_json())
    body["criteria"][1]["status"] = "FAIL" if body["criteria"][1]["status"] == "PASS" else "PASS"
    with pytest.raises(ValidationError, match="contradicts itself: model_fits: status"):
        SweepReport.model_validate(body)
    body = json.loads(report.model_dump_json())
    body["fits"][1]["r2"] = 0.5  # the models section and the verdict disagree
    with pytest.raises(ValidationError, match="contradicts itself"):
        SweepReport.model_validate(body)


def test_the_console_summary_prints_the_report(run: Path, tmp_path: Path) -> None:
    console = Console(record=True, width=200)
    print_summary(run, console)
    text = console.export_text()
    assert "PASS model fits" in text and "judged: R² of the step model" in text
    assert "beside it: seed 002's product model R² = " in text
    assert "CV step" in text and (run / "interference_table.csv").is_file()
    console = Console(record=True, width=200)
    print_summary(tmp_path / "missing", console)
    assert "no table written: run folder" in console.export_text()


def test_a_run_too_small_to_fit_says_so_instead_of_failing(tmp_path: Path) -> None:
    run = synthesize_run(
        tmp_path / "small", chunks=(2048,), decode_batches=(2,), prefill_tokens=(512, 1024), repetitions=2
    )
    console = Console(record=True, width=200)
    print_summary(run, console)
    text = console.export_text()
    assert "N/A model fits" in text and "judged: no model could be fitted (the notes say why)" in text
    assert "note: model fits skipped: " in text and "PASS break-even exists" in text
