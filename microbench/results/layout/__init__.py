"""The one layout of every job's run folder: every path, the atomic writes, and loading what ``derive`` reads.

DESIGN §4. Every job writes ``results/<run-id>/manifest.json`` naming the job (``Manifest.job``: ``sweep``,
``transfer``, ``battery``, ``ablate``), the resolved job definition, engine spec, argv and version, hardware,
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
``fit.json``, ``link-measured-local.yaml``, ``link-measured-local-handoff.yaml`` and
``transfer_breakdown.png``.

The battery (``BatteryFolder``): ``state/`` (finished tests, the capacity ledger), ``traces/``, the
reports (``report.json``, ``report.md``, ``report.html``, ``figures/``).

The route experiment (``RouteFolder``): ``replays/<policy>_r<rep>.json`` and ``.parquet`` per replay, the
report, both engines' logs.

The characterization (``CharacterizeFolder``): ``search/probes/<B…-S…>.json`` (every candidate probed, with
why), ``search/search.json``, ``levels/<config>/u<N>.json`` (each users level), ``raw/<config>/u<N>.parquet``
(its trace), ``rows.parquet`` (its dataset rows), ``engines/*.log``.

The ablation (``AblateFolder``): ``arms/<name>/``, one sweep run folder per arm (``RunFolder``, its own
manifest naming the arm's engine), and ``compare-<B>-vs-<A>/`` (``analysis.compare``'s outputs).
"""

from __future__ import annotations

from pathlib import Path

from microbench.results.layout.jobs import JOBS, JobFolder, RunFolderBusy, hold_folder, new_manifest
from microbench.results.layout.route import RouteFolder, replay_stem
from microbench.results.layout.sweep import RunFolder, attempt_stem
from microbench.results.layout.transfer import TransferFolder, point_stem
from microbench.results.records import Manifest

__all__ = [
    "JOBS",
    "AblateFolder",
    "BatteryFolder",
    "CharacterizeFolder",
    "JobFolder",
    "RouteFolder",
    "RunFolder",
    "RunFolderBusy",
    "TransferFolder",
    "attempt_stem",
    "hold_folder",
    "job_folder",
    "new_manifest",
    "point_stem",
    "replay_stem",
]


class BatteryFolder(JobFolder):
    """The battery's run folder (its state and reports are the battery's own: ``microbench.battery``)."""

    JOB = "battery"


class AblateFolder(JobFolder):
    """The ablation's run folder: one sweep run folder per arm under ``arms/``, the comparisons beside."""

    JOB = "ablate"

    def arm(self, name: str) -> RunFolder:
        return RunFolder(self.root / "arms" / name)

    def comparison(self, name_a: str, name_b: str) -> Path:
        return self.root / f"compare-{name_b}-vs-{name_a}"


class CharacterizeFolder(JobFolder):
    """The characterization's run folder (``microbench.characterize``)."""

    JOB = "characterize"

    def probe_path(self, label: str) -> Path:
        return self.root / "search" / "probes" / f"{label}.json"

    @property
    def search_path(self) -> Path:
        return self.root / "search" / "search.json"

    def level_path(self, config: str, users: int) -> Path:
        return self.root / "levels" / config / f"u{users}.json"

    def raw_level(self, config: str, users: int) -> str:
        return f"raw/{config}/u{users}.parquet"

    @property
    def rows_path(self) -> Path:
        return self.root / "rows.parquet"

    def engine_log(self, name: str) -> Path:
        return self.root / "engines" / f"{name}.log"


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
        "ablate": AblateFolder,
        "route": RouteFolder,
        "characterize": CharacterizeFolder,
    }
    if job not in folders:
        raise ValueError(
            f"{root} was written by job {job!r}, which this suite does not know ({', '.join(JOBS)})"
        )
    return folders[job](root)
