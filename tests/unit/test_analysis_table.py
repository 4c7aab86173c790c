"""analysis.table on synthesised run folders: columns, medians over valid records only, D = 0, 1 rep."""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

import pandas as pd
import pytest

from analysis.synthetic import synthesize_run
from analysis.table import (
    SEED_COLUMNS,
    TABLE_COLUMNS,
    bootstrap_median_ci,
    interference_table,
    load_records,
    write_interference_table,
)

INVALID = (8192, 4, 8192, 1)  # invalid first attempt, valid retry
FAILED = (2048, 2, 512, 0)  # retries spent: the point record itself is invalid


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthesize_run(
        tmp_path_factory.mktemp("runs") / "syn",
        chunks=(2048, 8192),
        decode_batches=(0, 2, 4),
        prefill_tokens=(512, 8192),
        repetitions=3,
        invalid_points=[INVALID],
        failed_points=[FAILED],
    )


def _cell(table: pd.DataFrame, chunk: int, d: int, p: int) -> pd.Series:
    row = table[
        (table.chunk_size == chunk) & (table.decode_batch_size == d) & (table.new_prefill_tokens == p)
    ]
    assert len(row) == 1
    return row.iloc[0]


def test_written_files_have_the_contract_columns(run: Path) -> None:
    path = write_interference_table(run)
    assert path == run / "interference_table.csv"
    header = path.read_text().splitlines()[0].split(",")
    assert header == TABLE_COLUMNS
    assert header[: len(SEED_COLUMNS)] == SEED_COLUMNS[:]
    assert SEED_COLUMNS[3:] == [
        "tpot_baseline_ms", "tpot_interference_ms", "tpot_penalty_ms", "penalty_ratio", "num_chunks",
        "prefill_duration_ms",
    ]  # fmt: skip
    csv_table = pd.read_csv(path)
    parquet = pd.read_parquet(run / "interference_table.parquet")
    assert list(parquet.columns) == TABLE_COLUMNS
    assert len(csv_table) == len(parquet) == 2 * 3 * 2
    pd.testing.assert_frame_equal(csv_table[["repetitions", "invalid"]], parquet[["repetitions", "invalid"]])
    assert parquet["penalty_ratio"].dropna().tolist() == pytest.approx(
        csv_table["penalty_ratio"].dropna(), rel=1e-5
    )


def test_d0_cells_leave_baseline_and_penalty_empty(run: Path) -> None:
    path = write_interference_table(run)
    rows = [r for r in csv.DictReader(path.open()) if r["decode_batch_size"] == "0"]
    assert len(rows) == 4
    for r in rows:
        for col in ("tpot_baseline_ms", "tpot_interference_ms", "tpot_penalty_ms", "penalty_ratio"):
            assert r[col] == "", (col, r[col])
        assert float(r["prefill_duration_ms"]) > 0
        assert r["repetitions"] == "3"


def test_medians_use_valid_records_only_and_invalid_are_counted(run: Path) -> None:
    table = interference_table(run)
    records = load_records(run)
    chunk, d, p, _ = FAILED
    cell = _cell(table, chunk, d, p)
    assert cell.repetitions == 2 and cell.invalid == 1
    valid = [
        r.derived.penalty_ratio
        for r in records
        if (r.config.chunk_size, r.config.decode_batch_size, r.config.new_prefill_tokens) == (chunk, d, p)
        and r.validity.valid
    ]
    assert len(valid) == 2
    assert cell.penalty_ratio == pytest.approx(statistics.median(valid))
    # the invalid record (a prefix-cache hit) is far from the valid ones: averaging it in would show
    bad = next(r for r in records if not r.validity.valid)
    assert abs(bad.derived.penalty_ratio - cell.penalty_ratio) > 0.5

    chunk, d, p, _ = INVALID
    cell = _cell(table, chunk, d, p)
    assert cell.repetitions == 3 and cell.invalid == 1
    assert (table.invalid.sum(), table.repetitions.sum()) == (2, 12 * 3 - 1)


def test_statistics_of_a_cell(run: Path) -> None:
    table = interference_table(run)
    for _, row in table[table.decode_batch_size > 0].iterrows():
        assert row.penalty_ratio_ci_low <= row.penalty_ratio <= row.penalty_ratio_ci_high
        assert 0 <= row.cv_penalty_ratio < 0.15
        assert row.num_chunks == math.ceil(row.new_prefill_tokens / (row.chunk_size - row.decode_batch_size))
        assert row.num_chunks_expected == row.num_chunks
        assert row.tpot_penalty_ms == pytest.approx(row.tpot_interference_ms - row.tpot_baseline_ms, rel=0.05)
        assert row.aggregate_decode_delay_ms > 0
    again = interference_table(run)
    pd.testing.assert_frame_equal(table, again)  # the bootstrap is seeded


def test_single_repetition(tmp_path: Path) -> None:
    run = synthesize_run(
        tmp_path / "one", chunks=(2048,), decode_batches=(0, 4), prefill_tokens=(4096,), repetitions=1
    )
    table = pd.read_csv(write_interference_table(run))
    assert table.repetitions.tolist() == [1, 1]
    row = table[table.decode_batch_size == 4].iloc[0]
    rec = next(r for r in load_records(run) if r.config.decode_batch_size == 4)
    assert row.penalty_ratio == pytest.approx(rec.derived.penalty_ratio, rel=1e-5)
    assert math.isnan(row.cv_penalty_ratio) and math.isnan(row.penalty_ratio_ci_low)


def test_bootstrap_ci() -> None:
    assert all(math.isnan(v) for v in bootstrap_median_ci([1.0]))
    low, high = bootstrap_median_ci([1.0, 2.0, 3.0, 4.0, 5.0], seed=3)
    assert 1.0 <= low <= 3.0 <= high <= 5.0
    assert (low, high) == bootstrap_median_ci([1.0, 2.0, 3.0, 4.0, 5.0], seed=3)


def test_bad_folders(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_interference_table(tmp_path / "missing")
    (tmp_path / "empty" / "runs").mkdir(parents=True)
    with pytest.raises(ValueError, match="no run records"):
        write_interference_table(tmp_path / "empty")
