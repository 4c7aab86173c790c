"""The wake probe end to end against the simulated engine, whose wake cost is known: a sweep with
``wake_probe`` stores the probe, and the calibration's fit recovers the sim's table from it (plus the
host's own wake, which no test on these boxes can take out: ``HOST_MS``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from analysis.calibrate.wake import fit_wake
from engine_harness.wake_model import WakeCost
from microbench.results.layout import RunFolder
from microbench.sweep.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

TRUTH = WakeCost(points=[(0.05, 0.0), (0.3, 200.0), (1.5, 400.0)])
# The host's own wake on top of the sim's: the probe measures everything between the client and the first
# token, and on the 2-core VMs an idle Python server answers slower the longer it idled. With no wake table
# the fit read +0–23 ms after 0.3 s and +0–74 ms after 1.5 s (2026-11-30; a bare GET /v1/models from aiohttp
# took 3 / 20 / 70 ms after 0.02 / 0.3 / 1.5 s idle, curl 1.5 / 8 / 30 ms, a socket echo between two threads
# 0.03 / 0.6 / 1.5 ms). So the fit reads the truth plus up to HOST_MS, never less.
HOST_MS = 100.0


def test_a_sweeps_wake_probe_recovers_the_sims_wake_cost(tmp_path: Path) -> None:
    params = tmp_path / "sim.yaml"
    params.write_text(yaml.safe_dump({"wake": TRUTH.model_dump(mode="json")}))
    sweep = {
        "chunks": [512],
        "decode_batch_sizes": [0],
        "prefill_tokens": [256],
        "repetitions": 2,
        "decode_context": 256,
        "engine": {
            "kind": "sim",
            "extra_args": ["--params", str(params), "--alpha-ms", "4", "--beta-c-ms", "0.02"],
        },
        "wake_probe": {"gaps_s": [0.02, 0.3, 1.5], "repetitions": 3, "prompt_tokens": 64},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    run = tmp_path / "run"
    assert main(["--config", str(path), "--out", str(run)]) == 0
    (probe,) = RunFolder(run).wake_probes()
    assert [s.gap_s for s in probe.samples] == [0.02, 0.3, 1.5] * 3
    seen = [(s.gap_s, s.idle_s, s.ttft_ms, s.error) for s in probe.samples]
    assert all(s.ttft_ms is not None and s.idle_s >= s.gap_s for s in probe.samples), seen
    fitted = dict(fit_wake([probe]).cost.points)
    for gap in (0.3, 1.5):
        idles = [s.idle_s for s in probe.samples if s.gap_s == gap]
        truth = TRUTH.extra_ms(sorted(idles)[1])  # the engine idled from its last step to the arrival
        assert truth - 5.0 <= fitted[gap] <= truth + HOST_MS, (gap, fitted, truth)
    # a resumed run keeps its probe: nothing is measured again
    before = RunFolder(run).wake_path(512).read_bytes()
    assert main(["--resume", "--out", str(run)]) == 0
    assert RunFolder(run).wake_path(512).read_bytes() == before
