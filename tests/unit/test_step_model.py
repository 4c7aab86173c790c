"""The one step-time model (``engine_harness.step_model``) on hand-computed values, and its fit on
synthesised runs of both scheduling modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.models import compare_models, fit_step_model
from analysis.synthetic import synthesize_run
from analysis.table import load_records
from engine_harness.step_model import (
    MODEL_COLUMNS,
    PARAMS,
    Chunk,
    StepModel,
    StepShape,
    chunk_schedule,
    decode_delay_ms,
    design_row,
    extra_wait_ms,
    is_eager,
    num_prefill_steps,
    prefill_budget,
)

MODEL = StepModel(
    alpha_ms=1.0, beta_d_ms=0.1, beta_c_ms=0.01, gamma_ns=100.0, delta_ns=50.0,
    prefill_fixed_ms=4.0, lambda_ns=3000.0,
)  # fmt: skip


def test_the_cost_of_one_step_by_hand() -> None:
    # 4 decodes whose contexts sum to 2000, one chunk of 1000 tokens after 2000 of its prompt:
    # α 1 + β_d·4 = 0.4 + β_c·1000 = 10 + γ·1000·(2000 + 500) = 100e-6 · 2.5e6 = 250 + δ·2000 = 0.1
    # + κ 4 (the step carries prompt tokens) + λ·(2000 of the chunk + 2000 of the riding decodes) = 3000e-6 ·
    # 4000 = 12
    shape = StepShape(4, (Chunk(1000, 2000),), 2000.0)
    assert shape.prefill_tokens == 1000 and shape.num_tokens == 1004
    assert shape.chunk_attention == 2.5e6 and shape.chunk_context == 2e6
    assert shape.prefill_context == 2000 and shape.extend_context == 4000
    assert MODEL.step_ms(shape) == pytest.approx(277.5)
    assert MODEL.step_ms(StepShape()) == pytest.approx(1.0)  # an empty step still pays α
    # two chunks in one step: each attends to its own context
    two = StepShape(0, (Chunk(10, 0), Chunk(20, 100)))
    assert two.chunk_attention == 10 * 5 + 20 * 110


def test_the_design_row_times_the_parameters_is_the_step() -> None:
    shape = StepShape(7, (Chunk(300, 1200),), 7 * 900.0)
    graphs = MODEL.model_copy(update={"eager_ms": 3.0, "cuda_graph_max_tokens": 256})
    for model in (MODEL, graphs):
        row = design_row(shape, model.cuda_graph_max_tokens)
        coef = model.coefficients()
        assert sum(row[c] * coef[PARAMS[c]] for c in MODEL_COLUMNS) == pytest.approx(model.step_ms(shape))
    assert row["c_ctx_m"] == pytest.approx(300 * 1200 / 1e6)  # the cached-context-only alternative
    assert set(coef) == {
        "alpha_ms", "prefill_fixed_ms", "beta_d_ms", "beta_c_ms", "gamma_ns", "delta_ns", "lambda_ns",
        "eager_ms",
    }  # fmt: skip


def test_only_a_step_carrying_prompt_tokens_pays_the_prefill_fixed_cost() -> None:
    model = StepModel(alpha_ms=1.5, prefill_fixed_ms=6.0, beta_d_ms=0.1, beta_c_ms=0.0, gamma_ns=0.0)
    assert model.step_ms(StepShape(2)) == pytest.approx(1.7)  # decode-only: α + 2 β_d
    assert model.step_ms(StepShape(2, (Chunk(1),))) == pytest.approx(7.7)  # one prompt token: + κ
    assert design_row(StepShape(2))["prefill_steps"] == 0.0
    assert design_row(StepShape(0, (Chunk(5), Chunk(7))))["prefill_steps"] == 1.0  # once per step


def test_each_prefill_chunk_pays_one_cost_per_token_of_its_cached_context() -> None:
    # SGLang's CPU attention gathers each prefilling request's whole KV: two chunks, one after 2048 tokens
    # of its prompt, one cold: κ once (per step) + λ × 2048 on top of the rest, whatever the chunks' sizes
    model = StepModel(
        alpha_ms=5.0, beta_d_ms=0.0, beta_c_ms=0.0, gamma_ns=0.0, prefill_fixed_ms=6.0, lambda_ns=4000.0
    )
    assert model.step_ms(StepShape(0, (Chunk(100, 2048), Chunk(300, 0)))) == pytest.approx(5 + 6 + 8.192)
    assert model.step_ms(StepShape(3, ())) == pytest.approx(5.0)  # a decode-only step has no chunk


def test_decodes_riding_in_a_prefill_step_pay_the_cached_context_cost_on_their_own_context() -> None:
    # SGLang --enable-mixed-chunk runs the decodes as one-token extend requests of the prefill batch: 3
    # decodes at contexts summing to 1500 next to a chunk after 500 tokens of its prompt pay λ × (500 + 1500);
    # the same decodes alone pay none
    model = StepModel(
        alpha_ms=5.0, beta_d_ms=1.0, beta_c_ms=0.0, gamma_ns=0.0, prefill_fixed_ms=6.0, lambda_ns=4000.0
    )
    mixed = StepShape(3, (Chunk(100, 500),), 1500.0)
    assert mixed.extend_context == 2000.0
    assert model.step_ms(mixed) == pytest.approx(5 + 6 + 3 + 8.0)
    assert model.step_ms(StepShape(3, (), 1500.0)) == pytest.approx(5 + 3)
    row = design_row(mixed)
    assert row["e_ctx_m"] == pytest.approx(2000 / 1e6) and row["p_ctx_m"] == pytest.approx(500 / 1e6)
    assert design_row(StepShape(3, (), 1500.0))["e_ctx_m"] == 0.0  # a decode-only step extends nothing
    # exclusive: a prefill step carries no decode, and the two columns agree
    alone = design_row(StepShape(0, (Chunk(100, 500),), 0.0))
    assert alone["e_ctx_m"] == alone["p_ctx_m"]
    # the extra wait of a mixed step is its λ on the decodes too: 3 × (6 + 4000e-6 · 2000) = 42 ms
    assert decode_delay_ms(model, [mixed], 3, "mixed") == pytest.approx(42.0)


def test_a_step_above_the_cuda_graph_ceiling_pays_the_eager_cost() -> None:
    graphs = StepModel(
        alpha_ms=2.0, beta_d_ms=0.0, beta_c_ms=0.0, gamma_ns=0.0, eager_ms=3.0, cuda_graph_max_tokens=512
    )
    assert graphs.step_ms(StepShape(8, (Chunk(504),))) == 2.0  # 512 tokens: a graph
    assert graphs.step_ms(StepShape(8, (Chunk(505),))) == 5.0  # 513: eager
    assert graphs.step_ms(StepShape(600)) == 5.0  # a decode batch above the ceiling too
    no_graphs = graphs.model_copy(update={"cuda_graph_max_tokens": 0})  # CPU: no ceiling, no break
    assert no_graphs.step_ms(StepShape(8, (Chunk(8000),))) == 2.0
    assert not is_eager(StepShape(8, (Chunk(8000),)), None)
    assert design_row(StepShape(8, (Chunk(505),)), 512)["eager_steps"] == 1.0


def test_mixed_and_exclusive_schedules_by_hand() -> None:
    # mixed: 48 decodes take their tokens first, 2000 of the 2048 are left for the prompt
    mixed = chunk_schedule(5000, 2048, 48, "mixed", decode_context=100.0)
    assert [(s.decode_tokens, s.chunks) for s in mixed] == [
        (48, (Chunk(2000, 0),)),
        (48, (Chunk(2000, 2000),)),
        (48, (Chunk(1000, 4000),)),
    ]
    assert all(s.decode_context == 48 * 100.0 for s in mixed)
    # exclusive: the whole budget, no decode token in a prefill step
    exclusive = chunk_schedule(5000, 2048, 48, "exclusive", decode_context=100.0)
    assert [(s.decode_tokens, s.chunks, s.decode_context) for s in exclusive] == [
        (0, (Chunk(2048, 0),), 0.0),
        (0, (Chunk(2048, 2048),), 0.0),
        (0, (Chunk(904, 4096),), 0.0),
    ]
    assert chunk_schedule(5000, 2048, 48, None) == chunk_schedule(5000, 2048, 48, "mixed")  # old records
    assert prefill_budget(2048, 48, "mixed") == 2000 and prefill_budget(2048, 48, "exclusive") == 2048
    assert (
        num_prefill_steps(4096, 2048, 4, "mixed") == 3 and num_prefill_steps(4096, 2048, 4, "exclusive") == 2
    )
    assert num_prefill_steps(10, 64, 64, "mixed") == 10  # no budget left: one token a step, never a crash
    with pytest.raises(ValueError, match="no prefill budget"):
        chunk_schedule(10, 64, 64, "mixed")


def test_a_decode_tokens_extra_wait_and_the_aggregate_delay_by_hand() -> None:
    assert extra_wait_ms(30.0, 5.0, "mixed") == 25.0 and extra_wait_ms(30.0, 5.0, "exclusive") == 30.0
    model = StepModel(alpha_ms=2.0, beta_d_ms=0.5, beta_c_ms=0.01, gamma_ns=0.0)
    # P = 300, chunk 200, D = 4. Mixed: chunks of 196 and 104 ride with the decodes; each step adds
    # β_c·c to a decode step: 4 × 0.01 × 300 = 12 ms.
    mixed = chunk_schedule(300, 200, 4, "mixed")
    assert decode_delay_ms(model, mixed, 4, "mixed") == pytest.approx(12.0)
    # Exclusive: chunks of 200 and 100 run instead of the decodes, each a whole step α + β_c·c:
    # 4 × ((2 + 2) + (2 + 1)) = 28 ms.
    exclusive = chunk_schedule(300, 200, 4, "exclusive")
    assert decode_delay_ms(model, exclusive, 4, "exclusive") == pytest.approx(28.0)
    # the decodes' own context term cancels in a mixed step (it is in the decode step it is compared with)
    with_ctx = model.model_copy(update={"delta_ns": 1000.0})
    assert decode_delay_ms(with_ctx, chunk_schedule(300, 200, 4, "mixed", 5000.0), 4) == pytest.approx(12.0)


def test_coefficients_are_bounded() -> None:
    with pytest.raises(ValueError, match="alpha_ms"):
        StepModel(alpha_ms=-1.0)
    with pytest.raises(ValueError, match="extra"):
        StepModel(alpha_ms=1.0, epsilon_ms=2.0)  # type: ignore[call-arg]


TRUTH = StepModel(alpha_ms=2.0, beta_d_ms=0.05, beta_c_ms=0.03, gamma_ns=8.0)
GRID = {
    "chunks": (2048, 8192),
    "decode_batches": (0, 1, 2, 4, 8),
    "prefill_tokens": (512, 2048, 8192, 16384),
    "repetitions": 2,
    "noise": 0.01,
}


@pytest.mark.parametrize("scheduling", ["mixed", "exclusive"])
def test_the_fit_recovers_the_model_in_both_scheduling_modes(scheduling: str, tmp_path: Path) -> None:
    run = synthesize_run(tmp_path / scheduling, params=TRUTH, scheduling=scheduling, **GRID)  # type: ignore[arg-type]
    records = load_records(run)
    assert {r.config.scheduling for r in records} == {scheduling}
    fit = fit_step_model(records)
    assert fit.model == "c·(ctx + c/2)", fit.selection
    for name in ("alpha_ms", "beta_d_ms", "beta_c_ms", "gamma_ns"):
        assert fit.params[name] == pytest.approx(getattr(TRUTH, name), rel=0.10), name
    # the predicted aggregate decode delay follows the scheduling: mixed, the chunk steps less the decode
    # steps; exclusive, the whole steps (α and all), which only the right schedule predicts
    comparison = compare_models(records)
    assert comparison["r2"].tolist()[1] > 0.99
    wrong = "mixed" if scheduling == "exclusive" else "exclusive"
    d, p, chunk = 8, 512, 2048  # one step: α is an eighth of the exclusive step
    measured = [
        r.derived.aggregate_decode_delay_ms
        for r in records
        if (r.config.decode_batch_size, r.config.new_prefill_tokens, r.config.chunk_size) == (d, p, chunk)
    ]
    right_ms = fit.interference_ms(d, p, chunk, scheduling)  # type: ignore[arg-type]
    assert sum(measured) / len(measured) == pytest.approx(right_ms, rel=0.05)
    assert abs(fit.interference_ms(d, p, chunk, wrong) / right_ms - 1) > 0.10
