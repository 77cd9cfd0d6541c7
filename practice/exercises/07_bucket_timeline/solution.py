"""Exercise 3.2, reference solution."""


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
    if len(layer_backward_s) != len(layer_grad_bytes):
        raise ValueError(
            f"{len(layer_backward_s)} backward times "
            f"but {len(layer_grad_bytes)} gradient sizes"
        )
    flat = sorted(i for bucket in buckets for i in bucket)
    if flat != list(range(len(layer_backward_s))):
        raise ValueError("the buckets must hold every layer exactly once")
    ready, t = [], 0.0
    for seconds in layer_backward_s:
        t += seconds
        ready.append(t)
    backward_s = ready[-1] if ready else 0.0
    steps = 2 * (world_size - 1)
    link_free, comm_s, times = 0.0, 0.0, []
    for bucket in buckets:
        nbytes = sum(layer_grad_bytes[i] for i in bucket)
        duration = steps * alpha_s + steps * nbytes / world_size / bandwidth_bytes_per_s
        start = max(
            max(ready[i] for i in bucket), link_free
        )  # wait for the gradients and the link
        link_free = start + duration
        comm_s += duration
        times.append((start, link_free))
    comm_end_s = times[-1][1] if times else 0.0
    exposed = max(0.0, comm_end_s - backward_s)
    return {
        "backward_s": backward_s,
        "bucket_times": times,
        "comm_s": comm_s,
        "comm_end_s": comm_end_s,
        "exposed_comm_s": exposed,
        "overlapped_comm_s": comm_s - exposed,
        "step_s": forward_s + backward_s + exposed + optimizer_s,
    }
