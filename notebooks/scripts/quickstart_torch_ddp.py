"""Data-parallel training with PyTorch's DistributedDataParallel.

Start it with: torchrun --standalone --nproc-per-node=N quickstart_torch_ddp.py
With CUDA: NCCL, one GPU per process (N = the GPUs of the machine). Without:
gloo, N processes on the CPU. Rank 0 saves the model to model.pt.
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

GLOBAL_BATCH, EPOCHS = 64, 3  # the same global batch at any number of processes

# torchrun puts RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the
# environment; init_process_group reads them.
local_rank = int(os.environ["LOCAL_RANK"])
if torch.cuda.is_available():
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)  # every rank builds the same data and the same model
x = torch.randn(1024, 16)
data = TensorDataset(x, torch.sin(x.sum(dim=1, keepdim=True)))
model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
sampler = DistributedSampler(data, shuffle=True, seed=0)  # this rank's share
loader = DataLoader(data, batch_size=GLOBAL_BATCH // world, sampler=sampler)
for epoch in range(EPOCHS):
    sampler.set_epoch(epoch)  # a new shuffle each epoch, the same on every rank
    for xb, yb in loader:
        loss = nn.functional.mse_loss(model(xb.to(device)), yb.to(device))
        opt.zero_grad()
        loss.backward()  # returns with the gradients averaged over the ranks
        opt.step()
if rank == 0:
    torch.save(model.module.state_dict(), "model.pt")
    print(f"rank 0 of {world} ({dist.get_backend()}): {EPOCHS} epochs, model.pt saved")
dist.destroy_process_group()
