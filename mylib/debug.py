"""Chapter 8. Tools that find data-parallel bugs (collectives: call them in a rank).

Data-parallel bugs rarely raise where they happen. A replica drifts silently, a
shard overlaps another, a rank calls collectives in another order and the job
hangs an hour later. Each tool here turns one such bug into a message:

* :func:`replica_drift`: how far each parameter and buffer is from rank 0's
  (replicas that should be identical, are they?);
* :func:`shard_report`: do the ranks read disjoint data, and all of it?
* :func:`checked_group`: a process group on which every collective first
  compares its kind and shapes across ranks, PyTorch's
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL``, so that ranks calling different
  collectives fail at once with both calls named instead of hanging;
* :func:`who_is_missing`: a barrier that names the ranks that did not arrive
  (gloo's ``monitored_barrier``).

The collective ledger, which numbers every collective each rank calls and says
where the ranks parted, is :mod:`mylib.ledger` (its class here too, with the tools
it belongs with: ``from mylib.debug import CollectiveLedger``).
"""

import datetime
import os

import torch
import torch.distributed as dist

from mylib.ledger import CollectiveHang, CollectiveLedger, ledger_report  # noqa: F401


@torch.no_grad()
def replica_drift(module, group=None):
    """Largest ``|x - x on rank 0|`` over ranks, per parameter and buffer.

    Zero everywhere means the replicas are identical, as data parallelism
    needs. A parameter that drifts means gradients were not averaged (or an
    optimizer state differs); a buffer that drifts means buffers are not
    synchronised (BatchNorm statistics, chapter 8).
    """
    named = [(f"param {n}", t) for n, t in module.named_parameters()]
    named += [
        (f"buffer {n}", t) for n, t in module.named_buffers() if t.is_floating_point()
    ]
    src = dist.get_global_rank(group, 0) if group is not None else 0
    drift = {}
    for name, tensor in named:
        reference = tensor.detach().clone()
        dist.broadcast(reference, src, group=group)
        diff = (tensor.detach() - reference).abs().max().reshape(1).double()
        dist.all_reduce(diff, op=dist.ReduceOp.MAX, group=group)
        drift[name] = diff.item()
    return drift


def shard_report(indices, dataset_size, group=None):
    """Which samples each rank read, compared across ranks (on every rank).

    ``indices`` are the dataset indices this rank read (in one epoch).
    Returns ``per_rank`` (how many each rank read), ``read_by_several``
    (samples that more than one rank read), ``read_twice_by_one`` (samples a
    rank read more than once), ``never_read`` and ``disjoint`` (no sample read
    by two ranks, none missed).
    """
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, [int(i) for i in indices], group=group)
    owners = {}
    for rank, mine in enumerate(everyone):
        for i in set(mine):
            owners.setdefault(i, set()).add(rank)
    several = sorted(i for i, ranks in owners.items() if len(ranks) > 1)
    twice = sorted({i for mine in everyone for i in mine if mine.count(i) > 1})
    never = sorted(set(range(dataset_size)) - set(owners))
    return {
        "per_rank": [len(mine) for mine in everyone],
        "read_by_several": several,
        "read_twice_by_one": twice,
        "never_read": never,
        "disjoint": not several and not never,
    }


def checked_group(ranks=None):
    """A new group of ``ranks`` (default: all) whose collectives are checked first.

    Before each collective, every rank sends its fingerprint (kind of
    collective, tensor shapes and dtypes, a sequence number) and a mismatch
    raises on every rank, naming both calls. This is what
    ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` does to every group; under ``torchrun``
    you set that variable before the launch. It costs an extra exchange per
    collective: use it to debug, not to train. Every rank must call it.
    """
    os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    dist.set_debug_level_from_env()
    return dist.new_group(ranks=ranks, backend=dist.get_backend())


def who_is_missing(timeout_s=5.0, group=None):
    """A barrier that raises after ``timeout_s``, naming the ranks that did not arrive.

    Gloo only. Rank 0 waits for every other rank and reports all the missing
    ones (``monitored_barrier(wait_all_ranks=True)``); the other ranks raise
    too. Returns None when everyone arrived.
    """
    dist.monitored_barrier(
        group=group, timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True
    )
