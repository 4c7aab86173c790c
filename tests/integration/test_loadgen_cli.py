"""``python -m microbench.loadgen run`` against the in-process sim: chat, keys, self-timed specs, repeats."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from engine_harness.engines import SIM_API_KEY_VAR
from engine_harness.sim import SimConfig, SimServer
from microbench.loadgen import session as session_module
from microbench.loadgen.cli import main
from microbench.loadgen.trace import read_metrics, read_trace

pytestmark = [pytest.mark.integration, pytest.mark.clock]  # reads the clock: the clock pass

_CHATML_OVERHEAD = 19  # <|im_start|>user\n … <|im_end|>\n<|im_start|>assistant\n around the text


@contextlib.contextmanager
def _sim(**config: Any) -> Iterator[str]:
    """A sim server on its own thread's loop (the command runs its loop, and its signals, on this one)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    server = SimServer(SimConfig(time_scale=0, **config))
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(30)
    try:
        yield server.base_url
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def _cli(url: str, out: Path, *flags: str, workload: str = "synthetic-uniform") -> int:
    return main(["run", "--workload", workload, "--url", url, "--out", str(out), *flags])


def _two_client_spec(tmp_path: Path, **extra: Any) -> str:
    lengths = {"input_length": {"type": "fixed", "value": 8}, "output_length": {"type": "fixed", "value": 2}}
    spec = {
        "name": "two-processes",
        "seed": 4,
        "aggregate_rate": 200,
        "clients": [
            {"id": "bursty", "arrival": {"process": "gamma", "cv": 3.0}, **lengths},
            {"id": "even", "arrival": {"process": "uniform"}, **lengths},
        ],
        **extra,
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_chat_with_a_key_sends_text_of_exact_token_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SIM_API_KEY_VAR, "sk-sim-7")
    monkeypatch.setenv("BENCH_KEY", "sk-sim-7")
    with _sim() as sim:
        flags = ["--api", "chat", "--api-key-env", "BENCH_KEY", "--scheduler", "concurrency"]
        assert _cli(sim, tmp_path / "ok", *flags, "--concurrency", "2", "--requests", "12") == 0
        # no key: refused before any request (exit 2, nothing written), also where the model is named
        nokey = ("--api", "chat", "--model", "sim", "--rate", "9", "--requests", "3")
        assert _cli(sim, tmp_path / "nokey", *nokey) == 2
    header, rows = read_trace(tmp_path / "ok")
    assert len(rows) == 12 and (rows["status"] == "ok").all()
    assert header.prompts["form"] == "text" and header.prompts["token_space"] == [33, 127]
    assert ((rows["input_tokens"] - rows["prompt_tokens"]) == _CHATML_OVERHEAD).all()
    series = read_metrics(tmp_path / "ok")  # the engine's /metrics beside the trace, named in the header
    assert (
        header.metrics["file"] == "metrics.csv"
        and series is not None
        and "requests_running" in set(series["quantity"])
    )
    assert rows["prompt_tokens"].nunique() > 1  # the workload's lengths, each one exact
    assert not (tmp_path / "nokey").exists()


def test_an_unset_key_variable_and_a_chat_model_without_tokenizer_are_bad_input(tmp_path: Path) -> None:
    with _sim(model="org/hub-model") as sim:
        assert _cli(sim, tmp_path / "a", "--api-key-env", "NO_SUCH_VAR_7", "--rate", "5") == 2
        assert _cli(sim, tmp_path / "b", "--api", "chat", "--rate", "5", "--requests", "2") == 2


def test_a_spec_with_two_arrival_processes_produces_both(tmp_path: Path) -> None:
    spec = _two_client_spec(tmp_path)
    with _sim() as sim:
        assert _cli(sim, tmp_path / "run", "--duration", "1s", workload=spec) == 0
        assert _cli(sim, tmp_path / "refused", "--concurrency", "2", workload=spec) == 2
    header, rows = read_trace(tmp_path / "run")
    assert header.workload["self_timed"] == [
        "aggregate_rate",
        "clients[bursty].arrival",
        "clients[even].arrival",
    ]
    cv = {}
    for client, group in rows.groupby("client_id"):
        gaps = np.diff(np.sort(group["intended_ns"].to_numpy()))
        cv[client] = gaps.std() / gaps.mean()
        assert 60 <= len(group) <= 140  # each at half of 200 req/s for 1 s
    assert cv["bursty"] > 1.8 and cv["even"] < 0.05


def test_windows_bound_a_client_s_arrivals(tmp_path: Path) -> None:
    spec = yaml.safe_load(Path(_two_client_spec(tmp_path)).read_text())
    spec["clients"][1]["windows"] = [{"start_s": 0.5, "end_s": 0.8}]
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec))
    with _sim() as sim:
        assert _cli(sim, tmp_path / "run", "--duration", "1s", workload=str(tmp_path / "spec.yaml")) == 0
    header, rows = read_trace(tmp_path / "run")
    start = header.stages[0]  # offsets are from the session start; the stage starts a little later
    even = rows[rows["client_id"] == "even"]["intended_ns"] / 1e9
    assert start.name == "spec-rate-200" and 25 <= len(even) <= 35
    assert even.max() - even.min() < 0.31


def test_the_header_s_salt_repeats_every_prompt_and_length(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, Any, int]] = []
    real = session_module.send_request

    async def recording(http: Any, url: str, spec: Any, *rest: Any, **kw: Any) -> Any:
        sent.append((spec.client_id, spec.prompt, spec.max_tokens))
        return await real(http, url, spec, *rest, **kw)

    monkeypatch.setattr(session_module, "send_request", recording)
    flags = ("--concurrency", "1", "--requests", "8", "--scheduler", "concurrency")
    with _sim() as sim:
        assert _cli(sim, tmp_path / "first", *flags) == 0
        salt = json.loads((tmp_path / "first" / "header.json").read_text())["prompts"]["salt"]
        first, sent[:] = list(sent), []
        assert _cli(sim, tmp_path / "again", *flags, "--salt", salt) == 0
        again, sent[:] = list(sent), []
        assert _cli(sim, tmp_path / "fresh", *flags) == 0
    assert len(first) == 8 and again == first
    assert [s[2] for s in sent] == [s[2] for s in first] and [s[1] for s in sent] != [s[1] for s in first]


def test_the_conversation_workload_reads_a_sharegpt_file_by_flag(tmp_path: Path) -> None:
    pairs = ((20, 30), (40, 8))  # question and answer lengths of two conversations: drawn as pairs
    turns = [[{"from": "human", "value": "q" * n}, {"from": "gpt", "value": "a" * m}] for n, m in pairs]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([{"conversations": t} for t in turns]))
    flags = ("--scheduler", "concurrency", "--concurrency", "2", "--requests", "6", "--sharegpt", str(path))
    with _sim() as sim:
        assert _cli(sim, tmp_path / "run", *flags, workload="conversation") == 0
        assert _cli(sim, tmp_path / "refused", *flags) == 2  # synthetic-uniform would ignore the file
    header, rows = read_trace(tmp_path / "run")
    assert "ShareGPT file" in header.workload["notes"][0] and not any(
        "STAND-IN" in n for n in header.workload["notes"]
    )
    assert set(zip(rows["prompt_tokens"] - rows["prefix_tokens"], rows["max_tokens"], strict=True)) <= set(
        pairs
    )


def test_clipped_requests_are_counted_from_what_the_workers_sent(tmp_path: Path) -> None:
    """The header's ``clipped_requests`` counts the sent requests shortened to fit ``--max-model-len``,
    whichever worker sent them (the parent draws none of them)."""
    spec = {
        "name": "clip", "seed": 3,
        "clients": [
            {"id": "short", "input_length": {"type": "fixed", "value": 16},
             "output_length": {"type": "fixed", "value": 8}},
            {"id": "long", "input_length": {"type": "fixed", "value": 200},
             "output_length": {"type": "fixed", "value": 8}},
        ],
    }  # fmt: skip
    path = tmp_path / "clip.yaml"
    path.write_text(yaml.safe_dump(spec))
    with _sim() as sim:
        flags = ("--rate", "100", "--requests", "30", "--max-model-len", "64", "--workers", "2")
        assert _cli(sim, tmp_path / "run", *flags, workload=str(path)) == 0
    header, rows = read_trace(tmp_path / "run")
    long = rows[rows["client_id"] == "long"]
    assert len(rows) == 30 and 0 < len(long) < 30 and set(rows["worker"]) == {0, 1}
    assert header.workload["clipped_requests"] == len(long)
    assert (long["prompt_tokens"] + long["max_tokens"] == 64).all()
