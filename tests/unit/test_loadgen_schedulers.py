"""Schedulers: rate and CV on large seeded samples, determinism, closed-loop and trace kinds, validation."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from microbench.workloads.schedulers import SCHEDULERS, parse_scheduler, weibull_shape_for_cv

N = 200_000


def _gaps(spec: dict[str, object], n: int = N) -> np.ndarray:
    offsets = np.fromiter(itertools.islice(parse_scheduler(spec).offsets_ns(), n), dtype=np.int64, count=n)
    assert offsets[0] == 0
    assert np.all(np.diff(offsets) >= 0)
    return np.diff(offsets) / 1e9


@pytest.mark.parametrize(
    ("spec", "cv"),
    [
        ({"kind": "poisson", "rate": 250.0, "seed": 3}, 1.0),
        ({"kind": "gamma", "rate": 40.0, "cv": 3.0, "seed": 3}, 3.0),
        ({"kind": "gamma", "rate": 40.0, "cv": 0.5, "seed": 3}, 0.5),
        ({"kind": "weibull", "rate": 10.0, "cv": 2.0, "seed": 3}, 2.0),
        ({"kind": "weibull", "rate": 10.0, "cv": 0.7, "seed": 3}, 0.7),
        ({"kind": "uniform", "rate": 100.0}, 0.0),
        ({"kind": "uniform", "rate": 100.0, "jitter": 0.6, "seed": 1}, 0.6 / np.sqrt(3)),
    ],
)
def test_mean_rate_and_cv_match_the_parameters(spec: dict[str, object], cv: float) -> None:
    gaps = _gaps(spec)
    rate = float(spec["rate"])  # type: ignore[arg-type]
    assert 1 / gaps.mean() == pytest.approx(rate, rel=0.02 * max(cv, 0.5))
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.04, abs=1e-9)


def test_same_seed_same_times_other_seed_other_times() -> None:
    a = _gaps({"kind": "gamma", "rate": 5, "cv": 2, "seed": 7}, 1000)
    b = _gaps({"kind": "gamma", "rate": 5, "cv": 2, "seed": 7}, 1000)
    c = _gaps({"kind": "gamma", "rate": 5, "cv": 2, "seed": 8}, 1000)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


def test_times_cross_block_boundaries_without_a_jump() -> None:
    gaps = _gaps({"kind": "uniform", "rate": 1000}, 10_000)  # blocks of 4096 are drawn at a time
    assert np.allclose(gaps, 1e-3, atol=2e-9)


def test_max_throughput_and_concurrency() -> None:
    assert set(itertools.islice(parse_scheduler({"kind": "max_throughput"}).offsets_ns(), 100)) == {0}
    closed = parse_scheduler({"kind": "concurrency", "concurrency": 8})
    assert closed.in_flight_limit == 8
    assert closed.requested_rate is None
    assert parse_scheduler({"kind": "poisson", "rate": 3}).in_flight_limit is None


def test_sweep_points_change_only_the_axis() -> None:
    base = parse_scheduler({"kind": "gamma", "rate": 1, "cv": 2, "seed": 4})
    point = base.with_load(16)
    assert point.model_dump() == {"kind": "gamma", "seed": 4, "rate": 16.0, "cv": 2.0}
    assert parse_scheduler({"kind": "concurrency", "concurrency": 1}).with_load(32).in_flight_limit == 32
    with pytest.raises(ValueError, match="no rate or concurrency"):
        parse_scheduler({"kind": "max_throughput"}).with_load(3)


def test_trace_replay_from_csv_and_text(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("timestamp,x\n10.5,1\n10.0,2\n12.0,3\n")
    sched = parse_scheduler({"kind": "trace", "path": str(csv), "speedup": 2})
    assert list(sched.offsets_ns()) == [0, 250_000_000, 1_000_000_000]
    assert sched.requested_rate == pytest.approx(2 / 1.0)
    txt = tmp_path / "t.txt"
    txt.write_text("1000\n3000\n")
    assert list(parse_scheduler({"kind": "trace", "path": str(txt), "unit": "ms"}).offsets_ns()) == [0, 2e9]
    with pytest.raises(ValueError, match="no column 'when'"):
        list(parse_scheduler({"kind": "trace", "path": str(csv), "column": "when"}).offsets_ns())


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "poisson", "rate": 0}, "rate: Input should be greater than 0"),
        ({"kind": "poisson", "rate": float("nan")}, "rate: Input should be a finite number"),
        ({"kind": "poisson", "rate": 1, "burst": 2}, "burst: Extra inputs are not permitted"),
        ({"kind": "fast", "rate": 1}, "unknown scheduler 'fast'"),
        (
            {"kind": "concurrency", "concurrency": 0},
            "concurrency: Input should be greater than or equal to 1",
        ),
        ({"kind": "trace", "path": "/nonexistent.csv"}, "does not exist"),
    ],
)
def test_invalid_specs_say_what_is_wrong(spec: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse_scheduler(spec)


def test_registry_lists_every_kind() -> None:
    assert SCHEDULERS.names() == [
        "concurrency", "gamma", "max_throughput", "poisson", "trace", "uniform", "weibull",
    ]  # fmt: skip


@pytest.mark.parametrize("cv", [0.2, 0.5, 1.0, 2.0, 5.0])
def test_weibull_shape_inverts_cv(cv: float) -> None:
    from math import exp, lgamma, sqrt

    k = weibull_shape_for_cv(cv)
    assert sqrt(exp(lgamma(1 + 2 / k) - 2 * lgamma(1 + 1 / k)) - 1) == pytest.approx(cv, rel=1e-6)
