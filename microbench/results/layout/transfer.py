"""The transfer benchmark's run folder (``TransferFolder``): points per mode, idle CPU, both engines' logs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel

from benchcore.atomic import atomic_write_bytes, write_model
from engine_harness.metrics import Snapshot
from microbench.results.layout.jobs import JobFolder
from microbench.results.records import read_record
from microbench.results.transfer import Mode, TransferRecord

__all__ = ["TransferFolder", "point_stem"]


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
