"""Issue #33: a point too short to judge by its own steps (a bare prefill of one or two chunks) is judged
against its cell's other repetitions (``microbench.results.validity``), and the run folder takes a point
so judged back to be measured again, within ``max_attempts`` (``RunFolder.judge_cell``), in the driver's
folder too when a Ray worker judged it (``executors.relay``); hand-built records, known answers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from microbench.executors.relay import Relay, RelaySink
from microbench.measure.shard import ShardEvents
from microbench.measure.sink import FolderSink
from microbench.results.layout import RunFolder
from microbench.results.records import RunRecord
from microbench.results.validity import IN_CELL, judged, stalled_in_cell


def _record(rep: int, prefill_ms: float | None, attempt: int = 0, reasons: tuple[str, ...] = ()) -> RunRecord:
    """A D = 0 point of the cell (chunk 512, P 1024) whose bare prefill took ``prefill_ms``."""
    config: dict[str, Any] = dict(decode_batch_size=0, new_prefill_tokens=1024, chunk_size=512, model="sim",
                                  gpu="CPU: test", repetition=rep, engine="sim", decode_context=0,
                                  decode_max_tokens=0)  # fmt: skip
    interference: dict[str, Any] = dict(
        tpot_during_prefill_p50_ms=None, tpot_during_prefill_p90_ms=None, tpot_during_prefill_max_ms=None,
        tpot_after_prefill_p50_ms=None, num_chunks_actual=2, num_chunks_source="engine_log",
        num_chunks_expected=2, engine_steps=None, prefill_duration_ms=prefill_ms, prefill_ttft_ms=prefill_ms,
        n_gaps_during=0, recovery_gaps_ms=[], prefix_cache_hits=0.0, prefix_cache_queries=1024.0,
        cached_prompt_tokens=None, preemptions=0.0,
    )  # fmt: skip
    derived: dict[str, Any] = dict(tpot_penalty_ms=None, tpot_during_prefill_ms=None, penalty_ratio=None,
                                   tpot_penalty_p50_ms=None, tpot_penalty_ratio=None,
                                   total_interference_ms=None, decode_tokens_delayed=0,
                                   aggregate_decode_delay_ms=None)  # fmt: skip
    validity = dict(valid=not reasons, reasons=list(reasons), attempt=attempt)
    return RunRecord.model_validate(
        dict(run_id="run", config=config, baseline=None, local_baseline=None, interference=interference,
             derived=derived, validity=validity, t_inject_ns=0, t_first_token_ns=1, raw_file="raw.parquet")
    )  # fmt: skip


def test_a_normal_spread_of_repetitions_is_never_flagged() -> None:
    # CPU noise: every rep within ±30 % of 40 ms, each judged against the others
    reps = [40.0, 52.0, 28.0, 45.0, 31.0]
    for i, took in enumerate(reps):
        assert stalled_in_cell(took, reps[:i] + reps[i + 1 :]) is None
    # a hiccup of a loaded machine (seen: a bare prefill 9x its repetitions, 362 vs 40 ms) is no stall
    assert stalled_in_cell(362.0, [40.0, 41.0, 39.0]) is None
    # a long prefill twice its repetitions' time is slow, not frozen
    assert stalled_in_cell(9000.0, [4500.0, 4700.0]) is None
    # ... more than 3x them and a second beyond is a stall (a 1 s prefill frozen for 3 s)
    assert stalled_in_cell(3300.0, [1035.0, 1094.0]) is not None


def test_a_prefill_frozen_for_3_s_is_named_with_its_reference() -> None:
    reason = stalled_in_cell(3040.0, [40.0, 44.0, 41.0])
    assert reason is not None and reason.startswith(IN_CELL)
    assert "took 3040 ms where the median of the cell's other 3 repetitions is 41 ms" in reason
    assert "stalled" in reason


def test_one_other_repetition_is_reference_enough_and_none_judges_nothing() -> None:
    # two repetitions: the frozen one is flagged against the sound one, never the other way round
    assert stalled_in_cell(3040.0, [40.0]) is not None
    assert stalled_in_cell(40.0, [3040.0]) is None
    assert stalled_in_cell(52.0, [28.0]) is None  # CPU noise between two sound repetitions
    assert stalled_in_cell(3040.0, []) is None
    assert stalled_in_cell(None, [40.0, 41.0]) is None  # no first token: nothing to judge


def test_a_record_is_judged_against_the_other_repetitions_valid_by_their_own_derivation() -> None:
    cell = [_record(0, 40.0), _record(1, 3040.0), _record(2, 44.0), _record(3, 30.0, reasons=("cache hit",))]
    flagged = judged(cell[1], cell)
    assert not flagged.validity.valid and flagged.validity.attempt == 0
    (reason,) = flagged.validity.reasons
    assert "median of the cell's other 2 repetitions is 42 ms" in reason  # rep 3 is invalid: not a reference
    assert judged(cell[0], cell) == cell[0]
    assert judged(cell[3], cell) == cell[3]  # invalid for its own reason: left as it is
    assert judged(flagged, cell) == flagged  # judging again gives the same verdict


def _store(folder: RunFolder, record: RunRecord) -> None:
    folder.write_point(record, final=True)


def test_the_folder_takes_a_judged_point_back_until_its_attempts_are_spent(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    for rep, ms in enumerate([40.0, 3040.0, 44.0]):
        _store(folder, _record(rep, ms))
    ((record, final),) = folder.judge_cell(512, 0, 1024, max_attempts=2)
    assert not record.validity.valid and not final
    assert folder.stored_record(512, 0, 1024, 1) is None  # taken back from runs/: measured again
    assert not folder.is_done(512, 0, 1024, 1) and folder.spent_attempts(512, 0, 1024, 1) == 1
    assert folder.invalid_path(512, "D0_P1024_r1_a0").is_file()
    assert folder.judge_cell(512, 0, 1024, max_attempts=2) == []  # nothing left to judge
    _store(folder, _record(1, 3100.0, attempt=1))  # frozen again: the last attempt
    ((record, final),) = folder.judge_cell(512, 0, 1024, max_attempts=2)
    assert final and folder.is_done(512, 0, 1024, 1)
    stored = folder.stored_record(512, 0, 1024, 1)
    assert stored is not None and not stored.validity.valid and stored.validity.attempt == 1
    assert folder.judge_cell(512, 0, 1024, max_attempts=2) == []  # a final verdict stays as it is


def test_a_sound_cell_is_left_as_it_is(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    for rep, ms in enumerate([40.0, 52.0, 28.0]):
        _store(folder, _record(rep, ms))
    assert folder.judge_cell(512, 0, 1024, max_attempts=3) == []
    assert all(folder.is_done(512, 0, 1024, rep) for rep in range(3))


def test_a_point_taken_back_on_a_worker_leaves_the_drivers_run_folder_too(tmp_path: Path) -> None:
    driver = RunFolder(tmp_path / "run")
    for rep, ms in enumerate([40.0, 3040.0, 44.0]):
        _store(driver, _record(rep, ms))
    seed = [(p.relative_to(driver.root).as_posix(), p.read_bytes()) for p in driver.point_paths()]
    messages: list[object] = []
    worker = RelaySink(RunFolder(tmp_path / "scratch" / "run"), messages.append, seed)
    (stored,) = worker.judge_cell(512, 0, 1024, max_attempts=3)
    assert stored.taken_back and not stored.final
    relay = Relay(FolderSink(driver), ShardEvents(), points=3)
    for message in messages:
        relay.apply(message)
    assert driver.stored_record(512, 0, 1024, 1) is None and not driver.is_done(512, 0, 1024, 1)
    assert driver.invalid_path(512, "D0_P1024_r1_a0").is_file() and relay.points == 2


def test_a_two_repetition_cell_takes_back_its_frozen_repetition_whichever_came_first(tmp_path: Path) -> None:
    for order in ([3040.0, 40.0], [40.0, 3040.0]):
        folder = RunFolder(tmp_path / str(order[0]))
        _store(folder, _record(0, order[0]))
        assert folder.judge_cell(512, 0, 1024, max_attempts=3) == []  # alone: nothing to judge by
        _store(folder, _record(1, order[1]))
        ((record, final),) = folder.judge_cell(512, 0, 1024, max_attempts=3)
        frozen = order.index(3040.0)
        assert record.config.repetition == frozen and not record.validity.valid and not final
        assert folder.stored_record(512, 0, 1024, frozen) is None
        assert folder.stored_record(512, 0, 1024, 1 - frozen) is not None
