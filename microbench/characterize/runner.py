"""One characterization run: the batch-budget search, then the users sweep of each configuration, every
result stored as it finishes (``CharacterizeFolder``) so a run stopped half-way resumes where it stopped.

Engines are started through ``engine_harness.launch.EngineProcess`` (one per search candidate, one per swept
configuration; each with its own log under ``engines/``); load comes from the load generator
(``LoadSession``) through the shared ``measure`` rules; the dataset rows go to ``rows.parquet`` in the run
folder and, when the definition names one, to the shared dataset (``analysis.characterize.dataset``).
The search and each swept configuration are a shard of the run (``shards``: run by an executor, in this
process or as a Ray task whose runner works in a scratch folder and sends what it ``stored`` and its
``rows`` back to the driver).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from rich.console import Console

from analysis.characterize.dataset import DatasetRow, append_rows
from benchcore.atomic import write_model
from benchcore.redact import redact_argv
from engine_harness.engines import EngineSpec
from engine_harness.launch import EngineError, EngineProcess
from microbench.characterize.budget import BudgetSearch, Candidate, ProbeRecord, search_budget
from microbench.characterize.config import CharacterizeConfig
from microbench.characterize.requests import request_source
from microbench.characterize.users import LEVEL_RULE, UserLevel, sweep_users
from microbench.client.requests import ApiSettings
from microbench.loadgen.session import LoadSession
from microbench.loadgen.stages import SessionSettings, Stage
from microbench.measure.runs import Run, run_of
from microbench.measure.timing import Timing
from microbench.results.layout import CharacterizeFolder

__all__ = ["CharacterizeRunner"]

START_TIMEOUT_S = 600.0


class CharacterizeRunner:
    """Runs ``config`` into ``folder`` (whose manifest is written and lock held by the caller).

    ``hardware``: the machine measuring (``benchcore.provenance.hardware_info``; default the manifest's);
    ``rows``: where the dataset rows go (default ``append_rows`` to ``rows.parquet`` and the dataset);
    ``stored``: told after each probe, search result and level is stored in ``folder``.
    """

    def __init__(
        self,
        folder: CharacterizeFolder,
        config: CharacterizeConfig,
        console: Console,
        hardware: dict[str, Any] | None = None,
        rows: Callable[[list[DatasetRow]], None] | None = None,
        stored: Callable[[], None] = lambda: None,
    ) -> None:
        self.folder = folder
        self.config = config
        self.console = console
        manifest = folder.read_manifest()
        self.run_id = manifest.run_id
        hardware = hardware if hardware is not None else manifest.hardware
        gpus = hardware.get("gpus") or []
        device = str(gpus[0]) if gpus else str(hardware.get("cpu", "unknown CPU"))
        base = config.base_spec()
        self.device = config.device or (f"sim on {device}" if base.kind == "sim" else device)
        self.rows = rows or self.append_rows
        self.stored = stored
        self.engine_version: str | None = None  # of the last engine started
        self.timing = Timing()  # where the wall time went: engine starts, the levels' windows
        self._about: dict[str, object] = {}

    def append_rows(self, rows: list[DatasetRow]) -> None:
        """The rows into the run folder's ``rows.parquet`` and, when the definition names one, the dataset."""
        append_rows(self.folder.rows_path, rows)
        if self.config.dataset is not None:
            append_rows(self.config.dataset, rows)

    @contextlib.asynccontextmanager
    async def engine(self, spec: EngineSpec, log_name: str) -> AsyncIterator[EngineProcess]:
        timeout = self.config.start_timeout_s or START_TIMEOUT_S
        engine = EngineProcess(spec, self.folder.engine_log(log_name), startup_timeout_s=timeout)
        try:
            with self.timing.phase("engine start"):
                await engine.start()
            self.engine_version = engine.version
            yield engine
        finally:
            await engine.stop()

    # -- the batch-budget search ---------------------------------------------------------------------

    def _known_probes(self) -> dict[str, ProbeRecord]:
        out = {}
        for path in sorted((self.folder.root / "search" / "probes").glob("*.json")):
            record = ProbeRecord.model_validate_json(path.read_text())
            out[record.candidate.label] = record
        return out

    def stored_search(self) -> BudgetSearch | None:
        """The search result stored for this definition's search (None: none yet, or another search's)."""
        if not self.folder.search_path.is_file():
            return None
        stored = BudgetSearch.model_validate_json(self.folder.search_path.read_text())
        return stored if stored.plan == self.config.search_plan() else None

    async def search(self) -> BudgetSearch:
        plan = self.config.search_plan()
        if (stored := self.stored_search()) is not None:
            self.console.print(f"search: stored result kept ({plan.dimension} = {stored.found})")
            return stored
        known = self._known_probes()
        self.console.print(
            f"search: {plan.dimension} in [{plan.minimum}, {plan.maximum}] from {plan.initial} "
            f"({'max-num-seqs' if plan.dimension == 'budget' else 'budget'} = {plan.fixed}, context "
            f"{plan.limits.context}); {len(known)} probes stored",
            soft_wrap=True,
        )

        def start(candidate: Candidate) -> contextlib.AbstractAsyncContextManager[EngineProcess]:
            self.console.print(f"  probe {candidate.label}: starting the engine …")
            return self.engine(self.config.spec_for(candidate), f"search-{candidate.label}")

        def on_probe(record: ProbeRecord) -> None:
            write_model(self.folder.probe_path(record.candidate.label), record)
            self.stored()
            mark = "[green]pass[/green]" if record.passed else "[red]fail[/red]"
            self.console.print(f"  probe {record.candidate.label}: {mark}: {record.why}", soft_wrap=True)

        result = await search_budget(
            plan, start, self.config.base_spec().model_name, known=known, on_probe=on_probe
        )
        write_model(self.folder.search_path, result)
        self.stored()
        return result

    # -- the users sweep -----------------------------------------------------------------------------

    def done_levels(self, name: str) -> dict[int, UserLevel]:
        out = {}
        for users in self.config.sweep.users:
            path = self.folder.level_path(name, users)
            if path.is_file():
                out[users] = UserLevel.model_validate_json(path.read_text())
        return out

    def config_name(self, name: str, spec: EngineSpec) -> str:
        return f"{self.config.name}:{name}-B{spec.chunk_size or 'engine'}-S{spec.max_num_seqs or 'engine'}"

    async def sweep(self, name: str, spec: EngineSpec) -> list[UserLevel]:
        done = self.done_levels(name)
        if len(done) == len(self.config.sweep.users):
            self.console.print(f"sweep {name}: every level stored")
            return [done[u] for u in self.config.sweep.users]
        self.console.print(f"sweep {name}: {self.config_name(name, spec)}, users {self.config.sweep.users}")
        async with self.engine(spec, f"sweep-{name}") as engine:
            self.console.print(
                f"  engine up in {engine.startup_s or 0:.1f} s ({engine.version or 'version ?'})"
            )
            requests, about = request_source(
                self.config.workload, self.config.joint_lengths, self.config.seed, spec.max_model_len
            )
            self._about = about

            async def run(label: str, stages: list[Stage], base_url: str | None = None) -> Run:
                settings = SessionSettings(
                    base_url=base_url or engine.base_url,
                    api=ApiSettings(model=spec.model_name),
                    api_key_env=spec.api_key_env,
                )
                level = next(s for s in stages if s.name == "level")
                self.console.print(f"  {label}: {level.in_flight_limit} users for {level.duration_s:.0f} s …")
                with self.timing.phase("measurement windows"):  # warm-up requests included
                    async with LoadSession(settings) as session:
                        result = run_of(await session.run(stages))
                if not await engine.responsive(10.0):  # a level against a dead engine measures nothing
                    raise EngineError(
                        f"the engine died during {label} (its log: {engine.log_path}); the levels before it "
                        "are stored"
                    )
                return result

            async def on_level(level: UserLevel, result: Run | None) -> None:
                if result is not None:
                    self.folder.write_raw(self.folder.raw_level(name, level.users), result.frame)
                write_model(self.folder.level_path(name, level.users), level)
                self.stored()
                self.rows([self.dataset_row(name, spec, engine.version, level)])
                r = level.row
                self.console.print(
                    f"  u{level.users}: {r.succeeded}/{r.requests} ok, {r.output_tps:.0f} tok/s, TTFT p50 "
                    f"{(r.ttft.p50 or 0) * 1e3:.0f} ms, ITL p50 {(r.tpot.p50 or 0) * 1e3:.1f} ms, nTTFT p50 "
                    f"{(level.nttft.p50 or 0) * 1e3:.2f} ms/token",
                    soft_wrap=True,
                )

            return await sweep_users(run, requests, self.config.sweep, name, done=done, on_level=on_level)

    def dataset_row(self, name: str, spec: EngineSpec, version: str | None, level: UserLevel) -> DatasetRow:
        r = level.row
        settings = spec.model_dump(mode="json", exclude={"env"}, exclude_defaults=True)
        settings["extra_args"] = redact_argv(spec.extra_args)
        dists = {"ttft_s": r.ttft, "nttft_s_per_token": level.nttft, "itl_s": r.tpot, "e2e_s": r.e2e}
        metrics = {f"{k}_{p}": getattr(d, p) for k, d in dists.items() for p in ("mean", "p50", "p90", "p99")}
        about = self._about
        return DatasetRow(
            run_id=self.run_id,
            created_utc=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            config=self.config_name(name, spec),
            model=spec.model_name,
            device=self.device,
            engine=spec.kind,
            engine_version=version,
            budget=spec.chunk_size,
            max_num_seqs=spec.max_num_seqs,
            settings_json=json.dumps(settings, sort_keys=True),
            workload=str(about.get("name") or about.get("source") or self.config.workload),
            users=level.users,
            requests=r.requests,
            succeeded=r.succeeded,
            window_s=r.window_s,
            request_rps=r.request_rps,
            output_tps=r.output_tps,
            input_tps=r.input_tps,
            level_rule=LEVEL_RULE,
            **metrics,
        )
