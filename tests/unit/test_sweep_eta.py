"""The sweep's ETA: remaining points predicted from the measured ones by (D, P), on hand-built times."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from microbench.sweep.eta import PointClock, remaining_s

PS = [512, 1024, 2048, 4096, 8192, 16384, 32768]
SEED_D = [0, 1, 2, 4, 6, 8, 12]


def _cost(d: int, p: int) -> float:
    """A point's seconds in a made-up run: bare points cheap, batched ones dearer with D, all with P."""
    return 0.3 + p / 16384 if d == 0 else 1.5 + 0.3 * d + p / 4096 * (1 + d / 8)


def _grid(ds: list[int], reps: int) -> list[tuple[int, int]]:
    return [(d, p) for d in ds for _ in range(reps) for p in PS]


def test_no_estimate_before_three_points() -> None:
    assert remaining_s([((0, 512), 1.0), ((0, 512), 1.1)], [(0, 1024)] * 10) is None
    assert remaining_s([((0, 512), 2.0)] * 3, [(0, 1024)] * 10) == pytest.approx(20.0)  # one P: its mean


def test_unmeasured_p_and_d_come_from_the_line_through_the_measured_ones() -> None:
    measured = [((4, p), p / 512) for p in (512, 1024, 2048)]  # 1 s per 512 tokens
    assert remaining_s(measured, [(4, 4096), (4, 8192)]) == pytest.approx(8.0 + 16.0)
    # never below the cheapest point measured
    assert remaining_s(measured, [(4, 16)]) == pytest.approx(1.0)
    # D is no axis to extrapolate along (see microbench.sweep.eta): a batched point costs the batched mean
    by_d = [((d, 1024), 1.0 + d) for d in (1, 2, 4) for _ in range(2)] + [((0, 1024), 0.5)] * 2
    assert remaining_s(by_d, [(8, 1024), (0, 1024)]) == pytest.approx(10 / 3 + 0.5)


POINT_TIMES = Path(__file__).resolve().parents[1] / "fixtures" / "sweep_point_times.csv"


@pytest.mark.parametrize("run", ["cpu-8192-a", "cpu-8192-b"])
def test_at_half_of_a_real_main_job_the_eta_is_within_a_quarter_of_the_truth(run: str) -> None:
    # Two real `--chunk 8192` runs on the CPU engine (2026-11-25, 245 points each): each point's seconds
    # from one injection to the next, in the order measured, and the real time left after it.
    rows = [r for r in csv.DictReader(POINT_TIMES.open()) if r["run"] == run]
    points = [((int(r["decode_batch"]), int(r["prefill_tokens"])), float(r["seconds"])) for r in rows]
    half = len(points) // 2
    truth = float(rows[half - 1]["remaining_truth_s"])
    eta = remaining_s(points[:half], [pt for pt, _ in points[half:]])
    assert eta is not None and abs(eta - truth) / truth < 0.25, (eta, truth)


def test_the_clock_charges_engine_starts_to_no_point_and_predicts_the_ones_ahead(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr("microbench.sweep.eta.time.monotonic", lambda: now[0])
    grid = [(chunk, d, p) for chunk in (2048, 8192) for d, p in _grid([0, 4], 1)]
    clock = PointClock(grid)
    now[0] += 60.0  # engine start and warm-up of the first chunk
    clock.measuring(2048)
    etas = []
    for chunk, d, p in grid[:4]:
        now[0] += _cost(d, p)
        clock.finished(chunk, d, p)
        etas.append(clock.eta_s())
    assert etas[:2] == [None, None] and None not in etas[2:]
    assert clock.measured[0] == ((0, 512), pytest.approx(_cost(0, 512)))  # the 60 s went to no point
    points_only = remaining_s(clock.measured, [(d, p) for _, d, p in clock.left.elements()])
    assert points_only is not None and etas[-1] == pytest.approx(points_only + 60.0)  # chunk 8192's start
    assert sum(clock.left.values()) == len(grid) - 4


def test_a_batch_start_is_spread_over_its_points_so_every_batch_ahead_pays_one() -> None:
    ps = [256, 1024, 2048, 4096]
    # one decode batch: its first point carries the batch's start (10 s), the others take 1 s
    measured = [((2, p), 10.0 if i == 0 else 1.0) for i, p in enumerate(ps)]
    measured += [((0, p), 0.5) for p in ps]  # bare points: no start
    next_batch = [(4, p) for p in ps]
    assert remaining_s(measured, next_batch) == pytest.approx(10.0 + 3 * 1.0, rel=0.3)
    assert remaining_s(measured, [(0, 512)]) == pytest.approx(0.5)  # an unmeasured P of the bare kind
