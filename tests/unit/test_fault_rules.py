"""The pure rules behind fault handling, on hand-built inputs: which invalid reasons are final, secrets
redaction, Retry-After, the retry wait, the loadgen's schedule-delay tail, derive on a failed injection."""

from __future__ import annotations

import datetime as dt
import email.utils
import math

import pandas as pd
import pytest
import tenacity

from benchcore.redact import REDACTED, looks_secret, redact_argv, redact_env, scrub, secret_values
from engine_harness.engines import engine_kind
from engine_harness.metrics import parse_metrics
from microbench.client.retry import RetryAfterWait, is_transient
from microbench.client.streams import ConnectFailed, HTTPStatusError, StreamCut, StreamRecord, retry_after_s
from microbench.loadgen.stages import RequestRecord, SessionResult, SessionSettings, StageOutcome
from microbench.loadgen.trace import write_trace
from microbench.results.derive import DeriveInputs, derive
from microbench.results.faults import INFRASTRUCTURE, infrastructure_reasons, is_infrastructure
from microbench.results.records import Baseline, Observation, ProtocolRules, RunConfig

MS = 1_000_000


@pytest.mark.parametrize(
    "reason",
    [
        INFRASTRUCTURE + "EngineError: engine is not running",
        "StreamCut: connection to http://127.0.0.1:1/v1/completions failed before any response",
        "the injected request failed: HTTP 500: {'error': 'boom'}",
        "the injected request failed: HTTP 429: slow down",
        "decode stream 2 broke: connection to http://h:1/v1/completions failed after 9 chunks: x",
        "/metrics after the injection failed: MetricsError: GET http://h/metrics failed",
        "MetricsError: GET http://127.0.0.1:5/metrics failed: ClientConnectorError: refused",
    ],
)
def test_infrastructure_reasons_are_recognised(reason: str) -> None:
    assert is_infrastructure(reason)


@pytest.mark.parametrize(
    "reason",
    [
        "the injection hit the prefix cache (512 tokens in /metrics)",
        "1 preemption(s) during the window",
        "the engine counted 511 prompt tokens, not 512",
        "never reached steady state: decode batch 0: timed out after 300 s waiting for steady decodes",
        "the injected request failed: HTTP 400: prompt too long",
        "the injected request got no answer within 900 s",
        "5 requests were running before the injection, not D = 4",
    ],
)
def test_measurement_verdicts_are_final(reason: str) -> None:
    assert not is_infrastructure(reason)
    assert infrastructure_reasons([reason]) == []


def test_secret_names_and_redaction() -> None:
    for name in ("OPENAI_API_KEY", "HF_TOKEN", "api-key", "AWS_SECRET_ACCESS_KEY", "APIKEY", "DB_PASSWORD"):
        assert looks_secret(name), name
    for name in ("TOKENIZERS_PARALLELISM", "max_tokens", "VLLM_CPU_KVCACHE_SPACE", "token_range", "PATH"):
        assert not looks_secret(name), name
    env = {"HF_TOKEN": "hf_abc", "OMP_NUM_THREADS": "2"}
    assert redact_env(env) == {"HF_TOKEN": REDACTED, "OMP_NUM_THREADS": "2"}
    assert secret_values(env) == ["hf_abc"]
    text = "Traceback ...\n    headers = {'Authorization': 'Bearer hf_abc'}\nKeyError: 'hf_abc_2'"
    assert scrub(text, env | {"X_TOKEN": "hf_abc_2"}).count(REDACTED) == 2 and "hf_abc" not in scrub(
        text, env | {"X_TOKEN": "hf_abc_2"}
    )
    argv = ["serve", "--api-key", "sk-1", "--port", "8000", "--hf-token=hf_2", "--max-num-seqs", "4"]
    assert redact_argv(argv) == [
        "serve", "--api-key", REDACTED, "--port", "8000", f"--hf-token={REDACTED}", "--max-num-seqs", "4",
    ]  # fmt: skip


def test_retry_after_header_in_seconds_or_as_a_date() -> None:
    assert retry_after_s("2") == 2.0 and retry_after_s(" 0.5 ") == 0.5
    assert retry_after_s(None) is None and retry_after_s("soon") is None
    later = email.utils.format_datetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=30), usegmt=True)
    assert 28 <= (retry_after_s(later) or 0) <= 30


def _state(exc: BaseException, attempt: int = 1) -> tenacity.RetryCallState:
    state = tenacity.RetryCallState(tenacity.AsyncRetrying(), fn=None, args=(), kwargs={})
    state.attempt_number = attempt
    state.set_exception((type(exc), exc, None))
    return state


def test_the_wait_is_what_retry_after_asked_for_else_a_backoff() -> None:
    wait = RetryAfterWait(initial_s=0.1, max_wait_s=10)
    assert wait(_state(HTTPStatusError(429, "busy", StreamRecord(), retry_after=1.5))) == 1.5
    assert wait(_state(HTTPStatusError(429, "busy", StreamRecord(), retry_after=99))) == 10  # capped
    backoff = wait(_state(HTTPStatusError(500, "x", StreamRecord()), attempt=3))
    assert 0.4 <= backoff <= 0.4 + 1.0  # 0.1·2², plus up to 1 s of jitter


def test_what_is_transient() -> None:
    rec = StreamRecord()
    assert is_transient(HTTPStatusError(429, "", rec)) and is_transient(HTTPStatusError(503, "", rec))
    assert not is_transient(HTTPStatusError(400, "bad", rec))
    assert is_transient(ConnectFailed("refused", rec)) and is_transient(StreamCut("cut", rec))
    assert not is_transient(StreamCut("cut mid-way", StreamRecord(chunk_t_ns=[1], chunk_tokens=[1])))


def _session(delays_ms: list[float]) -> SessionResult:
    t0, records = 1_000_000_000, []
    from microbench.client.requests import RequestSpec

    for i, delay in enumerate(delays_ms):
        intended = t0 + i * 10 * MS
        send = intended + int(delay * MS)
        stream = StreamRecord(t_send_ns=send, chunk_t_ns=[send + MS], chunk_tokens=[1], t_done_ns=send + MS)
        records.append(RequestRecord(i, "s", False, RequestSpec([1] * 4, 4, 1), intended, stream, "ok"))
    settings = SessionSettings.model_validate({"base_url": "http://x", "api": {"model": "m"}})
    outcome = StageOutcome("s", False, {"kind": "uniform", "rate": 100.0}, 100.0, None, None, None)
    outcome.end_ns = t0 + 2_000_000_000
    return SessionResult(settings, t0, 0, records, [outcome])


def test_a_late_tail_of_sends_is_flagged_though_the_median_is_fine(tmp_path) -> None:
    delays = [1.0] * 97 + [484.0] * 3  # the case: median fine, p99 484 ms
    header = write_trace(tmp_path, _session(delays))
    stage = header.stages[0]
    assert stage.schedule_delay_p50_ms == pytest.approx(1.0) and stage.schedule_delay_p99_ms > 100
    assert header.saturated and "schedule delay p99" in header.warnings[0]


HISTOGRAM = """# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{le="1.0"} 0
vllm:iteration_tokens_total_bucket{le="8.0"} 10
vllm:iteration_tokens_total_bucket{le="+Inf"} 10
vllm:iteration_tokens_total_count 10
vllm:iteration_tokens_total_sum 40
"""


def test_a_failed_injection_with_decodes_derives_without_dividing_by_zero() -> None:
    # D = 4, the injection failed (no first token) and the tokens-per-step histogram did not move:
    # zero mixed steps. The record is invalid with its reason; the penalty is None, never a crash or 0.
    cfg = RunConfig(
        decode_batch_size=4, new_prefill_tokens=256, chunk_size=512, model="m", gpu="cpu",
        repetition=0, engine="vllm", decode_context=64, decode_max_tokens=200,
    )  # fmt: skip
    obs = Observation(
        run_id="r", config=cfg, attempt=0, t_inject_ns=200 * MS, t_first_token_ns=None, prompt_tokens=None,
        cached_prompt_tokens=None, engine_steps=None, notes=["the injected request failed: HTTP 400: x"],
        baseline_file="baselines/512/D4_b0.json", raw_file="raw/x.parquet", metrics_file="metrics/x.json",
    )  # fmt: skip
    rows = [(i, "decode", t * MS, 1, k + 1) for i in range(4) for k, t in enumerate(range(0, 401, 10))]
    stamps = pd.DataFrame(rows, columns=["stream", "role", "t_ns", "tokens", "seen"])
    snap = parse_metrics(HISTOGRAM)
    rules = ProtocolRules(local_gaps=2, recovery_gaps=2, discard_tokens=0, steady_window=2)
    baseline = Baseline(tpot_p50_ms=10.0, tpot_p90_ms=10.0, tpot_p99_ms=10.0, n_gaps=64)
    record = derive(DeriveInputs(obs, stamps, baseline, snap, snap, rules, engine_kind("vllm").metrics))
    assert record.interference.num_chunks_actual == 0 and record.interference.num_chunks_source == "histogram"
    assert record.derived.tpot_penalty_ms is None and record.derived.total_interference_ms is None
    assert not record.validity.valid and "HTTP 400" in record.validity.reasons[0]
    # the schedule's chunk count stands in for the histogram's 0, and the record says so
    assert record.derived.num_chunks_used == 1 and "counted 0" in (record.derived.chunks_note or "")
    assert record.derived.penalty_identity_ms is None and not math.isnan(record.t_first_token_ns)


def test_which_errors_of_a_sweep_are_the_infrastructures() -> None:
    from engine_harness.launch import EngineError
    from engine_harness.metrics import MetricsError
    from microbench.client.streams import ServerStreamError
    from microbench.measure.engine_client import ProtocolError
    from microbench.measure.faults import FaultBudget, infrastructure_error

    rec = StreamRecord()
    busy = infrastructure_error(HTTPStatusError(429, "busy", rec, retry_after=2.0))
    assert busy is not None and busy.retry_after == 2.0 and str(busy).startswith(INFRASTRUCTURE)
    assert is_infrastructure(str(busy))  # what the runner notes is recognised again on --resume
    for exc in (
        HTTPStatusError(503, "", rec),
        ConnectFailed("refused", rec),
        MetricsError("x"),
        EngineError("y"),
    ):
        assert infrastructure_error(exc) is not None, exc
    cut = StreamCut("cut after 9 chunks", StreamRecord(chunk_t_ns=[1], chunk_tokens=[1]))
    assert infrastructure_error(cut) is not None  # a stream the engine dropped mid-way
    for exc in (HTTPStatusError(400, "too long", rec), ServerStreamError("bad", rec), ProtocolError("idle")):
        assert infrastructure_error(exc) is None, exc  # verdicts on the request or the protocol
    budget = FaultBudget(limit=2)
    assert budget.spend() and budget.spend() and not budget.spend()
    budget.progress()
    assert budget.in_a_row == 0 and budget.total == 3 and budget.spend()
