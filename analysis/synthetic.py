"""Synthesise a run folder from a known step-time model: synthetic stamps fed to the sweep's own ``derive``.

Used by the tests (ground truth for the fits) and to try notebooks and reports without an engine. The
engine schedules the injection's chunks as the one step-time model says (``engine_harness.step_model``:
``mixed``, vLLM's way, every step carrying the D decode tokens and ``min(remaining, chunk − D)`` prompt
tokens; or ``exclusive``, SGLang's default, a prefill step of up to ``chunk`` tokens running instead of
the decode step), and a step costs what that model says times a seeded factor ``1 + N(0, noise)``. The
request reaches the engine ``frontend_ns_per_token × P`` after its send (the API server's share), waits
for the running step to end, then its chunks run; each decode stream gets one token at the end of every
step that carried the decodes. What is written is what the live sweep writes — observations, stamps,
scrapes, baselines — and the records come from ``RunFolder.derive_attempt``, as in a real run.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd

from benchcore.atomic import atomic_write_bytes
from engine_harness.engines import engine_kind
from engine_harness.metrics import Snapshot
from engine_harness.step_model import Chunk, Scheduling, StepModel, StepShape, chunk_schedule, prefill_budget
from engine_harness.steps import EngineStep
from microbench.results.layout import RunFolder, attempt_stem
from microbench.results.records import (
    Baseline,
    BaselineRecord,
    Manifest,
    Observation,
    ProtocolRules,
    RunConfig,
)

__all__ = ["synthesize_run"]

_WARM_STEPS = 40
_RECOVERY_STEPS = 24
_MODEL = "qwen3-moe-tiny"  # the bundled model's KV shape, for break-even and the policy
_START_TOKENS = 40  # tokens each decode stream has when the first point of a batch is injected


@dataclass(frozen=True)
class _Cell:
    chunk: int
    d: int
    decode_context: int
    model: StepModel
    noise: float
    scheduling: Scheduling
    frontend_ns_per_token: float


def _timeline(cell: _Cell, p: int, seen0: int, cache_hit: bool, rng: np.random.Generator) -> dict:
    """Steps (start, duration, prefill tokens, decode tokens) and the injection's send/arrival/first-token
    times (ns)."""
    d = cell.d
    riders = cell.chunk - prefill_budget(cell.chunk, d, cell.scheduling)
    chunks = (
        [(Chunk(min(p, 16)),)]
        if cache_hit
        else [s.chunks for s in chunk_schedule(p, cell.chunk, d, cell.scheduling)]
    )
    t, seen = 1e9, seen0  # seen: tokens each decode stream has generated

    def ms(decodes: int, step_chunks: tuple[Chunk, ...]) -> float:
        factor = max(0.05, 1.0 + cell.noise * float(rng.standard_normal()))
        shape = StepShape(decodes, step_chunks, decodes * (cell.decode_context + seen))
        return cell.model.step_ms(shape) * factor

    out: list[tuple[float, float, int, int]] = []

    def step(decodes: int = d, step_chunks: tuple[Chunk, ...] = ()) -> None:
        nonlocal t, seen
        dur = ms(decodes, step_chunks)
        out.append((t, dur, sum(c.tokens for c in step_chunks), decodes))
        t, seen = t + dur * 1e6, seen + (decodes > 0)

    for _ in range(_WARM_STEPS if d else 0):
        step()
    t_send = t
    if d:  # sent part-way through a decode-only step
        t_send = t + float(rng.uniform(0.1, 0.9)) * ms(d, ()) * 1e6
        step()
    arrival = t_send + cell.frontend_ns_per_token * p
    while d and t < arrival:  # decode-only steps until the step boundary after the request arrived
        step()
    scheduled = t = max(t, arrival)
    for step_chunks in chunks:
        step(riders, step_chunks)
    first = t
    for _ in range(_RECOVERY_STEPS if d else 0):
        step()
    return {
        "steps": out,
        "send": int(t_send),
        "arrival": arrival,
        "scheduled": scheduled,
        "first": int(first),
    }


def _stamps(cell: _Cell, line: dict, seen0: int) -> pd.DataFrame:
    rows = []
    for s in range(cell.d):
        offset = (s + 1) * 2_000  # each stream's chunk arrives a few µs after the step ends
        seen = seen0
        for start, dur, _, decodes in line["steps"]:
            if decodes:  # an exclusive prefill step gives the decodes no token
                seen += 1
                rows.append((s, "decode", int(start + dur * 1e6) + offset, 1, seen))
    rows.append((-1, "prefill", line["first"], 1, 1))
    frame = pd.DataFrame(rows, columns=["stream", "role", "t_ns", "tokens", "seen"])
    return frame.astype({"stream": "int16", "t_ns": "int64", "tokens": "int32", "seen": "int32"})


def _scrapes(p: int, hits: int, line: dict) -> tuple[Snapshot, Snapshot]:
    def snap(done: bool) -> Snapshot:
        n = 1.0 if done else 0.0
        queue_s = (line["scheduled"] - line["arrival"]) / 1e9
        prefill_s = (line["first"] - line["scheduled"]) / 1e9
        return Snapshot(
            0,
            {
                ("vllm:prefix_cache_queries_total", frozenset()): float(p) * n,
                ("vllm:prefix_cache_hits_total", frozenset()): float(hits) * n,
                ("vllm:num_preemptions_total", frozenset()): 0.0,
                ("vllm:request_queue_time_seconds_count", frozenset()): n,
                ("vllm:request_queue_time_seconds_sum", frozenset()): queue_s * n,
                ("vllm:request_prefill_time_seconds_count", frozenset()): n,
                ("vllm:request_prefill_time_seconds_sum", frozenset()): prefill_s * n,
            },
        )

    return snap(False), snap(True)


def _attempt(
    folder: RunFolder, cell: _Cell, p: int, rep: int, attempt: int, cache_hit: bool, seed: int
) -> Path:
    rng = np.random.default_rng([seed, cell.chunk, cell.d, p, rep, attempt])
    seen0 = _START_TOKENS + 150 * rep  # a reused batch: later repetitions decode at a longer context
    line = _timeline(cell, p, seen0, cache_hit, rng)
    stem = attempt_stem(cell.d, p, rep, attempt)
    raw, scrapes = folder.raw_name(cell.chunk, stem), folder.metrics_name(cell.chunk, stem)
    folder.write_raw(raw, _stamps(cell, line, seen0))
    folder.write_scrapes(scrapes, *_scrapes(p, p // 2 if cache_hit else 0, line), engine_kind("sim").metrics)
    steps = [
        EngineStep(
            prefill_tokens=c,
            decode_tokens=decodes,
            prefill_requests=int(c > 0),
            decode_requests=decodes,
            elapsed_ms=dur,
        )
        for _, dur, c, decodes in line["steps"]
    ]
    config = RunConfig(
        decode_batch_size=cell.d,
        new_prefill_tokens=p,
        chunk_size=cell.chunk,
        model=_MODEL,
        gpu="synthetic",
        repetition=rep,
        engine="sim",
        decode_context=cell.decode_context,
        decode_max_tokens=2048 if cell.d else 0,
        scheduling=cell.scheduling,
    )
    obs = Observation(
        run_id=folder.root.name,
        config=config,
        attempt=attempt,
        t_inject_ns=line["send"],
        t_first_token_ns=line["first"],
        prompt_tokens=p,
        cached_prompt_tokens=p // 2 if cache_hit else 0,
        engine_steps=steps,
        baseline_file=folder.baseline_name(cell.chunk, cell.d, 0) if cell.d else None,
        raw_file=raw,
        metrics_file=scrapes,
    )
    return folder.write_observation(obs)


def _baseline(folder: RunFolder, cell: _Cell, seed: int) -> None:
    rng = np.random.default_rng([seed, cell.chunk, cell.d])
    decode_step = StepShape(cell.d, (), cell.d * (cell.decode_context + _START_TOKENS))
    gaps = [
        cell.model.step_ms(decode_step) * max(0.05, 1 + cell.noise * rng.standard_normal()) for _ in range(64)
    ]
    baseline = Baseline(
        tpot_p50_ms=float(np.median(gaps)),
        tpot_p90_ms=float(np.percentile(gaps, 90)),
        tpot_p99_ms=float(np.percentile(gaps, 99)),
        n_gaps=64 * cell.d,
    )
    record = BaselineRecord(
        run_id=folder.root.name,
        chunk_size=cell.chunk,
        decode_batch_size=cell.d,
        batch_index=0,
        baseline=baseline,
        steady_after_ms=50.0,
        raw_file="",
    )
    folder.write_baseline(folder.baseline_name(cell.chunk, cell.d, 0), record)


def _manifest(folder: RunFolder, cell: _Cell, grid: dict, seed: int) -> None:
    folder.write_manifest(
        Manifest(
            run_id=folder.root.name,
            created_utc=datetime.now(UTC).isoformat(timespec="seconds"),
            sweep={**grid, "protocol": ProtocolRules().model_dump()},
            engine_spec={
                "kind": "sim",
                "model": _MODEL,
                "dtype": "float32",
                "synthetic_step_model": cell.model.model_dump(),
                "frontend_ns_per_token": cell.frontend_ns_per_token,
                "scheduling": cell.scheduling,
                "noise": cell.noise,
            },
            engine_version=None,
            hardware={"cpu": "synthetic"},
            packages={},
            git_commit=None,
            seed=seed,
            notes=["synthesised by analysis.synthetic.synthesize_run: not a measurement"],
        )
    )


def synthesize_run(
    run_dir: Path,
    chunks: Iterable[int] = (2048, 8192),
    decode_batches: Iterable[int] = (0, 1, 2, 4, 8),
    prefill_tokens: Iterable[int] = (512, 2048, 8192, 16384),
    repetitions: int = 3,
    params: StepModel | None = None,
    noise: float = 0.02,
    seed: int = 0,
    decode_context: int = 2048,
    invalid_points: Iterable[tuple[int, int, int, int]] = (),
    failed_points: Iterable[tuple[int, int, int, int]] = (),
    scheduling: Scheduling = "mixed",
    frontend_ns_per_token: float = 0.0,
) -> Path:
    """Write a complete run folder at ``run_dir`` of an engine whose steps cost what ``params`` says
    (default ``StepModel()``), scheduled ``scheduling``, and return it.

    ``invalid_points`` ``(chunk, D, P, rep)`` get an invalid first attempt (a prefix-cache hit, kept under
    ``invalid/``) and a valid retry; ``failed_points`` end invalid (the invalid record is the point record).
    """
    model = params or StepModel()
    folder = RunFolder(Path(run_dir))
    chunks, decode_batches, prefill_tokens = list(chunks), list(decode_batches), list(prefill_tokens)
    grid = {
        "chunks": chunks,
        "decode_batch_sizes": decode_batches,
        "prefill_tokens": prefill_tokens,
        "repetitions": repetitions,
        "decode_context": decode_context,
    }
    _manifest(
        folder, _Cell(0, 0, decode_context, model, noise, scheduling, frontend_ns_per_token), grid, seed
    )
    invalid, failed = set(invalid_points), set(failed_points)
    for chunk, d in itertools.product(chunks, decode_batches):
        cell = _Cell(chunk, d, decode_context, model, noise, scheduling, frontend_ns_per_token)
        if d:
            _baseline(folder, cell, seed)
        for p, rep in itertools.product(prefill_tokens, range(repetitions)):
            key = (chunk, d, p, rep)
            attempts = [True] if key in failed else [True, False] if key in invalid else [False]
            for attempt, cache_hit in enumerate(attempts):
                record = folder.derive_attempt(_attempt(folder, cell, p, rep, attempt, cache_hit, seed))
                folder.write_point(record, final=attempt == len(attempts) - 1)
    atomic_write_bytes(folder.root / ".synthetic", b"analysis.synthetic\n")
    return folder.root
