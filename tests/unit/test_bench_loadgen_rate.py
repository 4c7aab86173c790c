"""scripts/bench_loadgen_rate.py: where the sims and the workers run, and the scaling figure per N."""

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "bench_loadgen_rate", Path(__file__).resolve().parents[2] / "scripts" / "bench_loadgen_rate.py"
)
assert _SPEC is not None and _SPEC.loader is not None
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def test_workers_are_pinned_below_the_sims_or_share_the_cores_when_they_do_not_fit() -> None:
    cores = list(range(16))
    assert [bench.placement(cores, n, 8) for n in (1, 2, 4, 8)] == [[0], [0, 1], [0, 1, 2, 3], cores[:8]]
    assert bench.placement(cores, 9, 8) is None
    assert bench.placement([0, 1], 1, 1) == [0] and bench.placement([0, 1], 2, 1) is None  # this box
    with pytest.raises(ValueError, match=r"2 sim process.*may use 2"):
        bench.placement([0, 1], 1, 2)


def test_scaling_is_each_worker_counts_knee_and_peak_over_one_workers() -> None:
    knee = {"timer": 30000.0, "1": 4000.0, "2": 8000.0, "4": 12000.0, "8": None}
    peak = {"timer": 30000.0, "1": 5000.0, "2": 9800.0, "4": 16000.0, "8": 20000.0}
    assert bench.scaling(knee, peak) == {
        "2": {"knee_ratio": 2.0, "peak_ratio": 1.96, "aim": 1.8},
        "4": {"knee_ratio": 3.0, "peak_ratio": 3.2, "aim": 3.6},
        "8": {"knee_ratio": None, "peak_ratio": 4.0, "aim": 7.2},
    }
