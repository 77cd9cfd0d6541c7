"""Exercise 3.1, reference solution."""

MB = 1024 * 1024


def buckets_for_parameters(param_bytes, cap_bytes, first_cap_bytes=None):
    """Group parameters into buckets, walking them in backward order.

    param_bytes: gradient bytes of each parameter, in forward order.
    Returns a list of buckets (lists of forward indices), in launch order.
    """
    if cap_bytes < 0:
        raise ValueError(f"cap_bytes must be >= 0, got {cap_bytes}")
    if first_cap_bytes is None:
        first_cap_bytes = min(cap_bytes, MB)
    if first_cap_bytes < 0:
        raise ValueError(f"first_cap_bytes must be >= 0, got {first_cap_bytes}")
    buckets, current, current_bytes = [], [], 0
    for i in reversed(range(len(param_bytes))):  # gradients arrive last layer first
        if param_bytes[i] < 0:
            raise ValueError(
                f"parameter {i} has a negative size ({param_bytes[i]} bytes)"
            )
        current.append(i)
        current_bytes += param_bytes[i]
        cap = first_cap_bytes if not buckets else cap_bytes
        if current_bytes >= cap:
            buckets.append(current)
            current, current_bytes = [], 0
    if current:
        buckets.append(current)
    return buckets
