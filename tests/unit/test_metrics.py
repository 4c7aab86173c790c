"""Prometheus parsing and deltas on /metrics text transcribed from real engines."""

from pathlib import Path

import pytest

from engine_harness.metric_names import SGLANG_METRICS, VLLM_METRICS
from engine_harness.metrics import HistogramDelta, MetricsError, only_families, parse_metrics, step_counts
from microbench.results.derive import METRICS_READ

FIXTURES = Path(__file__).parent.parent / "fixtures"


@pytest.fixture(scope="module")
def vllm_pair():
    # Two scrapes of vLLM 0.32 (CPU) around two requests: a 17-token prompt with 6 output tokens and
    # a chat request whose templated prompt is 24 tokens with 4 output tokens.
    before = parse_metrics((FIXTURES / "vllm_cpu_metrics_idle.txt").read_text(), t_ns=1)
    after = parse_metrics((FIXTURES / "vllm_cpu_metrics_after.txt").read_text(), t_ns=2)
    return before, after


def test_vllm_counter_deltas_match_the_requests_sent(vllm_pair) -> None:
    before, after = vllm_pair
    assert after.delta(before, VLLM_METRICS.prompt_tokens) == 17 + 24
    assert after.delta(before, VLLM_METRICS.generation_tokens) == 6 + 4
    assert after.delta(before, VLLM_METRICS.prefix_cache_queries) == 41
    assert after.delta(before, VLLM_METRICS.prefix_cache_hits) == 0
    assert after.total(VLLM_METRICS.requests_running) == 0
    assert after.total(VLLM_METRICS.kv_cache_usage) == 0


def test_vllm_steps_from_iteration_histogram(vllm_pair) -> None:
    before, after = vllm_pair
    counts = step_counts(before, after, VLLM_METRICS, decode_batch=1)
    # 1 prefill + 5 decode steps for the first request, 1 + 3 for the second.
    assert counts.steps == 10
    # the two prefill steps carried 17 and 24 tokens: both in buckets wholly above 1 token
    assert counts.mixed_steps == 2
    assert counts.histogram.upper_bounds[0] == 1.0 and counts.histogram.upper_bounds[-1] == float("inf")


def test_missing_metric_is_none_never_zero(vllm_pair) -> None:
    _, after = vllm_pair
    assert after.total(("vllm:no_such_metric",)) is None
    assert after.delta(after, ("vllm:no_such_metric",)) is None


def test_old_alias_is_found_when_current_name_is_absent() -> None:
    text = '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="m"} 0.25\n'
    assert parse_metrics(text).total(VLLM_METRICS.kv_cache_usage) == 0.25


def test_sglang_names_table_reads_sglang_exposition() -> None:
    snap = parse_metrics((FIXTURES / "sglang_metrics.txt").read_text())
    assert snap.total(SGLANG_METRICS.requests_running) == 162
    assert snap.total(SGLANG_METRICS.requests_waiting) == 2826
    assert snap.total(SGLANG_METRICS.kv_cache_usage) == pytest.approx(0.28)
    assert snap.total(("sglang:cached_tokens_total",)) == 61024
    assert snap.total(('sglang:cached_tokens_total{cache_source="host"}',)) == 0  # a name may fix labels
    assert snap.total(("sglang:cached_tokens_total",), cache_source="host") == 0
    assert snap.histogram(SGLANG_METRICS.time_to_first_token) == {
        0.1: 0,
        0.5: 6,
        1.0: 28,
        float("inf"): 27971,
    }
    with pytest.raises(MetricsError, match="tokens-per-step histogram"):
        step_counts(snap, snap, SGLANG_METRICS, decode_batch=4)


def test_a_declared_counter_without_samples_reads_zero_an_undeclared_one_none() -> None:
    # SGLang declares sglang:cached_tokens_total at start; its first sample comes with the first finished
    # request that hit the prefix cache
    text = "# HELP sglang:cached_tokens_total Number of cached prompt tokens.\n"
    text += "# TYPE sglang:cached_tokens_total counter\n"
    snap = parse_metrics(text)
    assert snap.total(("sglang:cached_tokens_total",)) == 0
    assert snap.total(("sglang:prompt_tokens_total",)) is None


def test_sglang_names_table_against_a_live_sglang_scrape() -> None:
    # tests/fixtures/sglang_cpu_metrics.txt: SGLang 0.5.23 on the CPU box after 4 decodes of 300 tokens on
    # a shared 1024-token prefix (each hit 1023 of it: 4092 cached tokens) and one cold 4096-token
    # injection, all finished.
    snap = parse_metrics((FIXTURES / "sglang_cpu_metrics.txt").read_text())
    gauges_and_counters = (
        "prefix_cache_queries", "prefix_cache_hits", "requests_running", "requests_waiting",
        "kv_cache_usage", "prompt_tokens", "generation_tokens", "cache_hit_rate",
    )  # fmt: skip
    for field in gauges_and_counters:
        assert snap.total(getattr(SGLANG_METRICS, field)) is not None, field
    for field in ("time_to_first_token", "inter_token_latency", "queue_time"):
        assert snap.histogram(getattr(SGLANG_METRICS, field)) is not None, field
    # hits as the scheduler counted them at each prefill (4 × 1023); queries: every prompt token prefilled
    assert snap.total(SGLANG_METRICS.prefix_cache_hits) == 4092
    assert snap.total(SGLANG_METRICS.prefix_cache_queries) == 5154 + 4092
    # SGLang's own start-up warm-up request (29 prompt tokens, 8 generated, not streamed), then ours:
    # the prefix (1024 → 1), 4 decodes (1024 → 300 each), the injection (4096 → 1)
    assert snap.total(SGLANG_METRICS.prompt_tokens) == 29 + 1024 + 4 * 1024 + 4096
    assert snap.total(SGLANG_METRICS.generation_tokens) == 8 + 1 + 4 * 300 + 1
    assert snap.total(SGLANG_METRICS.requests_running) == 0
    # what SGLang does not have stays absent (None), never 0
    assert SGLANG_METRICS.iteration_tokens == () and SGLANG_METRICS.preemptions == ()
    assert snap.total(SGLANG_METRICS.preemptions) is None


def test_histogram_delta_counts_mixed_steps_above_the_decode_bucket() -> None:
    bounds = (1.0, 8.0, 16.0, 32.0, 2048.0, float("inf"))
    before = dict(zip(bounds, (0, 0, 0, 0, 0, 0), strict=True))
    # 4 decode-only steps of 12 tokens (bucket ≤16), 2 mixed steps of 12+2036 tokens (bucket ≤2048)
    after = dict(zip(bounds, (0, 0, 4, 4, 6, 6), strict=True))
    delta = HistogramDelta.between(before, after)
    assert delta.counts == (0, 0, 4, 0, 2, 0)
    assert delta.count_above(12) == 2
    assert delta.count_above(16) == 2
    with pytest.raises(MetricsError, match="went backwards"):
        HistogramDelta.between(after, before)


def test_garbage_is_a_clear_error() -> None:
    with pytest.raises(MetricsError, match="not valid Prometheus text"):
        parse_metrics("vllm:foo{bad 1 2 3\n")


@pytest.mark.parametrize(
    ("names", "fixture"),
    [(VLLM_METRICS, "vllm_cpu_metrics_after.txt"), (SGLANG_METRICS, "sglang_cpu_metrics.txt")],
)
def test_the_families_a_point_reads_parse_alike_from_the_filtered_page(names, fixture) -> None:
    # EngineClient.scrape parses only these families: every counter, gauge and histogram sample of them
    # equals the whole page's, the rest of the page is gone
    text = (FIXTURES / fixture).read_text()
    families = [n for q in METRICS_READ for n in getattr(names, q)]
    whole, part = parse_metrics(text, t_ns=1), parse_metrics(only_families(text, families), t_ns=1)
    read = whole.only(names, METRICS_READ).samples
    assert part.only(names, METRICS_READ).samples == read
    assert any(k[0].endswith("_bucket") for k in read) and len(part.samples) < len(whole.samples) / 2
