"""The sweep's ETA: remaining points predicted from the measured ones by P, on hand-built point times."""

from __future__ import annotations

import pytest

from microbench.sweep.eta import PointClock, remaining_s

PS = [512, 1024, 2048, 4096, 8192, 16384, 32768]


def _cost(d: int, p: int) -> float:
    """A point's seconds in a made-up run: a fixed part, a part growing with D, one growing with P."""
    return 2.0 + 0.3 * d + p / 4096


def _grid(ds: list[int], reps: int) -> list[tuple[int, int]]:
    return [(d, p) for d in ds for _ in range(reps) for p in PS]


def test_no_estimate_before_three_points() -> None:
    assert remaining_s({512: [1.0, 1.1]}, [1024] * 10) is None
    assert remaining_s({512: [1.0, 1.1], 1024: [2.0]}, [1024] * 10) == pytest.approx(20.0)


def test_a_p_not_measured_yet_comes_from_a_line_through_the_per_p_means() -> None:
    times = {512: [1.0, 1.0], 1024: [2.0], 2048: [4.0]}  # 1 s per 512 tokens, through the origin
    assert remaining_s(times, [4096, 8192]) == pytest.approx(8.0 + 16.0)
    # below the measured range the line never goes under the cheapest P's mean
    assert remaining_s({1024: [2.0], 2048: [4.0], 4096: [8.0]}, [16]) == pytest.approx(2.0)
    # one P known: its mean stands for every P
    assert remaining_s({512: [3.0, 3.0, 3.0]}, [512, 32768]) == pytest.approx(6.0)


def test_a_measured_p_is_predicted_by_its_latest_times() -> None:
    times = {512: [1.0] * 5 + [3.0] * 5, 1024: [9.0]}  # the later (larger-D) points cost more
    assert remaining_s(times, [512], recent=5) == pytest.approx(3.0)


def test_at_half_of_the_seed_grid_the_eta_is_within_a_quarter_of_the_truth() -> None:
    # seed 002's grid (7 D × 5 repetitions × 7 P, D outer, P inner), points costing more with D and P
    grid = _grid([0, 1, 2, 4, 6, 8, 12], 5)
    half = len(grid) // 2
    times: dict[int, list[float]] = {}
    for d, p in grid[:half]:
        times.setdefault(p, []).append(_cost(d, p))
    truth = sum(_cost(d, p) for d, p in grid[half:])
    eta = remaining_s(times, [p for _, p in grid[half:]])
    assert eta is not None and abs(eta - truth) / truth < 0.25, (eta, truth)
    # a rate over all points so far (the old way's best case) would be further off
    rate = sum(map(sum, times.values())) / half * (len(grid) - half)
    assert abs(eta - truth) < abs(rate - truth)


def test_from_the_third_point_of_a_run_there_is_an_eta(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("microbench.sweep.eta.time.monotonic", lambda: now[0])
    grid = _grid([0, 4], 1)
    clock = PointClock(p for _, p in grid)
    now[0] += 60.0  # engine start and warm-up: no point's time
    clock.restart()
    etas = []
    for d, p in grid[:4]:
        now[0] += _cost(d, p)
        clock.finished(p)
        etas.append(clock.eta_s())
    assert etas[:2] == [None, None] and None not in etas[2:]
    assert clock.times[512] == [pytest.approx(_cost(0, 512))]  # the 60 s before went to no point
    assert sum(clock.left.values()) == len(grid) - 4
