"""Exercise 6.3, reference solution."""

import math
from collections import deque

import torch
import torch.distributed as dist

MAX_IN_FLIGHT = 2  # full flat gradients alive at once: one sent, one filling


class Zero2SGD:
    """SGD whose gradients are reduce-scattered from hooks, one parameter at a time."""

    def __init__(self, model, lr):
        self.lr = lr
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.shard_numel = {p: math.ceil(p.numel() / self.world) for p in self.params}
        self.grad_shards = {}  # param -> this rank's shard of its averaged gradient
        self._in_flight = deque()  # (param, shard, flat, work), oldest first
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._on_grad_ready)

    def _on_grad_ready(self, param):
        while len(self._in_flight) >= MAX_IN_FLIGHT:
            self._complete_oldest()  # frees its flat buffer before we make one
        size = self.shard_numel[param]
        flat = param.grad.new_zeros(size * self.world)
        torch.div(param.grad.reshape(-1), self.world, out=flat[: param.numel()])
        param.grad = None  # the point of ZeRO-2: no full gradient is kept
        shard = flat.new_empty(size)
        work = dist.reduce_scatter_single(shard, flat, async_op=True)
        self._in_flight.append((param, shard, flat, work))

    def _complete_oldest(self):
        param, shard, _flat, work = self._in_flight.popleft()
        work.wait()
        self.grad_shards[param] = shard

    @torch.no_grad()
    def step(self):
        while self._in_flight:
            self._complete_oldest()
        for p in self.params:
            size = self.shard_numel[p]
            full = p.new_zeros(size * self.world)
            full[: p.numel()] = p.reshape(-1)
            mine = full[self.rank * size : (self.rank + 1) * size].clone()
            mine -= self.lr * self.grad_shards[p]
            dist.all_gather_single(full, mine)
            p.copy_(full[: p.numel()].view_as(p))
        self.grad_shards = {}
