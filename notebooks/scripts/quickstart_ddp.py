"""Train a small model with MyDDP.

Start it with: torchrun --standalone --nproc-per-node=N quickstart_ddp.py
"""

import torch
import torch.distributed as dist
from torch import nn

from mylib import MyDDP, init_from_env

rank, world, device = init_from_env()
torch.manual_seed(0)
model = MyDDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(rank)  # each rank draws its own data
for step in range(20):
    x = torch.randn(32, 16, generator=g).to(device)
    y = x.sum(dim=1, keepdim=True)
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    model.finish_gradient_sync()
    opt.step()
# Are the weights identical on every rank? The elementwise maximum over
# the ranks equals the minimum exactly when they are, and every rank
# learns the answer.
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
high, low = flat.clone(), flat.clone()
dist.all_reduce(high, op=dist.ReduceOp.MAX)
dist.all_reduce(low, op=dist.ReduceOp.MIN)
same = torch.equal(high, low)
if rank == 0:
    print(
        f"{world} ranks on {device.type}, 20 steps; "
        f"weights identical on every rank: {same}"
    )
dist.destroy_process_group()
assert same, "the ranks' weights differ: gradients were not synchronised"
