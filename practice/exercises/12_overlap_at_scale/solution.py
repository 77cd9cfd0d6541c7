"""Exercise 7.1, reference solution."""

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
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if bandwidth_bytes_per_s <= 0 or bucket_bytes <= 0:
        raise ValueError("bandwidth_bytes_per_s and bucket_bytes must be positive")
    if min(n_params, bytes_per_grad, backward_s, alpha_s) < 0:
        raise ValueError(
            "n_params, bytes_per_grad, backward_s and alpha_s must be >= 0"
        )
    grad_bytes = n_params * bytes_per_grad
    n_buckets = math.ceil(grad_bytes / bucket_bytes)
    if n_buckets == 0:
        return {
            "grad_bytes": grad_bytes,
            "n_buckets": 0,
            "bucket_s": 0.0,
            "comm_s": 0.0,
            "exposed_s": 0.0,
            "hidden": True,
        }
    n = world_size
    bucket_s = (
        2 * (n - 1) * alpha_s
        + 2 * (n - 1) / n * (grad_bytes / n_buckets) / bandwidth_bytes_per_s
    )
    comm_s = n_buckets * bucket_s
    # Either the link keeps up (only the last bucket is left after the backward),
    # or it falls behind from the first bucket on and the surplus is exposed.
    surplus = comm_s - backward_s * (n_buckets - 1) / n_buckets
    return {
        "grad_bytes": grad_bytes,
        "n_buckets": n_buckets,
        "bucket_s": bucket_s,
        "comm_s": comm_s,
        "exposed_s": max(bucket_s, surplus),
        "hidden": surplus <= bucket_s,
    }
