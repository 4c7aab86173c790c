"""Figures and the report of a synthesised run: what they show, not only that they were drawn."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from analysis import plots
from analysis.breakeven import breakeven_table, load_link, load_model_kv
from analysis.criteria import success_criteria
from analysis.models import fit_step_model
from analysis.report import main, pick_timeline_record
from analysis.sweep_report import SweepReport
from analysis.synthetic import synthesize_run
from analysis.table import interference_table, load_raw, load_records


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_run(
        tmp_path_factory.mktemp("pr") / "syn", chunks=(2048, 8192), decode_batches=(0, 2, 4, 8),
        prefill_tokens=(512, 4096, 16384), repetitions=2, invalid_points=[(2048, 4, 4096, 0)],
    )  # fmt: skip


def test_heatmaps_show_the_table(run: Path) -> None:
    table = interference_table(run)
    fig = plots.penalty_heatmaps(table)
    assert isinstance(fig, Figure)
    heatmaps = [ax for ax in fig.axes if ax.get_title().startswith("chunk")]
    assert [ax.get_title() for ax in heatmaps] == ["chunk 2048", "chunk 8192"]
    labels = {t.get_text() for t in heatmaps[0].texts}
    expected = table[(table.chunk_size == 2048) & (table.decode_batch_size > 0)].penalty_ratio
    assert {format(v, ".3g") for v in expected} == labels  # 3 D × 3 P cells, D = 0 left out
    assert [t.get_text() for t in heatmaps[0].get_xticklabels()] == ["512", "4096", "16384"]


def test_offload_region_labels_the_decision(run: Path) -> None:
    table = interference_table(run)
    cells = breakeven_table(
        table, load_model_kv("Qwen3-Coder-30B-A3B-Instruct"), load_link("seed-layerwise-50ms")
    )
    fig = plots.offload_region(cells, 8192)
    ax = fig.axes[0]
    texts = [t.get_text().split("\n")[0] for t in ax.texts]
    wins = cells[(cells.chunk_size == 8192) & (cells.decode_batch_size > 0)].offload_wins
    assert texts.count("offload") == int(wins.sum()) and texts.count("local") == int((~wins).sum())


def test_timeline_and_fit_figures(run: Path, tmp_path: Path) -> None:
    records = load_records(run)
    record = pick_timeline_record(records)
    assert record is not None and record.config.chunk_size == 8192 and record.config.decode_batch_size == 4
    fig = plots.injection_timeline(load_raw(run, record), record)
    stream_ax = fig.axes[0]
    assert len(stream_ax.lines) >= record.config.decode_batch_size  # one segment per gap and stream
    assert f"P={record.config.new_prefill_tokens}" in stream_ax.get_title()
    fig.savefig(tmp_path / "t.png")
    assert (tmp_path / "t.png").stat().st_size > 10_000
    assert "R² = " in plots.step_fit_diagnostics(fit_step_model(records)).axes[0].get_title()
    assert plots.chunk_sensitivity(interference_table(run)).axes[0].get_ylabel().startswith("prefill chunks")


def test_success_criteria_statuses(run: Path) -> None:
    table = interference_table(run)
    crit = success_criteria(table, None)
    assert [c.status for c in crit] == ["PASS", "N/A", "PASS", "PASS"]
    low = table.assign(penalty_ratio=1.05)
    assert success_criteria(low, None)[0].status == "FAIL"


def test_report_files(run: Path, tmp_path: Path) -> None:
    assert main([str(run), "--out", str(tmp_path / "rep"), "--link", "roce-4x200g"]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    html = (tmp_path / "rep" / "report.html").read_text()
    for fig in re.findall(r"!\[[^]]*\]\((figures/[^)]+\.png)\)", md):
        assert (tmp_path / "rep" / fig).stat().st_size > 5_000
    assert md.count("![") == html.count("data:image/png;base64,") >= 6
    assert not re.search(r'src="(?!data:)', html)  # self-contained: no external image
    assert "| PASS |" in md and "## Manifest" in md and '"run_id": "syn"' in md
    assert "1 invalid attempts excluded" in md
    assert "| R² of the step model (" in md and "penalty_last_step_ms" in md  # the current penalty
    assert "<td>" in html and "| PASS |" not in html  # the page is rendered, not Markdown pasted in
    assert not (tmp_path / "rep" / "interference_table.csv").exists()  # the run's table is the sweep's
    back = SweepReport.model_validate_json((tmp_path / "rep" / "report.json").read_text())
    assert back.run_id == "syn" and [c.key for c in back.criteria][1] == "model_fits"
    assert main([str(tmp_path / "nope")]) == 2
