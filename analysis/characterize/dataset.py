"""The characterization dataset: one Parquet table across runs, rows only ever added (seed 001 §V-B).

A row is one users level of one configuration: what ran (model, device, engine and version, settings,
the configuration's name), the load (users), and its measurements with percentiles: TTFT, nTTFT (TTFT per
input token), ITL (per-request inter-token time), E2E, throughputs. ``append_rows`` holds a file lock
beside the table while it adds rows (read, concatenate, write to a temporary file, rename), so two runs
appending at once both land and a reader never sees half a table; existing rows are never changed.
``read_dataset`` checks the columns and the schema version.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import filelock
import pandas as pd
from pydantic import Field

from benchcore.atomic import atomic_write_bytes
from benchcore.schema import StrictModel

__all__ = [
    "DATASET_VERSION",
    "METRICS",
    "PERCENTILES",
    "DatasetError",
    "DatasetRow",
    "append_rows",
    "read_dataset",
]

DATASET_VERSION: Literal[1] = 1
METRICS = ("ttft_s", "nttft_s_per_token", "itl_s", "e2e_s")
PERCENTILES = ("mean", "p50", "p90", "p99")


class DatasetError(ValueError):
    """The dataset cannot be read or written as asked; the message says why."""


class DatasetRow(StrictModel):
    """One users level of one configuration."""

    dataset_version: Literal[1] = DATASET_VERSION
    run_id: str
    created_utc: str
    config: str = Field(..., description="the configuration's name (device × settings)")
    model: str
    device: str = Field(..., description="GPU name, or the CPU model where no GPU")
    engine: str
    engine_version: str | None
    budget: int | None = Field(..., description="max-num-batched-tokens")
    max_num_seqs: int | None
    settings_json: str = Field(..., description="every engine setting, as JSON")
    workload: str
    users: int
    requests: int
    succeeded: int
    window_s: float | None
    request_rps: float
    output_tps: float
    input_tps: float
    ttft_s_mean: float | None
    ttft_s_p50: float | None
    ttft_s_p90: float | None
    ttft_s_p99: float | None
    nttft_s_per_token_mean: float | None
    nttft_s_per_token_p50: float | None
    nttft_s_per_token_p90: float | None
    nttft_s_per_token_p99: float | None
    itl_s_mean: float | None
    itl_s_p50: float | None
    itl_s_p90: float | None
    itl_s_p99: float | None
    e2e_s_mean: float | None
    e2e_s_p50: float | None
    e2e_s_p90: float | None
    e2e_s_p99: float | None
    level_rule: str


COLUMNS = list(DatasetRow.model_fields)


def append_rows(path: Path, rows: Sequence[DatasetRow]) -> int:
    """Add ``rows`` to the table at ``path`` (created if absent); the number of rows it then holds."""
    if not rows:
        return len(read_dataset(path)) if path.exists() else 0
    path.parent.mkdir(parents=True, exist_ok=True)
    new = pd.DataFrame([r.model_dump() for r in rows], columns=COLUMNS)
    with filelock.FileLock(str(path) + ".lock", timeout=60):
        table = pd.concat([read_dataset(path), new], ignore_index=True) if path.exists() else new
        buf = io.BytesIO()
        table.to_parquet(buf, index=False)
        atomic_write_bytes(path, buf.getvalue())
    return len(table)


def read_dataset(path: Path) -> pd.DataFrame:
    """The table at ``path``, its columns checked (``DatasetError`` naming what is wrong)."""
    try:
        table = pd.read_parquet(path)
    except FileNotFoundError:
        raise DatasetError(
            f"{path}: no such dataset; `python -m microbench.characterize` writes one"
        ) from None
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{path}: not a readable Parquet table ({exc})") from None
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise DatasetError(
            f"{path}: not a characterization dataset (columns missing: {', '.join(missing[:5])})"
        )
    versions = set(table["dataset_version"].unique().tolist())
    if versions - {DATASET_VERSION}:
        raise DatasetError(f"{path}: dataset versions {sorted(versions)}; this suite reads {DATASET_VERSION}")
    return table
