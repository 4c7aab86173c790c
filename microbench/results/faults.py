"""Which reasons an attempt is invalid for are final, and which were the infrastructure's fault.

An attempt is a measurement of the engine only if the engine was there to be measured. When it was not
(its process died or restarted, it refused or dropped the connection, answered HTTP 429 or 5xx, or its
/metrics could not be read), the attempt says nothing about the point: it spends none of the point's
``max_attempts``, and ``--resume`` measures a point stored as invalid for such a reason again.

Final (a verdict on the point, kept by ``--resume``): the injection hit the prefix cache; a preemption;
the engine counted other prompt tokens than were sent; decodes never reached or did not hold steady
state; decodes did not span the window while the engine ran; delivery stalled; other requests were
running or waiting; the injection got no answer within ``injection_timeout_s``; the engine rejected the
request (HTTP 4xx other than 429) or sent an error inside the stream.

The sweep writes its own infrastructure reasons with the ``INFRASTRUCTURE`` prefix; the other patterns
recognise the wording of records written before that prefix existed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["INFRASTRUCTURE", "infrastructure_reasons", "is_infrastructure"]

INFRASTRUCTURE = "infrastructure fault: "

_PATTERNS = re.compile(
    "|".join(
        (
            re.escape(INFRASTRUCTURE),
            r"\bHTTP (429|5\d\d)\b",
            r"\b(StreamCut|ConnectFailed|EngineError|EngineStartError|MetricsError)\b",
            r"\b(ClientConnectorError|ServerDisconnectedError|ClientOSError|ClientPayloadError)\b",
            r"connection to \S+ failed",
            r"stream ended without \[DONE\]",
            r"/metrics after the injection failed",
            r"\bengine died\b",
        )
    )
)


def is_infrastructure(reason: str) -> bool:
    """True when ``reason`` blames the engine's absence or refusal, not the measurement."""
    return _PATTERNS.search(reason) is not None


def infrastructure_reasons(reasons: Iterable[str]) -> list[str]:
    """The reasons of an invalid attempt that were the infrastructure's fault (empty: a final verdict)."""
    return [r for r in reasons if is_infrastructure(r)]
