"""scripts/bench_plan_share.py: runs end to end on a small plan and reports every row against its N = 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_small_run_reports_each_row_and_worker_count(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_plan_share.py"), "--items", "40", "--reps", "1",
         "--workers", "1", "4", "--workloads", "sweeps/workloads/calibrate-poisson.yaml", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    modes = ("skip", "drafts", "all")
    rows = [(api, mode, n) for api in ("completions", "chat") for mode in modes for n in (1, 4)]
    keys = {f"calibrate-poisson|{api}|{mode}|{n}" for api, mode, n in rows}
    assert set(report["table"]) == keys
    assert all(report["table"][k]["ratio_to_one"] == 1.0 for k in keys if k.endswith("|1"))
    assert all(report["table"][k]["us_per_own_item"] > 0 for k in keys)
    assert "cores" in report["machine"] and "calibrate-poisson" in done.stdout


def test_bad_worker_counts_are_named() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_plan_share.py"), "--workers", "2", "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "must include 1" in done.stderr
