"""The client's event-loop helpers: no full garbage collection while something is being timed."""

import gc
import time

from microbench.client import aio
from microbench.client.aio import GcPasses, no_full_collections


def test_no_full_collections_freezes_the_heap_and_collects_only_the_youngest() -> None:
    before = gc.get_threshold()
    with no_full_collections(), GcPasses() as passes:
        assert gc.get_freeze_count() > 0  # what was alive at the start is out of every collection
        assert gc.get_threshold()[0] == before[0]  # generation 0 is still collected
        assert min(gc.get_threshold()[1:]) >= 1_000_000  # generations 1 and 2 are never triggered
        kept = [[i] for i in range(50 * before[0])]  # survivors of fifty young passes and more
        assert len(kept) > 0 and passes.passes and {p.generation for p in passes.passes} == {0}
        garbage = []
        garbage.append(garbage)  # a young cycle
        del garbage
        assert gc.collect(0) + gc.collect(1) >= 1
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_gc_passes_stamps_each_pass_with_its_generation_and_what_it_freed() -> None:
    with GcPasses() as passes:
        t0 = time.perf_counter_ns()
        garbage: list[object] = []
        garbage.append(garbage)
        del garbage
        gc.collect(1)
    assert gc.callbacks.count(passes._stamp) == 0  # the callback left with the block
    (gc_pass,) = passes.passes
    assert gc_pass.generation == 1 and gc_pass.collected >= 1
    assert t0 <= gc_pass.start_ns <= gc_pass.end_ns <= time.perf_counter_ns()
    assert passes.between(t0, gc_pass.start_ns) == [gc_pass] and passes.between(0, t0 - 1) == []


def test_run_hands_back_the_result_without_formatting_it() -> None:
    # Python 3.11's runner formats the finished main task (its result included) on its way out: a
    # session's records, prompts and all, took 0.4 s for 20,000
    formatted = []

    class Loud:
        def __repr__(self) -> str:
            formatted.append(self)
            return "loud"

    async def main() -> Loud:
        return Loud()

    assert isinstance(aio.run(main()), Loud) and formatted == []
