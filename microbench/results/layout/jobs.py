"""Every job's run folder: its manifest (naming the job), the one writer's lock, the notes, raw stamps."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import filelock
import pandas as pd

from benchcore.atomic import atomic_write_bytes, write_model
from benchcore.cli import BadInput
from benchcore.provenance import git_commit, hardware_info, package_versions
from microbench.results.records import Manifest, read_record

__all__ = ["JOBS", "JobFolder", "RunFolderBusy", "hold_folder", "new_manifest"]

JOBS = ("sweep", "transfer", "battery", "ablate", "route")
REPO = Path(__file__).resolve().parents[3]


class RunFolderBusy(BadInput):
    """Another process is writing this run folder (bad input: exit 2, the message says what to do)."""


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
                f"{Path(self.lock_file).parent} is being written by another process (another run or --resume "
                "into the same --out); wait for it to finish or stop it, or choose another --out"
            ) from None


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

    def role_log(self, role: str) -> Path:
        """The log of the folder's engine in ``role`` (producer, consumer, alone: the engine-pair jobs)."""
        return self.root / f"engine-{role}.log"

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """One writer per run folder: a second run (or ``--resume``) of the same folder is refused."""
        return hold_folder(self.root)

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


@contextlib.contextmanager
def hold_folder(root: Path) -> Iterator[None]:
    """The one writer's lock of a run folder, taken by every command that writes one (sweep, transfer,
    battery, load generator): the folder is created, and a second writer into it, or a folder that cannot
    be created or locked (read-only, a file in the way), is bad input (``BadInput``: exit 2)."""
    lock = _RunLock(root / ".lock")
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except OSError as exc:
        raise BadInput(
            f"cannot write the run folder {root}: {exc.strerror or exc}; choose another --out"
        ) from None
    try:
        yield
    finally:
        lock.release()


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
