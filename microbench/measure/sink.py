"""Where an interference shard's measurements go: a ``PointSink`` (one ``point`` call per attempt).

A shard measures; the sink stores what it measured, derives the point's record from what it stored and
says whether the point is final. ``FolderSink`` is the run folder of ``microbench.results.layout``; an
executor that runs shards elsewhere (Ray) gives them a sink of its own with the same methods.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pandas as pd

from benchcore.redact import redact_argv
from engine_harness.metric_names import MetricNames, table_name
from engine_harness.metrics import Snapshot
from engine_harness.step_modes import StepMode
from engine_harness.steps import EngineStep
from microbench.results.faults import infrastructure_reasons
from microbench.results.layout import RunFolder, attempt_stem
from microbench.results.records import Baseline, BaselineRecord, Observation, RunConfig, RunRecord
from microbench.results.wake import WakeProbeRecord

__all__ = ["Attempt", "FolderSink", "PointSink", "Stored"]


@dataclass
class Attempt:
    """What one attempt of a point measured, before it is stored (the sink numbers and names it)."""

    config: RunConfig
    t_inject_ns: int = field(default_factory=time.perf_counter_ns)
    t_first_token_ns: int | None = None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    engine_steps: list[EngineStep] | None = None
    step_mode: StepMode | None = None  # how the engine ran its steps, where their durations came from
    notes: list[str] = field(default_factory=list)
    decode_failure: str | None = None
    client_lag_max_ms: float | None = None
    baseline_file: str | None = None  # the sink's name of the decode batch's baseline (``baseline``)
    stamps: pd.DataFrame | None = None  # ``interference.raw_frame``
    scrapes: tuple[Snapshot | None, Snapshot | None] | None = None  # /metrics before and after
    metrics: MetricNames | None = None  # which families of the scrapes to keep

    @property
    def key(self) -> tuple[int, int, int, int]:
        c = self.config
        return c.chunk_size, c.decode_batch_size, c.new_prefill_tokens, c.repetition


@dataclass(frozen=True)
class Stored:
    """A stored attempt: its derived record, whether the point is now final, and the infrastructure
    reasons that spoiled it (such an attempt spends none of ``max_attempts``). ``taken_back``: a point
    stored as done, judged invalid against its cell since (``RunFolder.judge_cell``)."""

    record: RunRecord
    final: bool
    blamed: list[str]
    taken_back: bool = False

    @property
    def done(self) -> bool:
        return self.record.validity.valid or self.final


class PointSink(Protocol):
    """What a shard stores: points, decode-batch baselines, the engine it ran, notes."""

    def is_done(self, chunk: int, d: int, p: int, rep: int) -> bool: ...

    def point(self, attempt: Attempt, max_attempts: int) -> Stored: ...

    def judge_cell(self, chunk: int, d: int, p: int, max_attempts: int) -> list[Stored]: ...

    def baseline(
        self, chunk: int, d: int, index: int, baseline: Baseline, steady_ms: float, stamps: pd.DataFrame
    ) -> str: ...

    def note(self, text: str) -> None: ...

    def engine_log(self, shard: str) -> Path | None: ...

    def telemetry_path(self, shard: str) -> Path: ...

    def engine_started(
        self, chunk: int, version: str | None, argv: list[str], metrics: MetricNames
    ) -> None: ...

    def warmed(
        self, chunk: int, probes_ms: list[float], verified: bool, step_mode: StepMode | None = None
    ) -> None: ...

    def wake(self, record: WakeProbeRecord) -> None: ...

    def wake_done(self, chunk: int) -> bool: ...


class FolderSink:
    """A ``PointSink`` writing one run folder (DESIGN §4), the sweep's."""

    def __init__(self, folder: RunFolder) -> None:
        self.folder = folder

    @property
    def run_id(self) -> str:
        return self.folder.root.name

    def is_done(self, chunk: int, d: int, p: int, rep: int) -> bool:
        return self.folder.is_done(chunk, d, p, rep)

    def point(self, attempt: Attempt, max_attempts: int) -> Stored:
        """Store the attempt's stamps, scrapes and observation, derive the record from what the folder
        now holds, store the record (under runs/ once final)."""
        chunk, d, p, r = attempt.key
        number = self.folder.attempts(chunk, d, p, r)
        stem = attempt_stem(d, p, r, number)
        raw = scrapes = None
        if attempt.stamps is not None:
            raw = self.folder.raw_name(chunk, stem)
            self.folder.write_raw(raw, attempt.stamps)
        if attempt.scrapes is not None and attempt.metrics is not None:
            scrapes = self.folder.metrics_name(chunk, stem)
            self.folder.write_scrapes(scrapes, *attempt.scrapes, attempt.metrics)
        obs = Observation(
            run_id=self.run_id,
            config=attempt.config,
            attempt=number,
            t_inject_ns=attempt.t_inject_ns,
            t_first_token_ns=attempt.t_first_token_ns,
            prompt_tokens=attempt.prompt_tokens,
            cached_prompt_tokens=attempt.cached_prompt_tokens,
            engine_steps=attempt.engine_steps,
            step_mode=attempt.step_mode,
            notes=attempt.notes,
            decode_failure=attempt.decode_failure,
            client_lag_max_ms=attempt.client_lag_max_ms,
            baseline_file=attempt.baseline_file,
            raw_file=raw,
            metrics_file=scrapes,
        )
        spent = self.folder.spent_attempts(chunk, d, p, r)
        record = self.folder.derive_attempt(self.folder.write_observation(obs))
        blamed = infrastructure_reasons(record.validity.reasons) if not record.validity.valid else []
        final = not blamed and spent + 1 >= max_attempts
        self.folder.write_point(record, final)
        return Stored(record, final, blamed)

    def judge_cell(self, chunk: int, d: int, p: int, max_attempts: int) -> list[Stored]:
        """The cell's points judged against its repetitions and taken back (``RunFolder.judge_cell``)."""
        judged = self.folder.judge_cell(chunk, d, p, max_attempts)
        return [Stored(record, final, [], taken_back=True) for record, final in judged]

    def baseline(
        self, chunk: int, d: int, index: int, baseline: Baseline, steady_ms: float, stamps: pd.DataFrame
    ) -> str:
        """Store decode batch ``index``'s Phase 1 and its stamps; returns the name its points refer to.
        A resumed shard counts its batches from 0 again: the index moves past every baseline the folder
        already holds, so the points measured before keep the baseline they were derived from."""
        while (self.folder.root / self.folder.baseline_name(chunk, d, index)).exists():
            index += 1
        raw = self.folder.raw_name(chunk, f"baseline_D{d}_b{index}")
        self.folder.write_raw(raw, stamps)
        rel = self.folder.baseline_name(chunk, d, index)
        record = BaselineRecord(
            run_id=self.run_id,
            chunk_size=chunk,
            decode_batch_size=d,
            batch_index=index,
            baseline=baseline,
            steady_after_ms=steady_ms,
            raw_file=raw,
        )
        self.folder.write_baseline(rel, record)
        return rel

    def note(self, text: str) -> None:
        self.folder.add_note(text)

    def engine_log(self, shard: str) -> Path:
        return self.folder.engine_log(shard)

    def wake(self, record: WakeProbeRecord) -> None:
        self.folder.write_wake(record)

    def wake_done(self, chunk: int) -> bool:
        return self.folder.wake_path(chunk).is_file()

    def telemetry_path(self, shard: str) -> Path:
        return self.folder.telemetry_path(shard)

    def engine_started(self, chunk: int, version: str | None, argv: list[str], metrics: MetricNames) -> None:
        manifest = self.folder.read_manifest()
        manifest.engine_version = version
        manifest.metric_names = table_name(metrics)  # what derive reads the stored scrapes with
        manifest.engine_argv[str(chunk)] = redact_argv(argv)  # no --api-key value in the manifest
        self.folder.write_manifest(manifest)

    def warmed(
        self, chunk: int, probes_ms: list[float], verified: bool, step_mode: StepMode | None = None
    ) -> None:
        manifest = self.folder.read_manifest()
        manifest.warmup[str(chunk)] = {"probes_ms": [round(p, 3) for p in probes_ms], "verified": verified}
        if step_mode is not None:
            manifest.step_modes[str(chunk)] = step_mode
        self.folder.write_manifest(manifest)
