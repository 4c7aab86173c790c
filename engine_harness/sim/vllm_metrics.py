"""The simulated engine's /metrics: vLLM's metric names, types, labels and buckets (prometheus_client).

Each server owns a ``CollectorRegistry``; names and buckets are those of vLLM 0.32 (see
``tests/fixtures/vllm_cpu_metrics_after.txt``), with labels ``engine="0"`` and ``model_name``. Times are
wall seconds, so in accelerated mode (``time_scale`` < 1) they are scaled like everything the client sees.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE", "ITERATION_TOKEN_BUCKETS", "SimMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
_TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
_ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
_REQUEST_TIME_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
_TOKEN_COUNT_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000)
_FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")


class SimMetrics:
    """vLLM-named metrics of one simulated engine, already bound to its labels."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        r, labels, values = self.registry, ["engine", "model_name"], ("0", model_name)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=r).labels(*values)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=r).labels(*values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(*values)

        self.num_requests_running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.num_requests_waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_cache_usage_perc = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.num_preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ["engine", "finished_reason", "model_name"],
            registry=r,
        )
        self.request_success = {
            reason: success.labels(engine="0", finished_reason=reason, model_name=model_name)
            for reason in _FINISH_REASONS
        }
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            ITERATION_TOKEN_BUCKETS,
        )
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", _TOKEN_COUNT_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", _TOKEN_COUNT_BUCKETS
        )
        self.time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", _TTFT_BUCKETS
        )
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", _ITL_BUCKETS
        )
        self.e2e_request_latency = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            _REQUEST_TIME_BUCKETS,
        )
        self.request_queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            _REQUEST_TIME_BUCKETS,
        )
        self.request_prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            _REQUEST_TIME_BUCKETS,
        )
        self.request_decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            _REQUEST_TIME_BUCKETS,
        )

    def render(self) -> bytes:
        """The exposition text of every metric."""
        return generate_latest(self.registry)
