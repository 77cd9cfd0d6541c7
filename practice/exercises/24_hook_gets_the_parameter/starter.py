"""Exercise 3.6: a hand-made DDP whose replicas drift apart.

A bug hunt (chapter 3). Read
practice/exercises/24_hook_gets_the_parameter/README.md, find the bug in
``DataParallelNaive`` and fix it, then grade it:  python practice/judge.py 3.6
"""

import contextlib

import torch
import torch.distributed as dist


class DataParallelNaive(torch.nn.Module):
    """Data parallelism in its simplest form: a hook on every parameter averages
    its gradient over the ranks once backward has accumulated it, unless inside
    ``no_sync()`` (gradient accumulation). Every rank starts from the same
    weights."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True  # False inside no_sync()
        for p in self.module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._allreduce_grads)

    def _allreduce_grads(self, grad):
        """All-reduce the gradient over the ranks and divide by their number."""
        if self.require_backward_grad_sync:
            dist.all_reduce(grad, op=dist.ReduceOp.SUM)
            grad /= dist.get_world_size()
        return grad

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Inside this block, backward accumulates gradients without averaging."""
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = True
