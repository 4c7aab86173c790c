"""The step-model fit's decode-only row: the median of every decode-only step of the attempt.

Hand-built step lists and a synthesized run (``analysis.synthetic``) whose stored steps are perturbed as a
busy box perturbs the sim's wall-timed steps: the decode-only step a replay adds up hundreds of times must
come from the many decode steps of each attempt, not from one local median among twice as many noisy
prefill rows.
"""

from __future__ import annotations

import pytest

from analysis.models import fit_step_model
from analysis.steps import decode_row_ms, steps_frame
from analysis.synthetic import synthesize_run
from analysis.table import load_records
from engine_harness.step_model import StepModel, StepShape
from engine_harness.steps import EngineStep
from microbench.results.records import RunRecord
from microbench.results.steps import attempt_decode_steps


def _step(prefill: int, decode: int, ms: float | None) -> EngineStep:
    return EngineStep(
        prefill_tokens=prefill, decode_tokens=decode, prefill_requests=int(prefill > 0),
        decode_requests=decode, elapsed_ms=ms,
    )  # fmt: skip


def test_every_decode_only_step_of_the_attempt_at_its_batch_counts() -> None:
    steps = [
        _step(0, 2, 40.0), _step(0, 2, 41.0), _step(0, 1, 30.0),  # before; a step at another batch: not D
        _step(1024, 2, 130.0), _step(0, 2, 40.5), _step(1024, 2, 131.0),  # window, a decode step between
        _step(0, 2, 39.0), _step(0, 2, None), _step(0, 2, 40.2),  # after; an untimed step: not counted
    ]  # fmt: skip
    assert attempt_decode_steps(steps, 2) == (40.2, 5)  # median of 40, 41, 40.5, 39, 40.2
    assert attempt_decode_steps(steps, 0) == (None, 0)  # no decodes: no decode-only row
    assert attempt_decode_steps([_step(256, 0, 60.0)], 2) == (None, 0)


TRUTH = StepModel(alpha_ms=40.0, beta_d_ms=0.3, beta_c_ms=0.08, gamma_ns=20.0)


@pytest.fixture(scope="module")
def exact(tmp_path_factory: pytest.TempPathFactory) -> list[RunRecord]:
    grid = {"chunks": (2048,), "decode_batches": (0, 2, 4, 8), "prefill_tokens": (256, 1024, 2048, 4096)}
    run = synthesize_run(tmp_path_factory.mktemp("d") / "run", repetitions=1, params=TRUTH, noise=0.0, **grid)  # type: ignore[arg-type]
    return load_records(run)


def _with(rec: RunRecord, **fields: object) -> RunRecord:
    return rec.model_copy(update={"interference": rec.interference.model_copy(update=fields)})


def test_the_row_is_the_attempt_median_else_the_local_one(exact: list[RunRecord]) -> None:
    rec = next(r for r in exact if r.config.decode_batch_size == 2)
    assert rec.interference.attempt_decode_steps and rec.interference.attempt_decode_step_ms is not None
    both = _with(rec, decode_step_ms=40.9, attempt_decode_step_ms=40.6, attempt_decode_steps=25)
    assert decode_row_ms(both) == 40.6
    older = _with(rec, decode_step_ms=40.9, attempt_decode_step_ms=None, attempt_decode_steps=None)
    assert decode_row_ms(older) == 40.9  # a record derived before the field: as it always was
    frame = steps_frame([both])
    assert frame.loc[frame["kind"] == "decode", "elapsed_ms"].tolist() == [40.6]


def _busy_box(records: list[RunRecord], attempt_steps: int | None) -> list[RunRecord]:
    """Every prefill step ±0.4% (alternating: a wall-timed step starts late when the one before it ended
    late), every local decode baseline ±0.5% (10 steps' median on a busy box); the attempt's median of
    ``attempt_steps`` decode steps exact (most back-to-back steps are), or absent (an older record)."""
    out, sign = [], 1.0
    for rec in records:
        log = []
        for s in rec.interference.engine_steps_log:
            if s.prefill_tokens > 0 and s.elapsed_ms is not None:
                sign = -sign
                s = s.model_copy(update={"elapsed_ms": s.elapsed_ms * (1 + 0.004 * sign)})
            log.append(s)
        d = rec.config.decode_batch_size
        exact_ms = TRUTH.step_ms(StepShape(d)) if d else None
        local = exact_ms * (1 - 0.005 * (-1) ** (d // 2)) if exact_ms is not None else None
        out.append(_with(
            rec, engine_steps_log=log, decode_step_ms=local,
            attempt_decode_step_ms=exact_ms if attempt_steps else None, attempt_decode_steps=attempt_steps,
        ))  # fmt: skip
    return out


def test_the_attempt_s_decode_steps_pin_the_decode_step_a_replay_adds_up(exact: list[RunRecord]) -> None:
    errors = {}
    for n in (None, 25):
        fit = fit_step_model(_busy_box(exact, n), "c·(ctx + c/2)")
        shapes = [StepShape(d) for d in (1, 4, 12)]  # the serving trace's batches: 1 to 12
        errors[n] = max(abs(fit.step_ms(s) - TRUTH.step_ms(s)) for s in shapes)
    # the local medians: 0.27 ms off at one of these batches (120 ms over a 450-step busy period); the
    # attempt's medians: 0.05 ms, what the noisy prefill rows leave (each row weighs 1: ``decode_row_ms``)
    assert errors[None] > 0.1
    assert errors[25] < errors[None] / 4, errors
