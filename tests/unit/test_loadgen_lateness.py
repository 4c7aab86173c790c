"""Late sends lined up with the collector's passes, on hand-built stamps (ms → ns below)."""

from microbench.client.aio import GcPass
from microbench.loadgen.lateness import gc_lateness

MS = 1_000_000


def test_late_sends_are_lined_up_with_the_passes_of_the_sending_window() -> None:
    passes = [
        GcPass(10 * MS, 12 * MS, 1, 0),  # 2 ms
        GcPass(50 * MS, 50 * MS + MS // 2, 0, 3),  # 0.5 ms
        GcPass(150 * MS, 160 * MS, 2, 0),  # after the window: not counted
    ]
    sends = [
        (11 * MS, 13 * MS),  # due during the first pass, 2 ms late: near it
        (15 * MS, 16 * MS + 1),  # due 3 ms after it ended, just over 1 ms late: near it (reach 5 ms)
        (30 * MS, 32 * MS),  # 2 ms late, no pass within reach: not near
        (51 * MS, 51 * MS + MS // 2),  # near the second pass but only 0.5 ms late: on time
    ]
    figures = gc_lateness(passes, (0, 100 * MS), sends, late_ms=1.0, reach_ms=5.0)
    assert figures["passes_by_generation"] == [1, 1, 0]
    assert figures["pause_total_ms"] == 2.5 and figures["pause_max_ms"] == 2.0
    assert figures["late_sends"] == 3 and figures["late_sends_near_a_pass"] == 2
    # near a pass: [10, 17] and [50, 55.5] ms of the 100-ms window
    assert abs(figures["window_share_near_a_pass"] - 0.125) < 1e-12


def test_overlapping_reach_is_counted_once_and_an_empty_window_has_no_passes() -> None:
    passes = [GcPass(10 * MS, 11 * MS, 0, 0), GcPass(12 * MS, 13 * MS, 0, 0)]
    # [10, 16] and [12, 18] overlap: 8 ms of the 20-ms window, not 12
    assert gc_lateness(passes, (0, 20 * MS), [], reach_ms=5.0)["window_share_near_a_pass"] == 0.4
    empty = gc_lateness([], (0, 20 * MS), [(0, 5 * MS)])
    assert empty["passes_by_generation"] == [0, 0, 0] and empty["pause_max_ms"] == 0.0
    assert empty["late_sends"] == 1 and empty["late_sends_near_a_pass"] == 0
