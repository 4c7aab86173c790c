"""Issue #33: an engine frozen (``SIGSTOP``, 3 s, ``SIGCONT``) during a bare prefill (D = 0: one chunk, no
other step of its point to judge it by) leaves no valid point holding the stall: its cell's other
repetitions say it stalled (``microbench.results.validity.judged``), the point is kept invalid with that
reason and measured again, and ``analysis.rederive`` reaches the same verdicts from the folder."""

from __future__ import annotations

import pytest
from fault_checks import Place, assert_intact, frozen_sweep

from analysis.rederive import rederive_run
from microbench.results.layout import RunFolder
from microbench.results.records import RunRecord, read_record
from microbench.results.validity import IN_CELL

pytestmark = pytest.mark.clock  # reads the clock (stalls, schedule delay): the clock pass

# one 512-token chunk of about 1 s (2 ms a token), so the freeze lands inside the prefill
GRID = {"decode_batch_sizes": [0], "prefill_tokens": [512], "repetitions": 3, "max_attempts": 3}


def test_a_bare_prefill_frozen_for_3_s_is_invalid_against_its_cell_and_measured_again(place: Place) -> None:
    cfg = place.sweep_yaml(("--beta-c-ms", "2"), **GRID)
    out = place.tmp / "run"
    frozen_sweep(cfg, out, freeze_after=(1,), timeout_s=60)  # inside repetition 1
    records = assert_intact(out)
    assert len(records) == 3 and all(r.validity.valid for r in records)
    durations = sorted(r.interference.prefill_duration_ms or 0 for r in records)
    assert durations[-1] < 2500, durations  # no valid point holds the 3 s
    invalid = [read_record(p, RunRecord) for p in RunFolder(out).invalid_paths()]
    (stalled,) = [r for r in invalid if r.validity.reasons[0].startswith(IN_CELL)]
    assert stalled.config.repetition == 1 and (stalled.interference.prefill_duration_ms or 0) > 3000
    assert "the median of the cell's other 2 repetitions is" in stalled.validity.reasons[0]
    (again,) = [r for r in records if r.config.repetition == 1]
    assert again.validity.attempt == stalled.validity.attempt + 1  # measured again, one attempt spent
    assert rederive_run(out, write=False) == {}  # the folder alone gives the same verdicts
