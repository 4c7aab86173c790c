"""The battery's progress as it runs: a line per finished test with an ETA, a line a minute per load run.

``Progress`` rescales the plan's remaining estimates (``plan.estimate_plan``) by how the finished tests
compared with theirs. ``progress_line`` (pure) is the line a long load run prints every minute while it
goes (5.1 conformant alone runs for about half an hour).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from benchcore.flags import hms
from microbench.battery.plan import CAPACITY_ROW, PlanRow

__all__ = ["Progress", "progress_line"]


class Progress:
    """Prints one line per finished test: elapsed time and an ETA rescaled by the estimates so far."""

    def __init__(self, rows: list[PlanRow], emit: Callable[[str], None] = print) -> None:
        self.estimates = {r.name: r.seconds for r in rows}
        self.total = sum(r.seconds for r in rows)
        self.t0 = time.monotonic()
        self.done_est = 0.0
        self.emit = emit
        self.count = 0

    def finished(self, name: str, status: str, planned: int) -> None:
        self.count += 1
        self.done_est += self.estimates.get(name, 0.0)
        if self.count == 1 and CAPACITY_ROW in self.estimates:
            self.done_est += self.estimates[CAPACITY_ROW]
        elapsed = time.monotonic() - self.t0
        scale = elapsed / self.done_est if self.done_est > 0 else 1.0
        eta = max(self.total - self.done_est, 0.0) * scale
        self.emit(f"[{self.count}/{planned}] {name}: {status}; elapsed {hms(elapsed)}, ETA {hms(eta)}")


def progress_line(
    label: str, done: int, elapsed_s: float, planned_requests: int | None, planned_s: float | None
) -> str:
    """One progress line of a running load run: requests finished so far and the time left.

    A run bounded by a request count extrapolates from its completion rate so far; one bounded by a
    duration (or both) counts down its issuing time; with neither, no ETA is given.
    """
    parts = [f"  {label}: {done:,}" + (f"/{planned_requests:,}" if planned_requests else "") + " requests"]
    parts.append(f"{hms(elapsed_s)} in")
    left = []
    if planned_requests and done > 0:
        left.append(elapsed_s / done * max(planned_requests - done, 0))
    if planned_s is not None:
        left.append(max(planned_s - elapsed_s, 0.0))
    if left:
        parts.append(f"about {hms(min(left))} left")
    return ", ".join(parts)
