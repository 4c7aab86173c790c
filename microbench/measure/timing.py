"""Where a job's wall time went, by named phase (``with timing.phase(name):``); the rest is "other"."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["Timing"]


@dataclass
class Timing:
    """Where the wall time went, by phase (``with timing.phase(name):``); the rest is "other".

    Phases the interference shard uses: ``engine start`` (and restarts), ``measurement windows`` (Phase 1
    baselines with their wait for steady state, and every injection's window), ``warm-up`` (warm-up
    probes and the shared prefix), ``idle waits`` (until the engine runs nothing before a batch or a bare
    point), ``store + derive`` (writing a point's files and deriving its record from them).
    """

    t0: float = field(default_factory=time.perf_counter)
    spent: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self.spent[name] = self.spent.get(name, 0.0) + time.perf_counter() - t

    def report(self) -> str:
        wall = time.perf_counter() - self.t0
        start = self.spent.get("engine start", 0.0)
        other = max(wall - sum(self.spent.values()), 0.0)
        after = max(wall - start, 1e-9)
        parts = [f"{name} {s:.1f} s" for name, s in self.spent.items() if name != "engine start"]
        return (
            f"wall {wall:.1f} s = engine start {start:.1f} s + "
            + " + ".join([*parts, f"other {other:.1f} s"])
            + f"; after engine start: measurement windows "
            f"{self.spent.get('measurement windows', 0.0) / after:.0%}"
        )
