"""The shared measurement floor (DESIGN §1): the parts every job composes instead of copying.

Jobs (``sweep``, ``transfer``, ``battery``, and the next ones: ``ablate``, ``characterize``, ``route``)
are thin compositions of what lives here; the executors (``microbench.executors``) run its shard
functions. Nothing here imports a job; ``analysis`` never imports this package.
"""
