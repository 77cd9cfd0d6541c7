"""Exercise 4.1: gradient accumulation with no_sync (chapter 4).

Read practice/exercises/08_no_sync/README.md, write ``TinyDDP.no_sync`` and
``train_step``, then grade them:  python practice/judge.py 4.1
"""

import contextlib

import torch
import torch.distributed as dist


class TinyDDP(torch.nn.Module):
    """A small DDP (already written, except no_sync).

    Every rank starts from rank 0's weights. As in PyTorch's DDP, the forward
    decides whether the backward after it synchronises: a forward run while
    ``require_backward_grad_sync`` is True makes the hooks of the coming
    backward average each gradient over the ranks as soon as backward() has
    accumulated it; a forward run while it is False makes them do nothing.
    """

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.require_backward_grad_sync = True  # False inside no_sync()
        self._backward_syncs = False  # what the last forward decided
        for param in module.parameters():
            dist.broadcast(param.data, src=0)
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(self._average_gradient)

    def forward(self, *args, **kwargs):
        if torch.is_grad_enabled():  # the forward decides, not the backward
            self._backward_syncs = self.require_backward_grad_sync
        return self.module(*args, **kwargs)

    def _average_gradient(self, param):
        if self._backward_syncs:
            dist.all_reduce(param.grad)
            param.grad /= dist.get_world_size()

    @contextlib.contextmanager
    def no_sync(self):
        """Inside this block forward() prepares a backward that sends nothing.

        That backward only accumulates the gradients locally.
        """
        raise NotImplementedError("write no_sync")
        yield


def train_step(ddp, optimizer, micro_batches, loss_fn):
    """One optimizer step over several micro-batches.

    Gradients are communicated only after the last micro-batch.
    """
    raise NotImplementedError("write train_step")
