"""Chapter 2. Data parallelism by hand: equal replicas, averaged gradients.

Each rank holds a full copy of the model and a different slice of the batch.
Two calls keep the copies identical, step after step:

1. :func:`broadcast_parameters` once, before training: every rank takes
   rank 0's weights. Seeding every rank alike is not enough (any rank-dependent
   use of the random generator before the model is built breaks it), and
   averaged gradients never pull replicas that started apart back together.
2. :func:`average_gradients` after every ``backward()``: every rank gets the
   mean of all ranks' gradients. If every rank's loss is the *mean* over an
   equal share of the batch, that mean is exactly the gradient of the mean
   loss over the whole batch, so one optimizer step is the same on every rank
   and the same as one process training on the whole batch.

One all-reduce per parameter, after the backward pass: the simplest correct
version. Chapter 3's ``MyDDP`` sends the same bytes in buckets, overlapped
with the backward pass. The collectives come from :mod:`mylib.comm`, so
``count_bytes()`` sees them.
"""

import torch
import torch.distributed as dist

from mylib import comm


def broadcast_parameters(module, src=0, group=None):
    """Copy rank ``src``'s parameters and buffers to every rank, in place.

    Buffers too: BatchNorm's running statistics, for instance.
    """
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            comm.broadcast(tensor.data, src, group=group)


def average_gradients(module, group=None):
    """Replace each parameter's gradient by its mean over ``group``'s ranks.

    Every rank must call it after ``backward()`` and before
    ``optimizer.step()``. Every parameter that requires a gradient must have
    one on every rank: the ranks all-reduce the same tensors in the same
    order, and a rank that skipped one would leave the others waiting.
    """
    world = dist.get_world_size(group)
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        if param.grad is None:
            raise RuntimeError(
                f"parameter {name!r} has no gradient on rank "
                f"{dist.get_rank()}: it was not used in the loss. Freeze "
                f"it (param.requires_grad_(False)) or give it a zero "
                f"gradient, so that every rank all-reduces the same "
                f"tensors."
            )
        comm.all_reduce(param.grad, group=group)
        param.grad.div_(world)


def max_replica_difference(module, group=None):
    """Largest ``|w_rank - w_rank0|`` over all parameters and ranks.

    0.0 when the replicas are identical. Every rank calls it and gets the
    same number.
    """
    worst = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for param in module.parameters():
            if param.numel() == 0:
                continue
            reference = param.detach().clone()
            dist.broadcast(
                reference,
                dist.get_global_rank(group, 0) if group is not None else 0,
                group=group,
            )
            worst = torch.maximum(
                worst, (param.detach() - reference).abs().max().double()
            )
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return worst.item()
