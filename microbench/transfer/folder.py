"""The transfer run folder: the sweep's conventions (``microbench.results.layout``) with its own paths.

Layout: ``manifest.json``; ``runs/<mode>/P<p>_r<rep>.json`` (``TransferRecord``, the final attempt);
``invalid/<mode>/…_a<n>.json`` (every invalid or failed attempt, with its reasons); ``raw/<mode>/…parquet``
(every stamp); ``metrics/<mode>/…json`` (both engines' counters before and after);
``engine-producer.log`` / ``engine-consumer.log`` / ``engine-alone.log``; ``idle_cpu.json`` (each
engine's idle CPU per stage); ``kv-storage/`` (storage connectors only); ``transfer_table.csv``,
``breakdown.csv``, ``fit.json``, ``link-measured-local.yaml`` and ``transfer_breakdown.png``.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchcore.atomic import atomic_write_bytes
from benchcore.atomic import write_model as write_record
from engine_harness.idle_cpu import IdleCpu
from engine_harness.metrics import Snapshot
from microbench.results.layout import RunFolder
from microbench.results.records import read_record
from microbench.results.transfer import Mode, TransferRecord

__all__ = ["TransferFolder", "point_stem"]


def point_stem(prefill_tokens: int, repetition: int) -> str:
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


class TransferFolder(RunFolder):
    """Paths and atomic writes of one transfer run; records in ``runs/`` are what resume skips."""

    def point_path(self, mode: Mode, prefill_tokens: int, repetition: int) -> Path:
        return self.root / "runs" / mode / f"{point_stem(prefill_tokens, repetition)}.json"

    def is_point_done(self, mode: Mode, prefill_tokens: int, repetition: int) -> bool:
        """A valid record is on disk; a failed or invalid one is measured again on --resume."""
        path = self.point_path(mode, prefill_tokens, repetition)
        return path.is_file() and read_record(path, TransferRecord).valid

    def write_idle(self, stage: str, idle: dict[str, IdleCpu]) -> None:
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
            write_record(self.root / "invalid" / record.mode / f"{stem}_a{attempt}.json", record)
        if record.valid or final:
            write_record(self.point_path(record.mode, record.prefill_tokens, record.repetition), record)

    def write_metrics(self, mode: Mode, stem: str, scrapes: dict[str, Snapshot | None]) -> None:
        body = json.dumps({k: _pick(v) for k, v in scrapes.items()}, sort_keys=True)
        atomic_write_bytes(self.root / "metrics" / mode / f"{stem}.json", body.encode())

    def records(self) -> list[TransferRecord]:
        return [read_record(p, TransferRecord) for p in sorted((self.root / "runs").glob("*/P*_r*.json"))]
