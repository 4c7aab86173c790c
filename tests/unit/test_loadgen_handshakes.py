"""Handshakes dropped on a full accept queue: the host's count read, a stage's count in its health, and a
stage against a server whose queue overflows counting them."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from microbench.client.requests import RequestSpec
from microbench.client.streams import StreamRecord
from microbench.loadgen.handshakes import listen_overflows, on_this_host
from microbench.loadgen.session import LoadSession
from microbench.loadgen.stages import RequestRecord, SessionResult, SessionSettings, Stage, StageOutcome
from microbench.loadgen.trace import stage_health
from microbench.loadgen.workers import merge_results
from microbench.workloads.schedulers import parse_scheduler


def test_the_hosts_count_is_read_from_netstat_or_none(tmp_path: Path) -> None:
    netstat = tmp_path / "netstat"
    netstat.write_text(
        "TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 3 28153 28160\n"
        "IpExt: InNoRoutes ListenOverflows\nIpExt: 0 7\n"
    )
    assert listen_overflows(netstat) == 28153
    netstat.write_text("TcpExt: SyncookiesSent\nTcpExt: 3\n")
    assert listen_overflows(netstat) is None
    assert listen_overflows(tmp_path / "absent") is None


@pytest.mark.parametrize(
    ("url", "local"),
    [("http://127.0.0.1:8000", True), ("http://localhost:1/v1", True), ("http://[::1]:8", True),
     ("http://127.3.2.1:9", True), ("http://10.0.0.2:8000", False), ("http://engine.example", False),
     ("not a url", False)],
)  # fmt: skip
def test_the_engine_is_on_this_host_by_a_loopback_name(url: str, local: bool) -> None:
    assert on_this_host(url) is local


def _result(overflows: list[int | None]) -> list[SessionResult]:
    """One stage, one healthy request, in as many workers as ``overflows`` (each worker's count)."""
    results = []
    for k, count in enumerate(overflows):
        stream = StreamRecord(t_send_ns=10 + k, chunk_t_ns=[20], chunk_tokens=[1], t_done_ns=30, status=200)
        record = RequestRecord(k, "s", False, RequestSpec([1], 1, 1), 10 + k, stream, "ok")
        outcome = StageOutcome("s", False, {"kind": "uniform", "rate": 10.0}, 10.0, None, None, None)
        outcome.listen_overflows, outcome.end_ns = count, 1_000_000_000
        settings = SessionSettings.model_validate({"base_url": "http://127.0.0.1:1", "api": {"model": "m"}})
        results.append(SessionResult(settings, 0, 0, [record], [outcome]))
    return results


def test_a_stages_dropped_handshakes_are_warned_of_and_workers_give_the_hosts_count_once() -> None:
    (dropped,) = stage_health(_result([3])[0])
    assert dropped.listen_overflows == 3 and not dropped.saturated
    assert dropped.warning is not None and "dropped 3 connection handshake(s)" in dropped.warning
    (clean,) = stage_health(_result([0])[0])
    assert clean.listen_overflows == 0 and clean.warning is None
    (remote,) = stage_health(_result([None])[0])
    assert remote.listen_overflows is None and remote.warning is None
    merged = merge_results(_result([2, 5, None]))
    assert merged.stages[0].listen_overflows == 5  # one host's count over like windows: not a sum
    assert merge_results(_result([None, None])).stages[0].listen_overflows is None


@pytest.fixture
def full_queue() -> Iterator[int]:
    """A port whose listener never accepts, its backlog 1: the handshakes past it are dropped."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


async def test_a_stage_counts_the_handshakes_its_server_dropped(full_queue: int) -> None:
    settings = SessionSettings.model_validate(
        {"base_url": f"http://127.0.0.1:{full_queue}", "api": {"model": "m"}, "request_timeout_s": 0.3,
         "drain_timeout_s": 2}
    )  # fmt: skip
    requests = (RequestSpec([1, 2, 3], 3, 1) for _ in range(8))
    stage = Stage.scheduled("burst", parse_scheduler({"kind": "concurrency", "concurrency": 8}), requests,
                            max_requests=8)  # fmt: skip
    async with LoadSession(settings) as session:
        result = await session.run([stage])
    (outcome,) = result.stages
    assert outcome.listen_overflows is not None and outcome.listen_overflows >= 5  # 8 connects, ≤ 2 queued
    (health,) = stage_health(result)
    assert health.warning is not None and "handshake" in health.warning
