"""Exercise 08, reference solution."""

import contextlib

import torch
import torch.distributed as dist


class TinyDDP(torch.nn.Module):
    """A small DDP (already written, except no_sync).

    Every rank starts from rank 0's weights, and each gradient is averaged
    over the ranks by a hook as soon as backward() has accumulated it.
    """

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.require_sync = True  # False inside no_sync(): the hooks then do nothing
        for param in module.parameters():
            dist.broadcast(param.data, src=0)
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._average_gradient)

    def _average_gradient(self, param):
        if self.require_sync:
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside this block, backward() accumulates gradients locally.

        It communicates nothing.
        """
        previous = self.require_sync
        self.require_sync = False
        try:
            yield
        finally:  # an exception inside the block must not leave syncing off
            self.require_sync = previous


def train_step(ddp, optimizer, micro_batches, loss_fn):
    """One optimizer step over several micro-batches.

    Gradients are communicated only after the last micro-batch.
    """
    optimizer.zero_grad()
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        last = i == k - 1
        # Earlier micro-batches only accumulate into .grad; the last backward
        # all-reduces the accumulated sum, once.
        with contextlib.nullcontext() if last else ddp.no_sync():
            (loss_fn(ddp(x), y) / k).backward()
    optimizer.step()
