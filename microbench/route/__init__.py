"""``python -m microbench.route``: a router that applies an offload table (``analysis.policy``) to live
requests, against always-colocated and always-disaggregated, on one seeded bursty workload.

``cli`` (flags) → ``config`` (``RouteConfig``) → ``runner`` (the engine pair of ``microbench.measure``, the
``router`` in front, ``workload`` replayed per policy in rotated rounds) → ``derive`` and ``boundary``
(pure figures from the run folder) → ``report`` (one typed record; Markdown, HTML, timeline). ``decide``
is the per-request policy; ``predicted`` builds the table a known step model and link predict (the sim's
known answer).
"""
