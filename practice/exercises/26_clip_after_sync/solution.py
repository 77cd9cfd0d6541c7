"""Exercise 4.3, reference solution."""

import contextlib

import torch


def train_step(ddp, optimizer, micro_batches, loss_fn, max_norm):
    """One optimizer step of ``ddp`` (PyTorch's DistributedDataParallel) over
    ``micro_batches`` (gradient accumulation, the early ones under
    ``no_sync()``), the gradient clipped to the norm ``max_norm`` before the
    step. Returns the gradient's norm that ``clip_grad_norm_`` measured."""
    optimizer.zero_grad()
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():
            loss = loss_fn(ddp(x), y) / k
            loss.backward()
    # The bug: clipping after every micro-step clipped each rank's own partial,
    # unaveraged gradient. Clip once, after the last backward has averaged the
    # accumulated gradient over the ranks: then every rank clips the same
    # gradient, the one of the whole batch, by the same norm.
    norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm)
    optimizer.step()
    return float(norm)
