"""The engine's step mode from its start-up lines, and step durations in every mode, on transcribed lines.

vLLM lines are in the shapes CUDA vLLM 0.33 and the CPU build 0.32 write them: the engine's config line
(``vllm/config/vllm.py``'s ``__str__``, with ``compilation_config``'s non-default fields), the non-default
args of the API server, the ``world_size`` line of the process that runs the model (the engine core under
``uni``, a worker under ``mp``), and the iteration lines of ``vllm/v1/metrics/loggers.py``, stamped by the
suite's logging config. The CUDA lines' values are those of real CUDA vLLM start-ups (one GPU, default
capture sizes up to 512); no GPU run of vLLM 0.33 was transcribed here.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pandas as pd
import pytest

from engine_harness.engines import engine_kind
from engine_harness.metrics import Snapshot
from engine_harness.step_modes import describe_step_mode, sglang_step_mode, vllm_step_mode, with_timing
from engine_harness.steps import (
    EngineStep,
    SglangLogStepSource,
    VllmLogStepSource,
    parse_iteration_lines,
    parse_sglang_step_lines,
    sglang_settings,
    sglang_step_source,
    vllm_step_source,
)
from microbench.results.derive import DeriveInputs, derive
from microbench.results.records import Observation, ProtocolRules, RunConfig

CONFIG = (
    "({proc} pid=1026) INFO 11-25 07:00:10 [core.py:105] Initializing a V1 LLM engine (v{version}) with "
    "config: model='Qwen/Qwen3-Coder-30B-A3B-Instruct', speculative_config=None, tokenizer="
    "'Qwen/Qwen3-Coder-30B-A3B-Instruct', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, "
    "trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=65536, download_dir=None, load_format=auto, "
    "tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, quantization=None, "
    "enforce_eager={eager}, kv_cache_dtype=auto, device_config={device}, seed=0, "
    "served_model_name=Qwen/Qwen3-Coder-30B-A3B-Instruct, enable_prefix_caching=True, "
    "enable_chunked_prefill=True, pooler_config=None, compilation_config={compilation}\n"
)
GRAPHS = (
    "{'mode': <CompilationMode.VLLM_COMPILE: 3>, 'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: "
    "(2, 1)>, 'cudagraph_capture_sizes': [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 128, 256, 496, 512], "
    "'cudagraph_copy_inputs': False, 'max_cudagraph_capture_size': 512, 'local_cache_dir': None}"
)
NO_GRAPHS = "{'mode': <CompilationMode.NONE: 0>, 'cudagraph_mode': <CUDAGraphMode.NONE: 0>}"
ARGS = "(APIServer pid=1) INFO 11-25 07:00:01 [utils.py:233] non-default args: {args}\n"
WORLD = (
    "({proc} pid=1026) INFO 11-25 07:00:12 [parallel_state.py:1400] world_size=1 rank=0 local_rank=0 "
    "distributed_init_method=tcp://127.0.0.1:33435 backend=nccl\n"
)
ITER = (
    "(APIServer pid=1) INFO 11-25 07:01:00{stamp} [loggers.py:200] Engine 000: Iteration({i}): {cr} context "
    "requests, {ct} context tokens, 4 generation requests, 4 generation tokens, iteration elapsed time: "
    "{ms} ms, GPU KV cache usage: 0.3%\n"
)
BASE_ARGS = "{'model': 'Qwen/Qwen3-Coder-30B-A3B-Instruct', 'max_num_batched_tokens': 8192}"


def _cuda_start(args: str = BASE_ARGS, world_proc: str = "EngineCore", eager: bool = False) -> str:
    config = CONFIG.format(proc="EngineCore", version="0.33.0", eager=eager, device="cuda",
                           compilation=NO_GRAPHS if eager else GRAPHS)  # fmt: skip
    return ARGS.format(args=args) + config + WORLD.format(proc=world_proc)


def test_cuda_vllms_defaults_on_one_gpu_async_uni_and_graphs_to_512() -> None:
    mode = vllm_step_mode(_cuda_start())
    assert (mode.async_scheduling, mode.executor, mode.cuda_graph_max_tokens) == (True, "uni", 512)
    assert not mode.field_is_whole_step and mode.note is None
    assert any("default: async scheduling on" in e for e in mode.evidence)
    assert any("EngineCore" in e for e in mode.evidence)  # uni: the engine core itself runs the model
    assert with_timing(mode, stamped=True).timing == "log_interval"
    blind = with_timing(mode, stamped=False)
    assert blind.timing is None and "async scheduling" in (blind.note or "")
    assert "CUDA graphs up to 512 tokens" in describe_step_mode(mode)


def test_the_instrumented_launch_mp_and_async_off_times_steps_with_vllms_own_field() -> None:
    args = BASE_ARGS[:-1] + ", 'async_scheduling': False, 'distributed_executor_backend': 'mp'}"
    mode = vllm_step_mode(_cuda_start(args, world_proc="Worker_TP0"))
    assert (mode.async_scheduling, mode.executor) == (False, "mp") and mode.field_is_whole_step
    assert with_timing(mode, stamped=True).timing == "engine_field"  # stamps or not: the field is a step


def test_async_off_but_uni_leaves_the_field_short_of_a_step() -> None:
    args = BASE_ARGS[:-1] + ", 'async_scheduling': False}"
    mode = vllm_step_mode(_cuda_start(args))
    assert (mode.async_scheduling, mode.executor) == (False, "uni") and not mode.field_is_whole_step
    assert "uni executor" in (with_timing(mode, stamped=False).note or "")


def test_vllm_turning_its_default_off_and_enforce_eager() -> None:
    warning = (
        "(APIServer pid=1) WARNING 11-25 07:00:02 [vllm.py:1617] Async scheduling will be disabled because "
        "it is not supported with the `ray` distributed executor backend. \n"
    )
    mode = vllm_step_mode(_cuda_start(eager=True) + warning)
    assert mode.async_scheduling is False and mode.cuda_graph_max_tokens == 0


def test_the_cpu_build_mp_no_async_no_graphs() -> None:
    text = CONFIG.format(proc="EngineCore_DP0", version="0.32.0", eager=False, device="cpu",
                         compilation="{'mode': <CompilationMode.DYNAMO_TRACE_ONCE: 2>}")  # fmt: skip
    mode = vllm_step_mode(ARGS.format(args=BASE_ARGS) + text)
    assert (mode.async_scheduling, mode.executor, mode.cuda_graph_max_tokens) == (False, "mp", 0)
    assert with_timing(mode, stamped=True).timing == "engine_field"  # the reference runs' timing


def test_a_log_without_the_start_up_lines_says_so_and_never_uses_the_raw_field() -> None:
    mode = vllm_step_mode("some other engine's log\n")
    assert mode.async_scheduling is None and mode.executor is None and mode.note
    assert with_timing(mode, stamped=True).timing == "log_interval"  # stamped lines time whole steps anyway
    blind = with_timing(mode, stamped=False)
    assert blind.timing is None and "could not be determined" in (blind.note or "")


def _iterations() -> str:
    lines = [  # decode 18 ms apart, an 8192-token step 250 ms after; the field says 14, 14, 212 (async wait)
        ITER.format(stamp=" @1795500060.000000", i=1, cr=0, ct=0, ms="15.10"),
        ITER.format(stamp=" @1795500060.018000", i=2, cr=0, ct=0, ms="14.02"),
        ITER.format(stamp=" @1795500060.036500", i=3, cr=0, ct=0, ms="14.40"),
        ITER.format(stamp=" @1795500060.286500", i=4, cr=1, ct=8188, ms="212.31"),
    ]
    return "".join(lines)


def test_iteration_lines_are_timed_as_the_mode_allows() -> None:
    interval = parse_iteration_lines(_iterations(), "log_interval")
    assert [s.elapsed_ms for s in interval] == [None, 18.0, 18.5, 250.0]  # the first: start not logged
    assert [s.reported_ms for s in interval] == [15.10, 14.02, 14.40, 212.31]  # kept, never fitted
    assert interval[3].t_end_s == 1795500060.2865 and interval[3].prefill_tokens == 8188
    assert (
        parse_iteration_lines(_iterations(), "log_interval", previous_t=1795500059.98)[0].elapsed_ms == 20.0
    )
    assert [s.elapsed_ms for s in parse_iteration_lines(_iterations(), "engine_field")] == [
        15.1,
        14.02,
        14.4,
        212.31,
    ]
    assert [s.elapsed_ms for s in parse_iteration_lines(_iterations(), None)] == [None] * 4


def test_the_vllm_source_reads_its_mode_and_times_steps_by_the_stamps(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text(_cuda_start().replace(" [core.py", " @1795500050.000000 [core.py"))  # a stamped start
    source = vllm_step_source(None, "http://x", log)  # type: ignore[arg-type]
    assert isinstance(source, VllmLogStepSource) and source.mode is not None
    assert source.mode.timing == "log_interval" and source.mode.async_scheduling
    mark = asyncio.run(source.mark())
    with log.open("a") as f:
        f.write(_iterations())
    steps = asyncio.run(source.since(mark))
    assert [s.elapsed_ms for s in steps] == [None, 18.0, 18.5, 250.0]
    unstamped = tmp_path / "plain.log"
    unstamped.write_text(_cuda_start() + _iterations().replace(" @17955000", " x"))
    blind = vllm_step_source(None, "http://x", unstamped)  # type: ignore[arg-type]
    assert blind is not None and blind.mode is not None and blind.mode.timing is None
    assert [s.elapsed_ms for s in asyncio.run(blind.since(0))] == [None] * 4  # never the raw field


SGLANG_DECODE = "Decode batch, #running-req: {n}, #token: 9000, token usage: 0.01, cuda graph: True, gen "
SGLANG_DECODE += "throughput (token/s): 250.00, #queue-req: 0"
SGLANG_PREFILL = "Prefill batch, #new-seq: 1, #new-token: 8192, #cached-token: 0, token usage: 0.02, "
SGLANG_PREFILL += "#running-req: 4, #queue-req: 0, cuda graph: False, input throughput (token/s): 26000.00"
SGLANG_ARGS = "server_args={'model_path': 'Qwen/Qwen3-Coder-30B-A3B-Instruct', 'chunked_prefill_size': 8192, "
SGLANG_ARGS += "'device': 'cuda', 'disable_cuda_graph': False, 'cuda_graph_max_bs': 256, "
SGLANG_ARGS += "'disable_overlap_schedule': False, 'enable_mixed_chunk': False, 'decode_log_interval': 1}"
SGLANG_GPU = "".join(  # SGLang 0.5.23 on GPU with its overlap scheduler (the sglang-h100 preset's settings)
    f"[2026-11-25 07:01:00 @{t}] {body}\n"
    for t, body in [
        ("1795500000.100000", SGLANG_ARGS),
        ("1795500060.000000", SGLANG_DECODE.format(n=4)),
        ("1795500060.016000", SGLANG_DECODE.format(n=4)),
        ("1795500060.331000", SGLANG_PREFILL),
        ("1795500060.348000", SGLANG_DECODE.format(n=5)),
    ]
)  # fmt: skip


def test_sglangs_overlap_scheduler_lines_still_time_whole_steps(tmp_path: Path) -> None:
    mode = sglang_step_mode(sglang_settings(SGLANG_GPU) or {})
    assert mode.async_scheduling is True and mode.cuda_graph_max_tokens == 256
    steps = parse_sglang_step_lines(SGLANG_GPU, mixed=False)
    assert [(s.prefill_tokens, s.decode_tokens) for s in steps] == [(0, 4), (0, 4), (8192, 0), (0, 5)]
    assert [s.elapsed_ms for s in steps] == [None, 16.0, 315.0, 17.0]
    log = tmp_path / "sglang.log"
    log.write_text(SGLANG_GPU)
    source = sglang_step_source(None, "http://x", log)  # type: ignore[arg-type]
    assert isinstance(source, SglangLogStepSource) and source.mode is not None
    assert source.mode.timing == "log_interval" and "overlap scheduler on" in describe_step_mode(source.mode)


def _untimed(p: int, reported_ms: float) -> EngineStep:
    return EngineStep(prefill_tokens=p, decode_tokens=1, prefill_requests=int(p > 0), decode_requests=1,
                      elapsed_ms=None, reported_ms=reported_ms)  # fmt: skip


def test_a_step_log_without_durations_counts_chunks_but_the_penalty_comes_from_the_identity() -> None:
    # one decode stream at 10 ms a step; sent at 105 ms, first token at 160; gaps 100→130 and 130→150
    ms = 1_000_000
    reads = [*range(0, 101, 10), 130, 150, 170, 180, 190]
    rows = [(0, "decode", t * ms, 1, k + 1) for k, t in enumerate(reads)] + [(-1, "prefill", 160 * ms, 1, 1)]
    stamps = pd.DataFrame(rows, columns=["stream", "role", "t_ns", "tokens", "seen"])
    cfg = RunConfig(decode_batch_size=1, new_prefill_tokens=512, chunk_size=300, model="m", gpu="g",
                    repetition=0, engine="vllm", decode_context=64, decode_max_tokens=100)  # fmt: skip
    mode = with_timing(vllm_step_mode(_cuda_start()), stamped=False)  # async on, no stamps: no durations
    steps = [_untimed(0, 4.0), _untimed(299, 12.0), _untimed(213, 9.0), _untimed(0, 4.0)]
    obs = Observation(
        run_id="r", config=cfg, attempt=0, t_inject_ns=105 * ms, t_first_token_ns=160 * ms, prompt_tokens=512,
        cached_prompt_tokens=0, engine_steps=steps, step_mode=mode, baseline_file="b.json",
        raw_file="raw.parquet", metrics_file="m.json",
    )  # fmt: skip
    snap = Snapshot(0, {("vllm:prefix_cache_hits_total", frozenset()): 0.0,
                        ("vllm:prefix_cache_queries_total", frozenset()): 0.0})  # fmt: skip
    rules = ProtocolRules(local_gaps=2, recovery_gaps=2, discard_tokens=0, steady_window=2)
    rec = derive(DeriveInputs(obs, stamps, None, snap, snap, rules, engine_kind("vllm").metrics))
    assert rec.interference.num_chunks_actual == 2 and rec.interference.num_chunks_source == "engine_log"
    assert rec.derived.penalty_source == "identity"  # never the raw field's 12 − 4 = 8 ms
    # against the local 10 ms: (30 − 10) + (20 − 10) = 30 ms over 1 stream × 2 steps
    assert rec.derived.tpot_penalty_ms == pytest.approx(15.0)
    assert rec.interference.step_mode is not None and rec.interference.step_mode.timing is None
