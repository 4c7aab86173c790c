"""The sweep's one progress line: what it does, points done of all, elapsed time and the ETA.

The ETA is the sweep's own (``sweep.eta``: measured point times by P), handed in as the task's ``eta``
field; rich's rate over the last 30 s is not used (points finish in bursts: it said "–" for whole runs).
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from benchcore.flags import hms

__all__ = ["eta_text", "progress_bar"]

NO_ETA = "–"


def eta_text(seconds: float | None) -> str:
    return NO_ETA if seconds is None else hms(seconds)


class _EtaColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(f"ETA {task.fields.get('eta', NO_ETA)}")


class _Progress(Progress):
    """Rich's live bar on a terminal; elsewhere (a log file, CI, ``nohup``), where rich draws nothing
    until the end, one plain line at most every ``every_s`` as points finish, and one at once when the
    first ETA is known. Each line says the elapsed time, so a log shows how good every ETA was."""

    def __init__(self, *columns: ProgressColumn, console: Console, every_s: float) -> None:
        super().__init__(*columns, console=console, transient=False)
        self.every_s = every_s
        self._last = time.monotonic()
        self._had_eta = False

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        if self.console.is_terminal:
            return
        task = next(t for t in self.tasks if t.id == task_id)
        eta = task.fields.get("eta", NO_ETA)
        first_eta = eta != NO_ETA and not self._had_eta
        self._had_eta = self._had_eta or eta != NO_ETA
        if not first_eta and time.monotonic() - self._last < self.every_s:
            return
        self._last = time.monotonic()
        self.console.print(
            f"{task.completed:.0f}/{task.total:.0f} points, {hms(task.elapsed or 0.0)} in, ETA {eta}"
            f" · {task.description}",
            soft_wrap=True,
        )


def progress_bar(console: Console, every_s: float = 60.0) -> Progress:
    """The progress display; add its task with ``eta=eta_text(...)`` and update ``eta`` as points end."""
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        _EtaColumn(),
    )
    return _Progress(*columns, console=console, every_s=every_s)
