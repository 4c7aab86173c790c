"""A shard measured elsewhere, relayed into the run folder: the worker's sink and the driver's writer.

On the worker, ``RelaySink`` is a ``PointSink`` over a scratch run folder of its own (``FolderSink``): the
shard stores and derives every attempt there exactly as it would in the run folder, and each call emits
the files it wrote (``Files``) or the manifest change it made (``SinkCall``) as a message. On the driver,
``Relay.apply`` writes each message into the real run folder the moment it arrives: measured files first
and the point's record under ``runs/`` last, atomically, so a point is done there only once everything it
derives from is stored. Paths are checked to stay inside the run folder.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from benchcore.atomic import atomic_write_bytes
from engine_harness.metric_names import MetricNames
from engine_harness.step_modes import StepMode
from microbench.measure.shard import ShardEvents
from microbench.measure.sink import Attempt, FolderSink, Stored
from microbench.results.layout import RunFolder
from microbench.results.records import Baseline
from microbench.results.wake import WakeProbeRecord

__all__ = [
    "EventCall",
    "Files",
    "Finished",
    "FolderWatch",
    "Relay",
    "RelayEvents",
    "RelaySink",
    "SinkCall",
    "Started",
    "seed_files",
    "write_files",
]

Emit = Callable[[object], None]
_SINK_CALLS = frozenset({"engine_started", "warmed", "note"})  # manifest changes, replayed on the driver
_EVENT_CALLS = frozenset({"describe", "measuring"})
_SHIPPED_AT_END = ("manifest.json", ".lock", "telemetry/", "engine-")  # not per point


@dataclass(frozen=True)
class Started:
    host: str
    pid: int
    node_id: str | None
    gpus: list[str]
    cores: list[int]
    hardware: str  # the node's, as records name it (``RunConfig.gpu``)
    code: str  # the code the worker runs (``placement.running_code``)


@dataclass(frozen=True)
class EventCall:
    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class SinkCall:
    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Files:
    """Files a sink call wrote (relative path, bytes), and the stored point when it was ``point`` (or
    ``judge_cell``: then ``removed`` names the point records it took back)."""

    files: list[tuple[str, bytes]]
    stored: Stored | None = None
    removed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Finished:
    """The shard's end: its engine log and telemetry, where its time went, and the error it ended on."""

    files: list[tuple[str, bytes]]
    spent: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def _write_order(rel: str) -> int:
    """Measured files first, the invalid attempts' records next, the point's record last."""
    return 2 if rel.startswith("runs/") else 1 if rel.startswith("invalid/") else 0


class FolderWatch:
    """The files written under ``root`` since the last look (``changed``), but those in ``skip``."""

    def __init__(self, root: Path, skip: tuple[str, ...]) -> None:
        self.root, self.skip = root, skip
        self._seen = self._listing()

    def _listing(self) -> dict[str, tuple[int, int]]:
        out = {}
        for dirpath, _, names in os.walk(self.root):
            for name in names:
                path = Path(dirpath) / name
                rel = path.relative_to(self.root).as_posix()
                if not rel.startswith(self.skip):
                    st = path.stat()
                    out[rel] = (st.st_size, st.st_mtime_ns)
        return out

    def changed(self) -> list[tuple[str, bytes]]:
        now = self._listing()
        changed = [rel for rel, stat in now.items() if self._seen.get(rel) != stat]
        self._seen = now
        return [(rel, (self.root / rel).read_bytes()) for rel in sorted(changed)]


def write_files(root: Path, files: list[tuple[str, bytes]], order: Callable[[str], int]) -> None:
    """Write ``files`` (relative path, bytes) under ``root``, atomically, in ``order`` (a unit's marker
    last: it is done only once everything it derives from is there); a path leaving ``root`` is refused."""
    for rel, data in sorted(files, key=lambda f: order(f[0])):
        atomic_write_bytes(_inside(root, rel), data)


def seed_files(folder: RunFolder, chunk: int) -> list[tuple[str, bytes]]:
    """What a worker needs of the run folder to go on where it stopped: the manifest, and every point
    record, invalid attempt and observation of ``chunk`` (attempt numbers and spent attempts), and its
    baselines (a resumed shard's new batches take the next free names, never an earlier batch's)."""
    root = folder.root
    paths = [root / "manifest.json"]
    for sub in ("runs", "invalid", "observed", "baselines"):
        paths += sorted((root / sub / str(chunk)).glob("*.json"))
    return [(p.relative_to(root).as_posix(), p.read_bytes()) for p in paths]


class RelaySink:
    """A ``PointSink`` for a shard on a worker: a scratch ``FolderSink``, every write emitted as a message."""

    def __init__(self, scratch: RunFolder, emit: Emit, seed: list[tuple[str, bytes]]) -> None:
        for rel, data in seed:
            atomic_write_bytes(_inside(scratch.root, rel), data)
        self.inner = FolderSink(scratch)
        self.emit = emit
        self._watch = FolderWatch(scratch.root, _SHIPPED_AT_END)

    def _written(self) -> list[tuple[str, bytes]]:
        return sorted(self._watch.changed(), key=lambda f: _write_order(f[0]))

    def is_done(self, chunk: int, d: int, p: int, rep: int) -> bool:
        return self.inner.is_done(chunk, d, p, rep)

    def point(self, attempt: Attempt, max_attempts: int) -> Stored:
        stored = self.inner.point(attempt, max_attempts)
        self.emit(Files(self._written(), stored))
        return stored

    def judge_cell(self, chunk: int, d: int, p: int, max_attempts: int) -> list[Stored]:
        judged = self.inner.judge_cell(chunk, d, p, max_attempts)
        root = self.inner.folder.root
        for stored in judged:
            c = stored.record.config
            path = self.inner.folder.record_path(chunk, d, p, c.repetition)
            removed = [] if stored.final else [path.relative_to(root).as_posix()]
            self.emit(Files(self._written(), stored, removed))
        return judged

    def baseline(
        self, chunk: int, d: int, index: int, baseline: Baseline, steady_ms: float, stamps: pd.DataFrame
    ) -> str:
        rel = self.inner.baseline(chunk, d, index, baseline, steady_ms, stamps)
        self.emit(Files(self._written()))
        return rel

    def note(self, text: str) -> None:
        self.inner.note(text)
        self.emit(SinkCall("note", (text,)))

    def engine_log(self, shard: str) -> Path:
        return self.inner.engine_log(shard)

    def wake(self, record: WakeProbeRecord) -> None:
        self.inner.wake(record)
        self.emit(Files(self._written()))

    def wake_done(self, chunk: int) -> bool:
        return self.inner.wake_done(chunk)

    def telemetry_path(self, shard: str) -> Path:
        return self.inner.telemetry_path(shard)

    def engine_started(self, chunk: int, version: str | None, argv: list[str], metrics: MetricNames) -> None:
        self.inner.engine_started(chunk, version, argv, metrics)  # derive reads the metric names here
        self.emit(SinkCall("engine_started", (chunk, version, argv, metrics)))

    def warmed(
        self, chunk: int, probes_ms: list[float], verified: bool, step_mode: StepMode | None = None
    ) -> None:
        self.inner.warmed(chunk, probes_ms, verified, step_mode)
        self.emit(SinkCall("warmed", (chunk, probes_ms, verified, step_mode)))

    def end_files(self) -> list[tuple[str, bytes]]:
        """The engine's log and the telemetry files (samples, sampler errors), once the engine has stopped."""
        root = self.inner.folder.root
        paths = [*root.glob("engine-*"), *(root / "telemetry").rglob("*")]
        return [(p.relative_to(root).as_posix(), p.read_bytes()) for p in sorted(paths) if p.is_file()]


class RelayEvents(ShardEvents):
    """A worker's shard events, emitted; ``stored`` is told by the driver when it has written the point."""

    def __init__(self, emit: Emit) -> None:
        self.emit = emit

    def describe(self, text: str) -> None:
        self.emit(EventCall("describe", (text,)))

    def measuring(self, chunk: int) -> None:
        self.emit(EventCall("measuring", (chunk,)))


def _inside(root: Path, rel: str) -> Path:
    path = (root / rel).resolve()
    if Path(rel).is_absolute() or not path.is_relative_to(root.resolve()):
        raise ValueError(f"a shard sent a file outside its run folder: {rel!r}")
    return root / rel


@dataclass
class Relay:
    """The driver's side of one remote shard: applies its messages to the run folder and the display."""

    sink: FolderSink
    events: ShardEvents
    points: int = 0  # points that became final
    engine_version: str | None = None

    def apply(self, message: object) -> None:
        if isinstance(message, Files | Finished):
            write_files(self.sink.folder.root, message.files, _write_order)
        if isinstance(message, Files):
            for rel in message.removed:
                _inside(self.sink.folder.root, rel).unlink(missing_ok=True)
        if isinstance(message, Files) and message.stored is not None:
            self.points += message.stored.done - message.stored.taken_back  # taken back: counted before
            self.events.stored(message.stored)
        elif isinstance(message, SinkCall) and message.method in _SINK_CALLS:
            if message.method == "engine_started":
                self.engine_version = message.args[1]
            getattr(self.sink, message.method)(*message.args)
        elif isinstance(message, EventCall) and message.method in _EVENT_CALLS:
            getattr(self.events, message.method)(*message.args)
