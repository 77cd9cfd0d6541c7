"""Exercise 3.2: the timeline of a bucketed backward (chapter 3).

Read practice/exercises/07_bucket_timeline/README.md, write the function,
then grade it:  python practice/judge.py 3.2
"""


def simulate_backward(
    layer_backward_s,
    layer_grad_bytes,
    buckets,
    world_size,
    alpha_s,
    bandwidth_bytes_per_s,
    forward_s=0.0,
    optimizer_s=0.0,
):
    """When each bucket's all-reduce runs, and how much of it the backward hides."""
    raise NotImplementedError("write simulate_backward")
