"""An external engine's metric names are the ones its /metrics serves, not assumed to be vLLM's."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from engine_harness.engines import EngineSpec
from engine_harness.launch import EngineProcess
from engine_harness.metric_names import SGLANG_METRICS, VLLM_METRICS, served_table
from engine_harness.metrics import parse_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize(
    ("scrape", "table"),
    [
        ("sglang_cpu_metrics.txt", "sglang"),
        ("sglang_metrics.txt", "sglang"),
        ("vllm_cpu_metrics_idle.txt", "vllm"),
    ],
)
def test_the_table_is_the_one_whose_names_the_scrape_carries(scrape: str, table: str) -> None:
    assert served_table(parse_metrics((FIXTURES / scrape).read_text()).names()) == table


def test_a_scrape_of_no_known_engine_gets_the_default() -> None:
    assert served_table({"process_cpu_seconds_total"}) == "vllm"
    assert served_table(set(), default="sglang") == "sglang"


async def _serve(metrics: str | None) -> tuple[web.AppRunner, str]:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def scrape(_: web.Request) -> web.Response:
        return web.Response(text=metrics) if metrics is not None else web.Response(status=404)

    app = web.Application()
    app.add_routes([web.get("/health", ok), web.get("/metrics", scrape)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize(
    ("served", "table"),
    [((FIXTURES / "sglang_cpu_metrics.txt").read_text(), SGLANG_METRICS), (None, VLLM_METRICS)],
)
async def test_an_external_engine_is_read_with_the_table_its_metrics_serve(
    served: str | None, table: object
) -> None:
    runner, url = await _serve(served)
    try:
        engine = EngineProcess(EngineSpec(kind="external", url=url), startup_timeout_s=10)
        await engine.start()
        assert engine.metrics is table  # no /metrics: the kind's own table
    finally:
        await runner.cleanup()


async def test_an_external_engine_is_read_with_the_names_its_metrics_serve() -> None:
    from aiohttp import web

    from engine_harness.handles import ExternalEngine
    from engine_harness.metric_names import SGLANG_METRICS, VLLM_METRICS

    body = {"/metrics": (FIXTURES / "sglang_metrics.txt").read_text()}

    async def metrics(request: web.Request) -> web.Response:
        if request.path not in body:
            raise web.HTTPNotFound()
        return web.Response(text=body[request.path], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/{tail:.*}", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        url = f"http://127.0.0.1:{port}"
        assert (await ExternalEngine.reached(url)).metrics == SGLANG_METRICS  # an SGLang behind a URL
        body.clear()  # /metrics answers 404: the external kind's default table
        assert (await ExternalEngine.reached(url)).metrics == VLLM_METRICS
    finally:
        await runner.cleanup()
