"""Models and a training loop shared by the MyDDP tests (run inside ranks)."""

import torch
import torch.distributed as dist
from torch import nn

from mylib.experiments.common import global_batches, max_param_diff


class TiedMLP(nn.Module):
    """An MLP whose first and last layers share one weight (as tied embeddings do)."""

    def __init__(self, width):
        super().__init__()
        self.inp = nn.Linear(width, width)
        self.mid = nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.out.weight = self.inp.weight

    def forward(self, x):
        return self.out(torch.tanh(self.mid(torch.tanh(self.inp(x)))))


def build(kind, sizes, seed=0, dtype=torch.float32):
    """A small model: "mlp", "frozen", "tied" or "bn".

    "frozen" has its first layer frozen; "bn" has BatchNorm buffers.
    """
    torch.manual_seed(seed)
    if kind == "tied":
        return TiedMLP(sizes[0]).to(dtype)
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            if kind == "bn":
                layers.append(nn.BatchNorm1d(b))
            layers.append(nn.Tanh())
    model = nn.Sequential(*layers)
    if kind == "frozen":
        model[0].requires_grad_(False)
    return model.to(dtype)


def make_optimizer(name, params):
    params = [p for p in params if p.requires_grad]
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9)
    return torch.optim.Adam(params, lr=0.01)


def train_three_ways(
    kind, sizes, cap_mb, opt_name, steps, per_rank, dtype=torch.float32
):
    """Train MyDDP, PyTorch DDP and, except for "bn", one process on the whole batch.

    Returns (max |MyDDP - single|, max |MyDDP - DDP|, number of buckets).

    MyDDP and DDP sum the same numbers in the same order, so they agree to the
    last bits in any dtype. One process on the whole batch sums them in
    another order; Adam divides by sqrt(v), which turns a rounding difference
    in a near-zero float32 gradient into a visible difference in the weight.
    The whole-batch comparison is therefore exact in float64 (and in float32
    with SGD), which is what the tests assert.
    """
    from mylib import MyDDP

    rank, world = dist.get_rank(), dist.get_world_size()
    # Ranks start from *different* weights: MyDDP must broadcast rank 0's.
    mine = MyDDP(build(kind, sizes, rank, dtype), bucket_cap_mb=cap_mb)
    theirs = nn.parallel.DistributedDataParallel(
        build(kind, sizes, rank, dtype), bucket_cap_mb=max(cap_mb, 1e-6)
    )
    single = build(kind, sizes, 0, dtype)
    opts = [make_optimizer(opt_name, m.parameters()) for m in (mine, theirs, single)]
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    for x, y in global_batches(steps, per_rank * world, sizes, dtype=dtype):
        for model, opt in zip((mine, theirs, single), opts):
            opt.zero_grad()
            xs, ys = (x, y) if model is single else (x[lo:hi], y[lo:hi])
            nn.functional.mse_loss(model(xs), ys).backward()
            if model is mine:
                model.finish_gradient_sync()
            opt.step()
    single_diff = float("nan") if kind == "bn" else max_param_diff(mine.module, single)
    return single_diff, max_param_diff(mine.module, theirs.module), len(mine.buckets)
