"""A small sweep against the simulated engine; analysis recovers the sim's known step-time parameters."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.breakeven import load_link
from analysis.models import compare_models, fit_step_model
from analysis.policy import build_policy
from analysis.report import build_report
from analysis.table import TABLE_COLUMNS, load_records

pytestmark = pytest.mark.integration

TRUTH = {"alpha_ms": 4.0, "beta_d_ms": 0.2, "beta_c_ms": 0.02, "gamma_ns": 20.0}


@pytest.fixture(scope="module")
def sim_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    sweep_main = pytest.importorskip("microbench.sweep.cli").main
    tmp = tmp_path_factory.mktemp("sim-sweep")
    args = ["--alpha-ms", "4", "--beta-d-ms", "0.2", "--beta-c-ms", "0.02", "--gamma-ns", "20"]
    sweep = {
        "chunks": [512, 1024], "decode_batch_sizes": [0, 2, 4, 8], "prefill_tokens": [256, 1024, 2048],
        "repetitions": 1, "decode_context": 256, "engine": {"kind": "sim", "extra_args": args},
    }  # fmt: skip
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    assert sweep_main(["--config", str(path), "--out", str(tmp / "sim")]) == 0
    return tmp / "sim"


def test_step_model_recovers_the_sims_parameters(sim_run: Path) -> None:
    records = load_records(sim_run)
    assert len(records) == 2 * 4 * 3 and all(r.validity.valid for r in records)
    fit = fit_step_model(records)
    assert fit.data == "steps"
    for name, true in TRUTH.items():
        assert fit.params[name] == pytest.approx(true, rel=0.10), (name, fit.params)
    seed_r2, step_r2 = compare_models(records)["r2"].tolist()
    assert step_r2 > seed_r2 and step_r2 > 0.95


def test_table_policy_and_report_on_the_sim_run(sim_run: Path, tmp_path: Path) -> None:
    table = pd.read_csv(sim_run / "interference_table.csv")  # written by the sweep through analysis.table
    assert list(table.columns) == TABLE_COLUMNS and len(table) == 2 * 4 * 3
    assert table.loc[table.decode_batch_size == 0, "penalty_ratio"].isna().all()
    policy = build_policy(sim_run, load_link("seed-layerwise-50ms"), "layerwise")
    assert set(policy.cells.decision) <= {"offload", "local"}
    decisions = [policy.decide(8, p, 512).offload for p in (256, 512, 1024, 1500, 2048)]
    assert decisions == sorted(decisions)
    paths = build_report(sim_run, tmp_path / "report")
    assert paths.html.stat().st_size > 50_000 and "data:image/png;base64," in paths.html.read_text()
