"""Load a run folder into pandas and aggregate it per cell into ``interference_table.csv`` (+ Parquet).

A run folder (``results/<run-id>/``, layout in ``microbench.results.records``) holds one ``RunRecord`` per
measured point at ``runs/<chunk>/D<d>_P<p>_r<rep>.json`` and every invalid attempt under ``invalid/``.
A cell is one ``(chunk_size, decode_batch_size, new_prefill_tokens)``; its repetitions are summarised by
medians over the **valid** records only. Invalid attempts are never averaged in: they are counted in the
``invalid`` column. Statistics are computed here, when reading; the records keep the raw values.
Every derived column is against the point's local baseline (``tpot_baseline_ms``; the batch's Phase 1
baseline is ``batch_baseline_ms``, for reference only). ``tpot_penalty_ms``/``tpot_interference_ms``/
``penalty_ratio`` describe a step carrying a *full* prefill chunk, from the engine's own step record
(``microbench.results.records.Derived``; ``penalty_source`` says when it had to come from seed 002's
identity instead); the partial last chunk is ``penalty_last_step_ms``; seed 002's window-median versions
are ``tpot_interference_p50_ms`` and ``penalty_ratio_p50``. A repetition more than 3× or less than a third
of its cell's median headline (the penalty, or the prefill duration at D = 0) is an outlier: counted in
``outliers`` and left out of the cell's statistics, never averaged in.

Only pandas, numpy, ``benchcore.atomic`` and ``microbench.results.records`` are imported: the sweep calls
``write_interference_table`` at the end of a run.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchcore.atomic import atomic_write_bytes
from microbench.results.layout import RunFolder
from microbench.results.records import Manifest, RunRecord, read_record

__all__ = [
    "CELL",
    "SEED_COLUMNS",
    "TABLE_COLUMNS",
    "aggregate_cells",
    "bootstrap_median_ci",
    "find_record_files",
    "headline_column",
    "interference_table",
    "load_manifest",
    "load_raw",
    "load_records",
    "records_frame",
    "write_interference_table",
]

CELL = ["chunk_size", "decode_batch_size", "new_prefill_tokens"]

# Seed 002's "Aggregated Table" columns, in its order.
SEED_COLUMNS = [
    *CELL,
    "tpot_baseline_ms",
    "tpot_interference_ms",
    "tpot_penalty_ms",
    "penalty_ratio",
    "num_chunks",
    "prefill_duration_ms",
]

TABLE_COLUMNS = [
    *SEED_COLUMNS,
    "repetitions",
    "invalid",
    "outliers",
    "cv_penalty_ratio",
    "cv_tpot_interference_ms",
    "cv_step_time_full_chunk_ms",
    "penalty_ratio_ci_low",
    "penalty_ratio_ci_high",
    "penalty_source",
    "penalty_last_step_ms",
    "penalty_identity_ms",
    "identity_check",
    "num_chunks_expected",
    "aggregate_decode_delay_ms",
    "total_interference_ms",
    "tpot_interference_p50_ms",
    "tpot_interference_p90_ms",
    "penalty_ratio_p50",
    "batch_baseline_ms",
    "local_context_tokens",
    "decode_step_ms",
    "step_time_full_chunk_ms",
    "engine_prefill_ms",
    "frontend_ms",
    "client_lag_max_ms",
    "scheduling",
]

# Per-record columns whose medians over valid repetitions make up the table.
_MEDIAN_COLUMNS = {
    "tpot_baseline_ms": "tpot_baseline_ms",
    "tpot_interference_ms": "tpot_interference_ms",
    "tpot_penalty_ms": "tpot_penalty_ms",
    "penalty_ratio": "penalty_ratio",
    "num_chunks": "num_chunks",
    "prefill_duration_ms": "prefill_duration_ms",
    "penalty_last_step_ms": "penalty_last_step_ms",
    "penalty_identity_ms": "penalty_identity_ms",
    "identity_check": "identity_check",
    "num_chunks_expected": "num_chunks_expected",
    "aggregate_decode_delay_ms": "aggregate_decode_delay_ms",
    "total_interference_ms": "total_interference_ms",
    "tpot_interference_p50_ms": "tpot_interference_p50_ms",
    "tpot_interference_p90_ms": "tpot_interference_p90_ms",
    "penalty_ratio_p50": "penalty_ratio_p50",
    "batch_baseline_ms": "batch_baseline_ms",
    "local_context_tokens": "local_context_tokens",
    "decode_step_ms": "decode_step_ms",
    "step_time_full_chunk_ms": "step_time_full_chunk_ms",
    "engine_prefill_ms": "engine_prefill_ms",
    "frontend_ms": "frontend_ms",
    "client_lag_max_ms": "client_lag_max_ms",
}
OUTLIER_FACTOR = 3.0


def load_manifest(run_dir: Path) -> Manifest | None:
    """The run's manifest, or ``None`` when the folder has none (e.g. a run still starting)."""
    folder = RunFolder(Path(run_dir))
    return folder.read_manifest() if folder.exists() else None


def find_record_files(run_dir: Path) -> tuple[list[Path], list[Path]]:
    """``(point records, invalid attempts)`` as the run-folder layout keeps them, sorted; errors on a
    bad folder."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run folder {run_dir} does not exist")
    folder = RunFolder(run_dir)
    points, invalid = folder.point_paths(), folder.invalid_paths()
    if not points:
        raise ValueError(
            f"{run_dir} holds no run records (expected runs/<chunk>/D<d>_P<p>_r<rep>.json): "
            "is it a run folder, and has the sweep measured a point yet?"
        )
    return points, invalid


def load_records(run_dir: Path) -> list[RunRecord]:
    """Every point record under ``runs/`` (valid or not), any readable schema version."""
    points, _ = find_record_files(run_dir)
    return [read_record(p, RunRecord) for p in points]


def _row(rec: RunRecord, path: Path, source: str) -> dict[str, Any]:
    cfg, itf, der = rec.config, rec.interference, rec.derived
    return {
        "chunk_size": cfg.chunk_size,
        "decode_batch_size": cfg.decode_batch_size,
        "new_prefill_tokens": cfg.new_prefill_tokens,
        "repetition": cfg.repetition,
        "attempt": rec.validity.attempt,
        "valid": rec.validity.valid,
        "reasons": "; ".join(rec.validity.reasons),
        "source": source,
        "model": cfg.model,
        "gpu": cfg.gpu,
        "engine": cfg.engine,
        "scheduling": cfg.scheduling,
        "tpot_baseline_ms": rec.local_baseline.tpot_p50_ms if rec.local_baseline else None,
        "batch_baseline_ms": rec.baseline.tpot_p50_ms if rec.baseline else None,
        "local_context_tokens": rec.local_baseline.context_tokens if rec.local_baseline else None,
        "tpot_interference_ms": der.tpot_during_prefill_ms,
        "tpot_penalty_ms": der.tpot_penalty_ms,
        "penalty_ratio": der.penalty_ratio,
        "penalty_source": der.penalty_source,
        "penalty_last_step_ms": der.penalty_last_step_ms,
        "penalty_identity_ms": der.penalty_identity_ms,
        "identity_check": der.identity_check,
        "decode_step_ms": itf.decode_step_ms,
        "step_time_full_chunk_ms": itf.step_time_full_chunk_ms,
        "engine_prefill_ms": itf.engine_prefill_ms,
        "frontend_ms": itf.frontend_ms,
        "client_lag_max_ms": itf.client_lag_max_ms,
        "tpot_interference_p50_ms": itf.tpot_during_prefill_p50_ms,
        "tpot_interference_p90_ms": itf.tpot_during_prefill_p90_ms,
        "penalty_ratio_p50": der.tpot_penalty_ratio,
        "num_chunks": itf.num_chunks_actual,
        "num_chunks_expected": itf.num_chunks_expected,
        "num_chunks_source": itf.num_chunks_source,
        "prefill_duration_ms": itf.prefill_duration_ms,
        "n_steps_logged": len(itf.engine_steps_log),
        "total_interference_ms": der.total_interference_ms,
        "decode_tokens_delayed": der.decode_tokens_delayed,
        "aggregate_decode_delay_ms": der.aggregate_decode_delay_ms,
        "raw_file": rec.raw_file,
        "record_file": str(path),
    }


def records_frame(run_dir: Path, include_invalid_attempts: bool = True) -> pd.DataFrame:
    """One row per stored record: the point records (``source='runs'``) and, when asked, the invalid
    attempts kept under ``invalid/`` (``source='invalid'``). Missing values are NaN, never 0."""
    points, invalid = find_record_files(run_dir)
    rows = [_row(read_record(p, RunRecord), p, "runs") for p in points]
    if include_invalid_attempts:
        rows += [_row(read_record(p, RunRecord), p, "invalid") for p in invalid]
    frame = pd.DataFrame(rows)
    numeric = [c for c in _MEDIAN_COLUMNS.values() if c in frame]
    frame[numeric] = frame[numeric].astype("float64")
    return frame


def bootstrap_median_ci(
    values: Iterable[float], n_boot: int = 2000, level: float = 0.95, seed: int | list[int] = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the median; ``(nan, nan)`` with fewer than two finite values."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    if x.size < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    medians = np.median(x[rng.integers(0, x.size, size=(n_boot, x.size))], axis=1)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(medians, [tail, 1.0 - tail])
    return float(low), float(high)


def _cv(values: pd.Series) -> float:
    """Sample std / mean over finite values; NaN with fewer than two values or a zero mean."""
    x = values.dropna().to_numpy(dtype=float)
    if x.size < 2 or x.mean() == 0:
        return math.nan
    return float(x.std(ddof=1) / abs(x.mean()))


def _one_value(frame: pd.DataFrame, key: tuple[int, ...], column: str) -> Any:
    """The cell's single value of ``column`` over all its records; None when absent or mixed."""
    if column not in frame:
        return None
    cell = frame[(frame[CELL[0]] == key[0]) & (frame[CELL[1]] == key[1]) & (frame[CELL[2]] == key[2])]
    values = cell[column].dropna().unique()
    return values[0] if len(values) == 1 else None


def headline_column(d: int) -> str:
    """A cell's headline figure: the full-step penalty, or the bare prefill's duration at D = 0."""
    return "prefill_duration_ms" if d == 0 else "tpot_penalty_ms"


def _drop_outliers(group: pd.DataFrame, d: int) -> tuple[pd.DataFrame, int]:
    """A repetition whose headline (the full-step penalty; at D = 0 the prefill duration) is more than
    ``OUTLIER_FACTOR``× off the median of its cell is host noise: out of the cell's statistics, counted.
    (Seen: a bare prefill 9× its repetitions, 362 vs ≈ 40 ms, moved its cell's median from 40 to 294 ms.)"""
    values = group[headline_column(d)]
    median = values.median()
    if len(group) < 3 or not math.isfinite(median) or median <= 0:
        return group, 0
    off = (values > OUTLIER_FACTOR * median) | (values < median / OUTLIER_FACTOR)
    return group[~off], int(off.sum())


def aggregate_cells(frame: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per-cell medians over valid records, counts, CVs and a seeded bootstrap CI (``TABLE_COLUMNS``).

    ``frame`` is ``records_frame``'s output. Invalid attempts are counted once each (an attempt kept both
    as the point record and under ``invalid/`` is the same attempt). A cell with no valid record keeps its
    row, with ``repetitions`` 0 and empty statistics, so a reader sees what failed.
    """
    frame = frame.copy()
    invalid = frame[~frame["valid"]].drop_duplicates([*CELL, "repetition", "attempt"])
    invalid_counts = invalid.groupby(CELL).size()
    valid = frame[frame["valid"] & (frame["source"] == "runs")]
    rows = []
    for cell, _ in frame.groupby(CELL, sort=True):
        key = tuple(int(v) for v in cell)
        group = valid[
            (valid["chunk_size"] == key[0])
            & (valid["decode_batch_size"] == key[1])
            & (valid["new_prefill_tokens"] == key[2])
        ]
        row: dict[str, Any] = dict(zip(CELL, key, strict=True))
        group, row["outliers"] = _drop_outliers(group, key[1])
        for out, col in _MEDIAN_COLUMNS.items():
            row[out] = float(group[col].median()) if group[col].notna().any() else math.nan
        row["repetitions"] = len(group)
        row["invalid"] = int(invalid_counts.get(key, 0))
        row["cv_penalty_ratio"] = _cv(group["penalty_ratio"])
        row["cv_tpot_interference_ms"] = _cv(group["tpot_interference_ms"])
        row["cv_step_time_full_chunk_ms"] = _cv(group["step_time_full_chunk_ms"])
        sources = sorted(set(group["penalty_source"].dropna()))
        row["penalty_source"] = "+".join(sources) if sources else None
        low, high = bootstrap_median_ci(group["penalty_ratio"], n_boot=n_boot, seed=[seed, *key])
        row["penalty_ratio_ci_low"], row["penalty_ratio_ci_high"] = low, high
        row["scheduling"] = _one_value(frame, key, "scheduling")
        rows.append(row)
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    for col in [*CELL, "repetitions", "invalid", "outliers"]:
        table[col] = table[col].astype("int64")
    return table


def interference_table(run_dir: Path, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The aggregated per-cell table of a run folder (not written; see ``write_interference_table``)."""
    return aggregate_cells(records_frame(run_dir), n_boot=n_boot, seed=seed)


def write_interference_table(
    run_dir: Path, n_boot: int = 2000, seed: int = 0, table: pd.DataFrame | None = None
) -> Path:
    """Write ``<run_dir>/interference_table.csv`` and ``.parquet``; return the CSV path. ``table``: the
    run's table when the caller has aggregated it already (else it is aggregated here).

    Empty CSV fields mean "not measured" (e.g. baseline and penalty of D = 0 cells), never zero.
    """
    run_dir = Path(run_dir)
    if table is None:
        table = interference_table(run_dir, n_boot=n_boot, seed=seed)
    csv_path = run_dir / "interference_table.csv"
    atomic_write_bytes(csv_path, table.to_csv(index=False, float_format="%.6g").encode())
    parquet = io.BytesIO()
    table.to_parquet(parquet, index=False)
    atomic_write_bytes(run_dir / "interference_table.parquet", parquet.getvalue())
    return csv_path


def load_raw(run_dir: Path, record: RunRecord) -> pd.DataFrame:
    """The raw stamps of one record (columns ``stream, role, t_ns, tokens``), with ``t_ms`` added: ms
    relative to the injection's send (so the prefill window is ``[0, prefill_duration_ms]``)."""
    path = Path(run_dir) / record.raw_file
    if not path.exists():
        raise FileNotFoundError(f"raw stamps {path} of {record.run_id} are missing")
    raw = pd.read_parquet(path)
    missing = {"stream", "role", "t_ns", "tokens"} - set(raw.columns)
    if missing:
        raise ValueError(f"{path} lacks columns {sorted(missing)}")
    raw = raw.sort_values(["stream", "t_ns"]).reset_index(drop=True)
    raw["t_ms"] = (raw["t_ns"] - record.t_inject_ns) / 1e6
    return raw
