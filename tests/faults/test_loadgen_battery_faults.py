"""Issue #22, row 6 and the load generator's misleads: bad input is exit 2 with one line and nothing
written; failed requests under open-loop load are exit 1 with a warning; a refused connection is
labelled ``refused``, a stream the engine cut mid-way ``cut``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fault_checks import Place, assert_clear_error, start_sim

from engine_harness.launch import free_port
from microbench.battery.cli import main as battery
from microbench.loadgen.cli import main as loadgen
from microbench.loadgen.trace import read_trace

pytestmark = pytest.mark.clock  # reads the clock (stalls, schedule delay): the clock pass

BAD_UNIFORM = """name: bad
seed: 1
aggregate_rate: 5
clients:
  - id: a
    input_length: {type: uniform, min: 32, max: 16}
    output_length: {type: fixed, value: 4}
"""
BAD_LOGNORMAL = BAD_UNIFORM.replace(
    "{type: uniform, min: 32, max: 16}", "{type: lognormal, mu: 4, sigma: -0.5}"
)
WORKLOAD = "synthetic-uniform"


@pytest.fixture
def sim(request: pytest.FixtureRequest) -> Iterator[str]:
    """A sim engine started by hand with ``request.param`` (extra sim flags); yields its URL."""
    proc, url = start_sim(*getattr(request, "param", ()))
    yield url
    proc.kill()
    proc.wait()


END = ["--requests", "3"]  # every case but "no-end" gives its stages an end
M = ["--model", "m"]  # the model list is asked for before the workload is built
W1 = ["--workload", WORKLOAD, "--rate", "1"]


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--workload", "{uniform}", "--rate", "1", *M, *END], "max (16) is below min (32)"),
        (["--workload", "{lognormal}", "--rate", "1", *M, *END], "sigma: Input should be greater than 0"),
        (["--workload", WORKLOAD, "--concurrency", "0", *END], "--concurrency must be > 0"),
        (["--workload", WORKLOAD, "--rate", "-5", *END], "--rate must be > 0"),
        (["--workload", WORKLOAD, "--rate", "1", "--requests", "0"], "--requests must be ≥ 1"),
        (["--workload", WORKLOAD, "--rate", "1", *END], "no model list at http://127.0.0.1:1/v1/models"),
        (["--workload", WORKLOAD, "--rate", "1", "--token-range", "9:2", *M, *END], "0 <= lo < hi"),
        ([*W1, "--scheduler", "gamma", "--cv", "-1", *END], "--cv must be > 0"),
        ([*W1, "--scheduler", "trace", "--model", "m", *END], "--scheduler trace"),
        ([*W1, "--scheduler", "trace", "--trace-file", "{missing}", "--model", "m", *END], "does not exist"),
        (["--workload", WORKLOAD, "--rate", "1", "--model", "m"], "give --requests N, --duration T or both"),
        ([*W1, "--warm-connections", "-1", *M, *END], "--warm-connections must be 0-10000 (got -1)"),
    ],
    ids=["uniform", "lognormal", "concurrency0", "rate-5", "requests0", "closed-port", "token-range", "cv-1",
         "trace-without-file", "trace-missing", "no-end", "warm-1"],
)  # fmt: skip
def test_row6_loadgen_bad_input_is_one_line_and_exit_2(
    place: Place, run, argv: list[str], needle: str
) -> None:
    (place.tmp / "u.yaml").write_text(BAD_UNIFORM)
    (place.tmp / "l.yaml").write_text(BAD_LOGNORMAL)
    files = {"uniform": "u.yaml", "lognormal": "l.yaml", "missing": "no.csv"}
    argv = [a.format(**{k: place.tmp / v for k, v in files.items()}) for a in argv]
    out = place.tmp / "load"
    outcome = run(loadgen, "run", *argv, "--url", "http://127.0.0.1:1", "--out", out)
    assert outcome.code == 2
    assert_clear_error(outcome, needle)
    assert not out.exists() and not list(place.cwd.iterdir())


def test_a_closed_port_with_model_is_exit_1_with_every_request_refused(place: Place, run) -> None:
    out = place.tmp / "load"
    url = f"http://127.0.0.1:{free_port()}"
    outcome = run(loadgen, "run", "--workload", WORKLOAD, "--rate", "20", "--requests", "5", "--model", "m",
                  "--url", url, "--out", out)  # fmt: skip
    assert outcome.code == 1
    assert "warning: stage" in outcome.err and "5 of 5 requests did not complete (refused 5)" in outcome.err
    _, rows = read_trace(out)
    assert set(rows["status"]) == {"refused"}


@pytest.mark.parametrize("sim", [("--cut-after-chunks", "2")], indirect=True)
def test_a_stream_cut_mid_way_is_labelled_cut_not_refused(place: Place, run, sim: str) -> None:
    out = place.tmp / "load"
    outcome = run(loadgen, "run", "--workload", WORKLOAD, "--rate", "20", "--requests", "6", "--url", sim,
                  "--out", out)  # fmt: skip
    assert outcome.code == 1 and "(cut 6)" in outcome.err
    _, rows = read_trace(out)
    assert set(rows["status"]) == {"cut"}


@pytest.mark.parametrize("sim", [("--die-after-requests", "20")], indirect=True)  # of ~100: a count, no clock
def test_open_loop_load_on_an_engine_that_dies_is_exit_1_with_a_warning(place: Place, run, sim: str) -> None:
    out = place.tmp / "load"
    outcome = run(loadgen, "run", "--workload", WORKLOAD, "--rate", "20", "--duration", "5s", "--url", sim,
                  "--out", out)  # fmt: skip
    assert outcome.code == 1
    assert "requests did not complete" in outcome.err
    _, rows = read_trace(out)
    statuses = set(rows["status"])
    assert "ok" in statuses and "refused" in statuses  # before and after the death, told apart


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--tests", "ttft", "--workload", "{uniform}"], "max (16) is below min (32)"),
        (["--tests", "nope"], "unknown battery test 'nope'"),
        (["--engine", "external"], "--engine external needs --url"),
        (["--engine", "external", "--url", "http://127.0.0.1:1", "--tests", "ttft"], "is the engine running"),
        (["--tests", "ttft", "--ttft-slo", "0ms"], "a duration must be > 0"),
    ],
    ids=["workload", "unknown-test", "no-url", "closed-port", "slo"],
)
def test_row6_battery_bad_input_is_one_line_and_exit_2(
    place: Place, run, argv: list[str], needle: str
) -> None:
    (place.tmp / "u.yaml").write_text(BAD_UNIFORM)
    argv = [a.format(uniform=place.tmp / "u.yaml") for a in argv]
    out: Path = place.tmp / "battery"
    outcome = run(battery, "run", *argv, "--out", out)
    assert outcome.code == 2
    assert_clear_error(outcome, needle)
    assert not list(place.cwd.iterdir()) and not out.exists()
