"""The simulated engine's HTTP surface, read with the suite's client (``stream_request``, ``parse_metrics``).

Wire-format checks run the same assertions on the transcribed vLLM 0.32 payloads and on the sim's output.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine_harness.metric_names import VLLM_METRICS
from engine_harness.metrics import Snapshot, parse_metrics, scrape, step_counts
from engine_harness.sim import SimConfig, SimServer, SimStepModel
from microbench.client.streams import DONE, StreamRecord, parse_sse_line, stream_request

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
USAGE_OPTS = {"include_usage": True, "continuous_usage_stats": True}


async def until(cond: Callable[[], bool], timeout_s: float = 10.0, dt: float = 0.005) -> None:
    """Poll ``cond`` until it holds; fail the test after ``timeout_s``."""
    for _ in range(int(timeout_s / max(dt, 1e-4))):
        if cond():
            return
        await asyncio.sleep(dt)
    raise AssertionError(f"condition not met within {timeout_s} s")


def _fast(**kw: Any) -> SimConfig:
    return SimConfig(model="tiny", time_scale=0.0, **kw)


def _completion(prompt: Any, max_tokens: int, **kw: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, **kw}


async def _raw_sse(session: aiohttp.ClientSession, url: str, payload: dict[str, Any]) -> str:
    async with session.post(url, json={**payload, "stream": True}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return await resp.text()


def _events(raw: str) -> list[Any]:
    return [e for e in (parse_sse_line(line.encode()) for line in raw.splitlines()) if e is not None]


def _record_from(raw: str) -> StreamRecord:
    """What ``stream_request`` would record from this payload (its own ingest path, fake clock)."""
    from microbench.client.streams import _ingest, parse_chunk

    rec = StreamRecord()
    events = [e for e in (parse_chunk(line.encode()) for line in raw.splitlines()) if e is not None]
    for i, event in enumerate(events):
        if event is DONE:
            rec.t_done_ns = i
            break
        _ingest(rec, event, i)
    return rec


# -- wire format: the same checks on vLLM's payloads and on the sim's --------------------------------


def check_completions_stream(raw: str) -> None:
    events = _events(raw)
    assert events[-1] is DONE
    chunks = events[:-1]
    *content, last = chunks
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and next(iter(ids)).startswith("cmpl-")
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [c["usage"]["completion_tokens"] for c in content] == list(range(1, len(content) + 1))
    for c in content:
        (choice,) = c["choices"]
        assert list(choice) == [
            "index",
            "text",
            "logprobs",
            "finish_reason",
            "stop_reason",
            "prompt_token_ids",
            "token_ids",
        ]
        assert list(c["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens"]
        assert c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"]
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * (len(content) - 1) + ["length"]
    assert last["choices"] == [] and last["usage"] == content[-1]["usage"] and "system_fingerprint" in last
    rec = _record_from(raw)
    assert rec.tokens_from_usage and rec.chunk_tokens == [1] * len(content)
    assert rec.completion_tokens == last["usage"]["completion_tokens"] and rec.finish_reason == "length"


def check_chat_stream(raw: str) -> None:
    events = _events(raw)
    assert events[-1] is DONE
    role, *content, last = events[:-1]
    assert role["id"].startswith("chatcmpl-") and role["object"] == "chat.completion.chunk"
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert list(role) == ["id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"]
    for c in content:
        assert list(c) == ["id", "object", "created", "model", "choices"]
        assert set(c["choices"][0]["delta"]) == {"content"}
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * (len(content) - 1) + ["length"]
    assert "stop_reason" in content[-1]["choices"][0] and "stop_reason" not in content[0]["choices"][0]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == len(content)
    rec = _record_from(raw)
    assert rec.usage == last["usage"] and rec.finish_reason == "length"


def test_checks_pass_on_the_real_vllm_payloads() -> None:
    check_completions_stream((FIXTURES / "vllm_cpu_completions_stream.txt").read_text())
    check_chat_stream((FIXTURES / "vllm_cpu_chat_stream.txt").read_text())


async def test_wire_format_matches_vllm() -> None:
    async with SimServer(_fast()) as sim, aiohttp.ClientSession() as s:
        raw = await _raw_sse(
            s, f"{sim.base_url}/v1/completions", _completion(list(range(17)), 6, stream_options=USAGE_OPTS)
        )
        check_completions_stream(raw)
        chat = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 4,
            "stream_options": {"include_usage": True},
        }
        check_chat_stream(await _raw_sse(s, f"{sim.base_url}/v1/chat/completions", chat))
        # the same key layout as vLLM, chunk for chunk
        real = _events((FIXTURES / "vllm_cpu_completions_stream.txt").read_text())
        ours = _events(raw)
        assert [list(e) for e in ours[:-1]] == [list(e) for e in real[:-1]]


async def test_stream_request_counts_tokens_and_usage() -> None:
    async with SimServer(_fast()) as sim, aiohttp.ClientSession() as s:
        url = f"{sim.base_url}/v1/completions"
        rec = await stream_request(s, url, _completion(list(range(300)), 40, stream_options=USAGE_OPTS))
        assert rec.completion_tokens == 40 and rec.chunk_tokens == [1] * 40 and rec.tokens_from_usage
        assert rec.prompt_tokens == 300 and rec.finish_reason == "length" and rec.t_done_ns is not None
        assert all(len(t) == 1 and t.isprintable() for t in rec.text)  # every token is one visible character
        plain = await stream_request(s, url, _completion("héllo wörld", 5))  # text prompt, no usage options
        assert plain.completion_tokens == 5 and plain.usage is None and not plain.tokens_from_usage
        usage_only = await stream_request(
            s, url, _completion("hi", 3, stream_options={"include_usage": True})
        )
        assert usage_only.usage == {"prompt_tokens": 2, "total_tokens": 5, "completion_tokens": 3}


async def test_non_streaming_and_text_prompts() -> None:
    async with SimServer(_fast()) as sim, aiohttp.ClientSession() as s:
        async with s.post(f"{sim.base_url}/v1/completions", json=_completion("héllo", 7)) as resp:
            body = await resp.json()
        assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
        assert (
            body["usage"]["prompt_tokens"] == len("héllo".encode())
            and body["usage"]["completion_tokens"] == 7
        )
        assert len(body["choices"][0]["text"]) == 7 and body["choices"][0]["finish_reason"] == "length"
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3}
        async with s.post(f"{sim.base_url}/v1/chat/completions", json=chat) as resp:
            body = await resp.json()
        assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
        # ChatML: <|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n
        assert body["usage"]["prompt_tokens"] == 1 + len("user\nhi") + 1 + 1 + 1 + len("assistant\n")
        assert len(body["choices"][0]["message"]["content"]) == 3


async def test_min_tokens_and_eos() -> None:
    async with SimServer(_fast(eos_probability=1.0)) as sim, aiohttp.ClientSession() as s:
        url = f"{sim.base_url}/v1/completions"
        stop = await stream_request(
            s, url, {"model": "tiny", "prompt": [1, 2], "max_tokens": 9, "stream_options": USAGE_OPTS}
        )
        assert stop.finish_reason == "stop" and stop.completion_tokens == 1 and stop.text == [""]
        at_least = await stream_request(
            s,
            url,
            {
                "model": "tiny",
                "prompt": [1, 2],
                "max_tokens": 9,
                "min_tokens": 5,
                "stream_options": USAGE_OPTS,
            },
        )
        assert at_least.finish_reason == "stop" and at_least.completion_tokens == 5
        ignored = await stream_request(s, url, _completion([1, 2], 9, stream_options=USAGE_OPTS))
        assert ignored.finish_reason == "length" and ignored.completion_tokens == 9


async def test_same_seed_same_tokens() -> None:
    texts = []
    for seed in (7, 7, 8):
        async with SimServer(_fast(seed=seed)) as sim, aiohttp.ClientSession() as s:
            rec = await stream_request(s, f"{sim.base_url}/v1/completions", _completion([5, 6, 7], 20))
            texts.append("".join(rec.text))
    assert texts[0] == texts[1] != texts[2]


async def test_models_version_health_and_errors() -> None:
    async with SimServer(_fast(max_model_len=100)) as sim, aiohttp.ClientSession() as s:
        async with s.get(f"{sim.base_url}/v1/models") as resp:
            assert (await resp.json())["data"][0]["id"] == "tiny"
        async with s.get(f"{sim.base_url}/version") as resp:
            assert (await resp.json())["version"].startswith("sim-")
        async with s.get(f"{sim.base_url}/health") as resp:
            assert resp.status == 200
        async with s.post(f"{sim.base_url}/v1/completions", json={"model": "other", "prompt": "x"}) as resp:
            assert resp.status == 404 and "does not exist" in (await resp.json())["error"]["message"]
        async with s.post(f"{sim.base_url}/v1/completions", json=_completion(list(range(90)), 20)) as resp:
            body = await resp.json()
            assert resp.status == 400 and body["error"]["code"] == 400
            assert "maximum context length is 100" in body["error"]["message"]
        async with s.post(f"{sim.base_url}/v1/completions", data=b"{not json") as resp:
            assert resp.status == 400


# -- /metrics -----------------------------------------------------------------------------------------


async def test_metrics_parse_and_step_histogram_counts_steps() -> None:
    budget, d, p = 256, 4, 1000
    async with SimServer(_fast(max_num_batched_tokens=budget)) as sim, aiohttp.ClientSession() as s:
        url = f"{sim.base_url}/v1/completions"
        before = await scrape(s, sim.base_url)
        empty = before.histogram(VLLM_METRICS.iteration_tokens)
        assert empty is not None and set(empty.values()) == {0.0}
        decodes = [
            asyncio.create_task(stream_request(s, url, _completion([300 + i, 1, 2], 300))) for i in range(d)
        ]
        sched = sim.engine.scheduler
        await until(lambda: len(sched.running) == d and all(r.in_decode for r in sched.running), dt=0)
        cold = await stream_request(s, url, _completion([(7 * i) % 250 for i in range(p)], 1))
        await asyncio.gather(*decodes)
        after = await scrape(s, sim.base_url)
        text = sim.metrics_text()

    parse_metrics(text)  # prometheus_client's parser accepts it
    for name in (
        "vllm:iteration_tokens_total",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:request_prefill_time_seconds",
    ):
        assert f"# TYPE {name} histogram" in text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert f"# TYPE {name} gauge" in text
    for name in (
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:num_preemptions",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
    ):
        assert f'{name}_total{{engine="0",model_name="tiny"}}' in text

    log = sim.step_log
    counts = step_counts(before, after, VLLM_METRICS, decode_batch=d)
    assert counts.steps == len(log) > 300
    assert counts.mixed_steps == sum(1 for r in log if r.num_tokens > 8)  # buckets wholly above (1, 8]
    cold_steps = [
        r
        for r in log
        if any(c[0].startswith("cmpl-") and c[1] > 1 for c in r.prefill_chunks) and r.prefill_tokens > 3 * d
    ]
    assert len(cold_steps) == math.ceil(p / (budget - d)) and all(r.decode_tokens == d for r in cold_steps)
    assert cold.completion_tokens == 1
    assert after.total(VLLM_METRICS.generation_tokens) == d * 300 + 1
    assert after.total(VLLM_METRICS.prompt_tokens) == d * 3 + p
    assert after.total(["vllm:iteration_tokens_total_sum"]) == sum(r.num_tokens for r in log)
    assert after.total(["vllm:time_to_first_token_seconds_count"]) == d + 1
    assert after.total(["vllm:inter_token_latency_seconds_count"]) == d * 299


async def test_prefix_cache_hits_shared_and_not_unique() -> None:
    async with SimServer(_fast()) as sim, aiohttp.ClientSession() as s:
        url = f"{sim.base_url}/v1/completions"
        shared = list(range(10, 10 + 320))  # 20 blocks

        async def hits(prompt: list[int]) -> tuple[float, float]:
            before = await scrape(s, sim.base_url)
            await stream_request(s, url, _completion(prompt, 2))
            after = await scrape(s, sim.base_url)
            q = after.delta(before, VLLM_METRICS.prefix_cache_queries)
            h = after.delta(before, VLLM_METRICS.prefix_cache_hits)
            assert q is not None and h is not None
            return q, h

        assert await hits([*shared, 1]) == (321, 0)
        assert await hits([*shared, 2, 3]) == (322, 320)
        assert await hits([(5 * i + 1) % 250 for i in range(321)]) == (321, 0)


async def test_prompt_tokens_details_reports_cached_tokens() -> None:
    async with SimServer(_fast(enable_prompt_tokens_details=True)) as sim, aiohttp.ClientSession() as s:
        url = f"{sim.base_url}/v1/completions"
        first = await stream_request(s, url, _completion(list(range(40)), 2, stream_options=USAGE_OPTS))
        second = await stream_request(s, url, _completion(list(range(40)), 2, stream_options=USAGE_OPTS))
        assert (first.cached_prompt_tokens, second.cached_prompt_tokens) == (0, 32)


async def test_preemption_counted_in_metrics() -> None:
    cfg = _fast(num_kv_blocks=12, max_num_batched_tokens=512, enable_prefix_caching=False)
    async with SimServer(cfg) as sim, aiohttp.ClientSession() as s:
        url = f"{sim.base_url}/v1/completions"
        recs = await asyncio.gather(
            *[
                stream_request(s, url, _completion([i + 1] * 40, 100, stream_options=USAGE_OPTS))
                for i in range(3)
            ]
        )
        snap = await scrape(s, sim.base_url)
    assert all(r.completion_tokens == 100 for r in recs)
    preempted = snap.total(VLLM_METRICS.preemptions)
    assert preempted is not None and preempted > 0
    assert preempted == sum(r.preemptions for r in sim.step_log)


async def test_client_disconnect_aborts_request_and_frees_kv() -> None:
    cfg = SimConfig(model="tiny", time_scale=1.0, step=SimStepModel(alpha_ms=2.0))
    async with SimServer(cfg) as sim, aiohttp.ClientSession() as s:
        rec = StreamRecord()
        url = f"{sim.base_url}/v1/completions"
        task = asyncio.create_task(stream_request(s, url, _completion(list(range(200)), 10_000), rec))
        await until(lambda: len(rec.chunk_t_ns) >= 3)
        busy: Snapshot = await scrape(s, sim.base_url)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await until(lambda: not sim.engine.scheduler.has_work())
        idle = await scrape(s, sim.base_url)
    assert (
        busy.total(VLLM_METRICS.requests_running) == 1 and (busy.total(VLLM_METRICS.kv_cache_usage) or 0) > 0
    )
    assert idle.total(VLLM_METRICS.requests_running) == 0 and idle.total(VLLM_METRICS.kv_cache_usage) == 0
    assert idle.total(["vllm:request_success_total"], finished_reason="abort") == 1
    assert sim.engine.scheduler.pool.usage == 0


async def test_step_log_endpoint_matches_in_process_log() -> None:
    async with SimServer(_fast()) as sim, aiohttp.ClientSession() as s:
        await stream_request(s, f"{sim.base_url}/v1/completions", _completion(list(range(50)), 5))
        async with s.get(f"{sim.base_url}/sim/steps") as resp:
            body = await resp.json()
        async with s.get(f"{sim.base_url}/sim/steps", params={"since": "3"}) as resp:
            tail = await resp.json()
        async with s.get(f"{sim.base_url}/sim/config") as resp:
            cfg = await resp.json()
    assert [st["index"] for st in body["steps"]] == [r.index for r in sim.step_log] == list(range(5))
    assert body["steps"][0] == json.loads(json.dumps(sim.step_log[0].to_dict()))
    assert [st["index"] for st in tail["steps"]] == [3, 4] and body["next"] == 5
    assert cfg["step"]["alpha_ms"] == sim.config.step.alpha_ms


async def test_sims_with_reuse_port_share_one_port() -> None:
    # more sim processes than one on a port (a load generator faster than one core of sim, issue #38)
    async with SimServer(_fast()) as probe:
        port = probe.port
    async with (
        SimServer(_fast(port=port, reuse_port=True)) as one,
        SimServer(_fast(port=port, reuse_port=True)) as two,
    ):
        assert one.port == two.port == port
        async with aiohttp.ClientSession() as http, http.get(f"{one.base_url}/v1/models") as resp:
            assert resp.status == 200


async def test_a_burst_of_new_connections_fits_the_accept_queue_as_on_vllm(
    handshakes_waited: Callable[[int, int], int],
) -> None:
    """vLLM and SGLang listen with uvicorn's backlog of 2048; with aiohttp's 128 a burst of new connections
    overflowed the sim's accept queue and the kernel dropped the handshakes past it, each a 1-s wait for its
    request. 300 connections made while the sim's loop is blocked (it accepts none of them meanwhile) must
    all be taken in by the kernel: none waits for a retransmit."""
    async with SimServer(SimConfig(model="m", time_scale=0)) as sim:
        assert handshakes_waited(sim.port, 300) == 0
        async with aiohttp.ClientSession() as http, http.get(f"{sim.base_url}/health") as resp:
            assert resp.status == 200  # it serves on after taking them in
