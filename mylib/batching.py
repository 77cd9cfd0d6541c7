"""Chapter 2. Who reads which rows, and how big the batch really is.

Two pieces of bookkeeping that data parallelism adds to training:

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
