"""Exercise 4.2, reference solution."""

import contextlib


def train_step(ddp, optimizer, micro_batches, loss_fn):
    """One optimizer step of ``ddp`` (PyTorch's DistributedDataParallel) over
    ``micro_batches``, a list of ``(x, y)`` pairs.

    The gradients of all micro-batches are accumulated in ``.grad`` and
    averaged over the ranks once, in the last micro-batch's backward: the
    others run under ``ddp.no_sync()``, which skips the all-reduce.
    """
    optimizer.zero_grad()
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        # The bug: no_sync around the backward only. DDP decides at the forward
        # whether the next backward synchronises (the forward prepares its
        # reducer), so the forward must run inside no_sync too.
        with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():
            loss = loss_fn(ddp(x), y) / k
            loss.backward()
    optimizer.step()
