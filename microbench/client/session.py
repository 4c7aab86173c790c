"""The one way the suite opens a long-lived HTTP session to an engine (or to the PD proxy in front of two).

vLLM's and SGLang's API servers (uvicorn) close a keep-alive connection after 5 s idle
(``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, ``SGLANG_TIMEOUT_KEEP_ALIVE``); aiohttp's client keeps an idle
connection for 15 s. A request sent on a pooled connection just as the server closes it fails with
``ServerDisconnectedError`` before the engine saw it, and aiohttp retries no POST: a local CI of
2026-11-30 lost a transfer point this way (the PD proxy's first measured request to the producer, about 5 s
after its warm-up on the same connection). This session closes its own idle connections after
``IDLE_KEEPALIVE_S``, well inside the servers' 5 s, so a pooled connection is never one the server is
closing; a request after a longer gap opens a new one, as it had to before (the server had closed the old
one), its connect inside the request's measured time.
"""

from __future__ import annotations

from typing import Any

import aiohttp

__all__ = ["IDLE_KEEPALIVE_S", "engine_session"]

IDLE_KEEPALIVE_S = 2.0


def engine_session(limit: int = 100, **kwargs: Any) -> aiohttp.ClientSession:
    """An ``aiohttp.ClientSession`` (``kwargs``: its own, e.g. ``timeout``) whose pool holds at most
    ``limit`` connections (0: no limit) and drops any idle for ``IDLE_KEEPALIVE_S``."""
    connector = aiohttp.TCPConnector(limit=limit, keepalive_timeout=IDLE_KEEPALIVE_S)
    return aiohttp.ClientSession(connector=connector, **kwargs)
