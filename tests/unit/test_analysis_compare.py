"""``analysis.compare`` and ``analysis.effects`` on hand-built repetitions (ratios known) and a stored run."""

from __future__ import annotations

import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis.compare import (
    Comparison,
    align_chunks,
    compare_frames,
    compare_runs,
    grid_problem,
    main,
    round_levels,
    run_warnings,
)
from analysis.compare_pages import diff_heatmap, markdown, write_pages
from analysis.effects import correct_pvalues, min_detectable_effect, min_rank_pvalue

REFERENCE = Path(__file__).resolve().parents[2] / "results" / "reference-cpu"


def _frame(cells: dict[tuple[int, int, int], list[float]]) -> pd.DataFrame:
    rows = [
        {
            "chunk_size": c, "decode_batch_size": d, "new_prefill_tokens": p, "repetition": r,
            "valid": True, "source": "runs", "tpot_penalty_ms": v, "prefill_duration_ms": v,
        }
        for (c, d, p), values in cells.items()
        for r, v in enumerate(values)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def _noisy(n: int, rng: np.random.Generator, scale: float = 1.0) -> list[float]:
    return list(100 * scale * np.exp(rng.normal(0, 0.1, n)))


def test_known_ratios_are_recovered_with_their_verdicts() -> None:
    rng = np.random.default_rng(3)
    base = {(512, d, 2048): _noisy(8, rng) for d in (0, 2, 4)}
    b = {
        (512, 0, 2048): [1.3 * v for v in base[(512, 0, 2048)]],
        (512, 2, 2048): [0.7 * v for v in base[(512, 2, 2048)]],
    }
    b[(512, 4, 2048)] = list(base[(512, 4, 2048)])
    cells = {e.cell: e for e in compare_frames(_frame(base), _frame(b))}
    worse, better, same = cells[(512, 0, 2048)], cells[(512, 2, 2048)], cells[(512, 4, 2048)]
    assert (
        worse.ratio == pytest.approx(1.3)
        and worse.ci_low < 1.3 < worse.ci_high
        and worse.verdict == "B worse"
    )
    assert better.ratio == pytest.approx(0.7) and better.verdict == "B better"
    assert same.ratio == pytest.approx(1.0) and same.p_value == pytest.approx(1.0)
    assert worse.metric == "prefill_duration_ms" and better.metric == "tpot_penalty_ms"


def test_an_aa_pair_flags_no_more_cells_than_the_error_rate() -> None:
    rng = np.random.default_rng(11)
    cells = [(512, d, p) for d in range(10) for p in (256 * k for k in range(1, 21))]  # 200 cells
    a = _frame({c: _noisy(8, rng) for c in cells})
    b = _frame({c: _noisy(8, rng) for c in cells})
    effects = compare_frames(a, b)
    raw = sum(e.p_value < 0.05 for e in effects)
    assert raw <= 0.05 * len(cells) * 2  # uncorrected: about the nominal rate (10 of 200 expected)
    assert not [e for e in effects if e.verdict in ("B better", "B worse")]  # BH: no false discovery


def test_cells_of_one_run_only_are_reported_not_dropped() -> None:
    rng = np.random.default_rng(0)
    a = _frame({(512, 2, 1024): _noisy(5, rng), (512, 2, 2048): _noisy(5, rng)})
    b = _frame({(512, 2, 1024): _noisy(5, rng), (1024, 2, 2048): _noisy(5, rng)})
    verdicts = {e.cell: e.verdict for e in compare_frames(a, b)}
    assert verdicts[(512, 2, 2048)] == "only in A" and verdicts[(1024, 2, 2048)] == "only in B"
    assert len(verdicts) == 3


def test_a_chunk_size_ab_matches_cells_on_d_and_p() -> None:
    rng = np.random.default_rng(2)
    a = _frame({(2048, 2, 4096): _noisy(6, rng), (2048, 0, 4096): _noisy(6, rng)})
    b = _frame({(8192, 2, 4096): _noisy(6, rng, 0.5), (8192, 0, 4096): _noisy(6, rng, 0.5)})
    aligned, notes = align_chunks(a, b)
    assert notes == [
        "chunk size differs (A 2048, B 8192): cells matched on (D, P), listed under A's chunk 2048"
    ]
    assert {e.verdict for e in compare_frames(a, aligned)} == {"B better"}
    two = pd.concat([a, a.assign(chunk_size=8192)])
    assert align_chunks(two, b) == (b, [])  # several chunks in a run: cells keep their chunk


def test_round_levels_show_drift() -> None:
    drifting = _frame({(512, d, 1024): [100.0 * (1 + d), 110.0 * (1 + d), 120.0 * (1 + d)] for d in (0, 2)})
    assert round_levels(drifting) == pytest.approx([100 / 110, 1.0, 120 / 110])
    gap = drifting[drifting["repetition"] != 1]
    assert round_levels(gap)[1] is None


def test_benjamini_hochberg_and_the_rank_tests_floor() -> None:
    assert correct_pvalues([0.01, 0.02, 0.03, 0.5, math.nan])[:4] == pytest.approx([0.04, 0.04, 0.04, 0.5])
    assert math.isnan(correct_pvalues([0.01, math.nan])[1])
    assert min_rank_pvalue(3, 3) == pytest.approx(0.1)  # 3 vs 3 repetitions can never reach 0.05
    rng = np.random.default_rng(1)
    assert min_detectable_effect(_noisy(3, rng), _noisy(3, rng)) == math.inf
    few, many = (
        min_detectable_effect(_noisy(5, rng), _noisy(5, rng)),
        min_detectable_effect(_noisy(40, rng), _noisy(40, rng)),
    )
    assert 0 < many < few < 1  # more repetitions detect smaller effects


def test_renderers_mark_the_cells_whose_ci_excludes_one(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    a = {(512, 2, p): _noisy(8, rng) for p in (1024, 2048)}
    b = {(512, 2, 1024): [1.3 * v for v in a[(512, 2, 1024)]], (512, 2, 2048): _noisy(8, rng)}
    c = Comparison(
        name_a="A", name_b="B", run_a="a", run_b="b", alpha=0.05, tolerance=0.1, seed=0,
        warnings=["model differs"], cells=compare_frames(_frame(a), _frame(b)),
    )  # fmt: skip
    texts = [t.get_text() for t in diff_heatmap(c).axes[0].texts]
    assert "1.30*" in texts and not any(t.endswith("*") for t in texts if t != "1.30*")
    md = markdown(c)
    assert "**warning**: model differs" in md and md.count("\n| 512 | 2 |") == 2
    names = sorted(p.name for p in write_pages(c, tmp_path))
    assert names == ["comparison.html", "comparison.md", "comparison_heatmap.png"]
    assert "B worse" in (tmp_path / "comparison.html").read_text()


def test_a_b_location_at_or_below_zero_is_drawn_with_its_label() -> None:
    # B's penalties around 0 (the delay gone, noise left): the ratio is ≤ 0 and has no log; the map still
    # scales on the other cells and labels that one
    rng = np.random.default_rng(7)
    a = {(512, 2, p): _noisy(8, rng) for p in (1024, 2048)}
    b = {(512, 2, 1024): [v - 130 for v in a[(512, 2, 1024)]], (512, 2, 2048): _noisy(8, rng, 1.2)}
    cells = compare_frames(_frame(a), _frame(b))
    assert min(e.ratio for e in cells if e.ratio is not None) <= 0
    c = Comparison(
        name_a="A", name_b="B", run_a="a", run_b="b", alpha=0.05, tolerance=0.1, seed=0, warnings=[],
        cells=cells,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no log of a non-positive ratio
        texts = [t.get_text() for t in diff_heatmap(c).axes[0].texts]
    assert len(texts) == 2 and any(t.startswith("-") for t in texts), texts


def test_a_stored_run_against_itself_decides_no_difference(tmp_path: Path) -> None:
    c = compare_runs(REFERENCE, REFERENCE)
    assert c.cells and not c.warnings
    assert {e.verdict for e in c.cells} <= {"no detectable difference", "undecided"}
    assert all(e.ratio == pytest.approx(1.0) for e in c.cells if e.ratio is not None)


def test_warnings_name_what_differs_between_the_runs(tmp_path: Path) -> None:
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copy(REFERENCE / "manifest.json", tmp_path / name / "manifest.json")
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    manifest["engine_version"] = "9.9.9"
    (tmp_path / "b" / "manifest.json").write_text(json.dumps(manifest))
    warnings = run_warnings(tmp_path / "a", tmp_path / "b")
    assert (
        len(warnings) == 1
        and warnings[0].startswith("engine version differs: A ")
        and "'9.9.9'" in warnings[0]
    )


def test_cli_bad_folder_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope"), str(REFERENCE), "--out", str(tmp_path / "o")]) == 2
    assert "nope does not exist" in capsys.readouterr().err


def test_a_busy_hosts_one_sided_delays_leave_the_quartile_ratio_on_the_truth() -> None:
    # B is A × 1.3; a busy host adds 5-60% to half of each arm's repetitions (never takes time away), as
    # three busy processes did to the first rounds of a simulated ablation
    rng = np.random.default_rng(5)
    clean = 100 * np.exp(rng.normal(0, 0.005, 8))
    a = list(clean * np.r_[1 + rng.uniform(0.05, 0.6, 4), np.ones(4)])
    b = list(1.3 * clean * np.r_[np.ones(4), 1 + rng.uniform(0.05, 0.6, 4)])
    (effect,) = compare_frames(_frame({(512, 0, 2048): a}), _frame({(512, 0, 2048): b}))
    medians = float(np.median(b) / np.median(a))
    assert effect.ratio == pytest.approx(1.3, rel=0.02) and effect.ci_low < 1.3 < effect.ci_high
    assert abs(medians / 1.3 - 1) > 0.05  # the medians' ratio is pulled off by the delays


def test_a_figure_one_run_lacks_is_compared_nowhere_and_listed() -> None:
    rng = np.random.default_rng(2)
    a = _frame({(512, 4, 2048): _noisy(5, rng), (512, 0, 2048): _noisy(5, rng)})
    b = _frame({(512, 4, 2048): _noisy(5, rng), (512, 0, 2048): _noisy(5, rng)})
    b.loc[b["decode_batch_size"] == 4, "tpot_penalty_ms"] = math.nan  # e.g. a kind without step times
    cells = {e.cell: e for e in compare_frames(a, b)}
    assert cells[(512, 4, 2048)].verdict == "only in A" and cells[(512, 4, 2048)].n_b == 0
    assert cells[(512, 0, 2048)].verdict != "only in A"
    b["tpot_penalty_ms"] = math.nan
    with pytest.raises(ValueError, match="'tpot_penalty_ms' is not in both runs' records; figures both"):
        compare_frames(a, b, metric="tpot_penalty_ms")


def test_runs_of_grids_that_cannot_compare_are_a_clear_error(tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(REFERENCE, other, ignore=shutil.ignore_patterns("raw", "metrics", "observed", "*.log"))
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["sweep"]["decode_context"] = 2 * manifest["sweep"]["decode_context"]
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="grids differ in decode_context"):
        compare_runs(REFERENCE, other)
    # no cell in common: the error lists each run's cells
    rng = np.random.default_rng(1)
    a = _frame({(512, 2, 1024): _noisy(3, rng)})
    b = _frame({(1024, 4, 2048): _noisy(3, rng)})
    problem = grid_problem(tmp_path / "a", tmp_path / "b", compare_frames(a, b))
    assert problem is not None and "share no measured cell" in problem and "(1024, 4, 2048)" in problem
