"""Exercise 2.5, reference solution."""

import torch.distributed as dist


def train(ddp, optimizer, batches):
    """Train ``ddp`` (PyTorch's DistributedDataParallel) on this rank's batches.

    Each batch is ``(x, target, mask)``: rows of packed tokens, ``mask`` False
    where a row is padding. The loss is the mean squared error over the real
    tokens. Returns the loss of each step, the same on every rank (what rank 0
    logs).
    """
    world = dist.get_world_size()
    logged = []
    for x, target, mask in batches:
        optimizer.zero_grad()
        errors = (ddp(x).squeeze(-1) - target) ** 2
        # The bug: each rank's mean over its own tokens, then DDP's mean over
        # ranks, weighs a token of a rank with few tokens more. When the ranks
        # hold different numbers (a padded last batch), that is not the mean
        # over all tokens. Divide this rank's sum by the global count, times the
        # world size (DDP divides by it).
        count = mask.sum().to(errors.dtype)
        dist.all_reduce(count)
        total = errors[mask].sum()
        loss = total / count.clamp(min=1) * world
        loss.backward()
        optimizer.step()
        shown = total.detach().clone()
        dist.all_reduce(shown)
        logged.append((shown / count.clamp(min=1)).item())
    return logged
