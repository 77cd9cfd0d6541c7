"""Chapter 2. Data parallelism by hand: equal replicas, disjoint data, mean gradients.

Each rank holds a full copy of the model and a different slice of the batch.
Two calls keep the copies identical, step after step:

1. :func:`broadcast_parameters` once, before training: every rank takes
   rank 0's weights. Seeding every rank alike is not enough (any rank-dependent
   use of the random generator before the model is built breaks it), and
   averaged gradients never pull replicas that started apart back together.
2. :func:`average_gradients` after every ``backward()``: every rank gets the
   mean of all ranks' gradients. If every rank's loss is the *mean* over an
   equal share of the batch, that mean is exactly the gradient of the mean
   loss over the whole batch, so one optimizer step is the same on every rank
   and the same as one process training on the whole batch.

One all-reduce per parameter, after the backward pass: the simplest correct
version. Chapter 3's ``MyDDP`` sends the same bytes in buckets, overlapped
with the backward pass. The collectives come from :mod:`mylib.comm`, so
``count_bytes()`` sees them.

The last section of this file holds the two pieces of bookkeeping that data
parallelism adds to training:

* **Disjoint shards.** Each rank must read different rows, and together they
  must read every row once per epoch. ``torch.utils.data.DistributedSampler``
  does it: every rank draws the *same* permutation (same seed, same epoch, so
  call ``sampler.set_epoch(epoch)`` every epoch) and keeps every n-th index
  from its own offset. :func:`check_shards` verifies the result. When ``n``
  does not divide the dataset the sampler pads with repeated rows (or drops
  the tail with ``drop_last=True``), so the shards are then not quite
  disjoint (or not quite complete).
* **The global batch.** One optimizer step sees
  ``micro_batch x accumulation_steps x world_size`` examples
  (:func:`global_batch_size`); a recipe's batch size is this number.
"""

from collections import Counter, namedtuple

import torch
import torch.distributed as dist

from mylib import comm


def broadcast_parameters(module, src=0, group=None):
    """Copy rank ``src``'s parameters and buffers to every rank, in place.

    Buffers too: BatchNorm's running statistics, for instance.
    """
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            comm.broadcast(tensor.data, src, group=group)


def average_gradients(module, group=None):
    """Replace each parameter's gradient by its mean over ``group``'s ranks.

    Every rank must call it after ``backward()`` and before
    ``optimizer.step()``. Every parameter that requires a gradient must have
    one on every rank: the ranks all-reduce the same tensors in the same
    order, and a rank that skipped one would leave the others waiting.
    """
    world = dist.get_world_size(group)
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        if param.grad is None:
            raise RuntimeError(
                f"parameter {name!r} has no gradient on rank "
                f"{dist.get_rank()}: it was not used in the loss. Freeze "
                f"it (param.requires_grad_(False)) or give it a zero "
                f"gradient, so that every rank all-reduces the same "
                f"tensors."
            )
        comm.all_reduce(param.grad, group=group)
        param.grad.div_(world)


def max_replica_difference(module, group=None):
    """Largest ``|w_rank - w_rank0|`` over all parameters and ranks.

    0.0 when the replicas are identical. Every rank calls it and gets the
    same number.
    """
    worst = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for param in module.parameters():
            if param.numel() == 0:
                continue
            reference = param.detach().clone()
            dist.broadcast(
                reference,
                dist.get_global_rank(group, 0) if group is not None else 0,
                group=group,
            )
            worst = torch.maximum(
                worst, (param.detach() - reference).abs().max().double()
            )
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return worst.item()


# -- who reads which rows, and how big the batch really is ---------------------------


ShardCheck = namedtuple("ShardCheck", "disjoint complete read_twice missing per_rank")
ShardCheck.__doc__ = (
    "What :func:`check_shards` found: ``read_twice`` and ``missing`` are sorted "
    "row indices."
)


def check_shards(shards, dataset_len):
    """Whether the ranks' index lists split ``range(dataset_len)`` exactly.

    ``shards[r]`` is the list of row indices rank ``r`` reads in one epoch.
    ``disjoint``: no row is read twice (by two ranks or by one);
    ``complete``: every row is read. Both hold exactly when the shards
    partition the data.
    """
    counts = Counter(i for shard in shards for i in shard)
    outside = sorted(i for i in counts if not 0 <= i < dataset_len)
    if outside:
        raise ValueError(
            f"shards hold indices outside range({dataset_len}): {outside[:5]}"
        )
    read_twice = sorted(i for i, c in counts.items() if c > 1)
    missing = sorted(set(range(dataset_len)) - set(counts))
    return ShardCheck(
        not read_twice, not missing, read_twice, missing, [len(s) for s in shards]
    )


def global_batch_size(micro_batch, accumulation_steps, world_size):
    """Examples per optimizer step, over all ranks.

    ``micro_batch x accumulation_steps x world_size``.
    """
    for name, value in (
        ("micro_batch", micro_batch),
        ("accumulation_steps", accumulation_steps),
        ("world_size", world_size),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return micro_batch * accumulation_steps * world_size


def accumulation_steps_for(global_batch, micro_batch, world_size):
    """How many micro-batches each rank accumulates to reach ``global_batch`` per step.

    Raises ``ValueError`` naming the nearest batch sizes that work when
    ``micro_batch x world_size`` does not divide ``global_batch``.
    """
    per_pass = global_batch_size(micro_batch, 1, world_size)
    steps, rest = divmod(global_batch, per_pass)
    if rest or steps == 0:
        nearest = sorted({max(steps, 1) * per_pass, (steps + 1) * per_pass})
        raise ValueError(
            f"a global batch of {global_batch} is not a whole number of passes of "
            f"micro_batch x world_size = {micro_batch} x {world_size} = {per_pass}: "
            f"use a global batch of {' or '.join(str(b) for b in nearest)}, "
            "or change the micro-batch"
        )
    return steps
