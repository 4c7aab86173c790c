"""The sweep's one typed report: ``SweepReport``; the console summary, Markdown, HTML and the notebook
render it.

``analyse_run`` reads a run folder once and fits its models (``RunAnalysis``); ``sweep_report`` is a pure
function of that analysis. The record carries the run's identity, the penalty definition it uses,
seed 002's success criteria (``analysis.criteria``), both interference models, the step model's fit,
the break-even verdict per link and the per-cell table; its validator refuses a record whose criteria
contradict the table and fits it carries (``analysis.criteria.contradictions``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import model_validator

from analysis.breakeven import LinkProfile, ModelKV, TransferMode, breakeven_table, load_link, run_model_kv
from analysis.criteria import Criterion, ModelFit, contradictions, model_fits, success_criteria
from analysis.models import StepFit, compare_models, fit_step_model, leave_one_p_out
from analysis.table import interference_table, load_manifest, load_records
from benchcore.schema import StrictModel
from microbench.results.records import Manifest, RunRecord

__all__ = [
    "DEFAULT_LINKS",
    "PENALTY_DEFINITION",
    "BreakEven",
    "DataTable",
    "LinkVerdict",
    "RunAnalysis",
    "StepModelSummary",
    "SweepReport",
    "analyse_run",
    "sweep_report",
]

DEFAULT_LINKS = ("seed-layerwise-50ms", "roce-4x200g", "measured-local")
PENALTY_DEFINITION = (
    "tpot_penalty_ms is the extra wait of a decode token on a step carrying a full prefill chunk, from the "
    "engine's own step record (that step − the decode-only steps right before the prefill; "
    "penalty_source says where it came from seed 002's identity instead); penalty_ratio is the TPOT on a "
    "full-chunk step ÷ the point's local baseline TPOT; a partial last chunk is reported apart as "
    "penalty_last_step_ms. Cells are medians over valid repetitions; seed 002's window-median version "
    "is penalty_ratio_p50."
)
Cell = float | int | str | bool | None


class DataTable(StrictModel):
    """A table of values (not formatted): column names and rows; a missing value is None, never NaN."""

    columns: list[str]
    rows: list[list[Cell]]

    @classmethod
    def of(cls, frame: pd.DataFrame) -> DataTable:
        def cell(v: object) -> Cell:
            if isinstance(v, np.generic):
                v = v.item()
            if v is None or (isinstance(v, float) and math.isnan(v)):
                return None
            return v  # type: ignore[return-value]

        rows = [[cell(v) for v in row] for row in frame.itertuples(index=False)]
        return cls(columns=[str(c) for c in frame.columns], rows=rows)

    def frame(self) -> pd.DataFrame:
        """The table as pandas: a missing value is NaN again, an all-missing column float."""
        frame = pd.DataFrame(self.rows, columns=self.columns).infer_objects()
        empty = [c for c in frame if frame[c].dtype == object and frame[c].isna().all()]
        return frame.astype(dict.fromkeys(empty, "float64"))


class StepModelSummary(StrictModel):
    """The step model chosen from the candidates: its fit, parameters and leave-one-P-out errors."""

    candidate: str
    n: int
    data: str
    r2: float
    loo_step_mape: float
    selection: DataTable
    coefficients: DataTable
    diagnostics: dict[str, float]
    loo: DataTable


class LinkVerdict(StrictModel):
    """Where shipping the prefill over one link beats running it locally."""

    name: str
    placeholder: bool
    description: str
    offload_cells: int
    cells: int


class BreakEven(StrictModel):
    mode: str
    kv_model: str
    kv_bytes_per_token: int
    links: list[LinkVerdict]


class SweepReport(StrictModel):
    """Everything a sweep's report says, built once from the run folder."""

    version: Literal[1] = 1  # update on a breaking change of the report's fields
    run_id: str
    created_utc: str | None
    engine: str | None
    llm_models: list[str]
    hardware: list[str]
    git_commit: str | None
    manifest_notes: list[str]
    points: int
    valid_points: int
    invalid_attempts: int
    cells: int
    penalty_definition: str = PENALTY_DEFINITION
    criteria: list[Criterion]
    fits: list[ModelFit]
    step_model: StepModelSummary | None
    break_even: BreakEven | None
    table: DataTable
    notes: list[str]
    manifest_json: str

    @model_validator(mode="after")
    def _consistent(self) -> SweepReport:
        problems = contradictions(self.criteria, self.table.frame(), self.fits)
        if problems:
            raise ValueError("the report contradicts itself: " + "; ".join(problems))
        return self


@dataclass
class RunAnalysis:
    """A run folder read once and its models fitted once: what the report and its figures draw on."""

    run_dir: Path
    manifest: Manifest | None
    records: list[RunRecord]
    table: pd.DataFrame
    mode: TransferMode
    step: StepFit | None = None
    loo: pd.DataFrame | None = None
    comparison: pd.DataFrame | None = None
    kv: ModelKV | None = None
    links: list[LinkProfile] = field(default_factory=list)
    breakeven: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def analyse_run(
    run_dir: Path, links: Sequence[str] = DEFAULT_LINKS, mode: TransferMode = "layerwise"
) -> RunAnalysis:
    """Read ``run_dir``, aggregate its table, fit both models and the break-even of each link; what
    cannot be done (too few points, no model config) is a note, not an error."""
    run_dir = Path(run_dir)
    records = load_records(run_dir)
    out = RunAnalysis(run_dir, load_manifest(run_dir), records, interference_table(run_dir), mode)
    try:
        out.step = fit_step_model(records)
        out.loo = leave_one_p_out(records)
        out.comparison = compare_models(records, out.loo)
    except ValueError as exc:
        out.step = out.loo = out.comparison = None
        out.notes.append(f"model fits skipped: {exc}")
    try:
        out.kv = run_model_kv(run_dir)
        out.links = [load_link(name) for name in links]
        out.breakeven = {link.name: breakeven_table(out.table, out.kv, link, mode) for link in out.links}
    except ValueError as exc:
        out.kv, out.links, out.breakeven = None, [], {}
        out.notes.append(f"break-even skipped: {exc}")
    return out


def _step_summary(a: RunAnalysis) -> StepModelSummary | None:
    if a.step is None or a.loo is None:
        return None
    s = a.step
    return StepModelSummary(
        candidate=s.model, n=s.n, data=s.data, r2=s.r2, loo_step_mape=s.loo_step_mape,
        selection=DataTable.of(s.selection), coefficients=DataTable.of(s.coefficients()),
        diagnostics={k: float(v) for k, v in s.diagnostics.items()}, loo=DataTable.of(a.loo),
    )  # fmt: skip


def _break_even(a: RunAnalysis) -> BreakEven | None:
    if a.kv is None:
        return None
    verdicts = []
    for link in a.links:
        known = a.breakeven[link.name].dropna(subset=["interference_ms"])
        wins = known[known["decode_batch_size"] > 0]["offload_wins"]
        verdicts.append(LinkVerdict(name=link.name, placeholder=link.placeholder, description=link.describe(),
                                    offload_cells=int(wins.sum()), cells=len(wins)))  # fmt: skip
    return BreakEven(
        mode=a.mode, kv_model=a.kv.name, kv_bytes_per_token=a.kv.kv_bytes_per_token, links=verdicts
    )


def sweep_report(a: RunAnalysis) -> SweepReport:
    """The report of an analysed run (pure: no file is read or written)."""
    m, records = a.manifest, a.records
    fits = model_fits(a.comparison) if a.comparison is not None else []
    return SweepReport(
        run_id=m.run_id if m else a.run_dir.name,
        created_utc=m.created_utc if m else None,
        engine=(m.engine_version or str(m.engine_spec.get("kind"))) if m else None,
        llm_models=sorted({r.config.model for r in records}),
        hardware=sorted({r.config.gpu for r in records}),
        git_commit=m.git_commit if m else None,
        manifest_notes=list(m.notes) if m else [],
        points=len(records),
        valid_points=sum(r.validity.valid for r in records),
        invalid_attempts=int(a.table["invalid"].sum()),
        cells=len(a.table),
        criteria=success_criteria(a.table, fits),
        fits=fits,
        step_model=_step_summary(a),
        break_even=_break_even(a),
        table=DataTable.of(a.table),
        notes=list(a.notes),
        manifest_json=m.model_dump_json(indent=2) if m else "{}",
    )
