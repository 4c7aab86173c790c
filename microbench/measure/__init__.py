"""The shared measurement floor (DESIGN §1): the parts every job composes instead of copying.

Jobs (``sweep``, ``transfer``, ``battery``, and the next ones: ``ablate``, ``characterize``, ``route``)
are thin compositions of what lives here; the executors (``microbench.executors``) run its shard
functions. Nothing here imports a job; ``analysis`` never imports this package.

The interference floor (seed 002's protocol), bottom up: ``engine_client`` (what the protocol talks to),
``decode_batch`` (D steady decodes and Phase 1), ``interference`` (warm-up, Phase 2: one injection),
``engine_lifecycle`` (an engine per chunk: start, telemetry, recovery), ``faults`` (which errors are the
infrastructure's), ``timing`` (where the wall time went), ``plan`` + ``shard`` (``measure_shard``: one
chunk size's grid → records, through a ``sink.PointSink``; the sweep calls it per chunk size).
"""
