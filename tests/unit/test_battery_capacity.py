"""The battery's derived figures on hand-built data: saturation, rates, capacity, search, fits, fairness."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.latencies import latencies

from microbench.battery.plan import Probe, estimate_plan
from microbench.battery.profiles import profile
from microbench.battery.progress import progress_line
from microbench.battery.registry import TESTS
from microbench.battery.sections.fairness import jain_over_classes, mixed_order
from microbench.measure.levels import level_row, tokens_within
from microbench.measure.runs import StageWindow
from microbench.measure.saturation import steady_state
from microbench.measure.scaling import fit_scaling, fit_verdict
from microbench.measure.search import rate_search
from microbench.measure.stats import saturation_point
from microbench.measure.sustainable import LedgerEntry, capacity_from


def test_the_ramp_to_littles_law_is_not_queue_growth() -> None:
    # issue #23's CPU case: 31 req/s for 4 s, every request 0.5 s end to end. The in-flight count climbs
    # 0 → 15.5 in the first 0.5 s (Little's law), then stays: the old 10% cut called that growth.
    send = np.arange(0, 4, 1 / 31)
    s = steady_state(latencies(send, send + 0.5), 0.0, 4.0)
    assert s.ramp_s == pytest.approx(1.0)  # max(10% of 4 s, 2 × 0.5 s)
    assert s.inflight_mean == pytest.approx(15.5, abs=1.0)
    assert not s.saturated and not s.queue_growing and s.reasons == []
    # completions in [1, 4) are the requests sent in [0.5, 3.5): all of them
    assert s.completions == s.expected_completions == 93


def test_an_overloaded_level_is_saturated_by_both_signs() -> None:
    # 31 req/s offered, a FIFO server finishing one request every 50 ms (20 req/s) after 0.3 s of work
    send = np.arange(0, 4, 1 / 31)
    done = np.empty_like(send)
    free = 0.0
    for i, t in enumerate(send):
        free = max(free, t) + 0.05
        done[i] = free + 0.3
    s = steady_state(latencies(send, done), 0.0, 4.0)
    assert s.saturated and s.queue_growing
    assert any("completions" in r for r in s.reasons)
    assert s.completion_rate == pytest.approx(20, rel=0.1)


def test_a_window_shorter_than_three_e2e_times_is_inconclusive() -> None:
    send = np.arange(0, 2, 0.1)
    s = steady_state(latencies(send, send + 0.8), 0.0, 2.0)
    assert s.ramp_s == pytest.approx(1.0)  # 2 × 0.8 capped at half the window
    assert not s.conclusive


def test_level_rates_use_the_nominal_window_with_its_empty_tail() -> None:
    # 3.1 req/s asked for 10 s; the last arrival fell at 9.0 s. The open loop now ends at 10 s (nominal).
    send = np.array([0.2, 1.0, 1.5, 2.4, 3.0, 3.3, 4.1, 5.0, 5.6, 6.2, 7.0, 7.7, 8.4, 9.0])
    lat = latencies(send, send + 0.1, tokens=32.0)
    row = level_row(StageWindow("level", lat, 0.0, 10.0, 10.2), 3.1)
    # ramp max(1.0 s, 2 × 0.1 s) = 1 s; window [1, 10): 13 requests finish in it (1.1 … 9.1)
    assert row.window_s == pytest.approx(9.0)
    assert row.request_rps == pytest.approx(13 / 9.0)
    assert row.output_tps == pytest.approx(13 * 32 / 9.0)
    assert row.sent_rps == pytest.approx(13 / 9.0)  # sends at 1.0 … 9.0
    # batch means: parts of 1.8 s from 1 s (≥ 2 E2E times) hold 3, 3, 3, 2 and 2 requests
    assert row.output_tps_ci == pytest.approx(2.776 * np.std([3, 3, 3, 2, 2], ddof=1) * 32 / 1.8 / np.sqrt(5))
    # requests of 1 s: parts of 1.6 s (window [2, 10)) are under two E2E times: the Poisson bound instead
    slow = level_row(StageWindow("level", latencies(send, send + 1.0, tokens=32.0), 0.0, 10.0, 11.0), 3.1)
    assert slow.window_s == pytest.approx(8.0)
    assert slow.output_tps_ci == pytest.approx(1.96 * np.sqrt(slow.request_rps * 8.0) * 32 / 8.0)
    # the old window [1, last send 9.0] would have divided by 8 s: 12.5% too high
    assert row.output_tps < 13 * 32 / 8.0


def test_tokens_are_counted_where_they_were_delivered() -> None:
    # 11 tokens each: the first at send + 0.05 s, the other 10 evenly up to done; window [1, 10)
    lat = latencies(np.array([0.45, 5.0, 9.45, 3.0]), np.array([1.5, 5.5, 10.5, 3.05]), tokens=11.0)
    lat.loc[3, "output_tokens"] = 1.0  # one token, at its end (3.05 s): inside
    lat.loc[1, "ok"] = False  # a failure delivers nothing that counts
    # [0.5, 1.5]: half its 10 later tokens; [9.5, 10.5]: its first and half the rest; the single token
    assert tokens_within(lat, 1.0, 10.0).tolist() == pytest.approx([5.0, 0.0, 6.0, 1.0])


def test_a_batch_that_ends_together_leaves_the_token_rate_alone() -> None:
    # closed loop of 4 that start together and end together: 16 tokens each every 0.17 s, the first 0.02 s
    # in (TTFT), so 376.5 tok/s; the window (2.6 s less a ramp of 2 E2E times) of 13.3 cycles holds 13 or 14
    # bursts of completions
    starts = np.repeat(np.arange(0, 20) * 0.17, 4)
    lat = latencies(starts, starts + 0.17, tokens=16.0)
    lat["ttft_s"] = 0.02
    truth = 4 * 16 / 0.17
    for shift in (0.0, 0.05, 0.1):
        row = level_row(StageWindow("level", lat, shift, shift + 2.6, shift + 3.5), 4, "closed")
        assert row.output_tps == pytest.approx(truth, rel=0.01), shift
        # its interval, by batch means, says so (the Poisson bound of 13-14 completions would be ±27%)
        assert row.output_tps_ci is not None and row.output_tps_ci < 0.02 * truth, row.output_tps_ci
    completions = [
        level_row(StageWindow("level", lat, shift, shift + 2.6, shift + 3.5), 4, "closed").request_rps
        for shift in (0.0, 0.05, 0.1)
    ]
    assert max(completions) - min(completions) > 0.05 * truth / 16  # what whole completions would have read


async def test_rate_search_brackets_the_threshold_within_five_percent() -> None:
    probed: list[float] = []

    async def passes(rate: float) -> bool:
        probed.append(rate)
        return rate <= 97.0

    best, steps = await rate_search(passes, 100.0, probes=8)
    assert probed == pytest.approx([90.0, 100.0, 95.0])  # 0.9 passes, 1.0 fails, bisect to 0.95, stop
    assert best == pytest.approx(95.0) and [s.passed for s in steps] == [True, False, True]
    probed.clear()
    best, _ = await rate_search(passes, 200.0, probes=3)  # down by 0.1 of X while failing
    assert probed == pytest.approx([180.0, 160.0, 140.0]) and best is None


def _entry(label: str, loop: str, offered: float, tps: float, ok: bool) -> LedgerEntry:
    return LedgerEntry(
        test="5.x",
        label=label,
        loop=loop,
        offered=offered,
        achieved_rps=tps / 10,
        output_tps=tps,
        sustainable=ok,
    )


def test_capacity_is_the_best_sustainable_level_of_any_test() -> None:
    entries = [
        _entry("a", "open", 10.0, 100.0, True),
        _entry("b", "open", 20.0, 190.0, True),
        _entry("c", "open", 30.0, 250.0, False),  # saturated: the peak, not the max
        _entry("d", "closed", 32.0, 210.0, True),  # a closed loop meeting 5.5's criteria
    ]
    cap = capacity_from(entries, "rule")
    assert cap.max_output_tps == 210.0 and cap.max_source == "5.x d"
    assert cap.sustainable_rate_rps == 20.0  # open loop only
    assert cap.peak_output_tps == 250.0
    assert capacity_from([], "rule").max_output_tps is None


def test_the_sustainable_rate_is_what_a_level_sent_when_its_poisson_draw_fell_short() -> None:
    """CI's sim run: 27.27 req/s offered sent 23.33 in its window and kept up, against a capacity of 23.7;
    26.08 offered sent 24.73. The rate the engine was shown to sustain is the larger *sent* rate, 24.73."""
    short = _entry("e", "open", 27.27, 350.0, True).model_copy(update={"sent_rps": 23.33})
    fuller = _entry("f", "open", 26.08, 360.0, True).model_copy(update={"sent_rps": 24.73})
    lucky = _entry("g", "open", 20.0, 330.0, True).model_copy(update={"sent_rps": 22.0})  # vouches for 20
    cap = capacity_from([short, fuller, lucky], "rule")
    assert cap.sustainable_rate_rps == 24.73 and cap.sustainable_rate_source == "5.x f"
    assert capacity_from([lucky], "rule").sustainable_rate_rps == 20.0


def test_saturation_point_ignores_a_fall_within_sampling_error() -> None:
    levels, achieved = [1, 2, 3, 4], [100.0, 200.0, 190.0, 150.0]
    assert saturation_point(levels, achieved) == 3  # the draft's rule, literally
    assert saturation_point(levels, achieved, [10.0, 10.0, 10.0, 10.0]) == 4  # 190 vs 200 ± 14: noise


def test_fit_verdict_and_exponent_ci() -> None:
    # issue #23's case: three lengths spanning 8× with a poor fit is no headline
    ok, verdict = fit_verdict(3, 8.0, 0.57)
    assert (
        not ok
        and verdict == "not meaningful: 3 distinct lengths (< 4), lengths span 8× (< 16×), R² 0.57 (< 0.9)"
    )
    x = np.repeat([256.0, 1024.0, 4096.0, 16384.0], 3)
    y = 1e-4 * x * np.tile([0.98, 1.0, 1.02], 4)  # TTFT ∝ length, ±2%
    fit = fit_scaling(x, y)
    assert fit.meaningful and fit.exponent == pytest.approx(1.0, abs=0.01)
    assert fit.exponent_ci is not None and fit.exponent_ci[0] < 1.0 < fit.exponent_ci[1]
    assert fit.exponent_ci[1] - fit.exponent_ci[0] < 0.05


def test_jain_over_classes_and_an_exact_class_mix() -> None:
    # x_c = inflation P50 per class: 1.0 and 3.0 → (4)² / (2 · 10) = 0.8
    assert jain_over_classes({"short": 1.0, "long": 3.0}) == pytest.approx(0.8)
    assert jain_over_classes({"short": 1.2, "long": 1.2}) == pytest.approx(1.0)
    assert jain_over_classes({"short": 1.0, "long": None}) is None
    order = mixed_order({"short": 0.8, "long": 0.2}, 100, seed=0)
    assert order.count("short") == 80 and order.count("long") == 20
    assert all(order[i : i + 20].count("long") == 4 for i in range(0, 100, 20))
    assert order != mixed_order({"short": 0.8, "long": 0.2}, 100, seed=1)


def test_plan_estimates_the_conformant_ttft_test_from_the_probe() -> None:
    p = profile("conformant")
    rows = estimate_plan([TESTS.get("ttft")], p, Probe(rps=10.0, e2e_s=0.5))
    assert [r.name for r in rows] == ["capacity measurement (5.2)", "ttft"]
    ttft = rows[1]
    assert ttft.requests == 10_000
    assert ttft.seconds == pytest.approx(10_000 / (0.5 * 10.0) + 0.5)


def test_every_test_registers_its_plan_and_the_capacity_is_planned_once_before_the_first_that_needs_it() -> (
    None
):
    p = profile("quick")
    tests = [TESTS.get(n) for n in TESTS.names()]
    rows = estimate_plan(tests, p, Probe(rps=10.0, e2e_s=0.5), configs=2)
    assert [r.name for r in rows] == ["capacity measurement (5.2)", *TESTS.names()]
    no_load = [r.name for r in rows[1:] if r.seconds == 0]
    assert no_load == ["throughput"]  # 5.2 reports the capacity measurement, which is its load
    alone = estimate_plan([TESTS.get("fairness"), TESTS.get("guardrail")], p, Probe(rps=10.0, e2e_s=0.5))
    assert [r.name for r in alone] == ["fairness", "guardrail"] and alone[1].seconds == 0  # one config


def test_progress_line_extrapolates_a_count_and_counts_down_a_duration() -> None:
    # 2,500 of 10,000 after 10 min: 30 min left at the same completion rate
    assert (
        progress_line("ttft", 2500, 600.0, 10_000, None)
        == "  ttft: 2,500/10,000 requests, 10m00s in, about 30m00s left"
    )
    # a 120 s level 45 s in: 75 s left whatever the count
    assert progress_line("pressure", 90, 45.0, None, 120.0).endswith("45s in, about 1m15s left")
    # both bounds: the run stops at whichever comes first
    assert progress_line("x", 10, 10.0, 1000, 60.0).endswith("about 0m50s left")
    # nothing finished yet and no duration: no ETA rather than a division by zero
    assert progress_line("x", 0, 5.0, 100, None) == "  x: 0/100 requests, 0m05s in"


def test_the_ramp_survives_one_slow_level() -> None:
    from microbench.measure.capacity import ramp_done

    def rows(*tps: float):  # type: ignore[no-untyped-def]
        return [_row_at(2**i, t) for i, t in enumerate(tps, start=2)]

    assert not ramp_done(rows(700, 950, 711), 64)  # the CPU run's slow c=16: one stall is not the end
    assert not ramp_done(rows(700, 950, 711, 1364), 64)
    assert ramp_done(rows(700, 950, 711, 960), 64)  # two levels in a row ≤ 10% above the best: done
    assert ramp_done(rows(700, 950), 8)  # the next doubling would pass capacity_max


def _row_at(concurrency: int, tps: float):  # type: ignore[no-untyped-def]
    send = np.arange(0, 4, 0.1)
    row = level_row(
        StageWindow("level", latencies(send, send + 0.1), 0.0, 4.0, 4.2), concurrency, loop="closed"
    )
    return row.model_copy(update={"output_tps": tps})


def test_a_backlog_draining_after_a_stall_is_not_a_steady_level() -> None:
    # the CPU run's case: 36 req/s offered for 4 s, the engine stalled for the first 1.5 s (requests wait),
    # then served 60 req/s until caught up: completions in the window beat the offered rate
    send = np.arange(0, 4, 1 / 36)
    done = np.empty_like(send)
    free = 1.5
    for i, t in enumerate(send):
        free = max(free, t) + 1 / 60
        done[i] = free + 0.1
    s = steady_state(latencies(send, done), 0.0, 4.0)
    assert s.saturated and any("backlog drains" in r for r in s.reasons)
    assert s.completion_rate > 36


def test_an_open_level_judged_over_too_short_a_window_is_not_sustainable() -> None:
    send = np.arange(0, 2, 0.1)
    row = level_row(StageWindow("level", latencies(send, send + 0.8), 0.0, 2.0, 2.9), 10.0)
    assert not row.steady.saturated and not row.steady.conclusive and not row.sustainable


def _simulated_level(rng: np.random.Generator, rate: float, e2e: float, duration: float, mu: float | None):
    """A Poisson level of ``duration`` s; ``mu``: a FIFO server of that many req/s (None: never a queue)."""
    send = np.cumsum(rng.exponential(1 / rate, int(rate * duration * 1.5) + 10))
    send = send[send < duration]
    latency = e2e * rng.uniform(0.8, 1.2, send.size)
    done = send + latency
    if mu is not None:
        last = 0.0
        for i in range(send.size):
            last = done[i] = max(send[i] + latency[i], last + 1 / mu)
    return steady_state(latencies(send, done), 0.0, duration)


@pytest.mark.parametrize(
    ("rate", "e2e", "duration", "mu", "lo", "hi"),
    [
        (30.0, 0.5, 4.0, None, 0.0, 0.04),  # a quick level of 8 E2E times, steady: rarely called saturated
        (8.9, 0.19, 2.2, None, 0.0, 0.04),  # the quick CPU run's 5.4 level (20 requests)
        (17.0, 1.2, 60.0, None, 0.0, 0.01),  # a conformant level: never
        (30.0, 0.2, 4.0, 24.0, 0.85, 1.0),  # 25% overloaded, 4 s: caught
        (17.0, 1.0, 60.0, 16.0, 0.8, 1.0),  # 6% overloaded, 60 s: caught
    ],
)
def test_saturation_is_rare_on_steady_levels_and_common_on_overloaded_ones(
    rate: float, e2e: float, duration: float, mu: float | None, lo: float, hi: float
) -> None:
    rng = np.random.default_rng(7)
    share = np.mean([_simulated_level(rng, rate, e2e, duration, mu).saturated for _ in range(200)])
    assert lo <= share <= hi, share
