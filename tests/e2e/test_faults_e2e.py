"""Issue #22's real-engine row: SIGKILL of vLLM's ``EngineCore`` process in the middle of a D = 4 point.

It used to divide by zero (the failed injection's histogram counted no chunk) or spend the point's
attempts. Now the death is an infrastructure fault: the engine is restarted, the point measured again,
and with ``max_attempts: 1`` every point still ends valid (a spent attempt would leave it invalid).
Run it under ``flock /tmp/engine.lock`` on a shared machine.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from microbench.results.faults import infrastructure_reasons
from microbench.results.records import RunRecord, read_record

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]


def _engine_core(root: psutil.Process) -> psutil.Process | None:
    for p in root.children(recursive=True):
        try:
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline()):
                return p
        except psutil.Error:
            continue
    return None


def test_sigkill_of_engine_core_mid_point_is_survived(tmp_path: Path) -> None:
    sweep = {
        "chunks": [2048],
        "decode_batch_sizes": [4],
        "prefill_tokens": [1024, 4096],
        "repetitions": 2,
        "decode_context": 1024,
        "max_attempts": 1,
        "engine": {"preset": "cpu", "max_model_len": 16384, "cpu_kvcache_gib": 2, "torch_compile": False},
    }
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(yaml.safe_dump(sweep))
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "microbench.sweep", "--config", str(cfg), "--out", str(out)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 900
    while not list(out.glob("runs/*/*.json")):  # the D = 4 batch is measuring: the next point is in flight
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout and proc.stdout.read()[-3000:]
        time.sleep(0.05)
    core = _engine_core(psutil.Process(proc.pid))
    assert core is not None, "no EngineCore process under the sweep"
    core.send_signal(signal.SIGKILL)
    text, _ = proc.communicate(timeout=1200)
    assert proc.returncode == 0, text[-4000:]
    assert "Traceback" not in text and "restarting it" in text
    records = [read_record(p, RunRecord) for p in sorted(out.glob("runs/*/*.json"))]
    assert len(records) == 4 and all(r.validity.valid for r in records), [r.validity for r in records]
    for path in out.glob("invalid/*/*.json"):  # an attempt the death spoiled is kept, and blamed on it
        assert infrastructure_reasons(read_record(path, RunRecord).validity.reasons)
    notes = json.loads((out / "manifest.json").read_text())["notes"]
    assert any("engine restarted" in n for n in notes)
