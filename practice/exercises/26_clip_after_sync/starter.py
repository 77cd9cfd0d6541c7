"""Exercise 4.3: two ranks that part from one GPU once clipping starts.

A bug hunt (chapter 4). Read practice/exercises/26_clip_after_sync/README.md,
find the bug in ``train_step`` and fix it, then grade it:
python practice/judge.py 4.3
"""

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
        norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm)
    optimizer.step()
    return float(norm)
