"""Connection handshakes this host dropped because a listening socket's accept queue was full.

When a burst of new connections finds a server's accept queue (its listen backlog) full, Linux drops the
handshake and counts it (``TcpExt: ListenOverflows`` in ``/proc/net/netstat``); the client's kernel
retransmits the SYN after 1 s, so the request waits that long before the server sees it, and its TTFT and
E2E carry a second that is neither the engine's nor the client's. vLLM's and SGLang's API servers listen
with 2048 (uvicorn's default), the sim too; a load generator that falls behind sends its overdue requests
in one burst on new connections, and a server with a small backlog then holds a second's worth of them.
The count is the host's, every listening socket's: it speaks for the engine only when the engine runs on
this host (``on_this_host``), and another server's overflows on it count too. A stage counts them from its
start to the end of its drain (``StageOutcome.listen_overflows``), its health warns of any.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from urllib.parse import urlsplit

__all__ = ["listen_overflows", "on_this_host"]

_NETSTAT = Path("/proc/net/netstat")


def listen_overflows(netstat: Path = _NETSTAT) -> int | None:
    """This host's handshakes dropped on a full accept queue so far (None where the kernel does not say)."""
    try:
        lines = [line.split() for line in netstat.read_text().splitlines() if line.startswith("TcpExt:")]
        names, values = lines
        return int(values[names.index("ListenOverflows")])
    except (OSError, ValueError):
        return None


def on_this_host(url: str) -> bool:
    """Whether ``url``'s server is this host by its name: ``localhost`` or a loopback address."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
