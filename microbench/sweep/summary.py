"""End of a sweep: write ``interference_table.csv`` and print the run's ``SweepReport`` (the per-cell
table and seed 002's four success criteria, each naming what it judged).

The report is the one ``analysis.report`` renders as Markdown and HTML (``analysis.sweep_report``): the
table is aggregated once, written, and printed from the same object.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from analysis.table import SEED_COLUMNS, write_interference_table

if TYPE_CHECKING:
    from analysis.sweep_report import SweepReport

__all__ = ["print_report", "print_summary"]

_COLUMNS = {  # column → header
    **dict(zip(SEED_COLUMNS, ["chunk", "D", "P", "base ms", "during ms", "penalty ms", "ratio", "chunks",
                              "prefill ms"], strict=True)),
    "repetitions": "reps", "invalid": "inval", "outliers": "outl", "cv_penalty_ratio": "CV ratio",
    "cv_step_time_full_chunk_ms": "CV step",
}  # fmt: skip
_MARKS = {"PASS": "[green]PASS", "FAIL": "[red]FAIL", "N/A": "[yellow]N/A"}


def _fmt(v: object, column: str) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:.1%}" if column.startswith("cv") else f"{v:.2f}"
    return str(v)


def print_report(report: SweepReport, console: Console, where: str) -> None:
    """The per-cell table and the success criteria of ``report`` (``where``: the table's file)."""
    view = Table(title=f"interference table ({where}); against each point's local baseline")
    for head in _COLUMNS.values():
        view.add_column(head, justify="right")
    index = [report.table.columns.index(c) for c in _COLUMNS]
    for row in report.table.rows:
        view.add_row(*(_fmt(row[i], c) for i, c in zip(index, _COLUMNS, strict=True)))
    console.print(view)
    for c in report.criteria:
        console.print(
            f"{_MARKS[c.status]}[/] {escape(c.criterion)}: {escape(c.measured)} [dim](judged: "
            f"{escape(c.judged)})",
            soft_wrap=True,
        )
        for line in c.beside:
            console.print(f"      beside it: {escape(line)}", soft_wrap=True)
    for note in report.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)


def print_summary(run_dir: Path, console: Console) -> None:
    """Aggregate the run folder once, write its table and print its report."""
    # imported here: the report's fits pull in statsmodels (≈ 3 s), which a sweep needs only at its end,
    # and --help or a refused flag not at all
    from analysis.sweep_report import analyse_run, sweep_report

    try:
        analysis = analyse_run(run_dir)
    except (ValueError, FileNotFoundError) as exc:  # no valid point yet
        console.print(f"no table written: {escape(str(exc))}")
        return
    where = str(Path(run_dir) / "interference_table.csv")
    try:
        write_interference_table(run_dir, table=analysis.table)
    except OSError as exc:  # a full disk or read-only folder: the records on disk are intact
        console.print(f"[red]no table written: {escape(str(exc))}", soft_wrap=True)
        where = "not written"
    try:
        report = sweep_report(analysis)
    except ValueError as exc:  # a report that contradicts itself is a bug, shown instead of printed
        console.print(f"[red]no report: {escape(str(exc))}", soft_wrap=True)
        return
    print_report(report, console, where)
