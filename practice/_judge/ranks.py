"""Running a check on real ``torch.distributed`` ranks (gloo, on the CPU).

``on_ranks(worker, world_size, *args)`` runs ``worker(*args)`` on every rank
of a fresh gloo group and returns the results in rank order.

Where it runs: the checks run in the judge's process, which never runs the
reader's code. There ``on_ranks`` asks the process that runs the reader's
code (``child.py``) to fork the ranks (``forkranks.py``); the reader's
functions among ``args`` are handles to objects in that process, and only
the workers' plain results come back, for the check to compare. A rank that
raises becomes ``RankFailed`` and ranks that hang or loop become
``RanksStuck`` (with each rank's stack); :mod:`running` words both.

A checks module may list ``RANK_PRELOAD`` (module names): the fork server
imports them once, so no grade does.

A worker returns raw tensors and the check compares them with references it
computes itself, here in the judge (:func:`max_diff`, :func:`spread`): the
reader's code runs in the ranks and can reach anything computed there.
:func:`reference_on_ranks` runs what only ranks compute (PyTorch's own DDP,
hooks) on ranks of a second process that never loads the reader's file.

``spy_on_dist`` (used inside a worker; :mod:`spy`) records, or forbids,
calls to ``torch.distributed`` functions.
"""

import threading

from _judge.spy import DistSpy, canonical, spy_on_dist  # noqa: F401

# The judge's side: the connection to the process running the reader's code,
# per thread (``all --jobs 2`` grades two exercises at once).
_CURRENT = threading.local()
LOCAL_LOG_DIR = None


def on_ranks(worker, world_size, *args, timeout_s=None):
    """Run ``worker(*args)`` on ``world_size`` gloo ranks; return results in rank order.

    ``worker`` must be a function of the checks module. ``timeout_s`` bounds
    how long a rank may stay busy (by default the check's time left).
    """
    client = getattr(_CURRENT, "client", None)
    if client is not None:
        return client.on_ranks(worker, world_size, args, timeout_s)
    return run_locally(worker, world_size, args, busy_s=timeout_s or 60.0)


def reference_on_ranks(worker, world_size, *args, timeout_s=None):
    """Like :func:`on_ranks`, on ranks that run none of the reader's code.

    For what only real ranks compute (PyTorch's own DDP, hooks, collectives):
    they are forked from a second process of the grade, which never loads the
    reader's file, so its results are the checks' own. ``args`` are plain
    values and the checks' functions, never the reader's.
    """
    factory = getattr(_CURRENT, "reference", None)
    if factory is None:
        return run_locally(worker, world_size, args, busy_s=timeout_s or 60.0)
    client, reader = factory(), _CURRENT.client
    client.deadline, client.check_timeout_s = reader.deadline, reader.check_timeout_s
    client.what = f"the checks' reference ranks ({reader.what})"
    return client.on_ranks(worker, world_size, args, timeout_s)


def run_locally(worker, world_size, args, busy_s):
    from _judge.forkranks import run_forked

    return run_forked(
        worker, world_size, tuple(args), busy_s=busy_s, log_dir=LOCAL_LOG_DIR
    )


def max_diff(got, expected):
    """Largest ``|got - expected|`` over two lists of tensors (computed in the judge).

    ``inf`` where the lists differ in length, or a pair in shape or in being
    None; 0.0 for two empty lists. Both sides in float64.
    """
    import torch

    if len(got) != len(expected):
        return float("inf")
    worst = 0.0
    for g, e in zip(got, expected):
        if g is None or e is None:
            if (g is None) != (e is None):
                return float("inf")
            continue
        if not (torch.is_tensor(g) and tuple(g.shape) == tuple(e.shape)):
            return float("inf")
        if g.numel():
            worst = max(worst, float((g.double() - e.double()).abs().max()))
    return worst


def spread(per_rank):
    """Largest difference between any rank's tensors and rank 0's (lists of tensors)."""
    return max((max_diff(mine, per_rank[0]) for mine in per_rank), default=0.0)
