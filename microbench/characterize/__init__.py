"""``python -m microbench.characterize``: characterization sweeps (seed 001: concurrency 1…128, batch
budget search per accelerator). Home of the next job, same shape as ``microbench.sweep``; empty until its
issue.
"""
