"""The base every package of the suite stands on: the one strict pydantic model, atomic file writes, the
name registry, provenance of a run and layered configuration.

It lives below ``engine_harness`` (not inside ``microbench`` as DESIGN §1 sketches ``microbench/core``)
because the engine table needs the strict model too, and the engine harness must not import the client
side. It imports nothing of the suite.
"""
