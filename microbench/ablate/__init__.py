"""``python -m microbench.ablate``: A/B ablations of two engine configurations (home of the next job).

Same shape as ``microbench.sweep``: ``__main__`` (flags), ``config``, ``runner``; its arms are the
``--arm NAME=…`` configurations of the flag vocabulary. Empty until its issue.
"""
