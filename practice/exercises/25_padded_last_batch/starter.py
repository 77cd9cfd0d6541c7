"""Exercise 2.5: a loss curve with a blip at the end of every epoch.

A bug hunt (chapter 2). Read practice/exercises/25_padded_last_batch/README.md,
find the bug in ``train`` and fix it, then grade it:  python practice/judge.py 2.5
"""

import torch.distributed as dist


def train(ddp, optimizer, batches):
    """Train ``ddp`` (PyTorch's DistributedDataParallel) on this rank's batches.

    Each batch is ``(x, target, mask)``: rows of packed tokens, ``mask`` False
    where a row is padding. The loss is the mean squared error over the real
    tokens. Returns the loss of each step, the same on every rank (what rank 0
    logs).
    """
    logged = []
    for x, target, mask in batches:
        optimizer.zero_grad()
        errors = (ddp(x).squeeze(-1) - target) ** 2
        loss = errors[mask].mean()  # the mean over the real tokens
        loss.backward()  # DDP averages the gradients over the ranks
        optimizer.step()
        shown = loss.detach().clone()
        dist.all_reduce(shown)
        logged.append(shown.item() / dist.get_world_size())
    return logged
