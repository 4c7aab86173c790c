"""Step composition, real against predicted: does the replay schedule the steps the engine ran?

The real engine's steps come from its log (vLLM's iteration-details lines, SGLang's batch lines: parsed
by ``engine_harness.steps``), kept where their stamps fall inside the trace (the header's session start
plus the first send to the last chunk); the predicted ones are the replay's step log (``steps.parquet``).
Compared: the number of steps, prompt and decode tokens in all, the share of steps that carry both (mixed),
tokens per step (median, and two-sample KS), the median step time of prefill-carrying and of decode-only
steps, and the median step time shape by shape (``step_bands``: decode-only steps by batch, prefill-carrying
ones by prompt tokens), which tells a mispriced step from a different schedule. Where the engine's log
cannot time a step that began on an idle engine (SGLang), the replay's steps that began on an idle engine are
left out of its medians too: like with like (on the first SGLang calibration run, 2026-11-25 14:50 UTC, the
median prefill step of all replayed steps was 41.6 ms, of those that began on a busy engine 45.3, against the
engine's 49.4).
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field

from analysis.calibrate.stats import ks_two_sample
from benchcore.schema import StrictModel
from engine_harness.steps import parse_iteration_lines, parse_sglang_step_lines, sglang_settings
from microbench.results.trace import TraceHeader

__all__ = [
    "EngineLogError", "StepBand", "StepComposition", "StepSide", "engine_log_steps", "replay_began_idle",
    "step_bands", "step_composition",
]  # fmt: skip


class StepSide(StrictModel):
    """One side's steps in summary."""

    steps: int
    prefill_tokens: int
    decode_tokens: int
    mixed_share: float = Field(description="share of steps carrying prompt and decode tokens")
    median_tokens: float
    median_prefill_step_ms: float | None
    median_decode_step_ms: float | None


class StepBand(StrictModel):
    """The timed steps of one shape band, real against predicted."""

    kind: Literal["decode-only", "prefill-carrying"]
    band: str = Field(description="decode-only: requests in the batch; prefill-carrying: prompt tokens")
    real_steps: int
    real_median_ms: float | None
    real_median_decodes: float | None = Field(description="median decode requests in the band's steps")
    predicted_steps: int
    predicted_median_ms: float | None
    predicted_median_decodes: float | None


class EngineLogError(ValueError):
    """The engine log given cannot serve: unreadable, or no step of the trace's time in it."""


class StepComposition(StrictModel):
    """The real engine's steps during the trace against the replay's."""

    engine_log: str
    real: StepSide
    predicted: StepSide
    tokens_ks_d: float
    tokens_ks_p: float
    bands: list[StepBand] = Field(default_factory=list, description="step time shape by shape (step_bands)")


def engine_log_steps(log: Path, header: TraceHeader, frame: pd.DataFrame) -> pd.DataFrame:
    """The steps an engine logged while the trace ran: ``prefill_tokens``, ``decode_tokens``,
    ``elapsed_ms`` (vLLM's iteration lines; else SGLang's batch lines, mixed when its start-up line's
    ``server_args`` say ``'enable_mixed_chunk': True``; a step SGLang's interval timed from an idle
    engine has no duration: ``_idle_before``, and the column ``began_idle`` says which)."""
    text = _log_text(log)
    steps = parse_iteration_lines(text)
    sglang = not steps
    if sglang:
        mixed = (sglang_settings(text) or {}).get("enable_mixed_chunk") == "True"
        steps = parse_sglang_step_lines(text, mixed=mixed)
    if not steps:
        raise EngineLogError(
            f"{log} holds no step lines (vLLM --enable-logging-iteration-details, or SGLang's)"
        )
    start = header.session_start_unix_ns / 1e9
    first = start + float(frame["send_ns"].dropna().min()) / 1e9
    last = start + float(frame["last_chunk_ns"].dropna().max()) / 1e9
    rows = [s.model_dump() for s in steps if s.t_end_s is not None and first <= s.t_end_s <= last]
    if not rows:
        raise EngineLogError(f"{log} has no stamped step inside the trace's time ({first:.3f} to {last:.3f})")
    out = pd.DataFrame(rows)
    if sglang:
        out["began_idle"] = _idle_before(out, frame, start)
        out.loc[out["began_idle"], "elapsed_ms"] = np.nan
    return out


def _log_text(log: Path) -> str:
    """The log's text; a ``.gz`` log (a committed run keeps its engine's log compressed) through gzip.
    ``EngineLogError`` naming the log where it cannot be read (missing, or a broken or cut-off ``.gz``)."""
    try:
        if log.suffix == ".gz":
            with gzip.open(log, "rt", errors="replace") as f:
                return f.read()
        return log.read_text(errors="replace")
    except (OSError, EOFError) as exc:
        raise EngineLogError(
            f"the engine log {log} cannot be read ({exc}): give the log of the observed run's engine"
        ) from None


def _idle_before(steps: pd.DataFrame, frame: pd.DataFrame, start_s: float) -> np.ndarray:
    """Steps whose interval (previous step line → own line) began on an idle engine: no request sent
    before the interval began was still unfinished at its end. SGLang logs nothing while idle, so such an
    interval is the idle time plus the step, not the step."""
    end = steps["t_end_s"].to_numpy(float)
    began = end - steps["elapsed_ms"].to_numpy(float, na_value=np.nan) / 1e3
    sends = start_s + frame["send_ns"].to_numpy(float, na_value=np.nan) / 1e9
    lasts = start_s + frame["last_chunk_ns"].to_numpy(float, na_value=np.nan) / 1e9
    busy = ((sends[None, :] <= began[:, None]) & (lasts[None, :] > end[:, None])).any(axis=1)
    return np.isfinite(began) & ~busy


def replay_began_idle(predicted: pd.DataFrame) -> np.ndarray:
    """The replay's steps that began on an idle engine: later than the previous step's end (its duration
    plus the API server's time after it); the first step always did."""
    start = predicted["t_start_ns"].to_numpy(float)
    end = start + predicted["duration_ns"].to_numpy(float) + predicted["stream_ns"].to_numpy(float)
    return np.r_[True, start[1:] > end[:-1]] if start.size else np.zeros(0, bool)


def _side(prefill: np.ndarray, decode: np.ndarray, ms: np.ndarray) -> StepSide:
    tokens = prefill + decode
    carries = prefill > 0

    def median(values: np.ndarray) -> float | None:
        values = values[np.isfinite(values)]
        return float(np.median(values)) if values.size else None

    return StepSide(
        steps=int(tokens.size),
        prefill_tokens=int(prefill.sum()),
        decode_tokens=int(decode.sum()),
        mixed_share=float(np.mean(carries & (decode > 0))) if tokens.size else 0.0,
        median_tokens=float(np.median(tokens)) if tokens.size else 0.0,
        median_prefill_step_ms=median(ms[carries]),
        median_decode_step_ms=median(ms[~carries]),
    )


# Bands (inclusive upper bounds): decode-only steps by their batch, prefill-carrying ones by prompt tokens.
_DECODE_EDGES = (1, 2, 4, 8, 16)
_PROMPT_EDGES = (256, 1024, 2048)


def _band_names(edges: tuple[int, ...]) -> list[str]:
    lows = (1, *(e + 1 for e in edges))
    names = [str(lo) if lo == hi else f"{lo}–{hi}" for lo, hi in zip(lows, edges, strict=False)]
    return [*names, f"{lows[-1]}+"]


def _in_band(band: np.ndarray, ms: np.ndarray, dec: np.ndarray) -> tuple[int, float | None, float | None]:
    """Steps in the band (``band`` is the mask), their median ms and median decode requests."""
    n = int(band.sum())
    return (n, float(np.median(ms[band])), float(np.median(dec[band]))) if n else (0, None, None)


def step_bands(
    real: tuple[np.ndarray, np.ndarray, np.ndarray], predicted: tuple[np.ndarray, np.ndarray, np.ndarray]
) -> list[StepBand]:
    """Timed steps (``prefill tokens, decode requests, ms``; untimed ones NaN) grouped by shape, real against
    predicted: decode-only by their batch (1, 2, 3–4, 5–8, 9–16, 17+), prefill-carrying by their prompt
    tokens (1–256, 257–1024, 1025–2048, 2049+); bands neither side has are left out. Where one band's
    medians part, the step model misprices that shape (or the engine ran it slower than in the sweep);
    where they agree and the requests' errors remain, the schedule differs."""
    out = []
    kinds: tuple[tuple[Literal["decode-only", "prefill-carrying"], tuple[int, ...]], ...] = (
        ("decode-only", _DECODE_EDGES), ("prefill-carrying", _PROMPT_EDGES),
    )  # fmt: skip
    for kind, edges in kinds:
        sides = []
        for pre, dec, ms in (real, predicted):
            carries = pre > 0
            timed = np.isfinite(ms) & (carries if kind == "prefill-carrying" else ~carries & (dec > 0))
            key = (pre if kind == "prefill-carrying" else dec)[timed]
            sides.append((np.searchsorted(edges, key, side="left"), ms[timed], dec[timed]))
        for i, name in enumerate(_band_names(edges)):
            (rn, r_ms, r_dec), (pn, p_ms, p_dec) = (_in_band(band == i, ms, dec) for band, ms, dec in sides)
            if rn or pn:
                out.append(StepBand(
                    kind=kind, band=name, real_steps=rn, real_median_ms=r_ms, real_median_decodes=r_dec,
                    predicted_steps=pn, predicted_median_ms=p_ms, predicted_median_decodes=p_dec,
                ))  # fmt: skip
    return out


def step_composition(real: pd.DataFrame, predicted: pd.DataFrame, engine_log: str) -> StepComposition:
    """Compare the real steps (``engine_log_steps``) with the replay's (``steps.parquet``); where the real
    ones say which began on an idle engine (untimed), the replay's that did are not timed either."""
    r_pre, r_dec = real["prefill_tokens"].to_numpy(float), real["decode_tokens"].to_numpy(float)
    p_pre, p_dec = predicted["prefill_tokens"].to_numpy(float), predicted["decode_tokens"].to_numpy(float)
    p_ms = predicted["duration_ns"].to_numpy(float) / 1e6
    if "began_idle" in real:
        p_ms[replay_began_idle(predicted)] = np.nan
    r_ms = real["elapsed_ms"].to_numpy(float, na_value=np.nan)
    d, p = ks_two_sample(r_pre + r_dec, p_pre + p_dec)
    return StepComposition(
        engine_log=engine_log,
        real=_side(r_pre, r_dec, r_ms),
        predicted=_side(p_pre, p_dec, p_ms),
        tokens_ks_d=d,
        tokens_ks_p=p,
        bands=step_bands((r_pre, r_dec, r_ms), (p_pre, p_dec, p_ms)),
    )
