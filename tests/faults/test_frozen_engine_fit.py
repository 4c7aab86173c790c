"""Issue #33: an engine frozen in the middle of a point (``SIGSTOP``, then ``SIGCONT``) leaves the fitted
step model where the unfrozen run's is: each coefficient of the frozen run's fit has a 95 % interval that
meets the clean run's, or misses it by under 5 % of the clean value (``analysis.models.fit_step_model``),
because the attempt holding the stall is invalid (``microbench.results.validity``) and measured again. Both
runs on the sim, one grid, one seed."""

from __future__ import annotations

from pathlib import Path

import pytest
from fault_checks import Place, frozen_sweep, stalled_observations

from analysis.models import fit_step_model
from analysis.table import load_records

pytestmark = [pytest.mark.clock, pytest.mark.solo]  # two fits read off the clock, one interval: alone

# enough P and D to fit every term; a seeded 3 % jitter so the intervals have a width
GRID = {"decode_batch_sizes": [0, 2, 4], "prefill_tokens": [256, 512, 1024, 2048], "repetitions": 2}
SIM = ("--jitter", "0.03", "--seed", "11")


def _sweep(place: Place, name: str, freeze_after: tuple[int, ...] = ()) -> Path:
    """One sweep into ``tmp/name``; the engine frozen for 3 s just after each count of stored points."""
    out = place.tmp / name
    cfg = place.sweep_yaml(SIM, name=f"{name}.yaml", max_attempts=3, **GRID)
    frozen_sweep(cfg, out, freeze_after, timeout_s=300)
    return out


def test_a_frozen_engine_leaves_the_step_model_within_the_clean_runs_interval(place: Place) -> None:
    clean = fit_step_model(load_records(_sweep(place, "clean")))
    frozen_run = _sweep(place, "frozen", freeze_after=(10, 13, 19, 22))  # D = 2, 4
    stalled = stalled_observations(frozen_run)
    assert stalled, "no freeze landed inside a step"
    records = load_records(frozen_run)
    for r in records:  # the stalled step reached no valid point (with the rule reverted, one did)
        steps = r.interference.engine_steps_log or []
        assert all((s.elapsed_ms or 0) <= 2500 for s in steps), (r.config, r.validity, steps)
    frozen = fit_step_model(records, clean.model)  # (c·ctx and c·(ctx + c/2) tie on this grid)
    # Two sim runs differed by more than one run's CI while the sweep read the sim's wall-clock steps (until
    # 2026-11-30; they carried the box's speed: β_c came out 0.0238-0.0256 in CI 16 and 0.0196-0.0218 in CI
    # 21 of 2026-11-29 against the model's 0.02, the second alone on the box), and twice the intervals
    # missed each other, by 0.3% and 0.15% of the clean value: the frozen run's interval overlaps the clean
    # run's, or misses it by under 5% of the clean value, or, for a term the sim does not have (fitted near
    # 0, where 5% of it is nothing), by under half the clean interval's width (local CI 45: prefill_fixed_ms
    # [-0.218, -0.060] clean and [-0.033, 0.149] frozen, 0.027 apart; a stalled step averaged in moves a term
    # by seconds). The exact check of the rule is the one above: no valid point holds the stalled step.
    for name, (lo, hi) in clean.ci.items():
        f_lo, f_hi = frozen.ci[name]
        gap = max(f_lo - hi, lo - f_hi, 0.0)
        allowed = max(0.05 * abs(clean.params[name]), (hi - lo) / 2)
        assert gap <= allowed, (name, frozen.ci[name], (lo, hi), frozen.params)
