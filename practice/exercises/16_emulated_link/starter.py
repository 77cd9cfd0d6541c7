"""Exercise 3.5: deliver buckets on an emulated link (chapter 3).

Read practice/exercises/16_emulated_link/README.md, write both functions,
then grade them:  python practice/judge.py 3.5
"""


def link_schedule(buckets, ranks, alpha_s, bandwidth):
    """``(start_s, done_s, delivered_s)`` of each bucket on one FIFO link.

    ``buckets``: ``(launched_s, nbytes, real_done_s)`` per bucket, in launch order.
    """
    raise NotImplementedError("write link_schedule")


def exposed_seconds(schedule, backward_end_s):
    """How long the step waits after the backward for the last bucket."""
    raise NotImplementedError("write exposed_seconds")
