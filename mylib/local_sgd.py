"""Chapter 7. Local SGD: average the parameters every H steps, not the gradients.

Synchronous data parallelism all-reduces the gradients at every step, so the
ranks never differ. Local SGD lets each rank take ``H`` optimizer steps on its
own data, then averages the *parameters* over the ranks (one all-reduce of
the whole model) and starts again from the average. Communication falls by a
factor ``H``; the price is that the ranks drift apart between averages, so a
step is worth a little less (Stich 2019; Lin et al. 2020, who start with
synchronous steps and switch to local SGD later: "post-local SGD").

With ``H = 1`` and plain SGD it *is* synchronous data parallelism: every
rank starts a step from the same ``w``, and

    mean_r (w - lr g_r) = w - lr mean_r g_r.

Usage, on every rank::

    local = LocalSGD(model, optimizer, sync_every=8)
    for x, y in my_shard:
        loss_fn(model(x), y).backward()
        local.step()              # optimizer.step(), and every 8th call an average
        optimizer.zero_grad()

PyTorch's equivalent is
``torch.distributed.algorithms.model_averaging.averagers.PeriodicModelAverager``
(with ``period=H, warmup_steps=H - 1`` it averages after the same steps).
"""

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from mylib import comm


class LocalSGD:
    """Step ``optimizer`` locally; every ``sync_every`` steps, average the parameters.

    Averaging replaces each of ``module``'s parameters by its mean over ranks.
    Rank 0's parameters are broadcast at construction, so the ranks start
    equal. Optimizer state (momentum, Adam's moments) stays local, as in
    PyTorch's model averaging. ``averages`` counts the averages so far.
    """

    def __init__(self, module, optimizer, sync_every, process_group=None):
        if not dist.is_initialized():
            raise RuntimeError(
                "LocalSGD needs a process group: build it inside mylib.run_ranks(...) "
                "or after dist.init_process_group()"
            )
        if not isinstance(sync_every, int) or sync_every < 1:
            raise ValueError(
                f"sync_every must be a whole number of steps >= 1, got {sync_every!r} "
                "(1 averages after every step, like synchronous data parallelism)"
            )
        self.module, self.optimizer, self.sync_every = module, optimizer, sync_every
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.local_steps, self.averages = 0, 0
        self.params = [p for p in module.parameters() if p.requires_grad]
        src = dist.get_global_rank(process_group, 0) if process_group is not None else 0
        with torch.no_grad():
            for p in module.parameters():
                comm.broadcast(p.data, src=src, group=process_group)

    def step(self):
        """One local optimizer step; the parameters are averaged after every H-th."""
        self.optimizer.step()
        self.local_steps += 1
        if self.local_steps % self.sync_every == 0:
            self.average_parameters()

    @torch.no_grad()
    def average_parameters(self):
        """Replace every rank's parameters with their mean (one all-reduce, flat)."""
        if self.world_size == 1:
            return
        flat = _flatten_dense_tensors([p.data for p in self.params])
        flat.div_(self.world_size)
        comm.all_reduce(flat, group=self.process_group)
        averaged = _unflatten_dense_tensors(flat, [p.data for p in self.params])
        for p, mean in zip(self.params, averaged):
            p.data.copy_(mean)
        self.averages += 1


def bytes_per_step(param_bytes, world_size, sync_every):
    """Bytes one rank sends per optimizer step, averaged over a period.

    ``2(n-1)/n x P / H``: one ring all-reduce of the ``P`` parameter bytes
    every ``H`` steps.
    """
    if sync_every < 1 or world_size < 1:
        raise ValueError(
            "need sync_every >= 1 and world_size >= 1, "
            f"got {sync_every} and {world_size}"
        )
    return 2 * (world_size - 1) / world_size * param_bytes / sync_every


def stale_gradient_sgd(model, batches, lr, delay, loss_fn):
    """Asynchronous SGD as the parameters see it: gradients ``delay`` steps old.

    With ``n`` workers pushing gradients to a parameter server in turn, a
    worker's gradient was computed on parameters that ``n - 1`` others have
    updated since (Dean et al. 2012; Hogwild!, Niu et al. 2011). Nobody waits
    for a straggler; the price is staleness. One process plays it out: the
    gradient applied at step ``t`` is computed on the parameters of step
    ``t - delay`` (the first ``delay`` steps use the initial parameters).
    Returns the loss of each step's batch at the current parameters.
    """
    from torch.func import functional_call

    if delay < 0:
        raise ValueError(f"delay must be >= 0 steps, got {delay}")
    names = [name for name, _ in model.named_parameters()]
    history = [[p.detach().clone() for p in model.parameters()]]
    losses = []
    for x, y in batches:
        # The parameters as they were ``delay`` steps ago (or at the start).
        then = history[max(0, len(history) - 1 - delay)]
        stale = {name: p.clone().requires_grad_() for name, p in zip(names, then)}
        loss = loss_fn(functional_call(model, stale, (x,)), y)
        grads = torch.autograd.grad(loss, list(stale.values()))
        with torch.no_grad():
            losses.append(loss_fn(model(x), y).item())
            for p, g in zip(model.parameters(), grads):
                p.add_(g, alpha=-lr)
        history.append([p.detach().clone() for p in model.parameters()])
        del history[: -(delay + 1)]  # only the last delay + 1 versions are needed
    return losses
