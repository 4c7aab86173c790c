"""``python -m microbench.characterize``: seed 001's characterization of an engine configuration.

``probes`` (the corner-case batches of a candidate and their verdicts), ``budget`` (the batch-budget
search over max-num-batched-tokens or max-num-seqs, each candidate started for real), ``requests`` (the
sweep's requests: a workload, or an empirical joint length table), ``users`` (the 1, 2, 4 … N closed-loop
users sweep), ``config``, ``runner``, ``cli``. The dataset and its reader live in ``analysis.characterize``.
"""
