"""Chapter 2. Losses whose average over ranks is the mean over the global batch.

Data parallelism averages gradients over ranks. That gives the gradient of
the whole batch's mean loss only when every rank's loss is a mean over an
equal share. Language models break this: each rank's batch holds a different
number of target tokens (padding and masked prompts carry
``ignore_index = -100``). Say rank 0 holds three tokens of loss 1 and rank 1
one token of loss 3. The mean of the per-rank means is ``(1 + 3) / 2 = 2``;
the mean over the four tokens is ``(1 + 1 + 1 + 3) / 4 = 1.5``. The single
token of rank 1 weighs as much as the three of rank 0.

The fix: every rank sums its losses instead of averaging them, the ranks
all-reduce their *counts* (a few bytes), and each rank returns

    loss_sum * world_size / global_count

Averaging that over ranks, as gradient averaging does, gives
``sum over all tokens / global_count``: the token mean, and its gradient.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mylib import comm


def global_count(count, group=None):
    """The sum over ranks of a local count (int or 0-dim tensor), as a Python int."""
    total = torch.as_tensor(count, dtype=torch.int64).clone().reshape(())
    comm.all_reduce(total, group=group)
    return int(total.item())


def global_mean_loss(loss_sum, count, group=None):
    """Scale a summed loss: its mean over ranks is the mean over all items.

    ``loss_sum`` is the sum of this rank's per-item losses (a tensor with a
    graph), ``count`` how many items it summed. Returns
    ``loss_sum * world_size / global_count``; when no rank has any item it
    returns ``loss_sum * 0`` (zero loss, zero gradient) instead of dividing
    by zero.
    """
    if int(count) < 0:
        raise ValueError(
            f"count is a number of items and cannot be negative, got {count}"
        )
    total = global_count(count, group)
    if total == 0:
        return loss_sum * 0
    return loss_sum * dist.get_world_size(group) / total


def token_mean_cross_entropy(logits, labels, ignore_index=-100, group=None):
    """Cross-entropy over the target tokens of *all* ranks, for averaging.

    ``logits`` has shape ``(..., vocab)`` and ``labels`` the leading shape,
    with ``ignore_index`` where there is no target. After the gradients are
    averaged over ranks they equal the gradient of the mean loss over every
    target token of every rank, which is what one process would compute on
    the whole batch. The value returned on one rank is not that mean; the
    mean of the values over ranks is.
    """
    if logits.shape[:-1] != labels.shape:
        raise ValueError(
            f"logits {tuple(logits.shape)} and labels "
            f"{tuple(labels.shape)} do not match: logits need the labels' "
            f"shape plus a last dimension for the vocabulary"
        )
    loss_sum = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        labels.reshape(-1),
        ignore_index=ignore_index,
        reduction="sum",
    )
    count = (labels != ignore_index).sum()
    return global_mean_loss(loss_sum, count, group)
