"""``microbench.results.derive`` on hand-built stamp sets whose answers are worked out by hand.

Every case: decode steps of 10 ms (stamps at 0, 10, 20, … ms), rules with 2 local gaps, 2 recovery gaps,
no discarded tokens; the injection is sent at ``t0`` and its first token comes at ``t1``.
"""

from __future__ import annotations

import pandas as pd
import pytest

from engine_harness.engines import engine_kind
from engine_harness.metrics import Snapshot
from engine_harness.steps import EngineStep
from microbench.results.derive import DeriveInputs, derive
from microbench.results.records import Baseline, Observation, ProtocolRules, RunConfig

MS = 1_000_000
RULES = ProtocolRules(local_gaps=2, recovery_gaps=2, discard_tokens=0, steady_window=2)
VLLM = engine_kind("vllm").metrics
BASELINE = Baseline(tpot_p50_ms=12.0, tpot_p90_ms=12.0, tpot_p99_ms=12.0, n_gaps=64)  # stale: never used


def _stamps(streams: dict[int, list[tuple[float, int]]], prefill: list[float] = ()) -> pd.DataFrame:
    """(ms, tokens) reads per decode stream; ``seen`` counts tokens from the stream's start."""
    rows = []
    for i, reads in streams.items():
        seen = 0
        for ms, n in reads:
            seen += n
            rows.append((i, "decode", int(ms * MS), n, seen))
    rows += [(-1, "prefill", int(ms * MS), 1, k + 1) for k, ms in enumerate(prefill)]
    return pd.DataFrame(rows, columns=["stream", "role", "t_ns", "tokens", "seen"])


def _snap(hits: float, queries: float) -> Snapshot:
    return Snapshot(0, {("vllm:prefix_cache_hits_total", frozenset()): hits,
                        ("vllm:prefix_cache_queries_total", frozenset()): queries})  # fmt: skip


def _obs(d: int, t0_ms: float, t1_ms: float | None, **kw: object) -> Observation:
    cfg = RunConfig(
        decode_batch_size=d, new_prefill_tokens=512, chunk_size=300, model="m", gpu="cpu",
        repetition=0, engine="vllm", decode_context=64, decode_max_tokens=100 if d else 0,
    )  # fmt: skip
    fields: dict[str, object] = dict(
        run_id="r", config=cfg, attempt=0, t_inject_ns=int(t0_ms * MS),
        t_first_token_ns=None if t1_ms is None else int(t1_ms * MS), prompt_tokens=512,
        cached_prompt_tokens=0, engine_steps=None, baseline_file="baselines/300/D1_b0.json" if d else None,
        raw_file="raw/x.parquet", metrics_file="metrics/x.json",
    )  # fmt: skip
    fields.update(kw)
    return Observation.model_validate(fields)


def _steady(until_ms: int) -> list[tuple[float, int]]:
    return [(float(t), 1) for t in range(0, until_ms + 1, 10)]


TWO_CHUNKS = [  # decode-only steps of 9 and 11 ms right before the prefill; one after it, slow, not local
    EngineStep(prefill_tokens=0, decode_tokens=1, prefill_requests=0, decode_requests=1, elapsed_ms=9.0),
    EngineStep(prefill_tokens=0, decode_tokens=1, prefill_requests=0, decode_requests=1, elapsed_ms=11.0),
    EngineStep(prefill_tokens=299, decode_tokens=1, prefill_requests=1, decode_requests=1, elapsed_ms=30.0),
    EngineStep(prefill_tokens=213, decode_tokens=1, prefill_requests=1, decode_requests=1, elapsed_ms=20.0),
    EngineStep(prefill_tokens=0, decode_tokens=1, prefill_requests=0, decode_requests=1, elapsed_ms=50.0),
]


def test_a_burst_read_carrying_several_tokens() -> None:
    # send at 105 ms, first token at 160 ms; the decode reads at 110 (1 token) and at 150 (3 tokens in one
    # read), then recovers at 170, 180, 190.
    reads = [
        *_steady(100),
        (110.0, 1),
        (150.0, 1),
        (150.0, 1),
        (150.0, 1),
        (170.0, 1),
        (180.0, 1),
        (190.0, 1),
    ]
    inp = DeriveInputs(
        _obs(1, 105, 160, engine_steps=TWO_CHUNKS), _stamps({0: reads}, [160.0]), BASELINE,
        _snap(0, 0), _snap(0, 512), RULES, VLLM,
    )  # fmt: skip
    rec = derive(inp)
    assert rec.validity.valid, rec.validity.reasons
    i, d = rec.interference, rec.derived
    # local baseline: the last two gaps before the send, 10 ms each; 11 tokens had arrived: context 64 + 11
    assert rec.local_baseline is not None and rec.local_baseline.tpot_p50_ms == pytest.approx(10.0)
    assert rec.local_baseline.context_tokens == pytest.approx(75.0)
    # window gaps: 100→110 (1 token, 10 ms) and 110→150 (3 tokens in one read, 40 ms: 13.33 ms each);
    # token-weighted, the window median is 13.33 ms (three of its four tokens)
    assert i.n_gaps_during == 2 and i.max_tokens_per_read == 3
    assert i.tpot_during_prefill_p50_ms == pytest.approx(40 / 3)
    assert d.tpot_penalty_p50_ms == pytest.approx(40 / 3 - 10) and d.tpot_penalty_ratio == pytest.approx(
        4 / 3
    )
    # the engine's record: a full chunk (299 + 1 = 300 tokens, 30 ms), a partial last one (214, 20 ms),
    # decode-only steps of 9 and 11 ms → decode step 10 ms; penalties 20 ms (full) and 10 ms (last)
    assert i.full_chunk_steps == 1 and i.step_time_full_chunk_ms == 30.0 and i.step_time_last_chunk_ms == 20.0
    assert i.decode_step_ms == 10.0 and i.engine_prefill_ms == 50.0
    assert d.penalty_source == "engine_steps"
    assert d.tpot_penalty_ms == pytest.approx(20.0) and d.penalty_last_step_ms == pytest.approx(10.0)
    assert d.total_interference_ms == pytest.approx(30.0)
    # one baseline for every ratio: the local one (the batch's stale 12 ms is never divided by)
    assert d.tpot_during_prefill_ms == pytest.approx(30.0) and d.penalty_ratio == pytest.approx(3.0)
    # seed 002's identity as a check: aggregate delay (10 − 10·1) + (40 − 10·3) = 10 ms vs D·Σ penalties 30
    assert d.aggregate_decode_delay_ms == pytest.approx(10.0)
    assert d.identity_check == pytest.approx(10.0 / 30.0)
    assert (
        d.penalty_identity_ms == pytest.approx(10.0 / 2) and d.num_chunks_used == 2 and d.chunks_note is None
    )
    assert i.num_chunks_actual == 2 and i.num_chunks_source == "engine_log" and i.num_chunks_expected == 2
    assert i.recovery_gaps_ms == [20.0, 10.0]  # 150→170, 170→180
    assert i.prefill_duration_ms == pytest.approx(55.0) and i.prefix_cache_hits == 0


def test_a_window_with_no_gap_inside_is_invalid() -> None:
    # a prefill quicker than one decode step: send at 103, first token at 105, next decode read at 110
    inp = DeriveInputs(
        _obs(1, 103, 105),
        _stamps({0: _steady(200)}, [105.0]),
        BASELINE,
        _snap(0, 0),
        _snap(0, 512),
        RULES,
        VLLM,
    )
    rec = derive(inp)
    assert not rec.validity.valid
    assert rec.validity.reasons == ["decode stream 0 did not span the prefill window"]
    assert rec.interference.n_gaps_during == 0 and rec.interference.tpot_during_prefill_p50_ms is None
    assert rec.derived.aggregate_decode_delay_ms == 0.0


def test_a_failed_injection_with_no_prefill_step() -> None:
    obs = _obs(0, 100, None, prompt_tokens=None, cached_prompt_tokens=None, engine_steps=[],
               notes=["the injected request failed: HTTP 500"], raw_file=None, metrics_file=None)  # fmt: skip
    rec = derive(DeriveInputs(obs, None, None, None, None, RULES, VLLM))
    assert not rec.validity.valid and rec.validity.reasons == ["the injected request failed: HTTP 500"]
    i, d = rec.interference, rec.derived
    assert i.num_chunks_actual is None and i.num_chunks_source == "none" and i.engine_steps_log == []
    assert i.prefill_duration_ms is None and rec.t_first_token_ns == rec.t_inject_ns
    assert d.tpot_penalty_ms is None and d.penalty_ratio is None and rec.local_baseline is None


def test_a_decode_stream_that_ended_early() -> None:
    # stream 1 stopped at 60 ms (7 tokens); stream 0 decodes through the window as in the burst case
    reads0 = [*_steady(100), (130.0, 1), (150.0, 1), (170.0, 1), (180.0, 1), (190.0, 1)]
    obs = _obs(2, 105, 160, engine_steps=TWO_CHUNKS, decode_failure="decode stream 1 ended after 7 tokens")
    stamps = _stamps({0: reads0, 1: _steady(60)}, [160.0])
    rec = derive(DeriveInputs(obs, stamps, BASELINE, _snap(0, 0), _snap(0, 512), RULES, VLLM))
    assert rec.validity.reasons == [
        "decode stream 1 did not span the prefill window",
        "decode stream 1 ended after 7 tokens",
    ]
    # only stream 0 has window gaps: 100→130 (30 ms) and 130→150 (20 ms): 50 − 2·10 = 30 ms of delay
    assert rec.derived.aggregate_decode_delay_ms == pytest.approx(30.0)
    assert rec.derived.penalty_identity_ms == pytest.approx(30.0 / (2 * 2))
    # the logged decode-only steps carried 1 token, not D = 2: no decode step to compare with, no penalty
    assert rec.derived.tpot_penalty_ms is None and rec.derived.penalty_source == "none"


def test_a_prefix_cache_hit_or_a_wrong_prompt_length_invalidates() -> None:
    reads = [*_steady(100), (130.0, 1), (150.0, 1), (170.0, 1), (180.0, 1), (190.0, 1)]
    obs = _obs(1, 105, 160, engine_steps=TWO_CHUNKS, cached_prompt_tokens=64, prompt_tokens=511)
    rec = derive(DeriveInputs(obs, _stamps({0: reads}), BASELINE, _snap(0, 0), _snap(64, 512), RULES, VLLM))
    assert rec.validity.reasons == [
        "the injection hit the prefix cache (64 tokens in /metrics)",
        "the injection hit the prefix cache (usage.cached_tokens = 64)",
        "the engine counted 511 prompt tokens, not 512",
    ]


def test_a_chance_match_of_a_cold_prompts_first_ids_is_no_prefix_cache_hit() -> None:
    # SGLang's radix cache (page size 1) matched 1 token of cold prompts on 5 of 32 sweep attempts: a chance
    # match of the first id, not a warm prompt; a hit of a whole first block (16 tokens) still invalidates
    reads = [*_steady(100), (130.0, 1), (150.0, 1), (170.0, 1), (180.0, 1), (190.0, 1)]
    for hit, valid in ((1, True), (15, True), (16, False)):
        obs = _obs(1, 105, 160, engine_steps=TWO_CHUNKS, cached_prompt_tokens=hit)
        after = _snap(hit, 512)
        rec = derive(DeriveInputs(obs, _stamps({0: reads}), BASELINE, _snap(0, 0), after, RULES, VLLM))
        assert rec.validity.valid is valid, (hit, rec.validity.reasons)
        assert any("prefix cache" in why for why in rec.validity.reasons) is not valid


def test_the_discard_rule_counts_from_the_streams_real_start() -> None:
    # the stored slice starts at the stream's 30th token: discarding 16 tokens must drop nothing of it
    from microbench.results.derive import stream_gaps

    frame = _stamps({0: _steady(100)})
    frame["seen"] += 29
    assert len(stream_gaps(frame, 0, 16)) == 10
    assert len(stream_gaps(frame, 0, 35)) == 5  # the gaps ending at tokens 36…40


def test_without_a_step_log_the_penalty_is_the_identitys_and_a_disagreeing_histogram_is_not_divided_by() -> (
    None
):
    # vLLM's histogram puts a last chunk of ≤ 8 tokens in the decode bucket: it counts 1 where the schedule
    # has 2 (P 512 at chunk 300 − D 1). The penalty is solved from the identity over the schedule's 2 steps.
    reads = [*_steady(100), (130.0, 1), (150.0, 1), (170.0, 1), (180.0, 1), (190.0, 1)]
    hist = "vllm:iteration_tokens_total_bucket"

    def snap(low: float, high: float) -> Snapshot:
        base = _snap(0, 0).samples
        buckets = {(hist, frozenset({("le", "1.0")})): low, (hist, frozenset({("le", "8.0")})): low,
                   (hist, frozenset({("le", "+Inf")})): high}  # fmt: skip
        return Snapshot(0, base | buckets)

    rec = derive(
        DeriveInputs(_obs(1, 105, 160), _stamps({0: reads}), None, snap(10, 10), snap(14, 15), RULES, VLLM)
    )
    i, d = rec.interference, rec.derived
    assert i.num_chunks_source == "histogram" and i.num_chunks_actual == 1 and d.num_chunks_used == 2
    assert d.chunks_note and "counted 1" in d.chunks_note
    assert d.penalty_source == "identity"
    # gaps 100→130 and 130→150 against the local 10 ms: (30 − 10) + (20 − 10) = 30 ms over 1 × 2 steps
    assert d.tpot_penalty_ms == pytest.approx(15.0) and d.penalty_ratio == pytest.approx(2.5)


def test_a_transcribed_vllm_step_log_with_a_partial_last_chunk() -> None:
    # vLLM 0.32 CPU, chunk 2048, D = 4, P = 2048: a full chunk of 2044 prompt tokens (+ 4 decode tokens),
    # then a last chunk of 4 (tests/fixtures/vllm_cpu_iteration_log.txt, from the reference run's log)
    from pathlib import Path

    from engine_harness.steps import parse_iteration_lines
    from microbench.results.steps import count_chunks, prefill_steps

    text = (Path(__file__).parents[1] / "fixtures" / "vllm_cpu_iteration_log.txt").read_text()
    steps = parse_iteration_lines(text)
    assert [s.prefill_tokens for s in steps] == [0, 0, 2044, 4, 0, 0, 0]
    ps = prefill_steps(steps, chunk=2048, d=4)
    assert [s.elapsed_ms for s in ps.full] == [119.31] and ps.last_partial.elapsed_ms == 7.73
    assert ps.decode_step_ms == pytest.approx((0.47 + 3.38) / 2)  # the two decode-only steps before it
    assert ps.penalty_full_ms() == pytest.approx(119.31 - 1.925)
    assert ps.penalty_last_ms() == pytest.approx(7.73 - 1.925)
    assert ps.total_penalty_ms() == pytest.approx(119.31 + 7.73 - 2 * 1.925)
    assert count_chunks(len(ps.prefill), None, 2).used == 2


def test_an_engine_frozen_in_a_step_invalidates_the_point_with_its_reason() -> None:
    # The same point as the burst-read case, but the engine was frozen 30 s in the decode step after the
    # prefill (SIGSTOP/SIGCONT, issue #33): its step log says so, against the point's other decode steps.
    reads = [*_steady(100), (110.0, 1), *[(150.0, 1)] * 3, (170.0, 1), (180.0, 1), (190.0, 1)]
    frozen = [*TWO_CHUNKS[:4], TWO_CHUNKS[4].model_copy(update={"elapsed_ms": 30_050.0})]
    args = (_stamps({0: reads}, [160.0]), BASELINE, _snap(0, 0), _snap(0, 512), RULES, VLLM)
    assert derive(DeriveInputs(_obs(1, 105, 160, engine_steps=TWO_CHUNKS), *args)).validity.valid
    rec = derive(DeriveInputs(_obs(1, 105, 160, engine_steps=frozen), *args))
    assert not rec.validity.valid
    assert [r for r in rec.validity.reasons if "engine step 4 took 30050 ms for 1 tokens" in r]
