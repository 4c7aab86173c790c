"""Where a stage's late sends came from: the collector passes of its sending window, lined up with them.

A collector pass stops the event loop; a send due during it, or due while the loop works off what piled
up behind it, goes out late. ``gc_lateness`` counts the passes that began in the sending window (stage
start to the end of issuing) by generation, their total and longest pause, the sends later than
``late_ms``, and how many of those a pass could explain: one was running or had ended at most
``reach_ms`` before the send was due. Beside that count, the share of the window that lies so near a
pass: the share of late sends that chance alone would put there. Pure: stamps in, figures out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from microbench.client.aio import GcPass

__all__ = ["gc_lateness"]


def gc_lateness(
    passes: Sequence[GcPass],
    window_ns: tuple[int, int],
    sends_ns: Sequence[tuple[int, int]],
    late_ms: float = 1.0,
    reach_ms: float = 5.0,
) -> dict[str, Any]:
    """``sends_ns``: (intended, actual) send stamps; ``passes``: the collector's, same clock."""
    t0, t1 = window_ns
    inside = sorted((p for p in passes if t0 <= p.start_ns <= t1), key=lambda p: p.start_ns)
    pauses = [(p.end_ns - p.start_ns) / 1e6 for p in inside]
    reach = int(reach_ms * 1e6)
    starts = np.array([p.start_ns for p in inside], dtype=np.int64)
    ends = np.array([p.end_ns for p in inside], dtype=np.int64)
    late = [(i, a) for i, a in sends_ns if a - i > late_ms * 1e6]
    near = sum(bool(np.any((starts <= actual) & (ends + reach >= intended))) for intended, actual in late)
    return {
        "passes_by_generation": [sum(p.generation == g for p in inside) for g in range(3)],
        "pause_total_ms": float(sum(pauses)),
        "pause_max_ms": float(max(pauses, default=0.0)),
        "late_sends": len(late),
        "late_sends_near_a_pass": near,
        "window_share_near_a_pass": _covered(starts, ends + reach, t0, t1) / (t1 - t0) if t1 > t0 else 0.0,
    }


def _covered(starts: np.ndarray, ends: np.ndarray, t0: int, t1: int) -> int:
    """Nanoseconds of [t0, t1] inside the union of the intervals [starts, ends] (sorted by start)."""
    total, reached = 0, t0
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        s, e = max(s, reached), min(e, t1)
        if e > s:
            total += e - s
            reached = e
    return total
