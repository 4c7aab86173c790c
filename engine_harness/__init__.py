"""engine_harness."""
