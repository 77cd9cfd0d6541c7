"""Exercise 1.2, reference solution."""


def ring_allreduce_seconds(nbytes, world_size, alpha_s, bandwidth_bytes_per_s):
    """Seconds a ring all-reduce of ``nbytes`` over ``world_size`` ranks takes.

    In the alpha-beta model; beta is the bandwidth, in bytes per second.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if nbytes < 0 or alpha_s < 0:
        raise ValueError(f"nbytes and alpha_s must be >= 0, got {nbytes} and {alpha_s}")
    if bandwidth_bytes_per_s <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth_bytes_per_s}")
    steps = 2 * (world_size - 1)  # reduce-scatter, then all-gather
    return steps * alpha_s + steps * (nbytes / world_size) / bandwidth_bytes_per_s


def fit_alpha_beta(message_bytes, seconds):
    """Fit ``seconds = alpha + bytes / beta`` by least squares.

    Returns (alpha_s, beta_bytes_per_s): the line's intercept, and the inverse
    of its slope.
    """
    if len(message_bytes) != len(seconds):
        raise ValueError(
            f"{len(message_bytes)} sizes but {len(seconds)} times: "
            "give one time per size"
        )
    if len(set(message_bytes)) < 2:
        raise ValueError("need at least two distinct message sizes to fit a line")
    n = len(message_bytes)
    mean_x = sum(message_bytes) / n
    mean_y = sum(seconds) / n
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(message_bytes, seconds))
    sxx = sum((x - mean_x) ** 2 for x in message_bytes)
    slope = sxy / sxx  # seconds per byte
    if slope <= 0:
        raise ValueError(
            "the times do not grow with the size (slope <= 0): no bandwidth to fit"
        )
    return mean_y - slope * mean_x, 1 / slope
