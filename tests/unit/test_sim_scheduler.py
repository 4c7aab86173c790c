"""Scheduler of the simulated engine (pure): chunk counts per mode, prefix cache, preemption, limits."""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import pytest

from engine_harness.kv_blocks import BlockPool, block_hashes
from engine_harness.scheduler_model import EOS_TOKEN_ID, Scheduler, SimRequest, Status, StepPlan
from engine_harness.sim.params import SimConfig, SimStepModel, load_config
from engine_harness.step_model import Chunk, StepShape, chunk_schedule, num_prefill_steps

A = 65  # the token every test sampler generates


def _sample(req: SimRequest) -> int:
    return A


def _step(sched: Scheduler, sample: Callable[[SimRequest], int] = _sample) -> StepPlan:
    plan = sched.schedule()
    sched.commit(plan, sample)
    return plan


def _req(rid: str, n_prompt: int, max_tokens: int = 10_000, start: int = 0, **kw: object) -> SimRequest:
    return SimRequest(rid, [(start + i) % 250 for i in range(n_prompt)], max_tokens, **kw)  # type: ignore[arg-type]


def _start_decodes(sched: Scheduler, d: int) -> list[SimRequest]:
    """``d`` requests with short unique prompts, stepped until all of them decode."""
    reqs = [_req(f"d{i}", 8, start=1000 + 37 * i) for i in range(d)]
    for r in reqs:
        sched.add(r)
    while not all(r.in_decode for r in reqs):
        _step(sched)
    return reqs


def _prefill_steps(sched: Scheduler, req: SimRequest) -> list[StepPlan]:
    """Add ``req`` and step until its first token; the steps that carried its prompt."""
    sched.add(req)
    steps = []
    while req.num_output_tokens == 0:
        plan = _step(sched)
        if any(c.request is req for c in plan.chunks):
            steps.append(plan)
    return steps


def _shapes(steps: list[StepPlan]) -> list[tuple[int, tuple[Chunk, ...]]]:
    return [(s.shape.decode_tokens, s.shape.chunks) for s in steps]


@pytest.mark.parametrize(
    ("budget", "d", "p"),
    [(256, 0, 1000), (256, 4, 1000), (256, 16, 240), (256, 16, 241), (512, 100, 5000), (64, 63, 10)],
)
def test_vllm_chunk_count_is_ceil_p_over_budget_minus_d(budget: int, d: int, p: int) -> None:
    sched = Scheduler("vllm", max_num_batched_tokens=budget)
    decodes = _start_decodes(sched, d)
    before = [r.num_output_tokens for r in decodes]
    steps = _prefill_steps(sched, _req("cold", p, max_tokens=1, start=7))
    assert len(steps) == math.ceil(p / (budget - d)) == num_prefill_steps(p, budget, d, "mixed")
    assert all(s.shape.decode_tokens == d and s.num_tokens <= budget for s in steps)  # decodes ride along
    assert sum(s.shape.prefill_tokens for s in steps) == p
    assert [r.num_output_tokens - b for r, b in zip(decodes, before, strict=True)] == [len(steps)] * d
    # the step model's schedule is what the sim's scheduler does
    assert _shapes(steps) == [(s.decode_tokens, s.chunks) for s in chunk_schedule(p, budget, d, "mixed")]


@pytest.mark.parametrize(("budget", "d", "p"), [(256, 4, 1000), (256, 16, 256), (512, 100, 5000)])
def test_sglang_prefill_runs_instead_of_decodes(budget: int, d: int, p: int) -> None:
    sched = Scheduler("sglang", max_num_batched_tokens=budget)
    decodes = _start_decodes(sched, d)
    before = [r.num_output_tokens for r in decodes]
    steps = _prefill_steps(sched, _req("cold", p, max_tokens=1, start=7))
    assert len(steps) == math.ceil(p / budget) == num_prefill_steps(p, budget, d, "exclusive")
    assert all(s.shape.decode_tokens == 0 for s in steps)
    assert [r.num_output_tokens for r in decodes] == before  # the decodes stalled for the whole prefill
    nxt = _step(sched)
    assert nxt.shape.decode_tokens == d and nxt.shape.prefill_tokens == 0
    assert _shapes(steps) == [(0, s.chunks) for s in chunk_schedule(p, budget, d, "exclusive")]


@pytest.mark.parametrize(("budget", "d", "p"), [(256, 4, 1000), (256, 16, 241), (512, 100, 5000)])
def test_sglang_mixed_chunk_count(budget: int, d: int, p: int) -> None:
    sched = Scheduler("sglang-mixed", max_num_batched_tokens=budget)
    _start_decodes(sched, d)
    steps = _prefill_steps(sched, _req("cold", p, max_tokens=1, start=7))
    assert len(steps) == math.ceil(p / (budget - d))
    assert all(s.shape.decode_tokens == d for s in steps)
    assert _shapes(steps) == [(s.decode_tokens, s.chunks) for s in chunk_schedule(p, budget, d, "mixed")]


def test_context_of_each_chunk_is_tokens_already_computed() -> None:
    sched = Scheduler("vllm", max_num_batched_tokens=100)
    steps = _prefill_steps(sched, _req("p", 250, max_tokens=1))
    assert [c.context for s in steps for c in s.chunks] == [0, 100, 200]
    # Σ c·(ctx + c/2): causal attention to the cached context and to half of the chunk itself
    assert [s.shape.chunk_attention for s in steps] == [100 * 50, 100 * (100 + 50), 50 * (200 + 25)]


def test_max_tokens_one_finishes_at_end_of_prefill() -> None:
    sched = Scheduler("vllm", max_num_batched_tokens=64)
    req = _req("one", 100, max_tokens=1)
    steps = _prefill_steps(sched, req)
    assert len(steps) == 2
    assert req.status is Status.FINISHED and req.finish_reason == "length" and req.num_output_tokens == 1
    assert not sched.has_work() and sched.kv_usage == 0


def test_decode_finishes_after_max_tokens_steps() -> None:
    sched = Scheduler("vllm", max_num_batched_tokens=64)
    req = _req("r", 10, max_tokens=5)
    sched.add(req)
    n = 0
    while sched.has_work():
        _step(sched)
        n += 1
    assert n == 5 and req.token_ids[10:] == [A] * 5


def test_shared_prefix_hits_cache_unique_prompts_hit_nothing() -> None:
    sched = Scheduler("vllm", max_num_batched_tokens=4096, block_size=16)
    prefix = list(range(100, 164))  # 4 full blocks
    first = SimRequest("a", [*prefix, 1, 2, 3], max_tokens=1)
    second = SimRequest("b", [*prefix, 4, 5, 6, 7], max_tokens=1)
    _prefill_steps(sched, first)
    q0, h0 = sched.prefix_cache_queries, sched.prefix_cache_hits
    assert (q0, h0) == (67, 0)
    steps = _prefill_steps(sched, second)
    assert sched.prefix_cache_queries - q0 == 68 and sched.prefix_cache_hits - h0 == 64
    assert second.num_cached_tokens == 64
    assert sum(s.shape.prefill_tokens for s in steps) == 4  # cached tokens are not computed
    assert steps[0].chunks[0].context == 64
    for i in range(5):  # unique prompts: no hits at all
        _prefill_steps(sched, _req(f"u{i}", 80, max_tokens=1, start=1 + 40 * i))
    assert sched.prefix_cache_hits - h0 == 64


def test_identical_prompt_computes_at_least_one_token() -> None:
    sched = Scheduler("vllm", block_size=16)
    _prefill_steps(sched, _req("a", 64, max_tokens=1))
    steps = _prefill_steps(sched, _req("b", 64, max_tokens=1))
    assert sched.prefix_cache_hits == 48  # capped at 63 tokens, rounded down to full blocks
    assert sum(s.shape.prefill_tokens for s in steps) == 16


def test_same_block_at_another_position_is_not_a_hit() -> None:
    block = list(range(16))
    assert block_hashes(block * 2, 16)[0] != block_hashes(block * 2, 16)[1]
    sched = Scheduler("vllm", block_size=16)
    _prefill_steps(sched, SimRequest("a", [*list(range(50, 66)), *block, 1], 1))
    _prefill_steps(sched, SimRequest("b", [*block, 2], 1))
    assert sched.prefix_cache_hits == 0


def test_prefix_caching_disabled_counts_nothing() -> None:
    sched = Scheduler("vllm", enable_prefix_caching=False)
    _prefill_steps(sched, _req("a", 64, max_tokens=1))
    steps = _prefill_steps(sched, _req("b", 64, max_tokens=1))
    assert (sched.prefix_cache_queries, sched.prefix_cache_hits) == (0, 0)
    assert sum(s.shape.prefill_tokens for s in steps) == 64


def test_generated_tokens_enter_the_prefix_cache() -> None:
    sched = Scheduler("vllm", block_size=16)
    req = _req("a", 20, max_tokens=30)
    sched.add(req)
    while sched.has_work():
        _step(sched)
    # a follow-up turn repeats prompt + answer: the full blocks of both hit
    _prefill_steps(sched, SimRequest("b", [*req.token_ids, 9], 1))
    assert sched.prefix_cache_hits == (50 // 16) * 16


def test_preemption_when_kv_runs_out_is_counted_and_everyone_finishes() -> None:
    sched = Scheduler("vllm", max_num_batched_tokens=512, block_size=16, num_kv_blocks=10)
    reqs = [_req(f"r{i}", 30, max_tokens=40, start=50 * i) for i in range(3)]  # 5 blocks each at the end
    for r in reqs:
        sched.add(r)
    preempted = 0
    for _ in range(10_000):
        if not sched.has_work():
            break
        plan = _step(sched)
        preempted += len(plan.preempted)
        assert len(sched.pool._free) >= 0 and sched.kv_usage <= 1
    assert not sched.has_work()
    assert preempted > 0 and sched.num_preemptions == preempted
    assert sum(r.num_preemptions for r in reqs) == preempted
    assert all(r.finish_reason == "length" and r.num_output_tokens == 40 for r in reqs)
    assert sched.kv_usage == 0


def test_preempted_request_recomputes_prompt_and_outputs() -> None:
    sched = Scheduler("vllm", max_num_batched_tokens=512, num_kv_blocks=6, enable_prefix_caching=False)
    first, second = _req("a", 31, max_tokens=40), _req("b", 31, max_tokens=40, start=100)  # ≤ 5 blocks each
    sched.add(first)
    _step(sched)
    sched.add(second)
    recompute = None
    victim: SimRequest | None = None
    for _ in range(1000):
        plan = _step(sched)
        if victim is None and plan.preempted:
            victim = plan.preempted[0]
            n_tokens = victim.num_tokens
        elif victim is not None:
            chunk = next((c for c in plan.chunks if c.request is victim), None)
            if chunk is not None:
                recompute = (chunk.num_tokens, chunk.context, n_tokens)
                break
    assert recompute is not None
    tokens, context, n_tokens = recompute
    assert context == 0 and tokens == n_tokens  # everything, generated tokens included, is computed again


def test_max_num_seqs_caps_running_requests() -> None:
    sched = Scheduler("vllm", max_num_batched_tokens=4096, max_num_seqs=3)
    for i in range(5):
        sched.add(_req(f"r{i}", 10, start=20 * i))
    _step(sched)
    assert len(sched.running) == 3 and len(sched.waiting) == 2


def test_decodes_count_against_the_budget_in_vllm_mode() -> None:
    sched = Scheduler("vllm", max_num_batched_tokens=8, max_num_seqs=16)
    for i in range(8):
        sched.add(_req(f"r{i}", 1, start=i))
    while len(sched.running) < 8 or not all(r.in_decode for r in sched.running):
        _step(sched)
    sched.add(_req("late", 5))
    plan = _step(sched)
    assert plan.shape.decode_tokens == 8 and plan.shape.prefill_tokens == 0  # no room for the chunk this step


def test_abort_frees_blocks() -> None:
    sched = Scheduler("vllm", max_num_batched_tokens=64, num_kv_blocks=100)
    req = _req("a", 200)
    sched.add(req)
    _step(sched)
    assert sched.kv_usage > 0 and req.status is Status.RUNNING
    assert sched.abort(req)
    assert sched.kv_usage == 0 and not sched.has_work() and req.finish_reason == "abort"
    assert not sched.abort(req)


def test_abort_while_waiting() -> None:
    sched = Scheduler("vllm", max_num_seqs=1)
    a, b = _req("a", 10), _req("b", 10, start=50)
    sched.add(a)
    sched.add(b)
    _step(sched)
    assert sched.abort(b) and list(sched.waiting) == []


def test_eos_stops_unless_ignored_and_after_min_tokens() -> None:
    def eos(req: SimRequest) -> int:
        return EOS_TOKEN_ID

    sched = Scheduler("vllm")
    plain, ignore, at_least = (
        _req("a", 10, 20),
        _req("b", 10, 20, ignore_eos=True),
        _req("c", 10, 20, min_tokens=4),
    )
    for r in (plain, ignore, at_least):
        sched.add(r)
    while sched.has_work():
        _step(sched, eos)
    assert (plain.finish_reason, plain.num_output_tokens) == ("stop", 1)
    assert (ignore.finish_reason, ignore.num_output_tokens) == ("length", 20)
    assert (at_least.finish_reason, at_least.num_output_tokens) == ("stop", 4)


def test_block_pool_evicts_least_recently_freed_first() -> None:
    pool = BlockPool(4, 16)
    a, b = pool.allocate(2), pool.allocate(2)
    assert a is not None and b is not None
    pool.cache(a[0], 111)
    pool.cache(b[0], 222)
    pool.release(a)
    pool.release(b)
    assert pool.usage == 0 and pool.lookup([111]) == [a[0]]
    fresh = pool.allocate(2)  # takes a's blocks (freed first)
    assert fresh is not None and set(fresh) == set(a)
    assert pool.lookup([111]) == [] and pool.lookup([222]) == [b[0]]
    assert pool.allocate(3) is None


def test_sim_step_model_is_the_step_model_with_seeded_jitter() -> None:
    m = SimStepModel(alpha_ms=2, beta_d_ms=0.1, beta_c_ms=0.01, gamma_ns=5)
    # 10 decodes, one chunk of 1000 tokens at context 500: Σ c·(ctx + c/2) = 1000 × 1000 = 10⁶
    shape = StepShape(10, (Chunk(1000, 500),))
    assert m.sample_s(shape, random.Random(0)) == pytest.approx((2 + 1 + 10 + 5) / 1e3)
    j = SimStepModel(alpha_ms=2, jitter=0.2)
    one = StepShape(1)
    a = [j.sample_s(one, r) for r in [random.Random(3)] for _ in range(50)]
    b = [j.sample_s(one, r) for r in [random.Random(3)] for _ in range(50)]
    assert a == b and len(set(a)) == 50 and min(a) >= 0
    assert sum(a) / len(a) == pytest.approx(j.step_ms(one) / 1e3, rel=0.1)


def test_the_sim_prices_a_sglang_mixed_step_s_riding_decodes_as_the_step_model_does() -> None:
    sched = Scheduler(mode="sglang-mixed", max_num_batched_tokens=256)
    decodes = _start_decodes(sched, 3)
    plan = _prefill_steps(sched, _req("p", 500))[1]  # the second chunk, after 253 of its prompt
    contexts = [c.context for c in plan.chunks if c.is_decode]
    assert plan.shape.chunks == (Chunk(247, 253),) and len(contexts) == len(decodes)
    m = SimStepModel(alpha_ms=2, beta_d_ms=0.0, beta_c_ms=0.0, gamma_ns=0.0, lambda_ns=1000.0)
    # λ on the chunk's context and on each riding decode's own
    assert m.sample_s(plan.shape, random.Random(0)) == pytest.approx((2 + (253 + sum(contexts)) / 1e3) / 1e3)
    assert m.sample_s(plan.shape, random.Random(0)) == pytest.approx(m.step_ms(plan.shape) / 1e3)


def test_config_yaml_then_overrides(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "p.yaml"
    path.write_text("max_num_batched_tokens: 2048\nstep: {alpha_ms: 3.0, beta_d_ms: 0.5}\n")
    cfg = load_config(path, {"step": {"alpha_ms": 4.0, "gamma_ns": None}, "seed": None, "mode": "sglang"})
    assert (cfg.max_num_batched_tokens, cfg.step.alpha_ms, cfg.step.beta_d_ms, cfg.mode) == (
        2048,
        4.0,
        0.5,
        "sglang",
    )
    assert load_config("cpu-tiny").max_num_batched_tokens == 2048
    with pytest.raises(ValueError, match="extra"):
        load_config(None, {"max_num_batched_token": 5})
    with pytest.raises(ValueError):
        SimConfig(time_scale=-1)
