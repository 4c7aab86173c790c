"""scripts/bench_loadgen_rate.py: where the sims and the workers run, and the scaling figure per N."""

import importlib.util
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "bench_loadgen_rate", Path(__file__).resolve().parents[2] / "scripts" / "bench_loadgen_rate.py"
)
assert _SPEC is not None and _SPEC.loader is not None
bench = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(bench)


def test_workers_are_pinned_below_the_sims_or_share_the_cores_when_they_do_not_fit() -> None:
    groups = [[c] for c in range(16)]  # no SMT
    sims = bench.sim_placement(groups, 8)
    assert sims == list(range(8, 16))
    pinned = [bench.placement(groups, n, sims) for n in (1, 2, 4, 8)]
    assert pinned == [[0], [0, 1], [0, 1, 2, 3], list(range(8))]
    assert bench.placement(groups, 9, sims) is None
    two = [[0], [1]]  # this box
    assert bench.sim_placement(two, 1) == [1]
    assert bench.placement(two, 1, [1]) == [0] and bench.placement(two, 2, [1]) is None
    with pytest.raises(ValueError, match=r"2 sim process.*the 2 this process may use"):
        bench.sim_placement(two, 2)


def test_sims_take_whole_physical_cores_and_workers_one_thread_of_each_free_one() -> None:
    groups = [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]]  # 8 cores, 2 threads each
    sims = bench.sim_placement(groups, 7)  # 4 physical cores, one thread of them left idle
    assert sims == [5, 6, 7, 12, 13, 14, 15]
    assert bench.placement(groups, 2, sims) == [0, 1]  # never 0 and 8: siblings
    assert bench.placement(groups, 4, sims) == [0, 1, 2, 3]
    assert bench.placement(groups, 5, sims) is None  # core 4's sibling 12 runs a sim


def test_core_groups_read_the_siblings_from_sysfs(tmp_path: Path) -> None:
    for core, siblings in {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3", 4: "4-5", 5: "4-5"}.items():
        topology = tmp_path / f"cpu{core}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(siblings + "\n")
    # core 6's topology is unreadable: a group of its own
    assert bench.core_groups([0, 1, 2, 3, 4, 5, 6], tmp_path) == [[0, 2], [1, 3], [4, 5], [6]]
    assert bench.core_groups([1, 2], tmp_path) == [[1], [2]]  # a sibling outside the affinity is no group


def test_scaling_is_each_worker_counts_knee_and_peak_over_one_workers() -> None:
    knee = {"timer": 30000.0, "1": 4000.0, "2": 8000.0, "4": 12000.0, "8": None}
    peak = {"timer": 30000.0, "1": 5000.0, "2": 9800.0, "4": 16000.0, "8": 20000.0}
    assert bench.scaling(knee, peak) == {
        "2": {"knee_ratio": 2.0, "peak_ratio": 1.96, "aim": 1.8},
        "4": {"knee_ratio": 3.0, "peak_ratio": 3.2, "aim": 3.6},
        "8": {"knee_ratio": None, "peak_ratio": 4.0, "aim": 7.2},
    }


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)


def test_the_canned_responder_answers_each_request_once_whatever_the_reads() -> None:
    """Heads and bodies split across reads, two requests in one read: one whole answer per request, the
    stream for a POST and the model list for a GET."""
    answer = bench.canned_answer()
    responder = bench.CannedResponder(answer)
    transport = _Transport()
    responder.transport = transport  # type: ignore[assignment]
    post = b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n{"a": 1234}'
    get = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    for piece in (post[:10], post[10:50], post[50:]):
        responder.data_received(piece)
    responder.data_received(get + post)
    assert transport.writes[0] == answer and transport.writes[2] == answer
    assert transport.writes[1].startswith(b"HTTP/1.1 200 OK") and b'"id":"sim"' in transport.writes[1]
    assert len(transport.writes) == 3 and responder.buffer == b""
    head, body = answer.split(b"\r\n\r\n", 1)
    assert int(head.lower().split(b"content-length: ")[1]) == len(body)
    assert body.count(b"data: ") == bench.OUTPUT_TOKENS + 2 and body.endswith(b"data: [DONE]\n\n")
