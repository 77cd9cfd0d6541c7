"""Exercise 6.2, reference solution."""

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
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.numel = sum(p.numel() for p in self.params)
        self.shard_size = math.ceil(self.numel / self.world_size)
        self.start = min(self.rank * self.shard_size, self.numel)
        self.end = min(self.start + self.shard_size, self.numel)
        # The state of this rank's slice only: 1/N of DDP's optimizer memory.
        self.exp_avg = torch.zeros(self.end - self.start)
        self.exp_avg_sq = torch.zeros(self.end - self.start)
        self.t = 0

    def step(self):
        """Update this rank's slice with Adam, then all-gather every rank's slice.

        The gathered slices go into the parameters.
        """
        self.t += 1
        beta1, beta2 = self.betas
        flat = flatten(self.params)
        grad = flatten([p.grad for p in self.params])[self.start : self.end]
        mine = flat[self.start : self.end]
        self.exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        self.exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        m_hat = self.exp_avg / (1 - beta1**self.t)
        v_hat = self.exp_avg_sq / (1 - beta2**self.t)
        mine -= self.lr * m_hat / (v_hat.sqrt() + self.eps)
        # Every slice padded to shard_size, so all ranks send tensors of one size.
        send = torch.zeros(self.shard_size)
        send[: self.end - self.start] = mine
        gathered = torch.empty(self.shard_size * self.world_size)
        dist.all_gather_single(gathered, send)
        unflatten_into(self.params, gathered[: self.numel])

    def zero_grad(self):
        """Forget the gradients."""
        for p in self.params:
            p.grad = None
