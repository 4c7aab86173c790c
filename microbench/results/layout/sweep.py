"""The sweep's run folder (``RunFolder``): its paths, atomic writes, and what ``derive`` reads back."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

from benchcore.atomic import atomic_write_bytes, write_model
from engine_harness.engines import engine_kind
from engine_harness.metric_names import METRIC_TABLES, MetricNames
from engine_harness.metrics import Snapshot
from microbench.results.derive import METRICS_READ, DeriveInputs, derive
from microbench.results.faults import infrastructure_reasons
from microbench.results.layout.jobs import JobFolder
from microbench.results.records import (
    BaselineRecord,
    Observation,
    ProtocolRules,
    RunRecord,
    point_name,
    read_record,
)
from microbench.results.validity import IN_CELL, judged
from microbench.results.wake import WakeProbeRecord

__all__ = ["RunFolder", "attempt_stem"]


def _readable(path: Path) -> RunRecord | None:
    try:
        return read_record(path, RunRecord)
    except (OSError, ValueError):  # missing, truncated, not JSON, or not a record
        return None


def attempt_stem(d: int, p: int, rep: int, attempt: int) -> str:
    return f"{point_name(d, p, rep)}_a{attempt}"


class RunFolder(JobFolder):
    """The sweep's run folder: paths and atomic writes; records already on disk are what resume skips."""

    JOB = "sweep"

    # -- paths -------------------------------------------------------------------------------------

    def record_path(self, chunk: int, d: int, p: int, rep: int) -> Path:
        return self.root / "runs" / str(chunk) / f"{point_name(d, p, rep)}.json"

    def invalid_path(self, chunk: int, stem: str) -> Path:
        return self.root / "invalid" / str(chunk) / f"{stem}.json"

    def observed_path(self, chunk: int, stem: str) -> Path:
        return self.root / "observed" / str(chunk) / f"{stem}.json"

    def baseline_name(self, chunk: int, d: int, index: int) -> str:
        return f"baselines/{chunk}/D{d}_b{index}.json"

    def raw_name(self, chunk: int, stem: str) -> str:
        return f"raw/{chunk}/{stem}.parquet"

    def metrics_name(self, chunk: int, stem: str) -> str:
        return f"metrics/{chunk}/{stem}.json"

    def engine_log(self, shard: str) -> Path:
        """``shard``: ``ShardPlan.name``, the chunk size (or chunk size and D values of a split chunk)."""
        return self.root / f"engine-{shard}.log"

    def telemetry_path(self, shard: str) -> Path:
        return self.root / "telemetry" / f"{shard}.parquet"

    def wake_path(self, chunk: int) -> Path:
        return self.root / "wake" / f"{chunk}.json"

    def wake_probes(self) -> list[WakeProbeRecord]:
        """Every chunk size's stored wake probe (``microbench.measure.wake``), by chunk size."""
        paths = sorted((self.root / "wake").glob("*.json"))
        return sorted((read_record(p, WakeProbeRecord) for p in paths), key=lambda r: r.chunk_size)

    def stored_record(self, chunk: int, d: int, p: int, rep: int) -> RunRecord | None:
        """The point's record under runs/; None when it is missing or unreadable (e.g. truncated)."""
        return _readable(self.record_path(chunk, d, p, rep))

    def is_done(self, chunk: int, d: int, p: int, rep: int) -> bool:
        """A readable record that is valid, or invalid for a final reason (``results.faults``): a point
        missing, unreadable or invalid for an infrastructure reason is measured (again)."""
        record = self.stored_record(chunk, d, p, rep)
        return record is not None and (
            record.validity.valid or not infrastructure_reasons(record.validity.reasons)
        )

    def attempts(self, chunk: int, d: int, p: int, rep: int) -> int:
        """Attempts of a point observed so far (the next attempt's number)."""
        return len(list((self.root / "observed" / str(chunk)).glob(f"{point_name(d, p, rep)}_a*.json")))

    def spent_attempts(self, chunk: int, d: int, p: int, rep: int) -> int:
        """Invalid attempts of a point that count against ``max_attempts``: those invalid for a final
        reason (an attempt spoiled by the infrastructure spends none)."""
        paths = (self.root / "invalid" / str(chunk)).glob(f"{point_name(d, p, rep)}_a*.json")
        records = (_readable(path) for path in paths)
        return sum(1 for r in records if r is not None and not infrastructure_reasons(r.validity.reasons))

    def cell_records(self, chunk: int, d: int, p: int) -> list[RunRecord]:
        """The readable point records of one cell (chunk, D, P) under runs/, one per repetition."""
        paths = sorted((self.root / "runs" / str(chunk)).glob(f"D{d}_P{p}_r*.json"))
        return [r for r in map(_readable, paths) if r is not None]

    def judge_cell(self, chunk: int, d: int, p: int, max_attempts: int) -> list[tuple[RunRecord, bool]]:
        """Judge every point of a cell against its other repetitions (``validity.judged``). A point
        judged implausible is an invalid attempt under invalid/ (it spends one) and leaves runs/ to be
        measured again; once its attempts are spent it stays under runs/, invalid. Returns each point it
        judged so, with whether it is final; a point already stored so is left as it is."""
        cell = self.cell_records(chunk, d, p)
        out = []
        for record in cell:
            verdict = judged(record, cell)
            if not any(r.startswith(IN_CELL) for r in verdict.validity.reasons):
                continue
            c = verdict.config
            stem = attempt_stem(d, p, c.repetition, verdict.validity.attempt)
            copy = self.invalid_path(chunk, stem)
            spent = self.spent_attempts(chunk, d, p, c.repetition) - copy.exists()
            final = spent + 1 >= max_attempts
            if final and verdict == record and copy.exists():
                continue
            self.write_point(verdict, final)
            if not final:
                self.record_path(chunk, d, p, c.repetition).unlink()
            out.append((verdict, final))
        return out

    def point_paths(self) -> list[Path]:
        """The points' records under runs/ (the valid one, or the last invalid one once retries are spent)."""
        return sorted((self.root / "runs").glob("*/D*_P*_r*.json"))

    def invalid_paths(self) -> list[Path]:
        """Every invalid attempt kept under invalid/."""
        return sorted((self.root / "invalid").rglob("*.json"))

    def stored_record_paths(self) -> Iterator[Path]:
        """Every derived record: the points under runs/, then the invalid attempts under invalid/."""
        for sub in ("runs", "invalid"):
            yield from sorted((self.root / sub).glob("*/*.json"))

    # -- writes ------------------------------------------------------------------------------------

    def write_scrapes(
        self, rel: str, before: Snapshot | None, after: Snapshot | None, names: MetricNames
    ) -> None:
        """The families the engine's metric table names (what ``derive`` reads), before and after."""
        pair = (("before", before), ("after", after))
        body = {k: s.only(names, METRICS_READ).to_json() if s else None for k, s in pair}
        atomic_write_bytes(self.root / rel, json.dumps(body).encode())

    def write_baseline(self, rel: str, record: BaselineRecord) -> None:
        write_model(self.root / rel, record)

    def write_wake(self, record: WakeProbeRecord) -> None:
        write_model(self.wake_path(record.chunk_size), record)

    def write_observation(self, obs: Observation) -> Path:
        c = obs.config
        stem = attempt_stem(c.decode_batch_size, c.new_prefill_tokens, c.repetition, obs.attempt)
        path = self.observed_path(c.chunk_size, stem)
        write_model(path, obs)
        return path

    def write_point(self, record: RunRecord, final: bool) -> None:
        """A valid record (or the last invalid one once retries are spent) goes to runs/; every invalid
        attempt is also kept under invalid/ with its reasons."""
        c = record.config
        stem = attempt_stem(c.decode_batch_size, c.new_prefill_tokens, c.repetition, record.validity.attempt)
        if not record.validity.valid:
            write_model(self.invalid_path(c.chunk_size, stem), record)
        if record.validity.valid or final:
            path = self.record_path(c.chunk_size, c.decode_batch_size, c.new_prefill_tokens, c.repetition)
            write_model(path, record)

    # -- reading what derive needs -----------------------------------------------------------------

    @functools.cached_property
    def _rules_and_metrics(self) -> tuple[ProtocolRules, MetricNames]:
        """The run's protocol rules and metric names: fixed when the run starts, read once, not per point."""
        manifest = self.read_manifest()
        rules = ProtocolRules.model_validate(manifest.sweep.get("protocol", {}))
        if manifest.metric_names is not None:
            return rules, METRIC_TABLES[manifest.metric_names]
        return rules, engine_kind(str(manifest.engine_spec.get("kind", "vllm"))).metrics

    def inputs(self, obs: Observation) -> DeriveInputs:
        """Everything ``derive`` reads for one attempt, from this folder."""
        rules, metrics = self._rules_and_metrics
        stamps = pd.read_parquet(self.root / obs.raw_file) if obs.raw_file else None
        baseline = None
        if obs.baseline_file is not None:
            baseline = read_record(self.root / obs.baseline_file, BaselineRecord).baseline
        before = after = None
        if obs.metrics_file is not None:
            scrapes = json.loads((self.root / obs.metrics_file).read_text())
            before = Snapshot.from_json(scrapes["before"]) if scrapes.get("before") else None
            after = Snapshot.from_json(scrapes["after"]) if scrapes.get("after") else None
        return DeriveInputs(obs, stamps, baseline, before, after, rules, metrics)

    def derive_attempt(self, observed: Path) -> RunRecord:
        """The record of one stored attempt, derived from what this folder stores."""
        return derive(self.inputs(read_record(observed, Observation)))
