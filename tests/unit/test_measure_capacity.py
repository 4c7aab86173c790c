"""The capacity measurement runs on any stage runner: here a synthetic engine of known capacity."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pandas as pd
import pytest
from fixtures.latencies import latencies

from microbench.client.requests import RequestSpec
from microbench.loadgen.stages import Stage
from microbench.measure.capacity import CapacityPlan, capacity_ledger, measure_capacity
from microbench.measure.runs import Run, StageWindow

SLOTS, SERVICE_S, DURATION_S = 8, 0.5, 20.0  # capacity: 8 / 0.5 s = 16 req/s


def _closed(c: int) -> pd.DataFrame:
    """c back-to-back streams; past the engine's slots every request waits its turn."""
    e2e = SERVICE_S * max(1.0, c / SLOTS)
    send = np.repeat(np.arange(0.0, DURATION_S, e2e), c)
    return latencies(send, send + e2e)


def _open(rate: float) -> pd.DataFrame:
    """Evenly spaced arrivals; completions at most SLOTS / SERVICE_S per second (a queue grows beyond)."""
    send = np.arange(0.0, DURATION_S, 1 / rate)
    done = np.empty_like(send)
    last = -np.inf
    for i, t in enumerate(send):
        last = done[i] = max(t + SERVICE_S, last + SERVICE_S / SLOTS)
    return latencies(send, done)


class SyntheticEngine:
    """A ``StageRunner``: reads the level from the label the capacity measurement gives it."""

    def __init__(self) -> None:
        self.labels: list[str] = []

    async def __call__(self, label: str, stages: list[Stage], base_url: str | None = None) -> Run:
        self.labels.append(label)
        if m := re.fullmatch(r"capacity/closed/c(\d+)", label):
            lat = _closed(int(m.group(1)))
        else:
            lat = _open(float(label.removeprefix("capacity/rate-")))
        end = float(lat["done_s"].max())
        return Run(lat, lat, {"level": StageWindow("level", lat, 0.0, DURATION_S, end)}, [])


def _requests() -> Iterator[RequestSpec]:
    while True:
        yield RequestSpec(prompt=[1] * 100, prompt_tokens=100, max_tokens=10)


async def test_capacity_of_a_synthetic_engine_is_its_service_rate() -> None:
    engine = SyntheticEngine()
    plan = CapacityPlan(
        start_concurrency=1, max_concurrency=64, level_duration_s=DURATION_S, closed_ttft_p99_ms=1e4,
        search_probes=6,
    )  # fmt: skip
    search = await measure_capacity(engine, _requests, plan)
    # the ramp doubles while throughput rises and stops after two levels that do not beat 8's
    assert [r.offered for r in search.closed_loop] == [1, 2, 4, 8, 16, 32]
    assert search.closed_rps == pytest.approx(SLOTS / SERVICE_S, rel=0.05)
    assert search.sustainable_rps is not None
    assert 0.9 * 16 <= search.sustainable_rps <= 1.001 * search.closed_rps
    assert any(not s.passed for s in search.search)  # it found a saturated level above
    entries = capacity_ledger(search, "5.2")
    assert len(entries) == len(engine.labels) == len(search.closed_loop) + len(search.open_loop)
    assert entries[0].label == "closed loop, concurrency 1" and entries[-1].test == "5.2"
