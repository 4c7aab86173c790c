"""What a prefill step costs the decodes beyond its logged duration and the stream time every step pays.

The stream time (``analysis.calibrate.stream_time``) is fitted on decode-only steps. A step that carries
prompt tokens costs the engine more outside its step timer: CPU vLLM's engine core adds the request,
hashes its prompt's blocks and allocates them, and its API server takes the request in on the core the
engine core runs on. On the committed CPU calibration (``results/calibrate-vllm-cpu-isolated``, 02:25 UTC)
the engine's log stamps put 3.4 ms between a prefill step and the step before it where a decode-only
step had 1.0, and a decode-only step whose cycle took in a request's arrival had 3.3 ms against 0.9.
The replay priced neither, so every decode beside a prefill ran ahead of the real one.

The sweep measures it in every valid record with decodes, from stored fields only. The decodes' extra
time over the prefill window (``derived.aggregate_decode_delay_ms``: every decode gap of the window less
the local baseline's median gap, summed over the streams) divided by ``D`` is one stream's extra wait:
``Σ cycle − k × baseline gap`` for ``k`` prefill steps when the decodes ride in them (mixed scheduling),
``Σ cycle`` when they wait (exclusive: the decode step after them is one baseline gap). To it goes the
first gap after the window less the baseline (mean over the streams; ``recovery_gaps_ms`` holds each
stream's in turn): an engine that holds a step grid makes up a late step in the next one (the simulated
engine: its step ran 0.4–3 ms late while it took the injection in, and the next gap was short by as
much), which is no cost to the decodes; CPU vLLM's first gap after is the baseline's within ±1 ms. Less
the ``k`` logged prefill steps and the stream time the replay charges each (``D`` streamed tokens in mixed
steps, plus the prompt's first token in the last), what is left is ``excess_ms``, fitted as
``per_step_ms × k + per_token_ns × P`` (``P``: the prompt tokens of those steps) by the suite's robust
fit with each term kept only where its 95% CI lies above 0 (``stream_time.kept_terms``). The replay adds
``per_step_ms + per_token_ns × prompt tokens`` to every step that carries prompt tokens.

The first token of the request itself waits on that time too, which the front-end fit must not count
twice: ``charged_ms`` is what the replay charges a record's prefill steps beyond their logged time, and
``charged_twice_ms`` is the part of it each record's front-end time held (where the engine's own
prefill-time histogram did not), which ``analysis.frontend.fit_frontend`` takes out.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from analysis.calibrate.stream_time import StreamTimeFit, kept_terms
from microbench.results.records import RunRecord

__all__ = [
    "PrefillTimeFit",
    "beyond_log_ms",
    "charged_ms",
    "charged_twice_ms",
    "fit_prefill_time",
    "prefill_time_rows",
]


def beyond_log_ms(
    streamed: int,
    prefill_tokens: int,
    *,
    stream_fixed_ms: float,
    stream_ms_per_token: float,
    extra_ms: float = 0.0,
    extra_ns_per_token: float = 0.0,
) -> float:
    """The one price of what a step costs beyond its logged time: its stream time (per step, per token it
    streams) and, carrying prompt tokens, the prefill extra (per step, per prompt token). The replay
    charges it (``SimSettings.beyond_log_ms``) and the front-end fit takes it out (``charged_ms``): one
    formula, so the first token pays it exactly once."""
    stream = stream_fixed_ms + stream_ms_per_token * streamed
    return stream + (extra_ms + extra_ns_per_token * prefill_tokens / 1e6 if prefill_tokens else 0.0)


@dataclass(frozen=True)
class PrefillTimeFit:
    """``excess_ms = per_step_ms × k + per_token_ns × P / 1e6`` for ``k`` prefill steps of ``P`` tokens."""

    per_step_ms: float
    per_step_ci_ms: tuple[float, float]
    per_token_ns: float
    per_token_ci_ns: tuple[float, float] | None  # None: one prompt length, or the term dropped first
    n: int
    note: str = ""  # the terms dropped, with their estimates

    def text(self) -> str:
        """One line for the settings list: both terms with their intervals, the data and what was dropped."""
        low, high = self.per_step_ci_ms
        ci = self.per_token_ci_ns
        token = f"{self.per_token_ns:.3g} [{ci[0]:.3g}, {ci[1]:.3g}] ns" if ci else "0"
        return (
            f"prefill extra per prompt-carrying step: {self.per_step_ms:.3g} [{low:.3g}, {high:.3g}] ms + "
            f"{token} per prompt token (the decodes' aggregate delay over the prefill less its logged steps "
            f"and their stream time, robust fit, a term kept where its 95% CI is above 0, n={self.n})"
            + (f"; {self.note}" if self.note else "")
        )

    def step_ms(self, prefill_tokens: int) -> float:
        """The time one step carrying ``prefill_tokens`` prompt tokens costs beyond its stream time."""
        return beyond_log_ms(
            0,
            prefill_tokens,
            stream_fixed_ms=0.0,
            stream_ms_per_token=0.0,
            extra_ms=self.per_step_ms,
            extra_ns_per_token=self.per_token_ns,
        )


def _streamed(rec: RunRecord, k: int) -> list[int]:
    """Tokens each of the record's ``k`` prefill steps streams: the decodes riding in it (mixed) and the
    prompt's first token in the last."""
    riding = rec.config.decode_batch_size if rec.config.scheduling == "mixed" else 0
    return [riding + (j == k - 1) for j in range(k)]


def _prefill_steps(rec: RunRecord) -> list[tuple[int, float]] | None:
    """(prompt tokens, logged ms) of each of the injection's prefill steps; None where one is untimed."""
    steps = [s for s in rec.interference.engine_steps_log if s.prefill_tokens > 0]
    if not steps or any(s.elapsed_ms is None for s in steps):
        return None
    return [(s.prefill_tokens, float(s.elapsed_ms or 0.0)) for s in steps]


def charged_ms(rec: RunRecord, stream: StreamTimeFit, prefill: PrefillTimeFit | None) -> float | None:
    """What the replay charges the record's prefill steps beyond their logged time (stream time, and the
    prefill time where fitted); None without a timed step log of them."""
    steps = _prefill_steps(rec)
    return None if steps is None else _charged(rec, steps, stream, prefill)


def _charged(
    rec: RunRecord, steps: list[tuple[int, float]], stream: StreamTimeFit, prefill: PrefillTimeFit | None
) -> float:
    extra = (prefill.per_step_ms, prefill.per_token_ns) if prefill is not None else (0.0, 0.0)
    return sum(
        beyond_log_ms(
            n,
            p,
            stream_fixed_ms=stream.fixed_ms,
            stream_ms_per_token=stream.per_token_ms,
            extra_ms=extra[0],
            extra_ns_per_token=extra[1],
        )
        for (p, _), n in zip(steps, _streamed(rec, len(steps)), strict=True)
    )


def charged_twice_ms(rec: RunRecord, charged: float | None) -> float:
    """Of ``charged`` (``charged_ms``: what the replay charges the record's prefill steps beyond their
    logged durations), what the record's front-end time also holds: the part the engine's own prefill
    time (its histogram, else its step-log interval) does not cover beyond the logged steps. 0 where the
    record cannot say."""
    i = rec.interference
    engine = i.engine_prefill_time_ms if i.engine_prefill_time_ms is not None else i.engine_prefill_ms
    steps = _prefill_steps(rec)
    if charged is None or engine is None or steps is None:
        return 0.0
    return max(0.0, charged - (engine - sum(ms for _, ms in steps)))


def _first_after_ms(rec: RunRecord) -> float | None:
    """Mean over the streams of each one's first gap after the window (``recovery_gaps_ms`` holds every
    stream's gaps in turn, as many each); None where they cannot be told apart."""
    gaps, d = rec.interference.recovery_gaps_ms, rec.config.decode_batch_size
    per_stream, rest = divmod(len(gaps), d)
    return sum(gaps[::per_stream]) / d if per_stream and not rest else None


def prefill_time_rows(records: list[RunRecord], stream: StreamTimeFit) -> pd.DataFrame:
    """One row per valid record with decodes, a local baseline, the decodes' aggregate delay, their gaps
    after the window and a timed log of its prefill steps: ``k`` steps, ``P`` their prompt tokens,
    ``cycles_ms`` (one stream's wait over them, and its first gap after less the baseline),
    ``logged_ms``, ``stream_ms`` (charged already) and ``excess_ms``."""
    rows = []
    for r in records:
        d, base, aggregate = r.config.decode_batch_size, r.local_baseline, r.derived.aggregate_decode_delay_ms
        if not r.validity.valid or d == 0 or base is None or base.tpot_p50_ms is None or aggregate is None:
            continue
        steps, after = _prefill_steps(r), _first_after_ms(r)
        if steps is None or after is None:
            continue
        k = len(steps)
        riding = r.config.scheduling == "mixed"
        cycles = aggregate / d + (k * base.tpot_p50_ms if riding else 0.0) + after - base.tpot_p50_ms
        charged = _charged(r, steps, stream, None)
        logged = sum(ms for _, ms in steps)
        rows.append(
            {
                "k": k,
                "P": sum(p for p, _ in steps),
                "cycles_ms": cycles,
                "logged_ms": logged,
                "stream_ms": charged,
                "excess_ms": cycles - logged - charged,
            }
        )
    return pd.DataFrame(rows, columns=["k", "P", "cycles_ms", "logged_ms", "stream_ms", "excess_ms"])


def fit_prefill_time(records: list[RunRecord], stream: StreamTimeFit) -> PrefillTimeFit:
    """Fit the time a prefill step costs beyond its logged duration and stream time (see the module).
    ``ValueError`` when fewer than three records can say (no decodes, no timed log of the prefill)."""
    frame = prefill_time_rows(records, stream)
    if len(frame) < 3:
        raise ValueError(
            "the time a prefill step costs beyond its log needs three valid records or more with decodes, "
            "a client baseline and a timed engine log of the prefill steps"
        )
    p = frame["P"].to_numpy(float) / 1e6  # ms per million tokens: ns per token
    slope = p if frame["P"].nunique() > 1 else None
    terms = kept_terms(
        frame["excess_ms"].to_numpy(float),
        frame["k"].to_numpy(float),
        slope,
        ("per prefill step", "per prompt token"),
        ("ms", "ns"),
    )
    return PrefillTimeFit(terms.first, terms.first_ci, terms.second, terms.second_ci, len(frame), terms.note)
