"""End of a sweep: write ``interference_table.csv`` and print it with seed 002's success criteria.

The criteria checked here need only the table: interference is measurable (penalty ratio > 1.1 in
every cell with D ≥ 4 and P ≥ 4096) and reproducible (CV < 15% across repetitions in every cell).
The model-fit and break-even criteria belong to ``python -m analysis.report``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from analysis.table import SEED_COLUMNS, write_interference_table

__all__ = ["Criterion", "criteria", "print_summary"]

RATIO_BAR = 1.1
CV_BAR = 0.15


@dataclass(frozen=True)
class Criterion:
    name: str
    passed: bool | None  # None: no cell the criterion applies to
    detail: str


def criteria(table: pd.DataFrame) -> list[Criterion]:
    """Seed 002's table-level success criteria with pass/fail and the cells that fail."""
    out = []
    cells = table[(table.decode_batch_size >= 4) & (table.new_prefill_tokens >= 4096)]
    cells = cells[cells.penalty_ratio.notna()]
    if cells.empty:
        out.append(Criterion("penalty ratio > 1.1 for D ≥ 4, P ≥ 4096", None, "no such cell measured"))
    else:
        bad = cells[cells.penalty_ratio <= RATIO_BAR]
        out.append(
            Criterion(
                "penalty ratio > 1.1 for D ≥ 4, P ≥ 4096",
                bad.empty,
                f"{len(cells) - len(bad)}/{len(cells)} cells pass; min ratio {cells.penalty_ratio.min():.2f}"
                + (f"; failing: {_cells(bad)}" if not bad.empty else ""),
            )
        )
    cv = table[(table.repetitions >= 2) & table.cv_tpot_interference_ms.notna()]
    if cv.empty:
        out.append(Criterion("CV < 15% across repetitions", None, "no cell with ≥ 2 valid repetitions"))
    else:
        bad = cv[cv.cv_tpot_interference_ms >= CV_BAR]
        out.append(
            Criterion(
                "CV < 15% across repetitions",
                bad.empty,
                f"{len(cv) - len(bad)}/{len(cv)} cells pass; max CV {cv.cv_tpot_interference_ms.max():.1%}"
                + (f"; failing: {_cells(bad)}{_engine_spread(bad)}" if not bad.empty else ""),
            )
        )
    return out


def _engine_spread(bad: pd.DataFrame) -> str:
    """How much the engine's own prefill-step time varied in the failing cells (its step log)."""
    spread = bad.cv_step_time_mixed_ms.dropna()
    if spread.empty:
        return ""
    return (
        f"; in those cells the engine's own logged prefill-step time varied by CV {spread.min():.0%}–"
        f"{spread.max():.0%} (median {spread.median():.0%})"
    )


def _cells(df: pd.DataFrame, limit: int = 8) -> str:
    names = [f"c{r.chunk_size}/D{r.decode_batch_size}/P{r.new_prefill_tokens}" for r in df.itertuples()]
    return ", ".join(names[:limit]) + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def _fmt(v: object, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "–"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def print_summary(run_dir: Path, console: Console) -> None:
    try:
        csv = write_interference_table(run_dir)
    except ValueError as exc:  # no valid point yet
        console.print(f"no table written: {exc}")
        return
    table = pd.read_csv(csv)
    view = Table(title=f"interference table ({csv})", show_lines=False)
    cols = [*SEED_COLUMNS, "repetitions", "invalid", "cv_tpot_interference_ms"]
    heads = [
        "chunk",
        "D",
        "P",
        "base ms",
        "during ms",
        "penalty ms",
        "ratio",
        "chunks",
        "prefill ms",
        "reps",
        "inval",
        "CV",
    ]
    for h in heads:
        view.add_column(h, justify="right")
    for row in table[cols].itertuples(index=False):
        view.add_row(*(_fmt(v, 3 if c.startswith("cv") else 2) for c, v in zip(cols, row, strict=True)))
    console.print(view)
    for c in criteria(table):
        mark = {True: "[green]PASS", False: "[red]FAIL", None: "[yellow]N/A"}[c.passed]
        console.print(f"{mark}[/] {c.name}: {c.detail}")
