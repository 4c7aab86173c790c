"""End of a sweep: write ``interference_table.csv`` and print it with seed 002's four success criteria.

The criteria are computed by ``analysis.criteria`` (one place, shared with ``python -m analysis.report``);
the model-fit criterion needs the fits of ``analysis.models``, made here on the run's records.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from analysis.criteria import success_criteria
from analysis.models import compare_models
from analysis.table import SEED_COLUMNS, load_records, write_interference_table

__all__ = ["print_summary"]


def _fmt(v: object, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)):
        return "–"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _comparison(run_dir: Path) -> pd.DataFrame | None:
    try:
        return compare_models(load_records(run_dir))
    except (ValueError, KeyError, ZeroDivisionError):  # too few valid points to fit either model
        return None


def print_summary(run_dir: Path, console: Console) -> None:
    try:
        csv = write_interference_table(run_dir)
    except ValueError as exc:  # no valid point yet
        console.print(f"no table written: {exc}")
        return
    except OSError as exc:  # a full disk or read-only folder: the records on disk are intact
        console.print(f"[red]no table written: {exc}", soft_wrap=True)
        return
    table = pd.read_csv(csv)
    view = Table(title=f"interference table ({csv}); against each point's local baseline", show_lines=False)
    cols = [*SEED_COLUMNS, "repetitions", "invalid", "outliers", "cv_penalty_ratio"]
    heads = ["chunk", "D", "P", "base ms", "during ms", "penalty ms", "ratio", "chunks", "prefill ms", "reps",
             "inval", "outl", "CV"]  # fmt: skip
    for h in heads:
        view.add_column(h, justify="right")
    for row in table[cols].itertuples(index=False):
        view.add_row(*(_fmt(v, 3 if c.startswith("cv") else 2) for c, v in zip(cols, row, strict=True)))
    console.print(view)
    for c in success_criteria(table, _comparison(run_dir)).itertuples():
        mark = {"PASS": "[green]PASS", "FAIL": "[red]FAIL"}.get(c.status, "[yellow]N/A")
        console.print(f"{mark}[/] {c.criterion}: {c.measured}", soft_wrap=True)
