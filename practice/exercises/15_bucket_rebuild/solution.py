"""Exercise 3.4, reference solution."""

MiB = 1024 * 1024


def _fill(sizes, cap_bytes, first_cap_bytes, keys):
    """The bucketing rule over ``sizes`` in the order given: positions, per bucket."""
    if cap_bytes < 0:
        raise ValueError(f"cap_bytes must be >= 0, got {cap_bytes}")
    if first_cap_bytes is None:
        first_cap_bytes = min(cap_bytes, MiB)
    if first_cap_bytes < 0:
        raise ValueError(f"first_cap_bytes must be >= 0, got {first_cap_bytes}")
    closed, open_ = [], {}  # dtype -> [positions, bytes, buckets closed so far]
    for i, (size, key) in enumerate(zip(sizes, keys)):
        bucket = open_.setdefault(key, [[], 0, 0])
        bucket[0].append(i)
        bucket[1] += size
        if bucket[1] >= (first_cap_bytes if bucket[2] == 0 else cap_bytes):
            closed.append(bucket[0])
            open_[key] = [[], 0, bucket[2] + 1]  # same key: keeps its first place
    return closed + [b[0] for b in reversed(open_.values()) if b[0]]


def _checked(param_bytes, dtypes):
    for i, size in enumerate(param_bytes):
        if size < 0:
            raise ValueError(f"parameter {i} has a negative size ({size} bytes)")
    if dtypes is None:
        return [None] * len(param_bytes)
    if len(dtypes) != len(param_bytes):
        raise ValueError(
            f"dtypes has {len(dtypes)} entries for {len(param_bytes)} parameters: "
            "give one dtype per parameter"
        )
    return list(dtypes)


def rebuilt_buckets(
    param_bytes, ready_order, cap_bytes, first_cap_bytes=None, dtypes=None
):
    """The buckets DDP rebuilds after step 1, in the order the gradients arrived."""
    dtypes = _checked(param_bytes, dtypes)
    n = len(param_bytes)
    seen = set()
    for i in ready_order:
        if not 0 <= i < n:
            raise ValueError(
                f"ready_order holds {i}, not a parameter index (0..{n - 1})"
            )
        if i in seen:
            raise ValueError(f"ready_order holds parameter {i} twice")
        seen.add(i)
    missing = sorted(set(range(n)) - seen)
    if missing:
        raise ValueError(f"ready_order misses parameter {missing[0]}")
    order = list(ready_order)
    buckets = _fill(
        [param_bytes[i] for i in order],
        cap_bytes,
        first_cap_bytes,
        [dtypes[i] for i in order],
    )
    return [[order[k] for k in bucket] for bucket in buckets]


def first_iteration_buckets(param_bytes, cap_bytes, first_cap_bytes=None, dtypes=None):
    """DDP's buckets before any backward: registration order, then reversed."""
    dtypes = _checked(param_bytes, dtypes)
    buckets = _fill(param_bytes, cap_bytes, first_cap_bytes, dtypes)
    return [bucket[::-1] for bucket in sorted(buckets, key=min, reverse=True)]
