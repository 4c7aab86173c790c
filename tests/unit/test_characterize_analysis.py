"""The characterization dataset, its monotone fits and SLO capacities, and the recommender, on hand-built
tables with known answers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.characterize.__main__ import main as analysis_main
from analysis.characterize.curves import (
    SloError,
    latency_throughput,
    monotone_fit,
    parse_slo,
    predict,
    slo_capacity,
)
from analysis.characterize.dataset import DatasetError, DatasetRow, append_rows, read_dataset
from analysis.characterize.recommend import NothingMeets, parse_costs, recommend


def row(
    config: str, users: int, itl_ms: float, ttft_ms: float = 100.0, device: str = "dev-a", **kw: object
) -> DatasetRow:
    values = {
        f"{m}_{p}": None
        for m in ("ttft_s", "nttft_s_per_token", "itl_s", "e2e_s")
        for p in ("mean", "p50", "p90", "p99")
    }
    values |= {
        "itl_s_p90": itl_ms / 1e3,
        "itl_s_p50": itl_ms / 1e3,
        "ttft_s_p90": ttft_ms / 1e3,
        "ttft_s_p50": ttft_ms / 1e3,
    }
    base = dict(
        run_id="r1",
        created_utc="2026-01-01T00:00:00+00:00",
        config=config,
        model="m",
        device=device,
        engine="sim",
        engine_version=None,
        budget=2048,
        max_num_seqs=8,
        settings_json="{}",
        workload="w",
        users=users,
        requests=100,
        succeeded=100,
        window_s=10.0,
        request_rps=float(users),
        output_tps=100.0 * users,
        input_tps=10.0,
        level_rule="rule",
    )
    return DatasetRow(**(base | values | kw))  # type: ignore[arg-type]


def table(rows: list[DatasetRow]) -> pd.DataFrame:
    return pd.DataFrame([r.model_dump() for r in rows])


def test_dataset_appends_and_never_changes_rows(tmp_path: Path) -> None:
    path = tmp_path / "d" / "char.parquet"
    assert append_rows(path, [row("a", 1, 10), row("a", 2, 12)]) == 2
    first = read_dataset(path)
    assert append_rows(path, [row("b", 1, 30)]) == 3
    again = read_dataset(path)
    pd.testing.assert_frame_equal(again.iloc[:2].reset_index(drop=True), first)
    assert again["config"].tolist() == ["a", "a", "b"]
    pd.DataFrame({"x": [1]}).to_parquet(tmp_path / "other.parquet")
    with pytest.raises(DatasetError, match="columns missing"):
        read_dataset(tmp_path / "other.parquet")
    with pytest.raises(DatasetError, match="no such dataset"):
        read_dataset(tmp_path / "none.parquet")


def test_monotone_fit_pools_a_noisy_level_and_reports_out_of_sample_error() -> None:
    # ITL 10, 20, 15 (noise), 40 ms at 1, 2, 4, 8 users: PAV pools 20 and 15 into 17.5 (equal weights)
    levels = table([row("a", 1, 10), row("a", 2, 20), row("a", 4, 15), row("a", 8, 40)])
    fit = monotone_fit(levels, "itl_s_p90")
    assert fit.fitted == pytest.approx([0.010, 0.0175, 0.0175, 0.040])
    assert fit.r2 is not None and 0.9 < fit.r2 < 1
    # leave 2 out: fit of (1:10, 4:15, 8:40) at 2 → 10 + (15 − 10)/3 = 11.667 vs 20: 41.7%;
    # leave 4 out: (1:10, 2:20, 8:40) at 4 → 20 + 20·2/6 = 26.67 vs 15: 77.8%
    assert fit.loo_mape == pytest.approx((8.333 / 20 + 11.667 / 15) / 2 * 100, rel=1e-3)
    assert predict(fit, 3) == pytest.approx(0.0175) and predict(fit, 16) is None and predict(fit, 0.5) is None


def test_slo_capacity_is_monotone_and_censored_at_the_measured_edge() -> None:
    levels = table([row("a", 1, 10), row("a", 2, 20), row("a", 4, 15), row("a", 8, 40)])
    slo = parse_slo("itl=30")
    cap = slo_capacity(levels, "a", slo, "p90")
    # fitted 17.5 at 4, 40 at 8: 30 is crossed at 4 + 4·12.5/22.5 = 6.2 → 6 users
    assert cap.users == 6 and not cap.censored and cap.limiting == "itl_s"
    # one slow level (35 ms at 2 users, 20 at 4) does not cap the capacity at 1: PAV pools it to 27.5
    spiky = table([row("a", 1, 10), row("a", 2, 35), row("a", 4, 20), row("a", 8, 40)])
    assert slo_capacity(spiky, "a", slo, "p90").users == 4  # 27.5 at 4 → 30 crossed at 4 + 4·2.5/12.5 = 4.8
    assert slo_capacity(levels, "a", parse_slo("itl=50"), "p90").censored
    assert slo_capacity(levels, "a", parse_slo("itl=5"), "p90").users is None
    # more generous SLOs never give a smaller capacity
    caps = [slo_capacity(levels, "a", {"itl_s": ms / 1e3}, "p90").users or 0 for ms in range(5, 60, 5)]
    assert caps == sorted(caps)


def test_parse_slo_and_costs_reject_bad_input() -> None:
    assert parse_slo("ttft=500, itl=50") == {"ttft_s": 0.5, "itl_s": 0.05}
    for bad in ("ttft", "foo=3", "itl=-1", "itl=x", ""):
        with pytest.raises(SloError):
            parse_slo(bad)
    assert parse_costs(["a=1.5,b=2", "dev=0"]) == {"a": 1.5, "b": 2.0, "dev": 0.0}
    with pytest.raises(ValueError, match="CONFIG=USD_PER_HOUR"):
        parse_costs(["a=cheap"])


def test_recommend_picks_the_cheapest_per_user_and_never_extrapolates() -> None:
    rows = [row("small", u, itl) for u, itl in ((1, 10), (2, 12), (4, 20), (8, 45))]
    rows += [row("big", u, itl, device="dev-b") for u, itl in ((1, 8), (2, 9), (4, 10), (8, 12))]
    t = table(rows)
    slo = parse_slo("itl=30")
    # small serves 4 + 4·10/25 = 5.6 → 5 users; big serves all 8 measured (censored)
    out = recommend(t, slo, 5, {"dev-a": 1.0, "dev-b": 3.0})[0]
    assert (
        out.best == "small"
        and out.choices[0].devices == 1
        and out.choices[0].usd_per_user_hour == pytest.approx(0.2)
    )
    out = recommend(t, slo, 16, {"dev-a": 1.0, "dev-b": 3.0})[0]
    small, big = {c.config: c for c in out.choices}["small"], {c.config: c for c in out.choices}["big"]
    assert small.devices == 4 and small.usd_per_hour == pytest.approx(4.0)
    assert big.devices == 2 and "beyond the largest measured level (8)" in big.note
    assert out.best == "small"  # $0.25 vs $0.375 per user-hour
    with pytest.raises(NothingMeets, match="best measured: itl_s p90 8 ms"):
        recommend(t, parse_slo("itl=5"), 2, {"dev-a": 1.0, "dev-b": 3.0})
    with pytest.raises(KeyError, match="--cost big=USD_PER_HOUR"):
        recommend(t, slo, 2, {"dev-a": 1.0})


def test_latency_throughput_curve_is_sorted_per_configuration() -> None:
    t = table([row("b", 2, 10), row("a", 4, 10), row("a", 1, 5)])
    curve = latency_throughput(t)
    assert curve[["config", "users"]].values.tolist() == [["a", 1], ["a", 4], ["b", 2]]


def test_cli_bad_input_exits_2_with_a_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "c.parquet"
    append_rows(path, [row("a", 1, 10), row("a", 2, 20)])
    assert analysis_main(["recommend", str(path), "--slo", "itl=1", "--users", "2", "--cost", "a=1"]) == 2
    assert "no configuration meets the SLO" in capsys.readouterr().err
    assert analysis_main(["recommend", str(tmp_path / "x.parquet"), "--slo", "itl=1", "--users", "2"]) == 2
    assert analysis_main(["recommend", str(path), "--slo", "itl=50", "--users", "2", "--cost", "a=1"]) == 0
    assert "best a" in capsys.readouterr().out
    assert analysis_main(["curves", str(path), "--slo", "itl=15", "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "curves.png").stat().st_size > 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert "isotonic regression" in page and "LOO MAPE" in page and "<img" in page
