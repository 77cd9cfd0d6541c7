"""Exercise 3.4: rebuild the buckets after the first step (chapter 3).

Read practice/exercises/15_bucket_rebuild/README.md, write both functions,
then grade them:  python practice/judge.py 3.4
"""


def rebuilt_buckets(
    param_bytes, ready_order, cap_bytes, first_cap_bytes=None, dtypes=None
):
    """The buckets DDP rebuilds after step 1, in the order the gradients arrived.

    Returns a list of buckets, each a list of parameter indices.
    """
    raise NotImplementedError("write rebuilt_buckets")


def first_iteration_buckets(param_bytes, cap_bytes, first_cap_bytes=None, dtypes=None):
    """DDP's buckets before any backward: the rule in registration order, reversed.

    Returns a list of buckets, each a list of parameter indices.
    """
    raise NotImplementedError("write first_iteration_buckets")
