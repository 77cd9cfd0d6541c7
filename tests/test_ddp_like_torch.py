"""MyDDP does what PyTorch's DistributedDataParallel does (torch 2.13), each behaviour
compared with DDP itself: the bucketing rule with mixed dtypes, the bucket rebuild after
the first step, unused parameters, and the gradient copies."""

import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mylib.models.buckets import MB, assign_buckets, first_iteration_buckets

DTYPES = [torch.float32, torch.bfloat16, torch.float64]


# -- the bucketing rule: torch.distributed._compute_bucket_assignment_by_size ---------


@settings(max_examples=300, deadline=None)
@given(
    params=st.lists(
        st.tuples(st.integers(0, 40), st.sampled_from(DTYPES)), min_size=1, max_size=12
    ),
    cap=st.sampled_from([0, 1, 40, 100, 300, 10**9]),
    first_cap=st.sampled_from([None, 0, 50, 10**9]),
)
def test_bucketing_rule_is_pytorchs(params, cap, first_cap):
    tensors = [torch.empty(n, dtype=dtype) for n, dtype in params]
    sizes = [t.numel() * t.element_size() for t in tensors]
    keys = [t.dtype for t in tensors]
    first = min(cap, MB) if first_cap is None else first_cap
    limits = [first, cap]
    # In a given order (the rebuild passes the order gradients arrived in as
    # tensor_indices): buckets as they close, then the ones left open.
    order = list(range(len(tensors)))
    theirs, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [], order)
    assert assign_buckets(sizes, cap, first_cap, keys) == theirs
    # Before any backward (no tensor_indices): sorted by the smallest index, and DDP
    # reverses the list; MyDDP lays each bucket out in backward order.
    theirs, _ = dist._compute_bucket_assignment_by_size(tensors, limits)
    mine = first_iteration_buckets(sizes, cap, first_cap, keys)
    assert mine == [bucket[::-1] for bucket in reversed(theirs)]


def test_one_open_bucket_per_dtype():
    # bf16 weights (2 KB) with fp32 norms (40 B) between them, as in a transformer:
    # closing the bucket at every change of dtype would make 6 buckets.
    sizes, keys = [2000, 40] * 3, ["bf16", "fp32"] * 3
    # The bucket left open by the dtype seen last comes first (PyTorch's order).
    assert assign_buckets(sizes, 4000, keys=keys) == [[0, 2], [1, 3, 5], [4]]
