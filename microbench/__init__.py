"""microbench."""
