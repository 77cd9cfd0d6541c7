"""Exercise 4.2: a gradient accumulation that still communicates every micro-step.

A bug hunt (chapter 4). Read
practice/exercises/22_no_sync_around_backward/README.md, find the bug in
``train_step`` and fix it, then grade it:  python practice/judge.py 4.2
"""


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
        loss = loss_fn(ddp(x), y) / k  # the mean over all micro-batches
        if i < k - 1:
            with ddp.no_sync():  # accumulate locally, no all-reduce
                loss.backward()
        else:
            loss.backward()  # the last one averages the accumulated sum
    optimizer.step()
