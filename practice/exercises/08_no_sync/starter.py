"""Exercise 08: gradient accumulation with no_sync (chapter 4).

Read practice/exercises/08_no_sync/README.md, write ``TinyDDP.no_sync`` and
``train_step``, then grade them:  python practice/judge.py 08
"""

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
        raise NotImplementedError("write no_sync")
        yield


def train_step(ddp, optimizer, micro_batches, loss_fn):
    """One optimizer step over several micro-batches.

    Gradients are communicated only after the last micro-batch.
    """
    raise NotImplementedError("write train_step")
