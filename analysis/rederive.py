"""``python -m analysis.rederive RUN``: derive every record of a sweep run again from what the folder stores.

Every record under ``runs/`` and ``invalid/`` is recomputed by ``microbench.results.derive`` from its
attempt's stored observation, stamps, baseline and scrapes, and judged against its cell's repetitions
(``microbench.results.validity.judged``) as the sweep judges it; a point judged invalid now is measured
again by ``python -m microbench.sweep --resume``. ``--check`` only compares (exit 1 when a
record differs beyond 1e-9 relative); without it the records are rewritten in place and the
interference table is written again, so a fix to the derivation reaches old runs without measuring.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from analysis.table import write_interference_table
from benchcore.atomic import write_model
from benchcore.cli import BadInput, run_cli
from microbench.results.layout import RunFolder, attempt_stem, job_folder
from microbench.results.records import RunRecord, UnreadableRecord, read_record
from microbench.results.validity import judged

__all__ = ["differences", "main", "rederive_run"]


def differences(stored: Any, derived: Any, path: str = "", rel: float = 1e-9) -> list[str]:
    """Where two JSON-like values differ (floats compared to ``rel`` relative tolerance)."""
    if isinstance(stored, dict) and isinstance(derived, dict):
        keys = sorted(set(stored) | set(derived))
        return [d for k in keys for d in differences(stored.get(k), derived.get(k), f"{path}.{k}", rel)]
    if isinstance(stored, list) and isinstance(derived, list) and len(stored) == len(derived):
        return [
            d
            for i, (a, b) in enumerate(zip(stored, derived, strict=True))
            for d in differences(a, b, f"{path}[{i}]")
        ]
    if isinstance(stored, float) and isinstance(derived, float | int) and not isinstance(derived, bool):
        return (
            []
            if math.isclose(stored, float(derived), rel_tol=rel, abs_tol=1e-12)
            else [f"{path}: {stored} → {derived}"]
        )
    return [] if stored == derived else [f"{path}: {stored!r} → {derived!r}"]


def _sweep_folder(run: Path) -> RunFolder:
    """``run`` as a sweep's folder; another job's folder or no run folder is bad input."""
    try:
        folder = job_folder(run)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if not isinstance(folder, RunFolder):
        raise BadInput(f"{run} is a {folder.JOB} run; only a sweep's records are re-derived")
    return folder


def rederive_run(run: Path, write: bool) -> dict[str, list[str]]:
    """Re-derive every stored record; returns {record path: differences}; rewrites them when ``write``."""
    folder = _sweep_folder(run)
    derived = {path: _derive(folder, path) for path in folder.stored_record_paths()}
    cells: dict[tuple[int, int, int], list[RunRecord]] = defaultdict(list)
    for path, record in derived.items():
        if path.parent.parent.name == "runs":
            cells[_cell(record)].append(record)
    changed: dict[str, list[str]] = {}
    for path, record in derived.items():
        record = judged(record, cells[_cell(record)])  # against its cell's repetitions, as the sweep does
        diff = differences(json.loads(path.read_text()), record.model_dump(mode="json"))
        if diff:
            changed[str(path.relative_to(run))] = diff
            if write:
                write_model(path, record)
                if not record.validity.valid:  # a point judged invalid now: the attempt it spent
                    folder.write_point(record, final=False)
    if write:
        write_interference_table(run)
    return changed


def _cell(record: RunRecord) -> tuple[int, int, int]:
    c = record.config
    return c.chunk_size, c.decode_batch_size, c.new_prefill_tokens


def _derive(folder: RunFolder, path: Path) -> RunRecord:
    """The record at ``path`` derived again from its attempt's stored observation."""
    stored = read_record(path, RunRecord)
    c = stored.config
    stem = attempt_stem(c.decode_batch_size, c.new_prefill_tokens, c.repetition, stored.validity.attempt)
    observed = folder.observed_path(c.chunk_size, stem)
    if not observed.is_file():
        raise BadInput(f"{path} has no stored observation ({observed}): it was written before records "
                       "were derived from stored data, so it cannot be re-derived")  # fmt: skip
    return folder.derive_attempt(observed)


def _run(args: argparse.Namespace) -> int:
    try:
        changed = rederive_run(args.run, write=not args.check)
    except UnreadableRecord as exc:
        raise BadInput(f"{exc}; nothing was rewritten") from None  # every record is read before any write
    total = sum(1 for _ in _sweep_folder(args.run).stored_record_paths())
    for name, diff in changed.items():
        print(f"{name}: {len(diff)} field(s) differ, e.g. {diff[0]}")
    verb = "differ from" if args.check else "were rewritten from"
    print(f"{len(changed)} of {total} records {verb} their re-derivation")
    return 1 if args.check and changed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.rederive", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("run", type=Path, help="a sweep run folder, results/<run-id>")
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when a record differs")
    args = parser.parse_args(argv)
    return run_cli(lambda: _run(args), lambda: None)


if __name__ == "__main__":
    sys.exit(main())
