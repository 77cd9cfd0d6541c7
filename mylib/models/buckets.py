"""Which gradients travel together: the bucketing rule.

Gradients become ready during the backward pass in roughly the reverse order
of ``model.parameters()``. Sending each one alone pays the per-message latency
(alpha) once per parameter; sending all of them at the end hides nothing behind
the backward. Buckets are the middle road: walk the parameters in backward
order, add each to the open bucket, and close the bucket once it holds at
least ``cap_bytes``. This is the rule of PyTorch's ``DistributedDataParallel``
(``compute_bucket_assignment_by_size``, callable from Python as
``torch.distributed._compute_bucket_assignment_by_size``), including its small
first bucket and its one open bucket per dtype and device, so that ``MyDDP``
and DDP build the same buckets for the same cap (``tests/test_ddp_like_torch.py``
compares the two on the same tensors).

DDP applies the rule twice (torch 2.13, torch/nn/parallel/distributed.py,
and measured with ``ddp._get_ddp_logging_data()``):

* before it has seen a backward, over the parameters in *registration*
  order; it then sorts the buckets by their first parameter and reverses the
  list (:func:`first_iteration_buckets`; ``_ddp_init_helper``). DDP does this
  only with ``find_unused_parameters=True``: otherwise
  ``_BucketCapacityConfig.compute_bucket_size_limits`` gives the first
  iteration the limit ``sys.maxsize``, one bucket per dtype and device;
* once, before the second forward (``_pre_forward`` calls
  ``reducer._rebuild_buckets()``), unless ``find_unused_parameters=True``:
  over the order in which the gradients became ready on rank 0, which every
  rank adopts (:func:`assign_buckets` on that order). These *rebuilt* buckets
  are the ones training runs on; ``rebuilt_per_bucket_param_indices`` in the
  logging data lists them.

Where the small first bucket lands (``first_cap_bytes``):

* Before the rebuild the first cap takes the parameters *defined first*, and
  after the reversal their bucket is sent *last*. That is the reason DDP's
  own comment gives (``_ddp_init_helper``): "a single small bucket for
  parameters that are defined first, such that their gradients don't spill
  into a much larger bucket, adding unnecessary latency after gradient
  computation finishes. Experiments showed 1MB is a reasonable value."
* After the rebuild the first cap takes the gradients ready *first* (the
  last layers): bucket 0 is the small one, and its all-reduce starts early.
  Measured: 4 layers of 600 x 600 used in the order 3rd, 1st, 4th, 2nd are
  rebuilt as ``[2nd layer's bias, weight]`` (1.44 MB, over the 1 MB) and
  then the rest. ``_BucketCapacityConfig``'s docstring says this ("a smaller
  first bucket allows AllReduce to start sooner"), though its parenthesis
  ("first bucket contains parameters whose gradients complete last")
  describes the first case.
* The first cap is ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB)
  only while ``bucket_cap_mb`` is left at ``None``; an explicit
  ``bucket_cap_mb`` is also the first cap (``_BucketCapacityConfig.create``).
  :func:`assign_buckets`' default, ``min(cap, 1 MB)``, is DDP's default case
  at any cap; pass ``first_cap_bytes=cap_bytes`` for DDP's explicit one.

This module uses only the standard library on purpose: the same file runs in
``MyDDP``, in the timeline model and, through Pyodide, in the reader's browser.
"""

MB = 1024 * 1024

# PyTorch's small first bucket: ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``.
# Where it lands and why it exists: see the module docstring.
DEFAULT_FIRST_BUCKET_BYTES = 1 * MB


def assign_buckets(sizes_bytes, cap_bytes, first_cap_bytes=None, keys=None):
    """Group parameters, given in the order their gradients become ready, into buckets.

    ``sizes_bytes[i]`` is the gradient size of the i-th parameter in that
    order. A bucket is closed as soon as its size reaches its cap (so a bucket
    can exceed the cap by its last parameter, as in PyTorch); the first bucket
    uses ``first_cap_bytes`` (default: ``min(cap_bytes, 1 MB)``). A cap of 0
    gives one bucket per parameter.

    ``keys`` (for example dtype and device): one bucket is one flat buffer of
    one dtype on one device, so, as in PyTorch, each key keeps its own open
    bucket, with its own first cap; a parameter of another key does not close
    it. The buckets come in the order they were closed; the ones still open at
    the end follow, the key seen last first (PyTorch's order: its open buckets
    live in a C++ ``std::unordered_map``, which libstdc++ walks that way; this
    is measured, not documented).

    Returns a list of buckets, each a list of indices into ``sizes_bytes``.

    >>> assign_buckets([4, 4, 4, 4], cap_bytes=8, first_cap_bytes=8)
    [[0, 1], [2, 3]]
    >>> assign_buckets([4, 4, 4], cap_bytes=0)
    [[0], [1], [2]]
    >>> assign_buckets([4, 2, 4, 2], cap_bytes=8, keys=["bf16", "fp32"] * 2)
    [[0, 2], [1, 3]]
    """
    if cap_bytes < 0:
        raise ValueError(
            f"cap_bytes must be >= 0, got {cap_bytes}; "
            "use 0 for one bucket per parameter"
        )
    if first_cap_bytes is None:
        first_cap_bytes = min(cap_bytes, DEFAULT_FIRST_BUCKET_BYTES)
    if keys is None:
        keys = [None] * len(sizes_bytes)
    if len(keys) != len(sizes_bytes):
        raise ValueError(
            f"keys has {len(keys)} entries for {len(sizes_bytes)} sizes; "
            "give one key per parameter"
        )
    closed, open_ = [], {}  # key -> [indices, bytes, buckets closed so far]
    for i, (size, key) in enumerate(zip(sizes_bytes, keys)):
        if size < 0:
            raise ValueError(f"parameter {i} has a negative size ({size} bytes)")
        bucket = open_.setdefault(key, [[], 0, 0])
        bucket[0].append(i)
        bucket[1] += size
        if bucket[1] >= (first_cap_bytes if bucket[2] == 0 else cap_bytes):
            closed.append(bucket[0])
            open_[key] = [[], 0, bucket[2] + 1]
    return closed + [b[0] for b in reversed(open_.values()) if b[0]]


def first_iteration_buckets(sizes_bytes, cap_bytes, first_cap_bytes=None, keys=None):
    """PyTorch's buckets before any backward, from the sizes in registration order.

    DDP cannot know yet in which order the gradients will become ready, so it
    guesses the reverse of ``model.parameters()``: it applies
    :func:`assign_buckets` in registration order, sorts the buckets by their
    first parameter and reverses the list (``_ddp_init_helper`` in
    ``torch/nn/parallel/distributed.py``). The first cap therefore holds the
    parameters registered first, and that bucket is sent last. Inside a bucket
    the indices are in backward order (DDP lays them out in registration
    order; nothing but a hook that reads the flat buffer as a whole can tell).

    Returns buckets of indices into ``sizes_bytes``, in the order they launch.

    >>> first_iteration_buckets([8, 1, 8, 1], cap_bytes=9)
    [[3, 2], [1, 0]]
    """
    buckets = assign_buckets(sizes_bytes, cap_bytes, first_cap_bytes, keys)
    return [bucket[::-1] for bucket in sorted(buckets, key=min, reverse=True)]


def bucket_sizes(sizes_bytes, buckets):
    """Bytes in each bucket, for a bucket list from :func:`assign_buckets`."""
    return [sum(sizes_bytes[i] for i in bucket) for bucket in buckets]
