"""Exercise 2.4, reference solution."""

import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler


def train(model, optimizer, dataset, epochs, batch_size):
    """Train ``model`` on this rank's share of ``dataset`` for ``epochs`` epochs.

    ``dataset`` yields ``(index, x, y)``. Every rank reads a disjoint share,
    shuffled anew each epoch, and the gradients are averaged over the ranks
    after each backward. Returns the indices this rank read, one list per
    epoch, in the order it read them.
    """
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler)
    world = dist.get_world_size()
    read = []
    for epoch in range(epochs):
        # The bug: without this the sampler shuffles with seed + 0 every epoch.
        # It must come before the iteration starts: the DataLoader asks the
        # sampler for the epoch's order then.
        sampler.set_epoch(epoch)
        order = []
        for index, x, y in loader:
            optimizer.zero_grad()
            F.mse_loss(model(x), y).backward()
            for p in model.parameters():  # average the gradients over the ranks
                dist.all_reduce(p.grad)
                p.grad /= world
            optimizer.step()
            order += index.tolist()
        read.append(order)
    return read
