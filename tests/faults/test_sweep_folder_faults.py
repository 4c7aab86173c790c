"""Issue #22, rows 5 and 7-9 and the run-folder misleads: damaged files and --resume, bad input that
used to poison a run, read-only and full disks, paths outside --out, secrets, two writers, a missing
model folder."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from fault_checks import Place, assert_clear_error, assert_intact, assert_no_engine_left, fill_disk, remount

from analysis.compare import main as compare
from analysis.report import main as report
from microbench.battery.cli import main as battery
from microbench.loadgen.cli import main as loadgen
from microbench.results.records import RunRecord, read_record
from microbench.sweep.cli import main
from microbench.transfer.cli import main as transfer

pytestmark = pytest.mark.clock  # reads the clock (stalls, schedule delay): the clock pass

SMALL = {"repetitions": 2}  # 4 points: enough to damage one and resume


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished 4-point sweep on the sim; tests copy it before damaging anything."""
    tmp = tmp_path_factory.mktemp("finished")
    place = Place(tmp, tmp)
    out = tmp / "run"
    assert main(["--config", str(place.sweep_yaml(**SMALL)), "--out", str(out)]) == 0
    return out


def _copy(finished: Path, place: Place) -> Path:
    out = place.tmp / "run"
    shutil.copytree(finished, out, ignore=shutil.ignore_patterns(".lock"))
    return out


def _stamps(out: Path) -> dict[str, int]:
    return {p.name: read_record(p, RunRecord).t_inject_ns for p in out.glob("runs/*/*.json")}


def test_row5_a_truncated_manifest_is_a_clear_error_on_resume(finished: Path, place: Place, run) -> None:
    out = _copy(finished, place)
    manifest = out / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:100])
    outcome = run(main, "--resume", "--out", out)
    assert outcome.code == 2
    assert_clear_error(outcome, f"the manifest of {out} cannot be read", "start a new run with another --out")


def test_a_truncated_point_record_is_measured_again_on_resume(finished: Path, place: Place, run) -> None:
    out = _copy(finished, place)
    before = _stamps(out)
    damaged = sorted(out.glob("runs/*/*.json"))[1]
    damaged.write_bytes(damaged.read_bytes()[:50])
    outcome = run(main, "--resume", "--out", out)
    assert outcome.code == 0, outcome.text[-3000:]
    assert "3/4 points already measured" in outcome.out
    after = _stamps(out)
    assert len(after) == 4 and after[damaged.name] != before[damaged.name]  # measured again
    assert all(after[n] == t for n, t in before.items() if n != damaged.name)  # the others kept
    assert all(r.validity.valid for r in assert_intact(out))


def test_resume_retries_infrastructure_invalid_points_and_keeps_final_ones(
    finished: Path, place: Place, run
) -> None:
    out = _copy(finished, place)
    infra, final = sorted(out.glob("runs/*/*.json"))[:2]
    for path, reason in (
        (infra, "StreamCut: connection to http://127.0.0.1:1/v1/completions failed before any response"),
        (final, "the injection hit the prefix cache (256 tokens in /metrics)"),
    ):
        data = json.loads(path.read_text())
        data["validity"] = {"valid": False, "reasons": [reason], "attempt": data["validity"]["attempt"]}
        path.write_text(json.dumps(data))
    final_before = final.read_bytes()
    outcome = run(main, "--resume", "--out", out)
    assert outcome.code == 1  # the final invalid point stays: "measured, with failures"
    assert read_record(infra, RunRecord).validity.valid  # the infrastructure's point measured again
    assert final.read_bytes() == final_before  # a verdict on the point is kept


def test_row7_a_bad_token_range_writes_nothing_and_poisons_nothing(place: Place, run) -> None:
    out = place.tmp / "run"
    cfg = place.sweep_yaml(repetitions=1, prefill_tokens=[256])
    outcome = run(main, "--config", cfg, "--out", out, "--token-range", "300:5")
    assert outcome.code == 2
    assert_clear_error(outcome, "token_range", "0 <= lo < hi")
    assert not out.exists()  # the run folder is not taken
    assert run(main, "--config", cfg, "--out", out, "--token-range", "0:256").code == 0


READ_ONLY: dict[str, tuple[Callable[[list[str]], int], list[str]]] = {
    "sweep": (main, ["--config", "{sweep}"]),
    "transfer": (transfer, ["--engine", "sim", "--connector", "sim-link", "--no-alone", "--P", "256"]),
    "battery": (battery, ["run", "--engine", "sim", "--tests", "ttft", "--profile", "quick"]),
    "loadgen": (loadgen, ["run", "--workload", "synthetic-uniform", "--rate", "5", "--requests", "3",
                          "--url", "http://127.0.0.1:1", "--model", "m"]),
    "analysis.report": (report, ["{finished}"]),
    "analysis.compare": (compare, ["{finished}", "{finished}"]),
}  # fmt: skip


@pytest.mark.parametrize("command", list(READ_ONLY))
def test_row8_a_read_only_out_is_a_clear_error_for_every_command(
    finished: Path, place: Place, run, small_fs, command: str
) -> None:
    # a real read-only filesystem (root ignores chmod 0555): creating --out and its lock fails there
    out = small_fs("64k", ro=True) / "run"
    main_of, argv = READ_ONLY[command]
    fill = {"{sweep}": str(place.sweep_yaml(**SMALL)), "{finished}": str(finished)}
    outcome = run(main_of, *(fill.get(a, a) for a in argv), "--out", out)
    assert outcome.code == 2, outcome.text[-3000:]
    assert_clear_error(
        outcome, f"cannot write the run folder {out}", "Read-only file system", "another --out"
    )
    assert os.listdir(place.cwd) == []


def test_a_full_disk_names_the_file_leaves_no_temp_file_and_resumes(place: Place, run, monkeypatch) -> None:
    writes = itertools.count(1)
    # the disk fills up in the middle of the sweep, and stays full: the 41st file write fails, half written
    fill_disk(monkeypatch, lambda path: next(writes) > 40)
    out = place.tmp / "run"
    cfg = place.sweep_yaml()
    outcome = run(main, "--config", cfg, "--out", out)
    assert outcome.code == 1
    assert_clear_error(outcome, "No space left on device", f"cannot write {out}/")
    assert f"continue with: python -m microbench.sweep --resume --out {out}" in " ".join(outcome.out.split())
    assert "no table written" in outcome.out  # and no second traceback from the table writer
    measured = _stamps(out)
    assert 0 < len(measured) < 12
    assert_intact(out)  # no temporary file left behind (dot-files or *.tmp), every record readable
    monkeypatch.undo()  # space freed
    monkeypatch.chdir(place.cwd)
    outcome = run(main, "--resume", "--out", out)
    assert outcome.code == 0, outcome.text[-3000:]
    after = _stamps(out)
    assert len(after) == 12 and all(after[n] == t for n, t in measured.items())
    assert (out / "interference_table.csv").is_file() and not list(out.glob(".interference_table*"))


def test_a_really_full_disk_mid_sweep_loses_nothing_and_resumes(place: Place, run, small_fs) -> None:
    # a real 256 KiB filesystem: the sweep's 12 points need about 500 KiB, so the disk fills up mid-run
    mnt = small_fs("256k")
    out = mnt / "run"
    outcome = run(main, "--config", place.sweep_yaml(), "--out", out)
    assert outcome.code == 1, outcome.text[-3000:]
    assert_clear_error(outcome, "No space left on device", f"cannot write {out}/")
    measured = _stamps(out)
    assert 0 < len(measured) < 12
    assert_intact(out)  # every stored record readable, no temporary file left
    remount(mnt, "size=64m")  # space freed
    outcome = run(main, "--resume", "--out", out)
    assert outcome.code == 0, outcome.text[-3000:]
    after = _stamps(out)
    assert len(after) == 12 and all(after[n] == t for n, t in measured.items())


def test_a_full_disk_at_the_telemetry_write_keeps_the_error_that_ended_the_run(
    place: Place, run, monkeypatch
) -> None:
    # Issue #33: the telemetry table is written in a ``finally`` while the shard ends on an error (here an
    # engine that dies in every warm-up); a full disk there replaced that error and left the engine running.
    fill_disk(monkeypatch, lambda path: path.parent.name == "telemetry")
    out = place.tmp / "run"
    outcome = run(main, "--config", place.sweep_yaml(("--die-after-requests", "2")), "--out", out)
    assert outcome.code == 1, outcome.text[-3000:]
    assert_clear_error(outcome, "the engine died 4 times in this chunk")  # the original error, kept
    assert "telemetry not written" in outcome.text and "No space left on device" in outcome.text
    assert not list((out / "telemetry").iterdir())  # nothing half-written, no temporary file
    assert_intact(out)
    assert_no_engine_left()


def test_row9_nothing_is_written_outside_out(place: Place, run) -> None:
    with pytest.raises(SystemExit) as info:  # --run-id is gone: argparse refuses it (exit 2)
        main(["--config", str(place.sweep_yaml(**SMALL)), "--out", "../x", "--run-id", "../../y"])
    assert info.value.code == 2
    outcome = run(main, "--config", place.sweep_yaml(**SMALL), "--out", "here/run")
    assert outcome.code == 0, outcome.text[-3000:]
    assert os.listdir(place.cwd) == ["here"] and os.listdir(place.cwd / "here") == ["run"]
    assert sorted(p.name for p in place.tmp.iterdir()) == ["cwd", "sweep.yaml"]


def test_a_planted_api_key_never_reaches_the_run_folder(place: Place, run, monkeypatch) -> None:
    secret, token = "sk-planted-7f3a9c1e5d", "hf_planted_b2c4d6"
    env = {"OPENAI_API_KEY": secret, "HF_TOKEN": token, "OMP_NUM_THREADS": "1"}
    cfg = place.sweep_yaml(repetitions=1, prefill_tokens=[256])
    data = yaml.safe_load(cfg.read_text())
    data["engine"]["env"] = env
    cfg.write_text(yaml.safe_dump(data))
    out = place.tmp / "run"
    assert run(main, "--config", cfg, "--out", out).code == 0
    for path in out.rglob("*"):
        if path.is_file():
            blob = path.read_bytes()
            assert secret.encode() not in blob and token.encode() not in blob, path
    stored = json.loads((out / "manifest.json").read_text())["sweep"]["engine"]["env"]
    assert stored == {"OPENAI_API_KEY": "<redacted>", "HF_TOKEN": "<redacted>", "OMP_NUM_THREADS": "1"}
    # --resume needs the secrets from the shell again, and says so
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    outcome = run(main, "--resume", "--out", out)
    assert outcome.code == 2
    assert_clear_error(outcome, "export HF_TOKEN=… OPENAI_API_KEY=…")
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    monkeypatch.setenv("HF_TOKEN", token)
    assert run(main, "--resume", "--out", out).code == 0


def test_a_second_writer_of_one_run_is_refused(place: Place, run) -> None:
    out = place.tmp / "run"
    cfg = place.sweep_yaml(sim_args=("--time-scale", "3"))  # slow enough to overlap
    cmd = [sys.executable, "-m", "microbench.sweep", "--config", str(cfg), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (out / "manifest.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        outcome = run(main, "--resume", "--out", out)
        assert outcome.code == 2
        assert_clear_error(outcome, "is being written by another process")
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 143


def test_a_missing_model_folder_is_named_before_any_engine_starts(place: Place, run) -> None:
    out = place.tmp / "run"
    t0 = time.monotonic()
    outcome = run(main, "--engine", "vllm", "--model", str(place.tmp / "no-such-model"), "--out", out)
    assert outcome.code == 2 and time.monotonic() - t0 < 10
    assert_clear_error(outcome, f"model folder {place.tmp / 'no-such-model'} does not exist")
    assert not out.exists()
