"""The client's event-loop helpers: no full garbage collection while something is being timed."""

import gc

from microbench.client import aio
from microbench.client.aio import no_full_collections


def test_no_full_collections_freezes_the_heap_and_restores_the_collector() -> None:
    before = gc.get_threshold()
    with no_full_collections():
        assert gc.get_freeze_count() > 0  # what was alive at the start is out of every collection
        assert gc.get_threshold()[:2] == before[:2]  # young generations are still collected
        assert gc.get_threshold()[2] >= 1_000_000  # generation 2 is never triggered automatically
        garbage = []
        garbage.append(garbage)  # a young cycle
        del garbage
        assert gc.collect(0) + gc.collect(1) >= 1
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


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
