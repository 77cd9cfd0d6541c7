"""Exercise 2.3, reference solution."""

import math
import random


def shard_indices(
    dataset_len, world_size, rank, epoch=0, seed=0, shuffle=True, drop_last=False
):
    """The dataset indices rank ``rank`` visits in epoch ``epoch``.

    By DistributedSampler's rule.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}")
    if dataset_len < 0:
        raise ValueError(f"dataset_len must be >= 0, got {dataset_len}")
    order = list(range(dataset_len))
    if shuffle:
        # Same seed on every rank: every rank computes the same permutation.
        random.Random(seed + epoch).shuffle(order)
    if drop_last:
        per_rank = dataset_len // world_size
    else:
        per_rank = math.ceil(dataset_len / world_size)
        padding = per_rank * world_size - len(order)
        if padding > 0:
            order += (order * math.ceil(padding / len(order)))[:padding]
    total = per_rank * world_size
    return order[rank:total:world_size]
