"""Exercise 6.2: a ZeRO-1 sharded Adam (chapter 6).

Read practice/exercises/11_zero1_optimizer/README.md, write ``ShardedAdam``,
then grade it:  python practice/judge.py 6.2
"""

import math

import torch
import torch.distributed as dist


def flatten(tensors):
    """One flat 1-D copy of a list of tensors, in order (given)."""
    return torch.cat([t.detach().reshape(-1) for t in tensors])


def unflatten_into(tensors, flat):
    """Copy consecutive pieces of ``flat`` back into each tensor of the list (given)."""
    offset = 0
    for t in tensors:
        n = t.numel()
        with torch.no_grad():
            t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


class ShardedAdam:
    """Adam whose moments for each slice of the parameters live on one rank only.

    This is ZeRO-1.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params = list(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        raise NotImplementedError(
            "write ShardedAdam.__init__: this rank's slice and its state"
        )

    def step(self):
        """Update this rank's slice with Adam, then all-gather every rank's slice.

        The gathered slices go into the parameters.
        """
        raise NotImplementedError("write ShardedAdam.step")

    def zero_grad(self):
        """Forget the gradients."""
        for p in self.params:
            p.grad = None
