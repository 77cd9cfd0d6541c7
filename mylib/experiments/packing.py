"""Chapter 2's diagnosis: a loss blip at the end of every epoch, on packed sequences.

Language-model data is often *packed*: the token stream is cut into sequences
of exactly ``pack`` tokens, so every sequence is full and every rank holds the
same number of target tokens. Then the mean of per-rank means (PyTorch's
default ``cross_entropy`` on each rank, averaged by the gradient all-reduce)
equals the mean over all tokens, and the normalisation trap of chapter 2 cannot
show. Until the end of the epoch: the stream's last sequence is only partly
filled (padded with ``ignore_index``), the last step's ranks hold different
numbers of targets, and that one step weighs the short rank's tokens more.
:func:`packed_epoch` plays one epoch and reports every step's loss both ways.
"""

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from mylib.loss import token_mean_cross_entropy

IGNORE = -100


def packed_epoch(n_tokens, pack=8, packs_per_rank=2, vocab=7, seed=0):
    """On every rank: one epoch of a packed token stream; each step's loss two ways.

    The stream's ``n_tokens`` targets (random logits over ``vocab`` classes,
    the same on every rank) are cut into packs of ``pack`` tokens, the last
    one padded with ``IGNORE``. Each step takes the next ``world_size x
    packs_per_rank`` packs and deals them out: rank ``r`` gets packs ``r, r +
    n, ...`` of the step, which is what ``DistributedSampler`` without
    shuffling deals when the ranks divide the packs (else it would repeat some
    to even them out); the last step may hold fewer. Returns one row per
    step: the targets on each rank, the mean of per-rank means (averaged over
    ranks, as gradient averaging does), one process's mean over the step's
    tokens, and
    :func:`mylib.loss.token_mean_cross_entropy` averaged over ranks.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n_tokens, vocab, generator=g, dtype=torch.float64)
    labels = torch.randint(vocab, (n_tokens,), generator=g)
    n_packs = math.ceil(n_tokens / pack)
    padding = n_packs * pack - n_tokens
    logits = torch.cat([logits, logits.new_zeros(padding, vocab)]).view(-1, pack, vocab)
    labels = torch.cat([labels, labels.new_full((padding,), IGNORE)]).view(-1, pack)
    per_step = n * packs_per_rank
    if n_packs % per_step and n_packs % per_step < n:
        raise ValueError(
            f"the last step's {n_packs % per_step} packs leave a rank without any: "
            "choose n_tokens so that every rank gets at least one"
        )
    rows = []
    for first in range(0, n_packs, per_step):
        step = range(first, min(first + per_step, n_packs))
        mine = list(step[rank::n])
        targets = torch.tensor([int((labels[mine] != IGNORE).sum())])
        everyone = [torch.zeros_like(targets) for _ in range(n)]
        dist.all_gather(everyone, targets)
        # PyTorch's default on this rank: the mean over its own targets
        default = F.cross_entropy(
            logits[mine].reshape(-1, vocab), labels[mine].reshape(-1)
        )
        fixed = token_mean_cross_entropy(logits[mine], labels[mine])
        averaged = torch.stack([default, fixed])
        dist.all_reduce(averaged)  # what gradient averaging does to the losses
        averaged /= n
        one_process = F.cross_entropy(
            logits[step.start : step.stop].reshape(-1, vocab),
            labels[step.start : step.stop].reshape(-1),
        )
        rows.append(
            (
                [int(t) for t in everyone],
                averaged[0].item(),
                one_process.item(),
                averaged[1].item(),
            )
        )
    return rows
