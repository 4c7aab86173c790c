"""``python -m microbench.route``: a router that applies an offload table (``analysis.policy``) to live
requests. Home of the next job, same shape as ``microbench.sweep``; empty until its issue.
"""
