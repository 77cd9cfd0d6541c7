"""Exercise 7.1: does a 7B model's gradient sync hide behind its backward? (chapter 7)

Read practice/exercises/12_overlap_at_scale/README.md, write the function,
then grade it:  python practice/judge.py 7.1
"""

import math


def sync_report(
    n_params,
    bytes_per_grad,
    world_size,
    bandwidth_bytes_per_s,
    backward_s,
    bucket_bytes=25 * 2**20,
    alpha_s=0.0,
):
    """How long the bucketed gradient all-reduce takes, and what the backward hides."""
    raise NotImplementedError("write sync_report")
