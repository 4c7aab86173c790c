"""The one layout of every job's run folder: every path, the atomic writes, and loading what ``derive`` reads.

DESIGN §4. Every job writes ``results/<run-id>/manifest.json`` naming the job (``Manifest.job``: ``sweep``,
``transfer``, ``battery``), the resolved job definition, engine spec, argv and version, hardware,
packages, git commit (``JobFolder``); ``job_folder`` opens a folder as the job that wrote it.

The sweep (``RunFolder``), per run:

- ``observed/<chunk>/<stem>.json``: the ``Observation`` of every attempt (stem ``D<d>_P<p>_r<rep>_a<n>``);
- ``raw/<chunk>/<stem>.parquet``: the attempt's stamps; ``raw/<chunk>/baseline_D<d>_b<i>.parquet``;
- ``metrics/<chunk>/<stem>.json``: the engine's /metrics families before and after the attempt;
- ``baselines/<chunk>/D<d>_b<i>.json``: Phase 1 of each decode batch;
- ``runs/<chunk>/D<d>_P<p>_r<rep>.json``: the derived record of the point (its valid attempt, or the last
  invalid one once the attempts are spent); ``invalid/<chunk>/<stem>.json``: every invalid attempt;
- ``telemetry/<chunk>.parquet``, ``engine-<chunk>.log``, ``interference_table.csv``/``.parquet``.

Records under ``runs/`` and ``invalid/`` are derived (``derive_attempt``); everything else is measured.

The transfer benchmark (``TransferFolder``): ``runs/<mode>/P<p>_r<rep>.json`` (``TransferRecord``, the
final attempt); ``invalid/<mode>/…_a<n>.json`` (every invalid or failed attempt, with its reasons);
``raw/<mode>/…parquet`` (every stamp); ``metrics/<mode>/…json`` (both engines' counters before and after);
``engine-producer.log`` / ``engine-consumer.log`` / ``engine-alone.log``; ``idle_cpu.json`` (each engine's
idle CPU per stage); ``kv-storage/`` (storage connectors only); ``transfer_table.csv``, ``breakdown.csv``,
``fit.json``, ``link-measured-local.yaml`` and ``transfer_breakdown.png``.

The battery (``BatteryFolder``): ``state/`` (finished tests, the capacity ledger), ``traces/``, the
reports (``report.json``, ``report.md``, ``report.html``, ``figures/``).
"""

from __future__ import annotations

import datetime as dt
import functools
import io
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import filelock
import pandas as pd
from pydantic import BaseModel

from benchcore.atomic import atomic_write_bytes, write_model
from benchcore.provenance import git_commit, hardware_info, package_versions
from engine_harness.engines import engine_kind
from engine_harness.metric_names import METRIC_TABLES, MetricNames
from engine_harness.metrics import Snapshot
from microbench.results.derive import METRICS_READ, DeriveInputs, derive
from microbench.results.faults import infrastructure_reasons
from microbench.results.records import (
    BaselineRecord,
    Manifest,
    Observation,
    ProtocolRules,
    RunRecord,
    point_name,
    read_record,
)
from microbench.results.transfer import Mode, TransferRecord

__all__ = [
    "JOBS",
    "BatteryFolder",
    "JobFolder",
    "RunFolder",
    "RunFolderBusy",
    "TransferFolder",
    "attempt_stem",
    "job_folder",
    "new_manifest",
    "point_stem",
]

JOBS = ("sweep", "transfer", "battery")
REPO = Path(__file__).resolve().parents[2]


class RunFolderBusy(RuntimeError):
    """Another process is writing this run folder."""


class _RunLock(filelock.FileLock):
    def __init__(self, path: Path) -> None:
        super().__init__(str(path), timeout=0)

    def acquire(self, *args: Any, **kwargs: Any) -> Any:
        """As filelock's, with ``RunFolderBusy`` (what to do) instead of ``Timeout`` (an ``OSError`` that
        callers would report as an unwritable folder)."""
        try:
            return super().acquire(*args, **kwargs)
        except filelock.Timeout:
            raise RunFolderBusy(
                f"{Path(self.lock_file).parent} is being written by another process (a sweep or --resume of "
                "the same run); wait for it to finish or stop it, then --resume"
            ) from None


def _readable(path: Path) -> RunRecord | None:
    try:
        return read_record(path, RunRecord)
    except (OSError, ValueError):  # missing, truncated, not JSON, or not a record
        return None


def attempt_stem(d: int, p: int, rep: int, attempt: int) -> str:
    return f"{point_name(d, p, rep)}_a{attempt}"


class JobFolder:
    """One run folder of any job: its manifest (naming the job), the writer's lock, the notes."""

    JOB: ClassVar[str]

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def manifest_path(self) -> Path:
        return self.root / "manifest.json"

    def exists(self) -> bool:
        return self.manifest_path.is_file()

    def read_manifest(self) -> Manifest:
        return read_record(self.manifest_path, Manifest)

    def write_manifest(self, manifest: Manifest) -> None:
        """Store the manifest; one that names no job yet is given this folder's."""
        if manifest.job is None:
            manifest = manifest.model_copy(update={"job": self.JOB})
        write_model(self.manifest_path, manifest)

    def lock(self) -> filelock.BaseFileLock:
        """One writer per run folder: a second run (or ``--resume``) of the same folder is refused."""
        self.root.mkdir(parents=True, exist_ok=True)
        return _RunLock(self.root / ".lock")

    def add_note(self, note: str) -> None:
        """Append one line to the manifest's notes (infrastructure faults, restarts): the run's log book."""
        manifest = self.read_manifest()
        manifest.notes.append(note)
        self.write_manifest(manifest)

    def write_raw(self, rel: str, frame: pd.DataFrame) -> None:
        """Stamps as parquet at ``rel`` (relative to the folder), atomically."""
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        atomic_write_bytes(self.root / rel, buf.getvalue())


def new_manifest(
    folder: JobFolder,
    definition: dict[str, Any],
    engine_spec: dict[str, Any],
    *,
    seed: int = 0,
    notes: list[str] | None = None,
    packages: dict[str, str] | None = None,
) -> Manifest:
    """A fresh manifest for ``folder``'s job: the resolved job definition and engine, with this machine's
    hardware, the installed packages (plus ``packages``) and the git commit."""
    from engine_harness.telemetry import NvmlSource  # NVML is loaded only when a run starts

    return Manifest(
        job=folder.JOB,
        run_id=folder.root.name,
        created_utc=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        sweep=definition,
        engine_spec=engine_spec,
        engine_version=None,
        hardware=hardware_info(NvmlSource.gpu_names()),
        packages=package_versions() | (packages or {}),
        git_commit=git_commit(REPO),
        seed=seed,
        notes=list(notes or []),
    )


def _job_of(root: Path, manifest: Manifest) -> str:
    """The job a folder's manifest names; a manifest from before ``Manifest.job`` was a sweep's or a
    transfer's, told apart by their records (``runs/<mode>/P<p>_r<rep>.json`` is a transfer's)."""
    if manifest.job is not None:
        return manifest.job
    return "transfer" if next((root / "runs").glob("*/P*_r*.json"), None) is not None else "sweep"


def job_folder(root: Path) -> JobFolder:
    """The folder ``root`` as the job that wrote it (``ValueError`` without a manifest or for another job)."""
    probe = RunFolder(root)
    if not probe.exists():
        raise ValueError(f"{root} is not a run folder (no manifest.json)")
    job = _job_of(root, probe.read_manifest())
    folders: dict[str, type[JobFolder]] = {
        "sweep": RunFolder,
        "transfer": TransferFolder,
        "battery": BatteryFolder,
    }
    if job not in folders:
        raise ValueError(
            f"{root} was written by job {job!r}, which this suite does not know ({', '.join(JOBS)})"
        )
    return folders[job](root)


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

    def engine_log(self, chunk: int) -> Path:
        return self.root / f"engine-{chunk}.log"

    def telemetry_path(self, chunk: int) -> Path:
        return self.root / "telemetry" / f"{chunk}.parquet"

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


def point_stem(prefill_tokens: int, repetition: int) -> str:
    """A transfer point's file stem."""
    return f"P{prefill_tokens}_r{repetition}"


def _pick(s: Snapshot | None) -> dict[str, float] | None:
    """The engine's own samples (names with a ':' prefix), labels flattened into the key."""
    if s is None:
        return None
    out: dict[str, float] = {}
    for (name, labels), v in s.samples.items():
        if ":" in name and not name.endswith("_created"):
            rest = ",".join(f"{k}={x}" for k, x in sorted(labels) if k not in ("model_name", "engine"))
            out[name + ("{" + rest + "}" if rest else "")] = v
    return out


class TransferFolder(JobFolder):
    """The transfer benchmark's run folder; records in ``runs/`` are what resume skips."""

    JOB = "transfer"

    def point_path(self, mode: Mode, prefill_tokens: int, repetition: int) -> Path:
        return self.root / "runs" / mode / f"{point_stem(prefill_tokens, repetition)}.json"

    def is_point_done(self, mode: Mode, prefill_tokens: int, repetition: int) -> bool:
        """A valid record is on disk; a failed or invalid one is measured again on --resume."""
        path = self.point_path(mode, prefill_tokens, repetition)
        return path.is_file() and read_record(path, TransferRecord).valid

    def write_idle(self, stage: str, idle: Mapping[str, BaseModel]) -> None:
        """Idle CPU of the stage's engines, kept beside earlier stages' (``idle_cpu.json``)."""
        body = self.read_idle()
        body[stage] = {role: s.model_dump(mode="json") for role, s in idle.items()}
        atomic_write_bytes(self.root / "idle_cpu.json", (json.dumps(body, indent=2) + "\n").encode())

    def read_idle(self) -> dict[str, dict[str, dict[str, object]]]:
        path = self.root / "idle_cpu.json"
        return json.loads(path.read_text()) if path.is_file() else {}

    def role_log(self, role: str) -> Path:
        return self.root / f"engine-{role}.log"

    def write_transfer(self, record: TransferRecord, attempt: int, final: bool) -> None:
        """Invalid attempts are kept under invalid/; the valid one (or the last attempt) goes to runs/."""
        stem = point_stem(record.prefill_tokens, record.repetition)
        if not record.valid:
            write_model(self.root / "invalid" / record.mode / f"{stem}_a{attempt}.json", record)
        if record.valid or final:
            write_model(self.point_path(record.mode, record.prefill_tokens, record.repetition), record)

    def write_metrics(self, mode: Mode, stem: str, scrapes: dict[str, Snapshot | None]) -> None:
        body = json.dumps({k: _pick(v) for k, v in scrapes.items()}, sort_keys=True)
        atomic_write_bytes(self.root / "metrics" / mode / f"{stem}.json", body.encode())

    def records(self) -> list[TransferRecord]:
        return [read_record(p, TransferRecord) for p in sorted((self.root / "runs").glob("*/P*_r*.json"))]


class BatteryFolder(JobFolder):
    """The battery's run folder (its state and reports are the battery's own: ``microbench.battery``)."""

    JOB = "battery"
