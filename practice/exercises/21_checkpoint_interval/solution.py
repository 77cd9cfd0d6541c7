"""Exercise 9.2, reference solution."""

import math

DAY_S = 86400.0


def _positive(name, value):
    if not value > 0:
        raise ValueError(f"{name} must be > 0 seconds, got {value!r}")


def young_interval(checkpoint_s, mtbf_s):
    """Young's optimal interval between checkpoints: sqrt(2 C M)."""
    _positive("checkpoint_s", checkpoint_s)
    _positive("mtbf_s", mtbf_s)
    return math.sqrt(2 * checkpoint_s * mtbf_s)


def daly_interval(checkpoint_s, mtbf_s):
    """Daly's higher-order optimal interval (2006)."""
    _positive("checkpoint_s", checkpoint_s)
    _positive("mtbf_s", mtbf_s)
    if checkpoint_s >= 2 * mtbf_s:
        return float(mtbf_s)
    x = checkpoint_s / (2 * mtbf_s)
    return (
        math.sqrt(2 * checkpoint_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9)
        - checkpoint_s
    )


def cluster_mtbf(node_mtbf_s, nodes):
    """MTBF of a job on ``nodes`` nodes whose failures are independent."""
    _positive("node_mtbf_s", node_mtbf_s)
    if isinstance(nodes, bool) or int(nodes) != nodes or nodes < 1:
        raise ValueError(f"nodes must be a whole number >= 1, got {nodes!r}")
    return node_mtbf_s / nodes


def lost_seconds_per_day(interval_s, checkpoint_s, mtbf_s, restart_s=0.0):
    """Seconds of a day's wall clock lost to checkpoints, rework and restarts."""
    _positive("interval_s", interval_s)
    _positive("checkpoint_s", checkpoint_s)
    _positive("mtbf_s", mtbf_s)
    if restart_s < 0:
        raise ValueError(f"restart_s must be >= 0 seconds, got {restart_s!r}")
    # w: seconds lost per second of work; a second of work takes 1 + w
    w = checkpoint_s / interval_s + (interval_s / 2 + restart_s) / mtbf_s
    return DAY_S * w / (1 + w)
