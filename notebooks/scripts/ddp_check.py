"""The classic DDP check: MyDDP and PyTorch's DDP both train like one process.

Start it with: torchrun --standalone --nproc-per-node=2 ddp_check.py

Every rank trains three copies of a small MLP for 3 SGD steps on the same
global batches: MyDDP and PyTorch's DistributedDataParallel on this rank's
share of each batch, starting from this rank's own random weights (the
wrappers must broadcast rank 0's), and one process's model on the whole batch.
Rank 0 prints what MyDDP did; every rank asserts that both wrappers end with
the weights of one process. Float64, so that summing the same numbers in
another order changes nothing visible.
"""

import torch
import torch.distributed as dist
from torch import nn

from mylib import MyDDP, init_from_env

STEPS, PER_RANK, CAP_MB = 3, 4, 0.005  # a 5 KB cap: three buckets

rank, world, device = init_from_env()
torch.set_default_dtype(torch.float64)


def build(seed):
    torch.manual_seed(seed)
    layers = [nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


mine = MyDDP(build(seed=rank).to(device), bucket_cap_mb=CAP_MB)
theirs = nn.parallel.DistributedDataParallel(
    build(seed=rank).to(device),
    device_ids=[device.index] if device.type == "cuda" else None,
    bucket_cap_mb=CAP_MB,
)
single = build(seed=0).to(device)
models = (mine, theirs, single)
opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
data = torch.Generator().manual_seed(1)  # the same global batches on every rank
shard = slice(rank * PER_RANK, (rank + 1) * PER_RANK)  # this rank's share
launched = []
for step in range(STEPS):
    x = torch.randn(world * PER_RANK, 16, generator=data).to(device)
    y = torch.randn(world * PER_RANK, 4, generator=data).to(device)
    for model, opt in zip(models, opts):
        opt.zero_grad()
        xs, ys = (x, y) if model is single else (x[shard], y[shard])
        nn.functional.mse_loss(model(xs), ys).backward()
        if model is mine:
            launched.append(mine.allreduces_in_backward)
            mine.finish_gradient_sync()
        opt.step()


def max_diff(a, b):
    return max(
        (p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters())
    )


worst = torch.tensor(
    [max_diff(mine.module, single), max_diff(theirs.module, single)], device=device
)
dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # the worst rank's, on every rank
mine_diff, ddp_diff = worst.tolist()
match = mine_diff < 1e-12 and ddp_diff < 1e-12
if rank == 0:
    print(f"{world} ranks on {device.type}, {STEPS} SGD steps")
    n = len(mine.buckets)
    print(f"MyDDP: {n} buckets, all-reduces launched during each backward: {launched}")
    print(f"max |MyDDP - one process| = {mine_diff:.1e}")
    print(f"max |DDP   - one process| = {ddp_diff:.1e}")
    print(f"both match one process: {match}")
dist.destroy_process_group()
assert match, f"MyDDP or DDP differs from one process: {mine_diff}, {ddp_diff}"
