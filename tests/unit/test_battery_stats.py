"""The battery's computations on synthetic data with known answers."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from microbench.battery.sections.itl import itl_level
from microbench.battery.warmup import probe_variation, settle
from microbench.measure.saturation import steady_state
from microbench.measure.scaling import fit_scaling
from microbench.measure.search import search_max
from microbench.measure.stats import (
    jain_index,
    knee_point,
    length_bucket_label,
    modality,
    optimal_point,
    saturation_point,
    starvation_rate,
    summarize,
)


def test_summarize_matches_numpy_and_handles_empty() -> None:
    values = np.arange(1, 10_001, dtype=float)
    d = summarize(values)
    assert d.count == 10_000 and d.min == 1 and d.max == 10_000
    assert d.p50 == pytest.approx(5000.5) and d.p99 == pytest.approx(np.percentile(values, 99))
    assert d.p999 == pytest.approx(np.percentile(values, 99.9))
    assert summarize([]).count == 0 and summarize([float("nan")]).p50 is None


def test_length_buckets_follow_the_draft() -> None:
    assert [length_bucket_label(n) for n in (0, 255, 256, 1023, 4095, 4096, 100_000)] == [
        "0-256", "0-256", "256-512", "512-1024", "2048-4096", "4096+", "4096+",
    ]  # fmt: skip


def test_knee_saturation_and_optimal_points() -> None:
    levels = [1, 2, 3, 4, 5, 6]
    p99 = [0.10, 0.11, 0.15, 0.21, 0.9, 3.0]  # min 0.10 → knee at the first > 0.20
    achieved = [100, 200, 300, 380, 390, 350]  # first decrease at level 6
    assert knee_point(levels, p99) == 4
    assert saturation_point(levels, achieved) == 6
    slo = [v <= 0.5 for v in p99]
    assert optimal_point(levels, achieved, slo) == 4
    assert knee_point(levels, [0.1] * 6) is None and saturation_point(levels, sorted(achieved)) is None
    assert optimal_point(levels, achieved, [False] * 6) is None


def test_jain_index_and_starvation() -> None:
    assert jain_index([1, 1, 1, 1]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([1, 2]) == pytest.approx(9 / 10)
    waits = [1.0] * 95 + [10.0] * 5  # median 1 → 5 of 100 wait longer than 5×
    assert starvation_rate(waits) == pytest.approx(0.05)
    with pytest.raises(ValueError):
        jain_index([0, 0])


@pytest.mark.parametrize("k", [1.0, 1.5, 2.0])
def test_scaling_fit_recovers_the_exponent(k: float) -> None:
    lengths = np.repeat([1024, 2048, 4096, 8192, 16384], 5)
    rng = np.random.default_rng(1)
    ttft = 2e-6 * lengths**k * rng.lognormal(0, 0.01, lengths.size)
    fit = fit_scaling(lengths, ttft)
    assert fit.exponent == pytest.approx(k, abs=0.02) and fit.r2_power > 0.99
    if k == 1.0:
        assert fit.slope_s_per_token == pytest.approx(2e-6, rel=0.03) and fit.r2_linear > 0.99


def test_scaling_fit_needs_two_lengths() -> None:
    with pytest.raises(ValueError, match="two distinct"):
        fit_scaling([1024, 1024], [0.1, 0.2])


@pytest.mark.parametrize(("threshold", "initial"), [(37, 8), (5, 8), (512, 8), (1, 8), (100, 100)])
async def test_search_max_converges_on_a_monotone_criterion(threshold: int, initial: int) -> None:
    async def passes(c: float) -> bool:
        return c <= threshold

    best, steps = await search_max(
        passes, initial=initial, maximum=512, minimum=1, resolution=1, integer=True
    )
    assert best == threshold
    assert len(steps) <= 2 * math.ceil(math.log2(512)) + 2
    assert all(s.passed == (s.value <= threshold) for s in steps)


async def test_search_max_reports_none_when_nothing_passes_and_converges_on_floats() -> None:
    async def never(c: float) -> bool:
        return False

    assert (await search_max(never, initial=8, maximum=64, minimum=1, resolution=1, integer=True))[0] is None

    async def below(r: float) -> bool:
        return r <= 3.3

    best, _ = await search_max(below, initial=2.0, maximum=20.0, minimum=0.1, resolution=0.05)
    assert best is not None and 3.25 <= best <= 3.3


def test_modality_tells_one_peak_from_two() -> None:
    rng = np.random.default_rng(0)
    one = rng.lognormal(np.log(0.01), 0.2, 2000)
    two = np.concatenate([rng.lognormal(np.log(0.01), 0.1, 1000), rng.lognormal(np.log(0.2), 0.1, 400)])
    assert modality(one) == "unimodal"
    assert modality(two) == "multimodal (2 peaks)"
    assert modality([0.1] * 5).startswith("undetermined")


def _level(send: np.ndarray, done: np.ndarray, tokens: float = 10.0) -> pd.DataFrame:
    return pd.DataFrame(
        {"send_s": send, "done_s": done, "e2e_s": done - send, "ok": True, "output_tokens": tokens}
    )


def test_steady_state_flags_a_growing_queue_and_passes_a_stable_one() -> None:
    send = np.arange(0, 60, 0.1)  # 10 req/s for 60 s
    stable = steady_state(_level(send, send + 0.5), 0.0, 60.0)
    assert not stable.saturated and stable.throughput_stable and stable.conclusive
    assert stable.arrival_rate == pytest.approx(10, rel=0.05)
    served = np.arange(send.size) / 5.0 + 0.5  # the server finishes 5 req/s: the queue grows
    growing = steady_state(_level(send, served), 0.0, 60.0)
    assert growing.saturated and growing.queue_growing
    assert any("completions" in r for r in growing.reasons)


def test_itl_level_statistics_on_known_chunks() -> None:
    # two requests: one steady 10 ms stream, one with a single 100 ms pause
    a = [0, *range(10_000_000, 110_000_000, 10_000_000)]
    b = [0, 10_000_000, 110_000_000, 120_000_000]
    lv = itl_level([a, b], [[1] * len(a), [1, 1, 2, 1]], 0.5, 2.0, [60, 60])
    assert lv.gaps.count == len(a) - 1 + 3
    assert lv.max_pause.max == pytest.approx(0.1) and lv.max_pause.min == pytest.approx(0.01)
    assert lv.jitter.min == pytest.approx(0.0)
    assert lv.multi_token_chunk_share == pytest.approx(1 / (len(a) - 1 + 3))
    assert lv.tail_ratio == pytest.approx(lv.gaps.p99 / lv.gaps.p50)
    assert lv.burst_share == 0.0
    burst = itl_level([[0, 10_000_000, 10_000_000, 10_000_000]], [[1, 1, 1, 1]], 0.5, 2.0, [4])
    assert burst.burst_share == pytest.approx(2 / 3)


def test_probe_variation() -> None:
    assert probe_variation([1.0, 1.05, 0.98]) == pytest.approx(0.07 / 1.0)
    assert probe_variation([1.0]) is None


async def test_warm_up_probes_until_a_round_agrees_within_10_percent() -> None:
    # the conformant CPU run's probes right after the warm-up load: 66, 108, 53, 45, 46 ms (119%)
    rounds = iter([[0.066, 0.108, 0.053, 0.045, 0.046], [0.046, 0.045, 0.047, 0.046, 0.045]])

    async def probe_round() -> list[float]:
        return next(rounds)

    probes, variation = await settle(probe_round)
    assert len(probes) == 10 and variation is not None and variation < 0.1
    # a round that never settles: the cap, and the last round's variation as it is
    probes, variation = await settle(lambda: _round([0.05, 0.1]), rounds=3)
    assert len(probes) == 6 and variation == pytest.approx(0.05 / 0.075)


async def _round(values: list[float]) -> list[float]:
    return list(values)
