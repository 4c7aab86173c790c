"""Prometheus /metrics: scrape, parse (``prometheus_client``), snapshot, and deltas between snapshots.

A ``Snapshot`` holds every sample of one scrape keyed by (sample name, labels). Deltas subtract two
snapshots; histogram helpers turn ``_bucket`` samples into per-bucket counts. The engine's
``MetricNames`` table says which names carry which quantity, so callers ask for "prefix-cache hits",
not for a name that differs between vLLM versions and SGLang.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from engine_harness.metric_names import MetricNames

__all__ = [
    "HistogramDelta",
    "MetricsError",
    "Snapshot",
    "StepCounts",
    "only_families",
    "parse_metrics",
    "scrape",
    "step_counts",
]

LabelSet = frozenset[tuple[str, str]]
SampleKey = tuple[str, LabelSet]


class MetricsError(RuntimeError):
    """/metrics could not be read or lacks a metric the caller needs."""


def _name_and_labels(name: str) -> tuple[str, set[tuple[str, str]]]:
    """``'family{a="x",b="y"}'`` → ``('family', {('a', 'x'), ('b', 'y')})``; a bare name has no labels."""
    base, _, rest = name.partition("{")
    pairs = [p.split("=", 1) for p in rest.rstrip("}").split(",") if "=" in p]
    return base, {(k.strip(), v.strip().strip('"')) for k, v in pairs}


def _order(item: tuple[SampleKey, float]) -> tuple[str, list[tuple[str, str]]]:
    return item[0][0], sorted(item[0][1])


@dataclass(frozen=True)
class Snapshot:
    """Every sample of one scrape, stamped with ``time.perf_counter_ns()`` when the reply arrived."""

    t_ns: int
    samples: dict[SampleKey, float] = field(repr=False)

    def names(self) -> set[str]:
        return {name for name, _ in self.samples}

    def total(self, names: Iterable[str], **labels: str) -> float | None:
        """Sum of the first name in ``names`` that is present, over label sets matching ``labels``.

        A name may fix labels itself, ``family{mode="device_hit"}``. ``None`` when none of the names
        exists (so a missing metric is never read as zero).
        """
        for name in names:
            base, fixed = _name_and_labels(name)
            want = set(labels.items()) | fixed
            values = [v for (n, ls), v in self.samples.items() if n == base and want <= ls]
            if values:
                return float(sum(values))
        return None

    def delta(self, before: Snapshot, names: Iterable[str], **labels: str) -> float | None:
        """Increase of a counter from ``before`` to this snapshot (``None`` if absent in either)."""
        names = tuple(names)
        now, then = self.total(names, **labels), before.total(names, **labels)
        if now is None or then is None:
            return None
        return now - then

    def only(self, names: MetricNames, quantities: Iterable[str]) -> Snapshot:
        """Only the families that carry ``quantities`` (fields of ``MetricNames``) by the engine's table:
        counters, gauges, histogram buckets, sums and counts — what a derivation reads."""
        wanted = {n for q in quantities for n in getattr(names, q)}
        suffixes = ("", "_total", "_bucket", "_sum", "_count")
        keep = {n + s for n in wanted for s in suffixes}
        return Snapshot(self.t_ns, {k: v for k, v in self.samples.items() if k[0] in keep})

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form that ``from_json`` reads back into an equal snapshot."""
        rows = [
            [name, dict(sorted(labels)), value]
            for (name, labels), value in sorted(self.samples.items(), key=_order)
        ]
        return {"t_ns": self.t_ns, "samples": rows}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Snapshot:
        samples = {(str(n), frozenset(dict(ls).items())): float(v) for n, ls, v in data["samples"]}
        return cls(int(data["t_ns"]), samples)

    def histogram(self, names: Iterable[str], **labels: str) -> dict[float, float] | None:
        """Cumulative bucket counts {le: count} of the first present histogram, summed over labels."""
        want = set(labels.items())
        for base in names:
            buckets: dict[float, float] = {}
            for (n, ls), v in self.samples.items():
                if n == f"{base}_bucket" and want <= ls:
                    le = float(dict(ls)["le"])
                    buckets[le] = buckets.get(le, 0.0) + v
            if buckets:
                return dict(sorted(buckets.items()))
        return None


@dataclass(frozen=True)
class HistogramDelta:
    """Observations that fell into each bucket between two snapshots (non-cumulative)."""

    upper_bounds: tuple[float, ...]
    counts: tuple[float, ...]

    @property
    def total(self) -> float:
        return float(sum(self.counts))

    def count_above(self, value: float) -> float:
        """Observations in buckets whose lower bound is ≥ the upper bound of the bucket holding ``value``.

        With bucketed data this is exact only when no observation shares ``value``'s bucket; it is a
        lower bound on the observations strictly greater than ``value`` otherwise.
        """
        lowers = (-math.inf, *self.upper_bounds[:-1])
        return float(sum(c for lo, c in zip(lowers, self.counts, strict=True) if lo >= value))

    @classmethod
    def between(cls, before: dict[float, float], after: dict[float, float]) -> HistogramDelta:
        bounds = tuple(sorted(after))
        cum = [after[b] - before.get(b, 0.0) for b in bounds]
        counts = [cum[0]] + [cum[i] - cum[i - 1] for i in range(1, len(cum))]
        if any(c < 0 for c in counts):
            raise MetricsError("histogram went backwards between snapshots (engine restarted?)")
        return cls(bounds, tuple(counts))


@dataclass(frozen=True)
class StepCounts:
    """Engine steps between two snapshots, from the tokens-per-step histogram."""

    steps: int
    mixed_steps: int
    histogram: HistogramDelta


def step_counts(before: Snapshot, after: Snapshot, names: MetricNames, decode_batch: int) -> StepCounts:
    """Steps and mixed (prefill-carrying) steps between two snapshots.

    A decode-only step carries ``decode_batch`` tokens; a mixed step carries more. Mixed steps are
    counted from buckets wholly above the one that holds ``decode_batch`` (see ``count_above``).
    Caveat (seen on vLLM 0.32): the histogram is observed once per step that produced output, so a
    prefill chunk that samples no token is folded into the next observation and chunks are
    undercounted; the engine's per-step log (``--enable-logging-iteration-details``) is exact.
    """
    h0, h1 = before.histogram(names.iteration_tokens), after.histogram(names.iteration_tokens)
    if h0 is None or h1 is None:
        raise MetricsError(f"the engine exposes none of {names.iteration_tokens} (tokens-per-step histogram)")
    delta = HistogramDelta.between(h0, h1)
    steps = int(delta.total)
    # With no decodes running every step carries prefill tokens.
    mixed = steps if decode_batch <= 0 else int(delta.count_above(decode_batch))
    return StepCounts(steps, mixed, delta)


def parse_metrics(text: str, t_ns: int | None = None) -> Snapshot:
    """Parse Prometheus exposition text into a ``Snapshot``.

    A counter family the engine declares without any sample has not been incremented for any label set
    (prometheus_client creates a labelled child on its first use: SGLang's ``sglang:cached_tokens_total``
    appears with the first finished request that hit the cache); it reads 0, one unlabelled sample.
    """
    samples: dict[SampleKey, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.type == "counter" and not family.samples:
                samples[(f"{family.name}_total", frozenset())] = 0.0
            for s in family.samples:
                key = (s.name, frozenset(s.labels.items()))
                samples[key] = samples.get(key, 0.0) + float(s.value)
    except ValueError as exc:
        raise MetricsError(f"/metrics is not valid Prometheus text: {exc}") from exc
    return Snapshot(time.perf_counter_ns() if t_ns is None else t_ns, samples)


def only_families(text: str, families: Iterable[str]) -> str:
    """The exposition lines of ``families`` only (their samples, ``_total``/``_created`` and a histogram's
    ``_bucket``/``_sum``/``_count`` included, and their ``# TYPE``/``# HELP`` lines): parsing what a
    measurement reads then costs about 3 ms of CPU on a 2-core box, not the 15 ms a whole vLLM page takes
    (SGLang's 30), spent on the client's loop beside the engine it measures."""
    bases = {f.split("{", 1)[0].removesuffix("_total") for f in families}
    names = bases | {f"{b}_total" for b in bases}
    keep = {f"{n}{suffix}" for n in names for suffix in ("", "_created", "_bucket", "_sum", "_count")}
    lines = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) > 2 and parts[2] in keep:
                lines.append(line)
        elif line.split("{", 1)[0].split(" ", 1)[0] in keep:
            lines.append(line)
    return "\n".join(lines) + "\n"


async def scrape(
    session: aiohttp.ClientSession,
    base_url: str,
    timeout_s: float = 10.0,
    families: Iterable[str] | None = None,
) -> Snapshot:
    """GET ``{base_url}/metrics`` and parse it (only ``families``' lines when given: ``only_families``); a
    clear error when the engine does not answer."""
    url = f"{base_url.rstrip('/')}/metrics"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            text = await resp.text()
            t_ns = time.perf_counter_ns()
            if resp.status != 200:
                raise MetricsError(f"GET {url} answered HTTP {resp.status}: {text[:200]}")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise MetricsError(f"GET {url} failed: {type(exc).__name__}: {exc}") from exc
    return parse_metrics(text if families is None else only_families(text, families), t_ns)
