"""The route experiment's run folder (``RouteFolder``): one record and one per-request frame per replay."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd

from benchcore.atomic import atomic_write_bytes, write_model
from microbench.results.layout.jobs import JobFolder
from microbench.results.records import read_record
from microbench.results.route import ReplayRecord

__all__ = ["RouteFolder", "replay_stem"]


def replay_stem(policy: str, repetition: int) -> str:
    return f"{policy}_r{repetition}"


class RouteFolder(JobFolder):
    """``replays/<policy>_r<rep>.json`` (``ReplayRecord``) and ``.parquet`` (its requests); the report
    (``report.json``, ``report.md``, ``report.html``, ``timeline.png``); ``engine-<role>.log``."""

    JOB = "route"

    def replay_path(self, policy: str, repetition: int) -> Path:
        return self.root / "replays" / f"{replay_stem(policy, repetition)}.json"

    def is_replay_done(self, policy: str, repetition: int) -> bool:
        """A valid record is on disk (an invalid one is replayed again on --resume)."""
        path = self.replay_path(policy, repetition)
        return path.is_file() and read_record(path, ReplayRecord).valid

    def write_replay(self, record: ReplayRecord, requests: pd.DataFrame) -> None:
        """The requests first, then the record (its presence marks the replay as stored), atomically."""
        buf = io.BytesIO()
        requests.to_parquet(buf, index=False)
        atomic_write_bytes(
            self.replay_path(record.policy, record.repetition).with_suffix(".parquet"), buf.getvalue()
        )
        write_model(self.replay_path(record.policy, record.repetition), record)

    def replays(self) -> list[tuple[ReplayRecord, pd.DataFrame]]:
        out = []
        for path in sorted((self.root / "replays").glob("*_r*.json")):
            out.append((read_record(path, ReplayRecord), pd.read_parquet(path.with_suffix(".parquet"))))
        return out
