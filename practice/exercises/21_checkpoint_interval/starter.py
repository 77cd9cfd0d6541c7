"""Exercise 9.2: how often to checkpoint (chapter 9).

Read practice/exercises/21_checkpoint_interval/README.md, write the four
functions, then grade them:  python practice/judge.py 9.2
"""


def young_interval(checkpoint_s, mtbf_s):
    """Young's optimal interval between checkpoints: sqrt(2 C M)."""
    raise NotImplementedError("write young_interval")


def daly_interval(checkpoint_s, mtbf_s):
    """Daly's higher-order optimal interval (2006)."""
    raise NotImplementedError("write daly_interval")


def cluster_mtbf(node_mtbf_s, nodes):
    """MTBF of a job on ``nodes`` nodes whose failures are independent."""
    raise NotImplementedError("write cluster_mtbf")


def lost_seconds_per_day(interval_s, checkpoint_s, mtbf_s, restart_s=0.0):
    """Seconds of a day's wall clock lost to checkpoints, rework and restarts."""
    raise NotImplementedError("write lost_seconds_per_day")
