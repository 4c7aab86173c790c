"""Seed 002's four success criteria, computed in one place for every renderer of the sweep report.

1. Interference is measurable: ``penalty_ratio`` > 1.1 in every cell with D ≥ 4 and P ≥ 4096 (the ratio of
   a full-chunk step's TPOT to the local baseline).
2. A model fits: "a linear or polynomial model of total interference achieves R² > 0.85". Both models
   of ``analysis.models`` are fitted to the same target; the verdict judges the one with the higher R²,
   names it, and states the other's R² beside it (the seed's own product model can fail while the step
   model passes: R² −0.69 against 0.98 on ``results/reference-cpu``).
3. Break-even exists: an interference cost over the 50 ms layer-wise transfer budget in some cell.
4. Reproducible: the coefficient of variation of ``penalty_ratio`` across a cell's repetitions < 15%
   (seed 002 asks for 5 repetitions per configuration). The full-chunk step time's CV is shown beside
   it: the ratio divides by a 3–6 ms decode baseline, whose noise the step time does not carry.

Each verdict is a ``Criterion``: what it judged (quantity and model), the judged figure, the figures
shown beside it, and the status. ``contradictions`` lists every way a set of verdicts disagrees with the
table and model fits printed beside them; a report with any refuses to be built.
"""

from __future__ import annotations

import math
from typing import Literal

import pandas as pd

from benchcore.schema import StrictModel

__all__ = [
    "CV_BAR",
    "R2_BAR",
    "RATIO_BAR",
    "Criterion",
    "ModelFit",
    "contradictions",
    "model_fits",
    "success_criteria",
]

RATIO_BAR = 1.1
R2_BAR = 0.85
CV_BAR = 0.15
Status = Literal["PASS", "FAIL", "N/A"]
Key = Literal["measurable", "model_fits", "break_even", "reproducible"]
_LABELS = {"seed": "seed 002's product model", "step": "step model"}


class ModelFit(StrictModel):
    """One model of the total interference, judged on the measured aggregate decode delay."""

    name: str
    formula: str
    parameters: int
    r2: float | None
    loo_median_ape_pct: float | None
    n: int

    def describe(self) -> str:
        r2 = "–" if self.r2 is None else f"{self.r2:.3f}"
        loo = "–" if self.loo_median_ape_pct is None else f"{self.loo_median_ape_pct:.1f}%"
        return (
            f"{_LABELS.get(self.name, self.name + ' model')} R² = {r2} (leave-one-P-out median error {loo})"
        )


class Criterion(StrictModel):
    """One success criterion's verdict, saying what it judged and what it did not."""

    key: Key
    criterion: str
    judged: str
    value: float | None
    model: str | None = None
    measured: str
    beside: list[str]
    threshold: str
    status: Status


def _num(value: float) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def model_fits(comparison: pd.DataFrame) -> list[ModelFit]:
    """``analysis.models.compare_models``'s frame as typed rows (``seed`` and ``step``)."""
    return [
        ModelFit(
            name=str(row["model"]).split(":")[0],
            formula=str(row["model"]).split(": ", 1)[-1],
            parameters=int(row["parameters"]),
            r2=_num(row["r2"]),
            loo_median_ape_pct=_num(row["loo_p_median_ape_pct"]),
            n=int(row["n"]),
        )
        for _, row in comparison.iterrows()
    ]


def _status(value: float | None, passes: bool) -> Status:
    return "N/A" if value is None else ("PASS" if passes else "FAIL")


def _measurable(table: pd.DataFrame) -> Criterion:
    big = table[(table["decode_batch_size"] >= 4) & (table["new_prefill_tokens"] >= 4096)].dropna(
        subset=["penalty_ratio"]
    )
    value = float(big["penalty_ratio"].min()) if len(big) else None
    return Criterion(
        key="measurable",
        criterion=f"interference measurable: penalty_ratio > {RATIO_BAR:g} for D ≥ 4 and P ≥ 4096",
        judged="the smallest penalty_ratio (TPOT on a full-chunk step ÷ local baseline) of those cells",
        value=value,
        measured=f"min {value:.3g} over {len(big)} cells" if value is not None else "no cell",
        beside=[],
        threshold=f"> {RATIO_BAR:g} in every cell",
        status=_status(value, value is not None and value > RATIO_BAR),
    )


def _model_fit(models: list[ModelFit]) -> Criterion:
    fitted = [m for m in models if m.r2 is not None]
    criterion = f"model fits: a model of the total interference with R² > {R2_BAR:g}"
    if not fitted:
        return Criterion(key="model_fits", criterion=criterion, value=None, measured="no fit", beside=[],
                         judged="no model could be fitted (the notes say why)", threshold=f"> {R2_BAR:g}",
                         status="N/A")  # fmt: skip
    best = max(fitted, key=lambda m: m.r2 or -math.inf)
    others = [
        f"{m.describe()}: {'also clears' if (m.r2 or -math.inf) > R2_BAR else 'fails'} the bar on its own"
        for m in models
        if m is not best
    ]
    return Criterion(
        key="model_fits",
        criterion=criterion,
        judged=f"R² of the {best.name} model ({best.formula}), the higher of the {len(models)}, on the "
        f"aggregate decode delay of {best.n} valid injections with D > 0",
        value=best.r2,
        model=best.name,
        measured=best.describe(),
        beside=others,
        threshold=f"> {R2_BAR:g}",
        status=_status(best.r2, (best.r2 or -math.inf) > R2_BAR),
    )


def _break_even(table: pd.DataFrame, budget_ms: float) -> Criterion:
    cost = table.loc[table["decode_batch_size"] > 0, "aggregate_decode_delay_ms"].dropna()
    over = int((cost > budget_ms).sum())
    return Criterion(
        key="break_even",
        criterion=f"break-even exists: interference cost > {budget_ms:g} ms somewhere",
        judged="the number of cells whose median aggregate decode delay exceeds the transfer budget",
        value=float(over) if len(cost) else None,
        measured=f"{over} of {len(cost)} cells (max {cost.max():.4g} ms)" if len(cost) else "no cell",
        beside=[],
        threshold=f"> {budget_ms:g} ms in ≥ 1 cell",
        status=_status(over if len(cost) else None, over > 0),
    )


def _noisy(cv: pd.Series) -> int:
    return int((cv >= CV_BAR).sum())


def _reproducible(table: pd.DataFrame) -> Criterion:
    reps = table[(table["repetitions"] >= 2) & (table["decode_batch_size"] > 0)].dropna(
        subset=["cv_penalty_ratio"]
    )
    criterion = f"reproducible: CV < {CV_BAR:.0%} across repetitions"
    judged = "the number of cells whose penalty_ratio has a CV at or above the bar"
    if reps.empty:
        return Criterion(key="reproducible", criterion=criterion, judged=judged, value=None,
                         measured="no cell with ≥ 2 valid repetitions", beside=[],
                         threshold=f"< {CV_BAR:.0%} in every cell", status="N/A")  # fmt: skip
    noisy = _noisy(reps["cv_penalty_ratio"])
    beside = []
    step_cv = reps.get("cv_step_time_full_chunk_ms", pd.Series(dtype=float)).dropna()
    if len(step_cv):
        beside.append(
            f"CV of the full-chunk step time: {_noisy(step_cv)} of {len(step_cv)} cells at or above "
            f"{CV_BAR:.0%} (range {step_cv.min():.1%}–{step_cv.max():.1%})"
        )
    base = reps["tpot_baseline_ms"].dropna()
    if len(base):
        beside.append(
            f"the ratio divides by the decode baseline TPOT ({base.min():.3g}–{base.max():.3g} ms in these "
            "cells): where the step time's CV is small, the ratio's noise is the baseline's"
        )
    return Criterion(
        key="reproducible",
        criterion=criterion,
        judged=judged,
        value=float(noisy),
        measured=f"CV of penalty_ratio: {noisy} of {len(reps)} cells at or above {CV_BAR:.0%} "
        f"(range {reps['cv_penalty_ratio'].min():.1%}–{reps['cv_penalty_ratio'].max():.1%}; "
        f"repetitions {int(reps['repetitions'].min())}–{int(reps['repetitions'].max())})",
        beside=beside,
        threshold=f"< {CV_BAR:.0%} in every cell (seed: 5 repetitions)",
        status="PASS" if noisy == 0 else "FAIL",
    )


def success_criteria(
    table: pd.DataFrame, models: list[ModelFit] | None, budget_ms: float = 50.0
) -> list[Criterion]:
    """Seed 002's four success criteria on this run (``N/A`` where the run has no cell or fit to judge)."""
    return [
        _measurable(table),
        _model_fit(models or []),
        _break_even(table, budget_ms),
        _reproducible(table),
    ]


def _passes(c: Criterion) -> bool | None:
    """What the criterion's own figure says about its status (None: no figure)."""
    if c.value is None:
        return None
    return {
        "measurable": c.value > RATIO_BAR,
        "model_fits": c.value > R2_BAR,
        "break_even": c.value >= 1,
        "reproducible": c.value == 0,
    }[c.key]


def contradictions(
    criteria: list[Criterion], table: pd.DataFrame, models: list[ModelFit], budget_ms: float = 50.0
) -> list[str]:
    """Every way ``criteria`` disagree with their own figures or with the table and fits shown beside
    them (empty when the verdicts are consistent)."""
    problems = []
    for c in criteria:
        passes = _passes(c)
        expected = "N/A" if passes is None else ("PASS" if passes else "FAIL")
        if c.status != expected:
            problems.append(f"{c.key}: status {c.status} but its judged figure {c.value} says {expected}")
    by_model = {m.name: m for m in models}
    for c in criteria:
        if c.key == "model_fits" and c.model is not None:
            judged = by_model.get(c.model)
            if judged is None:
                problems.append(f"model_fits judged the {c.model} model, which the report does not show")
            elif judged.r2 != c.value:
                problems.append(f"model_fits judged R² {c.value} but the {c.model} model's R² is {judged.r2}")
            elif c.model not in c.judged or any(m.describe() not in " ".join(c.beside) for m in models
                                                if m.name != c.model):  # fmt: skip
                problems.append("model_fits does not name the model it judged and state the other's R²")
    for mine, fresh in zip(criteria, success_criteria(table, models, budget_ms), strict=False):
        if (mine.key, mine.value, mine.model) != (fresh.key, fresh.value, fresh.model):
            problems.append(
                f"{mine.key}: the verdict's figure {mine.value} ({mine.model or 'no model'}) is not the "
                f"table's {fresh.value} ({fresh.model or 'no model'})"
            )
    if [c.key for c in criteria] != ["measurable", "model_fits", "break_even", "reproducible"]:
        problems.append(f"criteria out of order or missing: {[c.key for c in criteria]}")
    return problems
