"""§6's comparison of two battery runs on hand-built reports and latencies: prices, cost, equivalence,
percentile ratios with their intervals and verdicts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from microbench.battery.compare import cost_per_mtok, equivalence, parse_price
from microbench.battery.compare_effects import percentile_effects
from microbench.battery.disclosures import Disclosures
from microbench.battery.report import BatteryReport, SystemInfo, WarmupResult

RNG = np.random.default_rng(3)


def test_prices_per_device_hour_per_million_or_per_token() -> None:
    assert parse_price("2.49/device-hour").model_dump(exclude={"text"}) == {
        "amount": 2.49,
        "unit": "device-hour",
    }
    assert parse_price("$3/h").unit == "device-hour"
    assert parse_price("0.6/Mtok").amount == 0.6
    assert parse_price("6e-7/token").amount == pytest.approx(0.6)
    with pytest.raises(ValueError, match="AMOUNT/device-hour"):
        parse_price("three dollars")


def test_cost_per_million_tokens_and_its_interval_from_the_throughputs() -> None:
    usd, span = cost_per_mtok(1000.0, 100.0, 2, parse_price("3.6/device-hour"))
    assert usd == pytest.approx(2.0)  # 2 devices x $3.6 for 3.6M tokens
    assert span == pytest.approx((7.2 / (1100 * 3600) * 1e6, 7.2 / (900 * 3600) * 1e6))
    assert cost_per_mtok(1000.0, 100.0, 2, parse_price("0.5/Mtok")) == (0.5, None)  # not throughput-bound
    assert cost_per_mtok(None, None, 1, parse_price("1/h")) == (None, None)
    assert cost_per_mtok(1000.0, 100.0, 1, None) == (None, None)


def _lat(values: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"ok": True, "ttft_s": values, "tpot_s": values / 10, "e2e_s": values * 5})


def test_percentile_ratios_with_bootstrap_intervals_and_corrected_verdicts() -> None:
    a = RNG.lognormal(np.log(0.1), 0.2, 400)
    same = {("ttft", "level"): _lat(a)}
    slower = {("ttft", "level"): _lat(a * 2.0), ("capacity/rate-1.000", "level"): _lat(a)}
    worse = percentile_effects(same, slower, n_boot=500)
    assert len(worse) == 3 * 3  # TTFT, TPOT, E2E x P50, P95, P99 of the one shared stage
    for e in worse:
        assert e.ratio == pytest.approx(2.0)
        assert e.ci[0] is not None and e.ci[1] is not None and e.ci[0] < 2.0 < e.ci[1] and e.ci[0] > 1.5
        assert e.verdict == "B worse" and e.p_adjusted is not None and e.p_adjusted < 1e-6
    twin = percentile_effects(same, {("ttft", "level"): _lat(a.copy())}, n_boot=500)
    p50 = next(e for e in twin if e.metric == "TTFT" and e.q == 50)
    assert p50.ratio == pytest.approx(1.0) and p50.verdict == "no detectable difference"
    few = percentile_effects({("x", "s"): _lat(np.array([0.1]))}, {("x", "s"): _lat(np.array([0.2, 0.3]))})
    assert few == []  # one sample cannot give an interval: no row, not a guess


def _report(**changes: object) -> BatteryReport:
    base = BatteryReport(
        created_at="2026-01-01T00:00:00+00:00",
        command="python -m microbench.battery run",
        profile="quick",
        seed=0,
        workload="synthetic-uniform",
        workload_spec={"name": "synthetic-uniform", "seed": 42},
        system=SystemInfo(
            model="tiny", engine_kind="sim", base_url="http://x", hardware="cpu", accelerators=0, cpu_count=2
        ),
        warmup=WarmupResult(cold_start=False),
        tests=[],
        disclosures=Disclosures(
            sut_boundary="Model Engine",
            sut_boundary_source="measured",
            guardrails="none",
            guardrails_source="stated",
            prompts={"form": "token ids", "token_space": [0, 256], "salt": "1"},
            workload_seed=42,
        ),
    )
    return base.model_copy(update=changes)


def test_equivalence_names_what_refuses_and_what_is_a_condition() -> None:
    a = _report()
    assert all(c.same for c in equivalence(a, _report()))
    other = a.disclosures.model_copy(update={"prompts": {**a.disclosures.prompts, "salt": "2"}})  # type: ignore[union-attr]
    checks = {c.item: c for c in equivalence(a, _report(seed=1, disclosures=other, profile="conformant"))}
    assert not checks["arrival seed"].same and checks["arrival seed"].refuses
    assert not checks["load model and durations (profile)"].same
    salt = checks["prompt salt (token contents; lengths and order are the seed's)"]
    assert not salt.same and not salt.refuses  # same lengths and order: a stated condition
    assert checks["workload (name and full spec)"].same
    gpu = _report(system=a.system.model_copy(update={"accelerators": 8, "hardware": "8x H100"}))
    hw = next(c for c in equivalence(a, gpu) if c.item == "hardware")
    assert not hw.same and not hw.refuses  # §6.2: normalise, do not refuse


def test_equivalence_over_repeated_runs_catches_a_difference_between_two_runs_of_one_system() -> None:
    a = _report()
    checks = {c.item: c for c in equivalence([a, a, _report(seed=1)], [a, a, a])}
    seed = checks["arrival seed"]
    assert not seed.same and seed.refuses and seed.a == "0 | 1" and seed.b == "0"  # A's third run differs
    assert all(c.same for c in equivalence([a, a, a], [_report(), _report(), _report()]))
