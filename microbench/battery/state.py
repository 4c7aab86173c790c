"""A battery run's saved state, so that a stopped run continues where it stopped (per test).

After each test ``RunState.save`` writes ``state/tests/<name>.json`` (its ``TestResult``) and
``state/context.json`` (the capacity ledger, the capacity search, the estimates other tests reuse, the
warm-up). ``load`` reads them back into a fresh context and returns the finished tests, which the runner
then does not rerun. Files are written to a temporary name and renamed, so a kill mid-write leaves the
previous state intact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from microbench.battery.context import BatteryContext
from microbench.battery.report import TestResult, WarmupResult
from microbench.measure.capacity import CapacitySearch
from microbench.measure.sustainable import LedgerEntry

__all__ = ["RunState"]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class RunState:
    """The ``state/`` folder of one battery output folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._warmup: WarmupResult | None = None

    def save(self, result: TestResult, ctx: BatteryContext, warmup: WarmupResult) -> None:
        _write(self.folder / "tests" / f"{result.name}.json", result.model_dump_json(indent=1))
        self.save_context(ctx, warmup)

    def save_context(self, ctx: BatteryContext, warmup: WarmupResult) -> None:
        """The ledger, capacity search and estimates (also right after the capacity measurement)."""
        context: dict[str, Any] = {
            "ledger": [e.model_dump(mode="json") for e in ctx.ledger],
            "search": None if ctx.search is None else ctx.search.model_dump(mode="json"),
            "capacity_note": ctx.capacity_note,
            "estimates": ctx.estimates,
            "warmup": warmup.model_dump(mode="json"),
            "profile": ctx.profile.name,
            "seed": ctx.seed,
        }
        _write(self.folder / "context.json", json.dumps(context, indent=1))

    def load(self, ctx: BatteryContext) -> dict[str, TestResult]:
        """Finished tests of an earlier run into this folder (none: a fresh run); restores ``ctx``."""
        path = self.folder / "context.json"
        if not path.is_file():
            return {}
        context = json.loads(path.read_text())
        if context.get("profile") != ctx.profile.name or context.get("seed") != ctx.seed:
            raise SystemExit(
                f"{self.folder.parent} holds a run with profile {context.get('profile')} and seed "
                f"{context.get('seed')}; resume it with the same --profile and --seed, or pick a new --out"
            )
        ctx.ledger = [LedgerEntry.model_validate(e) for e in context["ledger"]]
        ctx.search = None if context["search"] is None else CapacitySearch.model_validate(context["search"])
        ctx.capacity_note = context["capacity_note"]
        ctx.estimates.update(context["estimates"])
        self._warmup = WarmupResult.model_validate(context["warmup"])
        done = {}
        for file in sorted((self.folder / "tests").glob("*.json")):
            result = TestResult.model_validate_json(file.read_text())
            if result.status != "failed":  # a failed test runs again
                done[result.name] = result
        return done

    def warmup(self) -> WarmupResult:
        if self._warmup is None:
            raise RuntimeError("no saved warm-up to resume from")
        return self._warmup
