"""Which gradients travel together: the bucketing rule.

Gradients become ready during the backward pass in roughly the reverse order
of ``model.parameters()``. Sending each one alone pays the per-message latency
(alpha) once per parameter; sending all of them at the end hides nothing behind
the backward. Buckets are the middle road: walk the parameters in backward
order, add each to the open bucket, and close the bucket once it holds at
least ``cap_bytes``. This is the rule of PyTorch's ``DistributedDataParallel``
(``compute_bucket_assignment_by_size``), including its small first bucket, so
that ``MyDDP`` and DDP build the same buckets for the same cap.

This module uses only the standard library on purpose: the same file runs in
``MyDDP``, in the timeline model and, through Pyodide, in the reader's browser.
"""

MB = 1024 * 1024

# PyTorch closes the first bucket early (1 MB) so that the first all-reduce
# starts as soon as possible: ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``.
DEFAULT_FIRST_BUCKET_BYTES = 1 * MB


def assign_buckets(sizes_bytes, cap_bytes, first_cap_bytes=None, keys=None):
    """Group parameters, given in backward order, into buckets.

    ``sizes_bytes[i]`` is the gradient size of the i-th parameter in backward
    order. A bucket is closed as soon as its size reaches its cap (so a bucket
    can exceed the cap by its last parameter, as in PyTorch); the first bucket
    uses ``first_cap_bytes`` (default: ``min(cap_bytes, 1 MB)``). A cap of 0
    gives one bucket per parameter. ``keys`` (for example dtype and device)
    force a new bucket whenever the key changes, since one bucket is one flat
    buffer of one dtype on one device.

    Returns a list of buckets, each a list of indices into ``sizes_bytes``.

    >>> assign_buckets([4, 4, 4, 4], cap_bytes=8, first_cap_bytes=8)
    [[0, 1], [2, 3]]
    >>> assign_buckets([4, 4, 4], cap_bytes=0)
    [[0], [1], [2]]
    """
    if cap_bytes < 0:
        raise ValueError(
            f"cap_bytes must be >= 0, got {cap_bytes}; "
            "use 0 for one bucket per parameter"
        )
    if first_cap_bytes is None:
        first_cap_bytes = min(cap_bytes, DEFAULT_FIRST_BUCKET_BYTES)
    if keys is not None and len(keys) != len(sizes_bytes):
        raise ValueError(
            f"keys has {len(keys)} entries for {len(sizes_bytes)} sizes; "
            "give one key per parameter"
        )
    buckets, current, current_bytes, current_key = [], [], 0, None
    for i, size in enumerate(sizes_bytes):
        if size < 0:
            raise ValueError(f"parameter {i} has a negative size ({size} bytes)")
        key = None if keys is None else keys[i]
        if current and key != current_key:
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += size
        current_key = key
        cap = first_cap_bytes if not buckets else cap_bytes
        if current_bytes >= cap:
            buckets.append(current)
            current, current_bytes = [], 0
    if current:
        buckets.append(current)
    return buckets


def bucket_sizes(sizes_bytes, buckets):
    """Bytes in each bucket, for a bucket list from :func:`assign_buckets`."""
    return [sum(sizes_bytes[i] for i in bucket) for bucket in buckets]
