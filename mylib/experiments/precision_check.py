"""Chapter 6: what PyTorch's mixed-precision setups keep and send, measured.

The ZeRO paper counts 2 + 2 + 12 bytes per parameter: 16-bit parameters and
gradients, an fp32 master copy, momentum and variance. PyTorch's setups keep
other dtypes, which :data:`mylib.models.memory.RECIPES` states:

* ``DDP + autocast``: the parameters stay fp32 (autocast casts them op by
  op), so their gradients are fp32, in ``.grad`` and again in DDP's fp32
  buckets, unless ``gradient_as_bucket_view=True`` makes ``.grad`` a view of
  the bucket; the all-reduce is fp32.
* ``FSDP2 bf16, reduce fp32`` (``MixedPrecisionPolicy(param_dtype=bfloat16,
  reduce_dtype=float32)``): the sharded fp32 parameters are the master copy,
  all-gathered in bf16; the gradients are reduce-scattered in fp32 and kept
  sharded in fp32.

:func:`precision_rank` runs one of them for two steps on the chapter's model
and reports, from the second step, the bytes this rank keeps (each storage
once; DDP's buckets are the storages its all-reduces send) and the bytes it
sends per collective and dtype, seen by a ``TorchDispatchMode`` as the
``c10d`` operations run, at the ring volumes of :mod:`mylib.comm`.
"""

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mylib.experiments.zero_check import (
    MEASURE,
    held_bytes,
    lm_loss,
    num_trainable,
    tiny_lm,
    token_batches,
)

PRECISION = dict(MEASURE, steps=2, bucket_cap_mb=25.0)
"""The chapter's measured model, two steps (DDP's buckets are rebuilt after one)."""

SETUPS = ("DDP + autocast", "DDP + autocast, bucket view", "FSDP2 bf16, reduce fp32")
"""The setups measured: keys of :data:`mylib.models.memory.RECIPES`."""


class Collectives(TorchDispatchMode):
    """Every floating-point ``c10d`` collective: its op, its dtype, bytes sent.

    Bytes sent by this rank with ring algorithms, as :mod:`mylib.comm` counts
    them: an all-reduce 2(n-1)/n of its buffer, a reduce-scatter (n-1)/n of
    its input, an all-gather (n-1) times its input shard. ``sent`` maps
    ``(op, dtype)`` to bytes; ``buffers`` holds the storages all-reduced
    (DDP's buckets).
    """

    OPS = {
        "c10d::allreduce_": "all_reduce",
        "c10d::_reduce_scatter_base_": "reduce_scatter",
        "c10d::_allgather_base_": "all_gather",
    }

    def __init__(self, world_size):
        super().__init__()
        self.n, self.sent, self.buffers = world_size, {}, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        op = self.OPS.get(func.name())
        tensors = [t for t in tree_leaves((args, kwargs)) if torch.is_tensor(t)]
        if op is None or not tensors[0].is_floating_point():
            return out  # DDP's bookkeeping broadcasts are int32
        n, first = self.n, tensors[0]
        if op == "all_reduce":
            nbytes = 2 * (n - 1) * first.numel() * first.element_size() / n
            storage = first.untyped_storage()
            self.buffers[storage.data_ptr()] = storage.nbytes()
        else:  # (output, input): the input is what this rank contributes
            given = tensors[1]
            nbytes = given.numel() * given.element_size() * (n - 1)
            if op == "reduce_scatter":
                nbytes /= n
        key = (op, str(first.dtype).replace("torch.", ""))
        self.sent[key] = self.sent.get(key, 0) + nbytes
        return out


def precision_rank(setup, config=PRECISION):
    """Run on every rank: train ``config`` under ``setup`` (one of :data:`SETUPS`).

    Returns ``psi`` and ``root_params`` (the trainable parameters outside the
    blocks), the dtypes of the parameters and gradients the optimizer sees,
    ``held`` (bytes of parameters, gradients and optimizer state this
    rank keeps after the second backward, DDP's buckets among the
    gradients) and ``sent`` (bytes sent in the second step, by op and dtype).
    """
    if setup not in SETUPS:
        raise ValueError(f"unknown setup {setup!r}; choose one of {SETUPS}")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_lm(config)
    psi = num_trainable(model)
    if setup.startswith("DDP"):
        wrapped = torch.nn.parallel.DistributedDataParallel(
            model,
            bucket_cap_mb=config["bucket_cap_mb"],
            gradient_as_bucket_view=setup.endswith("bucket view"),
        )
        autocast = True
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16, reduce_dtype=torch.float32
        )
        for block in model.blocks:
            fully_shard(block, mp_policy=policy)
        wrapped = fully_shard(model, mp_policy=policy)
        autocast = False
    opt = config["optimizer"](model.parameters(), lr=config["lr"])
    for step, tokens in enumerate(token_batches(config)):
        with Collectives(world) as seen:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = lm_loss(wrapped, tokens.chunk(world)[rank])
            loss.float().backward()
        if step == len(token_batches(config)) - 1:
            held = held_bytes(model, opt)
            grads = {
                _local(p.grad).untyped_storage().data_ptr()
                for p in model.parameters()
                if p.grad is not None
            }
            # DDP's buckets: gradient storages beside .grad, unless .grad is a view
            held["grads"] += sum(
                nbytes for ptr, nbytes in seen.buffers.items() if ptr not in grads
            )
            facts = {
                "psi": psi,
                # FSDP2's root unit: what is not in a block (not gathered again
                # in the backward: reshard_after_forward=None is False for it)
                "root_params": psi - num_trainable(model.blocks),
                "param_dtypes": sorted({str(p.dtype) for p in model.parameters()}),
                "grad_dtypes": sorted(
                    {
                        str(p.grad.dtype)
                        for p in model.parameters()
                        if p.grad is not None
                    }
                ),
                "held": held,
                "sent": seen.sent,
            }
        opt.step()
        opt.zero_grad()
    return facts


def _local(t):
    """This rank's part of ``t``: the local shard of FSDP2's DTensor, else ``t``."""
    return t.to_local() if hasattr(t, "to_local") else t


def precision_setups(setups=SETUPS, config=PRECISION):
    """Run on every rank: :func:`precision_rank` for each setup in turn."""
    return {setup: precision_rank(setup, config) for setup in setups}
