"""``python -m microbench.ablate``: engine A/B ablations of the interference grid, with statistics.

Same shape as ``microbench.sweep``: ``__main__``/``cli`` (flags), ``config`` (the grid, the arms, the
rounds), ``runner`` (counterbalanced rounds of the measurement floor's shard function per arm × chunk);
the comparison is ``analysis.compare``.
"""
