"""Window cutting and the steady-state rule on hand-made stamps."""

from microbench.results.windows import Gap, gaps_of, is_steady, percentile_ms, split_window

MS = 1_000_000


def test_gaps_skip_the_first_tokens_and_divide_multi_token_chunks() -> None:
    stamps = [0, 10 * MS, 20 * MS, 40 * MS]
    gaps = gaps_of(stamps, [1, 1, 1, 2], skip_tokens=1)
    assert [g.ms for g in gaps] == [10.0, 10.0, 10.0]  # the last chunk: 20 ms for 2 tokens
    assert len(gaps_of(stamps, [1, 1, 1, 2], skip_tokens=3)) == 1


def test_chunks_read_together_form_one_gap_not_zero_gaps() -> None:
    stamps = [0, 10 * MS, 40 * MS, 40 * MS, 40 * MS, 50 * MS]
    gaps = gaps_of(stamps, [1] * 6)
    assert [(g.ms, g.tokens) for g in gaps] == [(10.0, 1), (10.0, 3), (10.0, 1)]
    assert all(g.ms > 0 for g in gaps)


def test_steady_rule_is_seed_002s() -> None:
    even = [Gap(i * 10 * MS, (i + 1) * 10 * MS, 1) for i in range(8)]
    assert is_steady(even, window=8, max_ratio=2.0)
    spiky = [*even[:-1], Gap(70 * MS, 95 * MS, 1)]  # 25 ms against 10 ms: > 2×
    assert not is_steady(spiky, window=8, max_ratio=2.0)
    assert not is_steady(even[:7], window=8, max_ratio=2.0)


def test_exclusive_prefill_steps_put_the_stalled_gap_that_straddles_t1_in_the_window() -> None:
    # decodes every 10 ms until 30 ms, then two exclusive prefill steps (no decode token) until the
    # prefill's first token at 75 ms; the decodes resume one decode step later, at 85 ms
    stamps = [0, 10 * MS, 20 * MS, 30 * MS, 85 * MS, 95 * MS, 105 * MS]
    gaps = gaps_of(stamps, [1] * 7)
    w = split_window(gaps, 28 * MS, 75 * MS, slack_ns=2 * MS, exclusive=True)
    assert [g.end_ns // MS for g in w.before] == [10, 20]
    assert [(g.start_ns // MS, g.end_ns // MS) for g in w.during] == [(20, 30), (30, 85)]
    assert [g.end_ns // MS for g in w.after] == [95, 105]
    # the mixed rule would have put the stalled gap after the window
    assert [g.end_ns // MS for g in split_window(gaps, 28 * MS, 75 * MS, slack_ns=2 * MS).during] == [30]


def test_split_window_assigns_each_token_to_where_it_arrived() -> None:
    # decodes every 10 ms; the prefill window is [35, 80] ms; slack 2 ms
    stamps = [i * 10 * MS for i in range(12)]
    gaps = gaps_of(stamps, [1] * 12)
    w = split_window(gaps, 35 * MS, 80 * MS, slack_ns=2 * MS)
    assert [g.end_ns // MS for g in w.before] == [10, 20, 30]
    assert [g.end_ns // MS for g in w.during] == [40, 50, 60, 70, 80]
    assert [g.end_ns // MS for g in w.after] == [90, 100, 110]
    # a decode token read 1 ms after the prefill's first token is in the window, one 9 ms later is not
    late = split_window(gaps, 35 * MS, 79 * MS, slack_ns=2 * MS)
    assert late.during[-1].end_ns == 80 * MS
    assert split_window(gaps, 35 * MS, 71 * MS, slack_ns=2 * MS).during[-1].end_ns == 70 * MS


def test_percentiles_are_none_without_data() -> None:
    assert percentile_ms([], 50) is None
    assert percentile_ms([Gap(0, 4 * MS, 1), Gap(0, 6 * MS, 1)], 50) == 5.0


def test_the_live_steady_tracker_agrees_with_the_rule_on_every_prefix() -> None:
    import random

    from microbench.results.windows import SteadyTracker

    rng = random.Random(7)
    for _ in range(20):
        stamps, tokens, t = [], [], 0
        for _ in range(120):
            t += 0 if rng.random() < 0.15 else rng.choice([4, 5, 6, 9, 20])  # bursts share a stamp
            stamps.append(t * 1_000_000)
            tokens.append(rng.choice([1, 1, 1, 2]))
        tracker = SteadyTracker(8, 2.0, 16)
        for k in range(len(stamps)):
            tracker.add(stamps[k], tokens[k])
            expected = is_steady(gaps_of(stamps[: k + 1], tokens[: k + 1], 16), 8, 2.0)
            assert tracker.steady() == expected, k
