"""The ablation end to end on two simulated engines whose step models differ by a known factor (×1.3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from microbench.ablate.cli import main
from microbench.measure.shard import Shard
from microbench.results.layout import AblateFolder, job_folder

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

# Steps of 20-40 ms: a loaded host's late wake-ups (a few ms a step, one-sided) stay a small share of each.
STEP_A = ["--alpha-ms", "8", "--beta-d-ms", "0.4", "--beta-c-ms", "0.04", "--gamma-ns", "40"]
STEP_B = ["--alpha-ms", "10.4", "--beta-d-ms", "0.52", "--beta-c-ms", "0.052", "--gamma-ns", "52"]  # ×1.3


def _ablation(tmp: Path, grid: dict[str, object] | None = None, **over: object) -> Path:
    data = {
        "name": "sim-x1.3",
        "grid": {
            "chunks": [512],
            "decode_batch_sizes": [0, 2],
            "prefill_tokens": [1024, 2048, 4096],
            "repetitions": 1,
            "decode_context": 256,
            "engine": {"kind": "sim", "extra_args": STEP_A},
        }
        | (grid or {}),
        "arms": {"A": {}, "B": {"extra_args": STEP_B}},
        "rounds": 5,
        "until_resolved": 0.05,
        "max_rounds": 10,
    } | over
    path = tmp / "ablation.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def ablation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ablate")
    assert main(["--config", str(_ablation(tmp)), "--out", str(tmp / "run")]) == 0
    return tmp / "run"


def test_the_known_ratio_is_recovered_with_the_right_verdicts(ablation: Path) -> None:
    folder = job_folder(ablation)
    assert isinstance(folder, AblateFolder) and folder.read_manifest().job == "ablate"
    comparison = json.loads((folder.comparison("A", "B") / "comparison.json").read_text())
    cells = comparison["cells"]
    assert len(cells) == 6 and all(5 <= c["n_a"] == c["n_b"] <= 10 for c in cells)
    for c in cells:
        # Both arms' times are real time on a shared host, whose contention only ever adds time to some
        # repetitions of either arm; the first quartiles compared stay on the clean ones (analysis.effects:
        # under three busy processes medians were up to 4.6% off, quartiles 1.4%).
        if c["new_prefill_tokens"] >= 2048:
            assert c["ratio"] == pytest.approx(1.3, rel=0.05), c
    # never a wrong verdict; a cell the contention kept undecided through 10 rounds says so
    verdicts = [c["verdict"] for c in cells]
    assert set(verdicts) <= {"B worse", "undecided"} and verdicts.count("B worse") >= 4, verdicts
    assert (folder.comparison("A", "B") / "comparison_heatmap.png").stat().st_size > 0
    # each arm is a sweep run folder of its own, with the arm's engine in its manifest
    assert folder.arm("B").read_manifest().engine_spec["extra_args"] == STEP_B


def test_a_finished_ablation_resumes_without_measuring(
    ablation: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.stat().st_mtime_ns for p in (ablation / "arms").rglob("runs/*/*.json"))
    assert main(["--resume", "--out", str(ablation)]) == 0
    assert sorted(p.stat().st_mtime_ns for p in (ablation / "arms").rglob("runs/*/*.json")) == before
    assert "start-up" not in capsys.readouterr().out  # no engine started
    assert main(["--resume", "--out", str(ablation), "--rounds", "9"]) == 2
    assert "drop --rounds" in capsys.readouterr().err


def test_an_unknown_setting_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--arm", "A=engine:", "--arm", "B=engine:no_such=1"])
    assert exit_.value.code == 2 and "B: unknown engine setting 'no_such'" in capsys.readouterr().err


def test_an_arm_that_fails_to_start_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = {"A": {}, "broken": {"extra_args": ["--no-such-flag"]}}
    one_point = {"decode_batch_sizes": [0], "prefill_tokens": [1024]}  # what is named is the arm, not a point
    path = _ablation(tmp_path, one_point, arms=broken, rounds=1)
    assert main(["--config", str(path), "--out", str(tmp_path / "run"), "--start-timeout", "20s"]) == 1
    assert "arm broken (chunk 512)" in capsys.readouterr().out


def test_a_decode_batch_that_runs_dry_gets_more_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 80 tokens per stream cannot hold steady state, a baseline and one injection: the first batch of
    # each arm runs out before its point; the next gets twice the tokens (was: 3 invalid attempts), and
    # the next round starts with what worked instead of running dry again.
    grown: list[int] = []
    original = Shard._grown
    monkeypatch.setattr(Shard, "_grown", lambda self, b, d: grown.append(b) or original(self, b, d))
    grid = {"decode_batch_sizes": [2], "prefill_tokens": [1024], "decode_tokens": 80}
    path = _ablation(tmp_path, grid, rounds=2, until_resolved=None)
    assert main(["--config", str(path), "--out", str(tmp_path / "run")]) == 0
    for arm in ("A", "B"):
        folder = tmp_path / "run" / "arms" / arm
        dry = [p for p in folder.glob("invalid/*/*.json") if "never reached steady state" in p.read_text()]
        assert not dry
        records = [json.loads(p.read_text()) for p in folder.glob("runs/*/*.json")]
        assert len(records) == 2 and all(r["config"]["decode_max_tokens"] > 80 for r in records)
    assert grown.count(80) == 2  # round 1 outgrew 80 once per arm; round 2 started where round 1 ended


def test_arms_of_different_models_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = {"decode_batch_sizes": [0], "prefill_tokens": [1024]}
    path = _ablation(
        tmp_path, grid, rounds=2, until_resolved=None, arms={"A": {}, "B": {"model": "sim-dense"}}
    )
    assert main(["--config", str(path), "--out", str(tmp_path / "run")]) == 0
    assert "the arms run different engines: model: " in capsys.readouterr().out
    folder = AblateFolder(tmp_path / "run")
    assert any(n.startswith("the arms run different engines: model:") for n in folder.read_manifest().notes)
    comparison = json.loads((folder.comparison("A", "B") / "comparison.json").read_text())
    assert any(w.startswith("model differs: A ") and "'sim-dense'" in w for w in comparison["warnings"])
    assert folder.arm("B").read_manifest().engine_spec["model"] == "sim-dense"
