"""Where a run's shards execute (DESIGN §7): ``local`` in turn (what every job does today) or on Ray.

Home of the executors; empty until the Ray scale-out issue: a job hands its shards (one engine
configuration × chunk size each) to an executor instead of looping over them itself.
"""
