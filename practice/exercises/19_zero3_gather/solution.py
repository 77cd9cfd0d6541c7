"""Exercise 6.4, reference solution."""

import math

import torch
import torch.distributed as dist


def _gather(shard):
    """The full flat parameters of a unit, from every rank's shard."""
    full = shard.new_empty(shard.numel() * dist.get_world_size())
    dist.all_gather_single(full, shard)
    return full


class _GatherLinear(torch.autograd.Function):
    """y = x W^T + b, with W and b gathered when needed and freed after."""

    @staticmethod
    def forward(ctx, x, shard, out_features, in_features):
        full = _gather(shard.detach())
        n_weight = out_features * in_features
        weight = full[:n_weight].view(out_features, in_features)
        bias = full[n_weight : n_weight + out_features]
        ctx.save_for_backward(x, shard)  # not the full weight: that is the point
        ctx.dims = (out_features, in_features)
        return torch.addmm(bias, x, weight.t())  # full is freed when we return

    @staticmethod
    def backward(ctx, grad_y):
        x, shard = ctx.saved_tensors
        out_features, in_features = ctx.dims
        world = dist.get_world_size()
        full = _gather(shard.detach())  # again: the backward needs W
        n_weight = out_features * in_features
        weight = full[:n_weight].view(out_features, in_features)
        grad_x = grad_y @ weight
        del full, weight
        flat_grad = torch.zeros(shard.numel() * world, dtype=grad_y.dtype)
        flat_grad[:n_weight] = (grad_y.t() @ x).flatten()
        flat_grad[n_weight : n_weight + out_features] = grad_y.sum(0)
        flat_grad /= world  # the reduce-scatter sums: the mean
        grad_shard = shard.new_empty(shard.numel())
        dist.reduce_scatter_single(grad_shard, flat_grad)
        return grad_x, grad_shard, None, None


class ShardedLinear(torch.nn.Module):
    """A Linear layer of which this rank keeps 1/N of the parameters."""

    def __init__(self, linear):
        super().__init__()
        rank, world = dist.get_rank(), dist.get_world_size()
        self.out_features, self.in_features = linear.weight.shape
        with torch.no_grad():
            flat = torch.cat([linear.weight.flatten(), linear.bias])
        size = math.ceil(flat.numel() / world)
        padded = torch.zeros(size * world, dtype=flat.dtype)
        padded[: flat.numel()] = flat
        self.shard = torch.nn.Parameter(padded[rank * size : (rank + 1) * size].clone())

    def forward(self, x):
        return _GatherLinear.apply(x, self.shard, self.out_features, self.in_features)
