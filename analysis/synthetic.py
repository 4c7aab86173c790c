"""Synthesise a run folder from a known step-time model, through the ``microbench.results.records`` schemas.

Used by the tests (ground truth for the fits) and to try notebooks and reports without an engine. The
engine is modelled as vLLM schedules a chunked prefill next to running decodes: every step first takes
one token of each of the D decodes, then ``min(remaining, chunk − D)`` prompt tokens of the injection.
A step costs ``α + β_d·D + β_c·c + γ·c·ctx`` (``ctx``: prompt tokens already computed), times a seeded
factor ``1 + N(0, noise)``. The injection is sent part-way through a decode-only step, which is logged
as the first entry of ``engine_steps_log``; every decode stream emits one token at the end of each step.
The derived fields are computed as the protocol defines them (DESIGN.md §3).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.steps import schedule_injection
from benchcore.atomic import atomic_write_bytes
from benchcore.atomic import write_model as write_record
from engine_harness.steps import EngineStep
from microbench.results.records import (
    Baseline,
    BaselineRecord,
    Derived,
    Interference,
    LocalBaseline,
    Manifest,
    RunConfig,
    RunRecord,
    Validity,
    point_name,
)

__all__ = ["StepParams", "synthesize_run"]

_BASELINE_STEPS = 64
_WARM_STEPS = 40
_RECOVERY_STEPS = 24
_LOCAL_GAPS = 8


@dataclass(frozen=True)
class StepParams:
    """The step-time model's true parameters (same units as the sim's ``StepModel``)."""

    alpha_ms: float = 1.0
    beta_d_ms: float = 0.02
    beta_c_ms: float = 0.05
    gamma_ns: float = 15.0

    def step_ms(self, decode_tokens: int, chunk: int, context: int) -> float:
        return (
            self.alpha_ms
            + self.beta_d_ms * decode_tokens
            + self.beta_c_ms * chunk
            + self.gamma_ns * 1e-6 * chunk * context
        )


def _p(values: Iterable[float], q: float) -> float | None:
    x = list(values)
    return float(np.percentile(x, q)) if x else None


def _point(
    run_dir: Path,
    run_id: str,
    model: str,
    chunk: int,
    d: int,
    p: int,
    rep: int,
    attempt: int,
    params: StepParams,
    noise: float,
    rng: np.random.Generator,
    baseline_p50: float | None,
    cache_hit: bool,
) -> RunRecord:
    """One injection: its steps, stamps (written to Parquet) and record."""

    def factor() -> float:
        return max(0.05, 1.0 + noise * float(rng.standard_normal()))

    mixed = schedule_injection(d, p, chunk)
    if cache_hit:  # an invalid attempt: the prompt hit the prefix cache and ran as one tiny chunk
        mixed = [(d, min(p, 16), 0)]
    pre = [params.step_ms(d, 0, 0) * factor() for _ in range(_WARM_STEPS)] if d else []
    inflight = params.step_ms(d, 0, 0) * factor() if d else 0.0
    mixed_ms = [params.step_ms(dd, c, ctx) * factor() for dd, c, ctx in mixed]
    post = [params.step_ms(d, 0, 0) * factor() for _ in range(_RECOVERY_STEPS)] if d else []
    t0 = 1_000_000_000 + int(rng.integers(0, 10**9))
    ends = t0 + np.cumsum(np.array([*pre, inflight, *mixed_ms, *post]) * 1e6).astype(np.int64)
    start_inflight = int(ends[len(pre) - 1]) if pre else t0
    t_inject = start_inflight + int(float(rng.uniform(0.1, 0.9)) * inflight * 1e6)
    t_first = int(ends[len(pre) + len(mixed_ms)])

    rows = []
    for s in range(d):
        offset = (s + 1) * 2_000  # each stream's chunk arrives a few µs after the step ends
        rows += [(s, "decode", int(t) + offset, 1) for t in ends]
    rows.append((-1, "prefill", t_first + 1_000, 1))
    raw = pd.DataFrame(rows, columns=["stream", "role", "t_ns", "tokens"])
    raw_rel = f"raw/{chunk}/{point_name(d, p, rep)}_a{attempt}.parquet"
    (run_dir / raw_rel).parent.mkdir(parents=True, exist_ok=True)
    raw.to_parquet(run_dir / raw_rel, index=False)
    t_first += 1_000

    during: list[float] = []
    local: list[float] = []
    aggregate = 0.0
    per_stream: list[list[tuple[int, int]]] = []
    for s in range(d):
        t = raw.loc[raw["stream"] == s, "t_ns"].to_numpy()
        gaps = list(itertools.pairwise(t))
        per_stream.append([(int(a), int(b)) for a, b in gaps if b > t_inject and a < t_first])
        local += [(b - a) / 1e6 for a, b in gaps if b <= t_inject][-_LOCAL_GAPS:]
        during += [(b - a) / 1e6 for a, b in per_stream[-1]]
    local_p50 = _p(local, 50)
    if d and local_p50 is not None:
        aggregate = sum((b - a) / 1e6 - local_p50 for gaps in per_stream for a, b in gaps)
    after = [g for g in post[:4]]
    during_p50 = _p(during, 50)
    p50_penalty = during_p50 - baseline_p50 if during_p50 is not None and baseline_p50 is not None else None
    n_chunks = len(mixed)
    penalty = aggregate / (d * n_chunks) if d and local_p50 is not None else None
    during_ms = baseline_p50 + penalty if baseline_p50 is not None and penalty is not None else None
    steps_log = (
        [
            EngineStep(
                prefill_tokens=0, decode_tokens=d, prefill_requests=0, decode_requests=d, elapsed_ms=inflight
            )
        ]
        if d
        else []
    )
    steps_log += [
        EngineStep(prefill_tokens=c, decode_tokens=dd, prefill_requests=1, decode_requests=dd, elapsed_ms=ms)
        for (dd, c, _), ms in zip(mixed, mixed_ms, strict=True)
    ]
    reasons = ["prefix cache hit: 16 of the injection's tokens were cached"] if cache_hit else []
    return RunRecord(
        run_id=run_id,
        config=RunConfig(
            decode_batch_size=d,
            new_prefill_tokens=p,
            chunk_size=chunk,
            model=model,
            gpu="synthetic",
            repetition=rep,
            engine="synthetic step model",
            decode_context=4096,
            decode_max_tokens=256,
        ),
        baseline=Baseline(
            tpot_p50_ms=baseline_p50,
            tpot_p90_ms=baseline_p50,
            tpot_p99_ms=baseline_p50,
            step_time_ms=baseline_p50,
            n_gaps=_BASELINE_STEPS * d,
        )
        if d
        else None,
        local_baseline=LocalBaseline(tpot_p50_ms=local_p50, tpot_p90_ms=_p(local, 90), n_gaps=len(local))
        if d
        else None,
        interference=Interference(
            tpot_during_prefill_p50_ms=during_p50,
            tpot_during_prefill_p90_ms=_p(during, 90),
            tpot_during_prefill_max_ms=max(during) if during else None,
            tpot_after_prefill_p50_ms=_p(after, 50),
            num_chunks_actual=n_chunks,
            num_chunks_source="engine_log",
            num_chunks_expected=math.ceil(p / (chunk - d)),
            engine_steps=len(steps_log),
            step_time_mixed_ms=_p(mixed_ms, 50),
            prefill_duration_ms=(t_first - t_inject) / 1e6,
            prefill_ttft_ms=(t_first - t_inject) / 1e6,
            n_gaps_during=len(during),
            recovery_gaps_ms=[g for _ in range(d) for g in after],
            prefix_cache_hits=16.0 if cache_hit else 0.0,
            prefix_cache_queries=float(p),
            cached_prompt_tokens=16 if cache_hit else 0,
            preemptions=0.0,
            engine_steps_log=steps_log,
        ),
        derived=Derived(
            tpot_penalty_ms=penalty,
            tpot_during_prefill_ms=during_ms,
            penalty_ratio=during_ms / baseline_p50 if during_ms is not None and baseline_p50 else None,
            tpot_penalty_p50_ms=p50_penalty,
            tpot_penalty_ratio=during_p50 / baseline_p50 if during_p50 is not None and baseline_p50 else None,
            local_penalty_p50_ms=during_p50 - local_p50 if during_p50 is not None and local_p50 else None,
            total_interference_ms=n_chunks * penalty if penalty is not None else None,
            decode_tokens_delayed=d * n_chunks,
            aggregate_decode_delay_ms=aggregate if d else None,
        ),
        validity=Validity(valid=not cache_hit, reasons=reasons, attempt=attempt),
        t_inject_ns=t_inject,
        t_first_token_ns=t_first,
        raw_file=raw_rel,
    )


def synthesize_run(
    run_dir: Path,
    *,
    chunks: Iterable[int] = (2048, 8192),
    decode_batches: Iterable[int] = (0, 1, 2, 4, 8),
    prefill_tokens: Iterable[int] = (512, 2048, 8192, 16384),
    repetitions: int = 3,
    params: StepParams | None = None,
    noise: float = 0.02,
    seed: int = 0,
    model: str = "qwen3-moe-tiny",
    invalid_points: Iterable[tuple[int, int, int, int]] = (),
    failed_points: Iterable[tuple[int, int, int, int]] = (),
) -> Path:
    """Write a complete run folder at ``run_dir`` and return it.

    ``invalid_points`` ``(chunk, D, P, rep)`` get an invalid first attempt (a prefix-cache hit, kept under
    ``invalid/``) and a valid retry; ``failed_points`` end invalid (the invalid record is the point record).
    """
    params = params or StepParams()
    run_dir = Path(run_dir)
    run_id = run_dir.name
    chunks, decode_batches, prefill_tokens = list(chunks), list(decode_batches), list(prefill_tokens)
    invalid, failed = set(invalid_points), set(failed_points)
    write_record(
        run_dir / "manifest.json",
        Manifest(
            run_id=run_id,
            created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
            sweep={
                "chunks": chunks,
                "decode_batches": decode_batches,
                "prefill_tokens": prefill_tokens,
                "repetitions": repetitions,
            },
            engine_spec={"kind": "synthetic", "step": vars(params), "noise": noise},
            engine_version=None,
            hardware={"cpu": "synthetic"},
            packages={},
            git_commit=None,
            seed=seed,
            notes=["synthesised by analysis.synthetic.synthesize_run: not a measurement"],
        ),
    )
    for chunk in chunks:
        for d in decode_batches:
            rng = np.random.default_rng([seed, chunk, d])
            base_gaps = [
                params.step_ms(d, 0, 0) * max(0.05, 1 + noise * rng.standard_normal()) for _ in range(64)
            ]
            baseline_p50 = float(np.median(base_gaps)) if d else None
            if d:
                write_record(
                    run_dir / "baselines" / str(chunk) / f"D{d}.json",
                    BaselineRecord(
                        run_id=run_id,
                        chunk_size=chunk,
                        decode_batch_size=d,
                        batch_index=0,
                        baseline=Baseline(
                            tpot_p50_ms=baseline_p50,
                            tpot_p90_ms=float(np.percentile(base_gaps, 90)),
                            tpot_p99_ms=float(np.percentile(base_gaps, 99)),
                            step_time_ms=baseline_p50,
                            n_gaps=len(base_gaps) * d,
                        ),
                        steady_after_ms=50.0,
                        raw_file=f"raw/{chunk}/D{d}_baseline.parquet",
                    ),
                )
            for p in prefill_tokens:
                for rep in range(repetitions):
                    key = (chunk, d, p, rep)
                    prng = np.random.default_rng([seed, chunk, d, p, rep])
                    args = (run_dir, run_id, model, chunk, d, p, rep)
                    name = f"{point_name(d, p, rep)}.json"
                    if key in invalid or key in failed:
                        bad = _point(*args, 0, params, noise, prng, baseline_p50, cache_hit=True)
                        write_record(
                            run_dir / "invalid" / str(chunk) / f"{point_name(d, p, rep)}_a0.json", bad
                        )
                        if key in failed:
                            write_record(run_dir / "runs" / str(chunk) / name, bad)
                            continue
                    attempt = 1 if key in invalid else 0
                    rec = _point(*args, attempt, params, noise, prng, baseline_p50, cache_hit=False)
                    write_record(run_dir / "runs" / str(chunk) / name, rec)
    atomic_write_bytes(run_dir / ".synthetic", b"analysis.synthetic\n")
    return run_dir
