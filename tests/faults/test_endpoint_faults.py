"""Issue #33: an endpoint that is not an OpenAI server (an HTML page, a port that accepts and never
answers, a non-HTTP URL) or that refuses the key (HTTP 401) is named as such within seconds by the sweep,
the load generator and the battery (one check: ``engine_harness.handles.checked_endpoint``), exit 2,
nothing written; never ``cut`` request by request, a 30 s /health wait or a 300 s wait."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from fault_checks import Place, assert_clear_error, start_sim

from engine_harness import handles
from engine_harness.sim_kind import SIM_API_KEY_VAR
from microbench.battery.cli import main as battery
from microbench.loadgen.cli import main as loadgen
from microbench.sweep.cli import main as sweep


class _Html(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<!doctype html><html><body>a router's login page</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def html_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Html)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


SILENT_WAIT_S = 1.0  # the probe's timeout here (PROBE_TIMEOUT_S is 10 s): a silent port costs all of it


@pytest.fixture
def silent_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    monkeypatch.setattr(handles, "PROBE_TIMEOUT_S", SILENT_WAIT_S)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


COMMANDS: dict[str, tuple[Callable[[list[str]], int], list[str]]] = {
    "loadgen": (loadgen, ["run", "--workload", "synthetic-uniform", "--rate", "5", "--requests", "3"]),
    "loadgen --model": (  # a named model skips the model list, never the check of what answers
        loadgen,
        ["run", "--workload", "synthetic-uniform", "--rate", "5", "--requests", "3", "--model", "sim"],
    ),
    "battery": (battery, ["run", "--engine", "external", "--tests", "ttft"]),
    "sweep": (sweep, ["--engine", "external", "--model", "sim", "--chunk", "512", "--D", "0", "--P", "256"]),
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize(
    ("endpoint", "needle"),
    [
        ("html", "answered with an HTML page, not a model list: not an OpenAI-compatible server"),
        ("silent", f"sent no answer within {SILENT_WAIT_S:g} s: not an OpenAI-compatible server"),
        ("ftp", "'ftp://127.0.0.1:21' is not an http(s) URL of an OpenAI-compatible server"),
    ],
)
def test_an_endpoint_that_is_not_an_openai_server_is_named_within_seconds(
    place: Place, run, html_url: str, silent_url: str, command: str, endpoint: str, needle: str
) -> None:
    url = {"html": html_url, "silent": silent_url, "ftp": "ftp://127.0.0.1:21"}[endpoint]
    main, argv = COMMANDS[command]
    out = place.tmp / "out"
    t0 = time.monotonic()
    outcome = run(main, *argv, "--url", url, "--out", out)
    assert outcome.code == 2, outcome.text[-2000:]
    assert time.monotonic() - t0 < SILENT_WAIT_S + 10
    assert_clear_error(outcome, needle)
    assert not out.exists() and not list(place.cwd.iterdir())


@pytest.fixture(scope="module")
def keyed_url() -> Iterator[str]:
    """A sim that wants a bearer key on /v1/ (vLLM's --api-key), as an engine started by someone else."""
    proc, url = start_sim(env={SIM_API_KEY_VAR: "sk-fault-tier"})
    yield url
    proc.kill()
    proc.wait()


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_engine_answering_401_names_the_api_key_flag(
    place: Place, run, keyed_url: str, command: str
) -> None:
    main, argv = COMMANDS[command]
    out = place.tmp / "out"
    outcome = run(main, *argv, "--url", keyed_url, "--out", out)
    assert outcome.code == 2, outcome.text[-2000:]
    assert_clear_error(
        outcome, f"{keyed_url}/v1/models refused no API key (HTTP 401)", "set --api-key-env VAR"
    )
    assert not out.exists() and not list(place.cwd.iterdir())
