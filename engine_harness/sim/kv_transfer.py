"""A simulated KV connector with a known link: ``t = setup_ms + bytes / bandwidth`` per hand-off.

With ``SimConfig.kv_transfer`` set, a sim engine speaks the two halves of vLLM's NIXL protocol as the
transfer benchmark's proxy drives them:

* producer: a request whose ``kv_transfer_params`` ask ``do_remote_decode`` is answered with
  ``kv_transfer_params`` (``do_remote_prefill: true`` and the prompt length), as NixlConnector does;
* consumer: a request carrying ``do_remote_prefill`` first waits out the modelled transfer of
  ``P × bytes_per_token`` bytes (× ``time_scale``), records that modelled time in NIXL's metric
  names (``vllm:nixl_xfer_time_seconds``,
  ``vllm:nixl_bytes_transferred``) and ``vllm:prompt_tokens_by_source{source="external_kv_transfer"}``,
  and then computes only the prompt's last token (the rest counts as loaded).

The true ``setup_ms`` and ``bandwidth_gbit_s`` are the ground truth a link fit must recover.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import Field

from benchcore.schema import StrictModel

__all__ = ["KvTransferModel", "LinkMetrics", "consumer_transfer", "producer_params"]

_XFER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))


class KvTransferModel(StrictModel):
    """The simulated link: a fixed setup time plus the KV bytes at a bandwidth."""

    setup_ms: float = Field(ge=0, le=60_000, description="fixed cost of one hand-off (ms)")
    bandwidth_gbit_s: float = Field(gt=0, le=1e6, description="10⁹ bit/s")
    bytes_per_token: int = Field(gt=0, description="KV bytes per prompt token (2·layers·kv_heads·dim·dtype)")

    def transfer_s(self, prompt_tokens: int) -> float:
        """Model seconds to move ``prompt_tokens`` tokens of KV."""
        return self.setup_ms / 1e3 + prompt_tokens * self.bytes_per_token * 8 / (self.bandwidth_gbit_s * 1e9)


def producer_params(body: dict[str, Any], prompt_tokens: int) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` a producer returns when the request asked for a remote decode."""
    params = body.get("kv_transfer_params")
    if not isinstance(params, dict) or not params.get("do_remote_decode"):
        return None
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "sim-producer",
        "remote_block_ids": [],
        "remote_host": "127.0.0.1",
        "remote_port": 0,
        "remote_prompt_tokens": prompt_tokens,
    }


def consumer_transfer(body: dict[str, Any]) -> bool:
    """True when the request asks the consumer to load its prompt's KV from a producer."""
    params = body.get("kv_transfer_params")
    return isinstance(params, dict) and bool(params.get("do_remote_prefill"))


class LinkMetrics:
    """NIXL's metric names on the consumer, in the engine's registry (vLLM 0.32's buckets)."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels, values = ["engine", "model_name"], ("0", model_name)
        self.xfer_time = Histogram(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            labels,
            buckets=_XFER_BUCKETS,
            registry=registry,
        ).labels(*values)
        self.bytes_transferred = Histogram(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            labels,
            buckets=_BYTES_BUCKETS,
            registry=registry,
        ).labels(*values)
        self.external_tokens = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [*labels, "source"],
            registry=registry,
        ).labels(*values, "external_kv_transfer")

    def observe(self, seconds: float, nbytes: int, tokens: int) -> None:
        self.xfer_time.observe(seconds)
        self.bytes_transferred.observe(nbytes)
        self.external_tokens.inc(tokens)
