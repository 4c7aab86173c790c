"""What each engine kind calls the quantities the suite reads on its ``/metrics`` (data, not code paths).

``MetricNames`` lists, per quantity, the Prometheus sample names an engine may use (first found wins:
vLLM renamed several between releases). ``engines.EngineKind.metrics`` points at one of these tables; an
engine the suite did not launch (kind ``external``) gets the table whose names its ``/metrics`` serves
(``served_table``), so an external SGLang is read as SGLang, not as vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

__all__ = ["METRIC_TABLES", "SGLANG_METRICS", "VLLM_METRICS", "MetricNames", "served_table", "table_name"]


@dataclass(frozen=True)
class MetricNames:
    """Prometheus sample names an engine uses for the quantities the suite reads (first found wins)."""

    iteration_tokens: tuple[str, ...] = ()
    prefix_cache_queries: tuple[str, ...] = ()
    prefix_cache_hits: tuple[str, ...] = ()
    requests_running: tuple[str, ...] = ()
    requests_waiting: tuple[str, ...] = ()
    kv_cache_usage: tuple[str, ...] = ()
    preemptions: tuple[str, ...] = ()
    prompt_tokens: tuple[str, ...] = ()
    generation_tokens: tuple[str, ...] = ()
    time_to_first_token: tuple[str, ...] = ()
    inter_token_latency: tuple[str, ...] = ()
    prefill_time: tuple[str, ...] = ()
    queue_time: tuple[str, ...] = ()
    cache_hit_rate: tuple[str, ...] = ()


VLLM_METRICS = MetricNames(
    iteration_tokens=("vllm:iteration_tokens_total",),
    prefix_cache_queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    prefix_cache_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    requests_running=("vllm:num_requests_running",),
    requests_waiting=("vllm:num_requests_waiting",),
    kv_cache_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm:cpu_cache_usage_perc"),
    preemptions=("vllm:num_preemptions_total",),
    prompt_tokens=("vllm:prompt_tokens_total",),
    generation_tokens=("vllm:generation_tokens_total",),
    time_to_first_token=("vllm:time_to_first_token_seconds",),
    inter_token_latency=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    prefill_time=("vllm:request_prefill_time_seconds",),
    queue_time=("vllm:request_queue_time_seconds",),
)

# SGLang: no tokens-per-step histogram (steps: its log), preemption counter or prefill-time histogram; hits
# as counted at each prefill (cached_tokens_total counts at a request's *finish*: decodes ending between two
# scrapes would be charged to the injection). Checked on a live scrape: tests/fixtures/sglang_cpu_metrics.txt
SGLANG_METRICS = MetricNames(
    prefix_cache_queries=("sglang:prefill_effective_tokens_total",),  # all its modes: every prompt token
    prefix_cache_hits=('sglang:prefill_effective_tokens_total{mode="device_hit"}',),  # HiCache: host_hit too
    requests_running=("sglang:num_running_reqs",),
    requests_waiting=("sglang:num_queue_reqs",),
    kv_cache_usage=("sglang:token_usage",),
    prompt_tokens=("sglang:prompt_tokens_total",),
    generation_tokens=("sglang:generation_tokens_total",),
    time_to_first_token=("sglang:time_to_first_token_seconds",),
    inter_token_latency=("sglang:inter_token_latency_seconds",),
    queue_time=("sglang:queue_time_seconds",),
    cache_hit_rate=("sglang:cache_hit_rate",),
)

METRIC_TABLES: dict[str, MetricNames] = {"vllm": VLLM_METRICS, "sglang": SGLANG_METRICS}


def _served(table: MetricNames, served: set[str]) -> int:
    """How many of the table's quantities the served sample names carry (a histogram's name counts
    through its ``_bucket``/``_sum``/``_count`` samples)."""
    families = {name.split("{", 1)[0] for f in fields(table) for name in getattr(table, f.name)}
    return sum(1 for fam in families if any(s == fam or s.startswith(f"{fam}_") for s in served))


def served_table(sample_names: Iterable[str], default: str = "vllm") -> str:
    """The name of the table (``METRIC_TABLES``) whose metrics ``sample_names`` (one scrape's) carry
    most; ``default`` when they carry none of any table's."""
    served = set(sample_names)
    counts = {name: _served(table, served) for name, table in METRIC_TABLES.items()}
    best = max(counts, key=lambda name: counts[name])
    return best if counts[best] > 0 else default


def table_name(table: MetricNames) -> str:
    """The name ``METRIC_TABLES`` knows ``table`` by."""
    return next(name for name, t in METRIC_TABLES.items() if t == table)
