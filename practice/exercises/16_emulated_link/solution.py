"""Exercise 3.5, reference solution."""


def link_schedule(buckets, ranks, alpha_s, bandwidth):
    """``(start_s, done_s, delivered_s)`` of each bucket on one FIFO link."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    if alpha_s < 0:
        raise ValueError(f"alpha_s must be >= 0 seconds, got {alpha_s}")
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be > 0 bytes/s, got {bandwidth}")
    steps = 2 * (ranks - 1)  # a ring all-reduce: reduce-scatter, then all-gather
    free_at = float("-inf")  # when the link has sent everything booked so far
    last_launch = float("-inf")
    schedule = []
    for k, (launched, nbytes, real_done) in enumerate(buckets):
        if nbytes < 0:
            raise ValueError(f"bucket {k} has a negative size ({nbytes} bytes)")
        if launched < last_launch:
            raise ValueError(
                f"bucket {k} is launched at {launched} s, before bucket {k - 1}: "
                "give the buckets in launch order"
            )
        last_launch = launched
        start = max(launched, free_at)
        done = start + steps * alpha_s + steps / ranks * nbytes / bandwidth
        free_at = done
        schedule.append((float(start), float(done), float(max(done, real_done))))
    return schedule


def exposed_seconds(schedule, backward_end_s):
    """How long the step waits after the backward for the last bucket."""
    if not schedule:
        return 0.0
    return max(0.0, max(delivered for _, _, delivered in schedule) - backward_end_s)
