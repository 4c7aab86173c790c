"""The repeat floor of analysis.calibrate (the engine against itself) on hand-built traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.calibrate.__main__ import main
from analysis.calibrate.pages import markdown, repeat_rows
from analysis.calibrate.repeat import floor_verdict, repeat_floor, same_schedule
from analysis.calibrate.report import CalibrationReport, calibration_report
from tests.unit.test_calibrate_replay import _frame, _row, _write

# four requests 1 s apart, E2E 100/200/300/400 ms in the real run (TTFT 50 ms, 3 tokens)
REAL_E2E = [100.0, 200.0, 300.0, 400.0]
REPEAT_E2E = [110.0, 180.0, 300.0, 440.0]  # errors +10, −10, 0, +10 %: median APE 10, MAPE 7.5, bias +2.5
PRED_E2E = [100.0, 220.0, 330.0, 400.0]  # errors 0, +10, +10, 0 %: median APE 5, MAPE 5


def _rows(e2e: list[float], offset_ms: float = 0.0, **kw: object) -> list[dict[str, object]]:
    return [
        _row(i, offset_ms + 1000 * i, [offset_ms + 1000 * i + 50, offset_ms + 1000 * i + (50 + e) / 2,
                                       offset_ms + 1000 * i + e], **kw)
        for i, e in enumerate(e2e)
    ]  # fmt: skip


def test_the_floor_is_the_repeats_error_against_the_real_run_beside_the_predictions() -> None:
    real, pred = _frame(_rows(REAL_E2E)), _frame(_rows(PRED_E2E))
    repeat = _frame(_rows(REPEAT_E2E, offset_ms=250.0))  # its warm-up ran longer: the schedule moved whole
    floor = repeat_floor(real, pred, repeat, ["0", "1", "2", "3"], "again", 200, 0)
    assert (floor.n_compared, floor.not_in_repeat) == (4, 0)
    e2e = next(r for r in floor.rows if r.metric == "e2e")
    assert e2e.repeat_median_ape_pct == pytest.approx(10.0) and e2e.model_median_ape_pct == pytest.approx(5.0)
    assert e2e.repeat_mape_pct == pytest.approx(7.5) and e2e.model_mape_pct == pytest.approx(5.0)
    assert e2e.repeat_bias_pct == pytest.approx(2.5) and e2e.ratio == pytest.approx(0.5)
    assert e2e.repeat_mape_ci_pct[0] <= 7.5 <= e2e.repeat_mape_ci_pct[1]
    assert floor_verdict(e2e) == "within the floor"
    ttft = next(r for r in floor.rows if r.metric == "ttft")  # 50 ms in all three: no error, no floor
    assert ttft.repeat_median_ape_pct == 0 and ttft.ratio is None and "no floor" in floor_verdict(ttft)


def test_a_request_the_repeat_did_not_complete_is_left_out_of_both_sides_and_counted() -> None:
    real, pred = _frame(_rows(REAL_E2E)), _frame(_rows(PRED_E2E))
    rows = _rows(REPEAT_E2E)
    rows[1] = _row(1, 1000, [], status="timeout")
    floor = repeat_floor(real, pred, _frame(rows), ["0", "1", "2", "3"], "again", 200, 0)
    assert (floor.n_compared, floor.not_in_repeat) == (3, 1)
    e2e = next(r for r in floor.rows if r.metric == "e2e")
    # left: errors +10, 0, +10 (repeat) and 0, +10, 0 (prediction) on requests 0, 2, 3
    assert (e2e.n, e2e.repeat_median_ape_pct, e2e.model_median_ape_pct) == (3, pytest.approx(10.0), 0.0)
    assert floor_verdict(e2e.model_copy(update={"model_median_ape_pct": 25.0})) == "2.50× the floor"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda rows: rows.pop(), "measured requests are not the real trace's"),
        (lambda rows: rows[2].update(prompt_tokens=999), "request 2 has prompt_tokens 1000 .* and 999"),
        (lambda rows: rows[3].update(max_tokens=9), "request 3 has max_tokens 3"),
        (lambda rows: rows[1].update(intended_ns=1_000_000_000 + 2_000), "request 1 was due 1000.000 ms"),
    ],
)
def test_a_repeat_of_another_schedule_is_refused(change, message: str) -> None:  # type: ignore[no-untyped-def]
    rows = _rows(REPEAT_E2E)
    change(rows)
    with pytest.raises(ValueError, match=message):
        same_schedule(_frame(_rows(REAL_E2E)), _frame(rows))


def test_warm_up_requests_may_differ_and_the_schedule_may_move_whole() -> None:
    real = _rows(REAL_E2E)
    real[0]["warmup"] = True
    repeat = _rows(REPEAT_E2E, offset_ms=-30.0)
    repeat[0].update(warmup=True, prompt_tokens=7)  # a warm-up request is not part of the schedule
    same_schedule(_frame(real), _frame(repeat))


def test_the_report_carries_the_floor_renders_it_and_refuses_to_contradict_it(tmp_path: Path) -> None:
    real = _write(tmp_path / "real", _rows(REAL_E2E))
    pred = _write(tmp_path / "pred", _rows(PRED_E2E))
    again = _write(tmp_path / "again", _rows(REPEAT_E2E, offset_ms=40.0))
    report = calibration_report(real, pred, n_boot=200, repeat_dir=again)
    assert report.repeat is not None and report.repeat.repeat == str(again)
    e2e = next(r for r in report.repeat.rows if r.metric == "e2e")
    assert e2e.model_median_ape_pct == report.metric("e2e").median_ape_pct  # one figure, both tables
    md = markdown(report, figures=False)
    assert "## Repeatability: the engine against itself" in md
    assert "| E2E | 4 | 5.0 | 10.0 | 0.50 | 5.0 |" in md
    assert [r[0] for r in repeat_rows(report)] == ["TTFT", "TPOT", "E2E"]
    data = report.model_dump()
    data["repeat"]["rows"][2]["model_median_ape_pct"] = 7.0  # a floor table that says otherwise
    with pytest.raises(ValueError, match="e2e: the floor's model error contradicts the comparison's"):
        CalibrationReport.model_validate(data)
    data = report.model_dump()
    data["repeat"]["not_in_repeat"] = 1
    with pytest.raises(ValueError, match="do not add up"):
        CalibrationReport.model_validate(data)
    assert calibration_report(real, pred, n_boot=200).repeat is None


def test_the_command_line_takes_a_repeat_and_names_a_bad_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    real = _write(tmp_path / "real", _rows(REAL_E2E))
    pred = _write(tmp_path / "pred", _rows(PRED_E2E))
    again = _write(tmp_path / "again", _rows(REPEAT_E2E))
    out = tmp_path / "report"
    assert main(["report", str(real), str(pred), "--repeat", str(again), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "E2E   median APE: predicted 5.0 %, the engine's repeat 10.0 % (within the floor)" in printed
    assert "Repeatability" in (out / "calibration.html").read_text()
    saved = CalibrationReport.model_validate_json((out / "calibration.json").read_text())
    assert saved.repeat is not None and saved.repeat.rows[2].repeat_median_ape_pct == pytest.approx(10.0)
    other = _write(tmp_path / "other", _rows(REPEAT_E2E[:3]))
    code = main(["report", str(real), str(pred), "--repeat", str(other), "--out", str(tmp_path / "r2")])
    assert code == 2
    assert f"{other} is not a repeat of {real}: its measured requests are not" in capsys.readouterr().err
    missing = [
        "report",
        str(real),
        str(pred),
        "--repeat",
        str(tmp_path / "none"),
        "--out",
        str(tmp_path / "r3"),
    ]
    assert main(missing) == 2
    assert "--repeat" in capsys.readouterr().err and not (tmp_path / "r3").exists()
