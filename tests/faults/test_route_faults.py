"""Issue #40: the decode worker dies in the middle of a route replay (sim pair, simulated KV link): the
command ends with exit 1 and a clear error, the replays measured before stay on disk untouched, the
broken replay is stored invalid with its reason, and ``--resume`` replays only what has no valid record."""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml
from fault_checks import STEP_ARGS, Place, assert_clear_error, assert_no_engine_left

from analysis.breakeven import LinkProfile
from engine_harness.model_kv import ModelKV
from engine_harness.step_model import StepModel
from microbench.results.layout import RouteFolder
from microbench.route.cli import main
from microbench.route.predicted import predicted_policy
from microbench.route.workload import RouteWorkload

CHUNK = 512
# decode worker, requests finished before it dies: 2 warm-up (one hand-off, one local) + the 4 of the
# first replay (colocated) + 2 of the second (table): its cold prompts are done, its decodes still run
DIE_AFTER = 2 + 4 + 2


def _config(place: Place) -> Path:
    link = LinkProfile(name="sim-link", basis="assumed", assumption="the sim's link", setup_latency_ms=20,
                       bandwidth_gbit_s=1)  # fmt: skip
    model = ModelKV("sim", layers=1, kv_heads=1, head_dim=1024, dtype_bytes=4)
    step = StepModel(alpha_ms=20, beta_d_ms=0.5, beta_c_ms=0.05, gamma_ns=20)
    predicted_policy(step, link, model, CHUNK, range(0, 5), [64, 256, 1024]).save(place.tmp / "table")
    workload = RouteWorkload(
        decode_streams=2, decode_tokens=60, cold_tokens=[256], cold_output_tokens=2, bursts=2, burst_size=1,
        first_burst_s=0.1, burst_gap_s=0.1, burst_spread_s=0.0,
    )  # fmt: skip
    cfg = {
        "name": "die", "policies": ["colocated", "table"], "repetitions": 1, "seed": 0,
        "workload": workload.model_dump(), "table": str(place.tmp / "table.json"), "connector": "sim-link",
        "engine": {"kind": "sim", "chunk_size": CHUNK, "extra_args": STEP_ARGS},
        "decode_args": ["--die-after-requests", str(DIE_AFTER)], "pause_s": 0.1, "startup_timeout_s": 60,
        "phase_timeout_s": 20, "drain_timeout_s": 20,
    }  # fmt: skip
    path = place.tmp / "route.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_decode_worker_dying_mid_replay_exits_1_keeps_the_done_replay_and_resumes(place: Place, run) -> None:
    out = place.tmp / "run"
    outcome = run(main, "--config", _config(place), "--out", out)
    assert outcome.code == 1, outcome.text[-3000:]
    assert_clear_error(outcome, "the decode worker died during table r0")
    assert f"--resume --out {out}" in " ".join(outcome.text.split())
    folder = RouteFolder(out)
    stored = {r.policy: r for r, _ in folder.replays()}
    assert stored["colocated"].valid and stored["colocated"].failed_requests == 0
    done = (out / "replays" / "colocated_r0.json").read_bytes()
    broken = stored["table"]  # the replay it died in: stored, invalid, with why
    assert not broken.valid and broken.failed_requests > 0
    assert any("did not finish" in reason for reason in broken.reasons)
    report = json.loads((out / "report.json").read_text())  # the report of what was measured
    assert {r["policy"]: r["valid"] for r in report["replays"]} == {"colocated": True, "table": False}
    assert_no_engine_left()

    # a fresh pair: warm-up 2 + the table replay's 4 stay under the death count, so the replay completes
    outcome = run(main, "--resume", "--out", out)
    assert outcome.code == 0, outcome.text[-3000:]
    assert (out / "replays" / "colocated_r0.json").read_bytes() == done  # not replayed, not rewritten
    stored = {r.policy: (r, f) for r, f in folder.replays()}
    record, frame = stored["table"]
    assert record.valid and record.failed_requests == 0 and (frame["status"] == "ok").all()
    assert set(frame["client_id"]) == {"decode", "cold"} and len(frame) == 4
    assert "Traceback" not in outcome.text and os.listdir(place.cwd) == []
    assert_no_engine_left()
