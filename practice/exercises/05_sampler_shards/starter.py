"""Exercise 2.3: a sampler's disjoint, complete shards (chapter 2).

Read practice/exercises/05_sampler_shards/README.md, write the function,
then grade it:  python practice/judge.py 2.3
"""

import math
import random


def shard_indices(
    dataset_len, world_size, rank, epoch=0, seed=0, shuffle=True, drop_last=False
):
    """The dataset indices rank ``rank`` visits in epoch ``epoch``.

    By DistributedSampler's rule.
    """
    raise NotImplementedError("write shard_indices")
