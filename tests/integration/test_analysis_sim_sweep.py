"""The sweep and the analysis recover the simulated engine's ground truth, in both scheduling modes.

The sim carries what real engines do: partial last chunks (P = chunk with D > 0 ends in a D-token chunk),
decode context that grows while a batch is reused (δ), intra-chunk attention (γ on c·(ctx + c/2)) and a
front-end delay per prompt token before the engine sees the request. It runs as vLLM schedules (mixed:
the decodes ride in every chunk step) and as SGLang does by default (exclusive: a prefill step runs
instead of the decode step); one step-time model (``engine_harness.step_model``) is its truth and the
analysis' fit.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd
import pytest
import yaml

from analysis.breakeven import load_link
from analysis.frontend import fit_frontend
from analysis.models import compare_models, fit_step_model, interference_frame
from analysis.policy import build_policy
from analysis.report import build_report
from analysis.table import TABLE_COLUMNS, load_records
from engine_harness.step_model import Scheduling, StepModel, StepShape, chunk_schedule, extra_wait_ms

pytestmark = [pytest.mark.integration, pytest.mark.clock, pytest.mark.solo]  # fits read off the clock: alone

TRUTH = {"alpha_ms": 4.0, "beta_d_ms": 0.2, "beta_c_ms": 0.02, "gamma_ns": 20.0, "delta_ns": 40.0}
# 25–205 ms over P 256–2048: the host's own share of the front-end (its HTTP path and wake-ups, which grow
# with the prompt: 0.8–2.5 µs per token with the sim's set to 0, 2026-11-29) is under 3% of it; at 20 µs a
# token it was 9-17% (fits of 21.8-23.5 µs in local and official CIs)
FRONTEND_NS = 100000.0


MODEL = StepModel(**TRUTH)
SCHEDULE_KEYS = ["decode_batch_size", "new_prefill_tokens", "chunk_size", "scheduling"]
SCHEDULING = {"vllm": "mixed", "sglang": "exclusive"}


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def sim_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    sweep_main = pytest.importorskip("microbench.sweep.cli").main
    tmp = tmp_path_factory.mktemp(f"sim-sweep-{request.param}")
    args = [
        "--alpha-ms",
        "4",
        "--beta-d-ms",
        "0.2",
        "--beta-c-ms",
        "0.02",
        "--gamma-ns",
        "20",
        "--delta-ns",
        "40",
        "--frontend-ns-per-token",
        str(FRONTEND_NS),
        "--mode",
        request.param,
    ]
    sweep = {
        "chunks": [512, 1024],
        "decode_batch_sizes": [0, 2, 4, 8],
        "prefill_tokens": [256, 1024, 2048],
        "repetitions": 1,
        "decode_context": 256,
        "engine": {"kind": "sim", "extra_args": args},
    }
    path = tmp / "sweep.yaml"
    path.write_text(yaml.safe_dump(sweep))
    out = tmp / f"sim-{request.param}"
    assert sweep_main(["--config", str(path), "--out", str(out)]) in (0, 1)
    return out


def _truth_full_penalty(d: int, p: int, chunk: int, scheduling: Scheduling) -> float:
    """Median over the full-chunk steps of a decode token's extra wait on them: the step less a decode
    step (mixed: β_c·c + γ·c·(ctx + c/2)), or the whole step (exclusive)."""
    sched = chunk_schedule(p, chunk, d, scheduling)
    full = [s for s in sched if s.num_tokens >= chunk] or sched
    return statistics.median(
        extra_wait_ms(MODEL.step_ms(s), MODEL.step_ms(StepShape(d)), scheduling) for s in full
    )


def _truth_decode_step(d: int, context: float) -> float:
    return MODEL.step_ms(StepShape(d, (), d * context))


def test_the_per_full_chunk_step_penalty_and_ratio_are_recovered(sim_run: Path) -> None:
    records = [r for r in load_records(sim_run) if r.validity.valid and r.config.decode_batch_size > 0]
    assert len(records) >= 2 * 3 * 3 - 2  # a loaded box may refuse a point or two
    scheduling = records[0].config.scheduling
    assert scheduling == SCHEDULING[sim_run.name.removeprefix("sim-")]
    # The sim sleeps its steps in real time: on a loaded 2-core box a step can run late (25 ms seen), so
    # most points are held to 15% or 4 ms and the run as a whole (the median over points) to 5%.
    penalty, ratio, identity, partial, close = [], [], [], 0, 0
    for r in records:
        c = r.config
        assert r.derived.penalty_source == "engine_steps"
        truth = _truth_full_penalty(c.decode_batch_size, c.new_prefill_tokens, c.chunk_size, scheduling)
        decode = _truth_decode_step(c.decode_batch_size, r.local_baseline.context_tokens)
        penalty.append(r.derived.tpot_penalty_ms / truth)
        ratio.append(r.derived.penalty_ratio / ((decode + truth) / decode))
        close += r.derived.tpot_penalty_ms == pytest.approx(truth, rel=0.15, abs=4.0)
        # seed 002's identity holds on the client's stamps: D × Σ per-step penalties ≈ measured delay (where
        # the penalties are large against a decode gap's delivery jitter of ~1 ms)
        if c.new_prefill_tokens >= 1024:
            identity.append(r.derived.identity_check)
        partial += r.derived.penalty_last_step_ms is not None
    assert close >= 0.8 * len(records), (close, len(records))
    assert statistics.median(identity) == pytest.approx(1.0, abs=0.1), identity
    assert statistics.median(penalty) == pytest.approx(1.0, abs=0.05)
    assert statistics.median(ratio) == pytest.approx(1.0, abs=0.05)
    # mixed, P = chunk with D > 0 ends in a last chunk of D tokens, reported apart; exclusive, none does
    assert partial >= 4 if scheduling == "mixed" else partial == 0


def test_step_model_and_front_end_recover_the_sims_parameters(sim_run: Path) -> None:
    records = load_records(sim_run)
    fit = fit_step_model(records)
    # intra-chunk attention is found from the data; the decode-context term (δ·D·ctx, 0.1 ms at D = 8 on
    # this grid's short contexts) is too small to tell apart from β_d here, so it may be folded into it
    assert fit.data == "steps" and fit.model.startswith("c·(ctx + c/2)"), fit.selection
    for name in ("alpha_ms", "beta_c_ms", "gamma_ns"):
        assert fit.params[name] == pytest.approx(TRUTH[name], rel=0.10), (name, fit.params)
    # β_d and δ·ctx_dec are nearly collinear on these contexts: their sum, a decode token's cost at the
    # run's mean decode context, is what the data determine
    ctx = statistics.mean(r.local_baseline.context_tokens for r in records if r.local_baseline)
    decode_token = fit.params["beta_d_ms"] + fit.params.get("delta_ns", 0.0) * 1e-6 * ctx
    assert decode_token == pytest.approx(TRUTH["beta_d_ms"] + TRUTH["delta_ns"] * 1e-6 * ctx, rel=0.10)
    front = fit_frontend(records)
    assert front.per_token_ns == pytest.approx(FRONTEND_NS, rel=0.10), front
    comparison = compare_models(records)
    step_r2 = comparison["r2"].tolist()[1]
    # on failure, the points whose measured delay the step model misses most (a host stall shows here)
    target = interference_frame(records)
    target = target.assign(predicted_ms=[fit.interference_ms(*k) for k in target[SCHEDULE_KEYS].to_numpy()])
    worst = target.assign(ratio=target["interference_ms"] / target["predicted_ms"]).sort_values("ratio")
    assert step_r2 > 0.95 and comparison["loo_p_median_ape_pct"].notna().all(), worst.iloc[[0, 1, -2, -1]]


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
