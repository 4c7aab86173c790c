"""The sweep's ETA: remaining points predicted from the measured ones by (D, P), on hand-built times."""

from __future__ import annotations

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
    by_d = [((d, 1024), 1.0 + d) for d in (1, 2, 4) for _ in range(2)]
    assert remaining_s(by_d, [(8, 1024)]) == pytest.approx(9.0)


@pytest.mark.parametrize("fraction", [0.5, 0.75])
def test_from_half_of_the_seed_grid_on_the_eta_is_within_a_quarter_of_the_truth(fraction: float) -> None:
    grid = _grid(SEED_D, 5)
    done = int(len(grid) * fraction)
    measured = [(pt, _cost(*pt)) for pt in grid[:done]]
    truth = sum(_cost(*pt) for pt in grid[done:])
    eta = remaining_s(measured, grid[done:])
    assert eta is not None and abs(eta - truth) / truth < 0.25, (eta, truth)
    # a rate over the points so far (the best a rate can do) is further off
    rate = sum(s for _, s in measured) / done * (len(grid) - done)
    assert abs(eta - truth) < abs(rate - truth)


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


def test_a_decode_batch_size_enters_the_fit_only_once_measured_at_every_p() -> None:
    ps = [256, 1024, 2048, 4096]
    pts = [(d, p) for d in (0, 2) for _ in range(2) for p in ps]
    measured = [(pt, 0.4 + 0.001 * i) for i, pt in enumerate(pts)]  # a little noise, as measured
    measured.append(((4, 256), 20.0))  # D = 4's first point carries its batch's start
    remaining = [(4, p) for p in ps[1:]] + [(8, p) for _ in range(2) for p in ps]
    eta = remaining_s(measured, remaining)
    assert eta is not None and eta == pytest.approx(0.41 * len(remaining), rel=0.25)
