"""Who reads which sample: PyTorch's ``DistributedSampler`` rule, in plain Python.

Data parallelism needs every rank to read a *disjoint* share of the data and,
for synchronous steps, the *same number of batches*: a rank with one batch
more starts an all-reduce the others never join. Splitting ``N`` samples over
``n`` ranks cannot do both when ``n`` does not divide ``N``, so
``DistributedSampler`` chooses:

* by default it pads: the list of indices is extended by repeating its start
  until its length is a multiple of ``n`` (a few samples count twice);
* with ``drop_last=True`` it truncates to a multiple of ``n`` (a few samples are
  never read that epoch).

Then rank ``r`` takes every ``n``-th index starting at ``r``. Shuffling only
permutes the list first, with the same seed (plus the epoch) on every rank, so
the shares stay disjoint; a different seed per rank breaks that.

:func:`naive_indices` is the hand-rolled split ``range(r, N, n)``: disjoint
but uneven. Standard library only: the chapter's slider figure runs it in the
browser (:mod:`mylib.figures.sharding`).
"""

import math


def sampler_indices(dataset_size, world_size, rank, drop_last=False, order=None):
    """The indices ``DistributedSampler(shuffle=..., drop_last=...)`` gives a rank.

    ``order`` is the permutation of ``range(dataset_size)`` the sampler
    shuffled to (``torch.randperm(N, generator=seeded(seed + epoch))``);
    None means no shuffling.
    """
    _check(dataset_size, world_size, rank)
    indices = list(range(dataset_size)) if order is None else [int(i) for i in order]
    if len(indices) != dataset_size:
        raise ValueError(f"order has {len(indices)} indices for {dataset_size} samples")
    if drop_last and dataset_size % world_size:
        per_rank = math.ceil((dataset_size - world_size) / world_size)
    else:
        per_rank = math.ceil(dataset_size / world_size)
    total = per_rank * world_size
    if drop_last:
        indices = indices[:total]
    else:
        padding = total - len(indices)
        # Pad by repeating the start (the whole list again if it is short).
        indices += (indices * math.ceil(padding / len(indices)))[:padding]
    return indices[rank:total:world_size]


def naive_indices(dataset_size, world_size, rank):
    """The hand-rolled split: rank ``r`` takes samples ``r, r + n, r + 2n, ...``.

    The shares are uneven when n does not divide N.
    """
    _check(dataset_size, world_size, rank)
    return list(range(rank, dataset_size, world_size))


def batches_of(indices, batch_size, drop_last=False):
    """Cut ``indices`` into batches, as a ``DataLoader`` does.

    ``batch_size`` and ``drop_last`` mean what they mean there.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    batches = [indices[i : i + batch_size] for i in range(0, len(indices), batch_size)]
    return [b for b in batches if len(b) == batch_size] if drop_last else batches


def shares(dataset_size, world_size, batch_size, mode="sampler"):
    """Every rank's batches under ``mode``.

    ``mode`` is ``"naive"``, ``"sampler"`` (pads) or ``"drop_last"``.
    """
    if mode not in ("naive", "sampler", "drop_last"):
        raise ValueError(
            f"mode must be 'naive', 'sampler' or 'drop_last', got {mode!r}"
        )
    per_rank = [
        naive_indices(dataset_size, world_size, r)
        if mode == "naive"
        else sampler_indices(
            dataset_size, world_size, r, drop_last=(mode == "drop_last")
        )
        for r in range(world_size)
    ]
    return [batches_of(indices, batch_size) for indices in per_rank]


def _check(dataset_size, world_size, rank):
    if dataset_size < 1 or world_size < 1:
        raise ValueError(
            "need dataset_size >= 1 and world_size >= 1, "
            f"got {dataset_size} and {world_size}"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
