"""§6.3 over repeated runs, on hand-built latencies: each run's percentile is one value, so run-to-run
variation is in the interval; a known effect is found, an A/A of repeated runs is not flagged beyond the
error rate (where the request-level comparison of one run each is), and the run counts the statistics
cannot use are refused."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.effects import min_rank_pvalue
from benchcore.cli import BadInput
from microbench.battery.compare import _sides, compare_reports
from microbench.battery.compare_effects import Latencies, method, percentile_effects, run_effects

STAGES = [("ttft", "level"), ("itl", "level"), ("tradeoff/level-1", "level")]  # 3 stages x 3 metrics x 3 q


def _runs(n: int, rng: np.random.Generator, scale: float = 1.0, run_sd: float = 0.1) -> list[Latencies]:
    """``n`` runs of one configuration: each run shifts every latency by its own factor exp(N(0, run_sd))
    (a shared host's run-to-run variation), and its 200 requests vary around that (lognormal, σ 0.3)."""
    runs = []
    for _ in range(n):
        shift = scale * float(np.exp(rng.normal(0.0, run_sd)))
        run = {}
        for key in STAGES:
            x = shift * rng.lognormal(np.log(0.1), 0.3, 200)
            run[key] = pd.DataFrame({"ok": True, "ttft_s": x, "tpot_s": x / 10, "e2e_s": x * 5})
        runs.append(run)
    return runs


def _flagged(effects: list) -> int:
    return sum(e.verdict in ("B better", "B worse") for e in effects)


def test_a_known_effect_over_five_runs_each_is_found_with_an_interval_from_the_runs() -> None:
    rng = np.random.default_rng(1)
    effects = run_effects(_runs(5, rng), _runs(5, rng, scale=1.5))
    assert len(effects) == 27  # 3 stages x TTFT/TPOT/E2E x P50/P95/P99
    for e in effects:
        assert e.runs_a == e.runs_b == 5 and len(e.values_a) == 5 and e.n_a == 1000
        assert e.ratio is not None and 1.2 < e.ratio < 1.9  # 5 runs of ±10% each: the estimate's spread
        assert e.ci[0] is not None and e.ci[1] is not None and 1.0 < e.ci[0] < e.ci[1]
        assert e.verdict == "B worse"  # every B run slower than every A run: p = 2/252, BH keeps it
    assert sum(e.ci[0] <= 1.5 <= e.ci[1] for e in effects) >= 24  # the true ratio is inside (nearly) all


def test_an_a_over_a_of_repeated_runs_flags_no_more_than_the_error_rate_where_one_run_each_flags_many() -> (
    None
):
    rng = np.random.default_rng(7)
    experiments = 40
    with_a_flag = 0
    request_level = 0
    for _ in range(experiments):
        a, b = _runs(6, rng), _runs(6, rng)  # one configuration, one distribution
        with_a_flag += _flagged(run_effects(a, b)) > 0
        request_level += _flagged(percentile_effects(a[0], b[0], n_boot=300))
    # BH under the complete null bounds P(any row flagged) by alpha = 0.05: 2 of 40 expected, > 5 has p 0.014
    assert with_a_flag <= 5
    # the single-run method on the same data (requests as samples) flags rows in bulk: 483 of 1080 here
    assert request_level > 8 * experiments


def test_three_runs_each_cannot_call_a_row_and_the_method_says_so() -> None:
    rng = np.random.default_rng(3)
    same = run_effects(_runs(3, rng, run_sd=0.02), _runs(3, rng, run_sd=0.02))
    assert _flagged(same) == 0 and min_rank_pvalue(3, 3) == pytest.approx(0.1)
    assert all(e.p_value is not None and e.p_value >= 0.1 for e in same)
    assert all(e.mde is None for e in same)  # no change is detectable: the rank test cannot reach 0.05
    assert any(e.verdict == "no detectable difference" for e in same)  # tight runs rule out ±10%
    assert "smallest p the rank test can give is 0.1" in method(3, 3)
    assert "smallest p" not in method(4, 4)  # 2/70 = 0.029: a verdict is possible


def test_run_counts_and_argument_forms_the_statistics_cannot_use_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="A has 3 run"):
        compare_reports([tmp_path / "a1", tmp_path / "a2", tmp_path / "a3"], [tmp_path / "b1"])
    with pytest.raises(BadInput, match="more than once"):
        compare_reports([tmp_path / "a", tmp_path / "a"], [tmp_path / "b", tmp_path / "c"])
    ns = argparse.Namespace
    assert _sides(ns(reports=[Path("x"), Path("y")], a=None, b=None)) == ([Path("x")], [Path("y")])
    assert _sides(ns(reports=[], a=[Path("x"), Path("z")], b=[Path("y")])) == (
        [Path("x"), Path("z")],
        [Path("y")],
    )
    for bad in (
        ns(reports=[Path("x")], a=None, b=None),
        ns(reports=[Path("x"), Path("y")], a=[Path("z")], b=None),
        ns(reports=[], a=[Path("x")], b=None),
    ):
        with pytest.raises(BadInput):
            _sides(bad)
