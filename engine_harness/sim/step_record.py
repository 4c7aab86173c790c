"""One engine step as the simulated engine logs it (its ground-truth step log, ``GET /sim/steps``).

``t_start_ns``/``duration_ns`` are ``time.perf_counter_ns()`` wall (scaled) times: a back-to-back step is
logged from the previous one's actual end, so durations add up to the wall time and no step carries the
wake-up's lateness (5-7 µs: the sweep's fit read α 0.05% high from it, and the replay's grid fell 4 ms
behind in 600 steps). ``model_duration_s`` is unscaled.

``engine_ns`` is the step on the engine's own clock, what the sweep reads as a real engine's elapsed field
(``engine_harness.steps.SimStepSource``): the scaled model time, or the wall time of a step that ended
more than the engine's resync threshold (50 ms) behind its grid, the engine's own stall (a freeze). A late
wake-up below that is the sim's event loop serving HTTP, which a real engine's API server does in another
process: on 2026-11-30 a sweep's step ran 0.5-8 ms late and the next one as much early (14% of its steps
off by over 0.3 ms), and a fit to those wall times put γ 2-3% off the model's (the solo pass of the CI of
``ecbab4c``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True, slots=True)
class StepRecord:
    """Ground truth of one engine step."""

    index: int
    t_start_ns: int
    duration_ns: int
    model_duration_s: float  # the whole step, as the decodes wait it
    behind_ns: int  # how far the step ended behind the model's step grid (over the threshold: moved on)
    engine_ns: int  # on the engine's own clock: the model time (scaled), the wall time if it stalled
    reported_ms: float  # what vLLM's iteration field would say in the sim's mode (sim.gpu_modes)
    decode_tokens: int
    prefill_tokens: int
    chunk_context: float
    num_decode_reqs: int
    num_prefill_reqs: int
    preemptions: int
    request_ids: tuple[str, ...]
    prefill_chunks: tuple[tuple[str, int, int], ...]  # (request id, chunk tokens, context before it)
    arrivals: tuple[tuple[str, int], ...]  # (request id, its perf_counter_ns arrival): those taken in first

    @property
    def t_end_ns(self) -> int:
        """When the step's tokens were handed to their streams."""
        return self.t_start_ns + self.duration_ns

    @property
    def num_tokens(self) -> int:
        return self.decode_tokens + self.prefill_tokens

    def to_dict(self) -> dict[str, object]:
        return asdict(self)
