"""Exercise 8.2: a job that hangs at the last step of the epoch.

A bug hunt (chapter 8). Read practice/exercises/27_skip_empty_batch/README.md,
find the bug in ``train`` and fix it, then grade it:  python practice/judge.py 8.2
"""

import torch.distributed as dist
import torch.nn.functional as F


def train(model, optimizer, batches, global_batch):
    """Train on this rank's ``batches`` of ``(x, y)``, one per step.

    The loss of a step is the sum of the squared errors of every rank's rows
    divided by ``global_batch``, the step's nominal number of rows over all
    ranks: each rank computes its part and the gradients are summed over the
    ranks. At the end of the data a rank's batch may be empty (zero rows).
    Returns the number of steps this rank took.
    """
    steps = 0
    for x, y in batches:
        if len(x) == 0:
            continue  # nothing to learn from on this rank
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y, reduction="sum") / global_batch
        loss.backward()
        for p in model.parameters():  # the sum over ranks: the whole batch's
            dist.all_reduce(p.grad)
        optimizer.step()
        steps += 1
    return steps
