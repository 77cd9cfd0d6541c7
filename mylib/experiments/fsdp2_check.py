"""Chapter 6: ``ShardedModel`` beside FSDP2's ``fully_shard``, with its two options.

Both take FSDP2's arguments: ``mp_policy`` (a ``MixedPrecisionPolicy``:
gather and compute in ``param_dtype``, reduce-scatter in ``reduce_dtype``,
fp32 shards as the master copy) and ``ignored_params`` (parameters left whole
on every rank, their gradients not averaged). :func:`train_both_ways` trains
the chapter's check model (:data:`mylib.experiments.zero_check.CHECK`) both
ways on the same data, from the same weights, and reports what each holds
and sends, so that chapter 6 and ``tests/test_zero3_fsdp2.py`` compare them.
"""

import torch
import torch.distributed as dist

from mylib import comm
from mylib.experiments.precision_check import Collectives
from mylib.experiments.zero_check import (
    CHECK,
    full_parameters,
    lm_loss,
    param_groups,
    tiny_lm,
    token_batches,
)
from mylib.zero3 import MixedPrecisionPolicy, ShardedModel

POLICIES = {
    "fp32": {},
    "bf16, reduce fp32": {"param_dtype": torch.bfloat16, "reduce_dtype": torch.float32},
    "bf16": {"param_dtype": torch.bfloat16},
}
"""The policies compared, as ``MixedPrecisionPolicy`` keyword arguments."""

WAYS = ("ShardedModel", "fully_shard")


def block_norms(model):
    """The parameters chapter 6 leaves to FSDP: every block's LayerNorm (64 each)."""
    return {p for block in model.blocks for p in block.norm.parameters()}


def wrap(way, model, policy, ignored=()):
    """``model`` sharded by ``way`` (one of :data:`WAYS`): a unit per block."""
    if way == "ShardedModel":
        return ShardedModel(
            model,
            unit_modules=list(model.blocks),
            mp_policy=MixedPrecisionPolicy(**policy),
            ignored_params=ignored,
        )
    from torch.distributed.fsdp import MixedPrecisionPolicy as TorchPolicy
    from torch.distributed.fsdp import fully_shard

    options = {"mp_policy": TorchPolicy(**policy), "ignored_params": set(ignored)}
    for block in model.blocks:
        fully_shard(block, **options)
    return fully_shard(model, **options)


def average_ignored_gradients(model, ignored):
    """What the user must do for ``ignored_params``: average their gradients.

    On every rank in the model's order, not the set's (a set of tensors
    iterates by address, which differs from rank to rank).
    """
    world = dist.get_world_size()
    for p in model.parameters():
        if p in ignored and p.grad is not None:
            comm.all_reduce(p.grad)
            p.grad.div_(world)


def full_gradients(way, model, wrapped):
    """``{name: averaged gradient, whole}`` on this rank, after a backward.

    Gathered from the gradient shards: FSDP2's DTensors, ``ShardedModel``'s
    flat gradient shards. Ignored parameters (whole, not averaged) are left out.
    """
    if way == "fully_shard":
        return {
            name: p.grad.full_tensor().clone()
            for name, p in model.named_parameters()
            if p.grad is not None and hasattr(p.grad, "full_tensor")
        }
    full = {}
    for unit in wrapped.units:
        for flat in unit.flats:
            if flat.grad_shard is not None:
                full.update(flat.full_copies(flat.grad_shard))
    return {name: full[p] for name, p in model.named_parameters() if p in full}


def train_rank(way, policy_name, config=CHECK, ignore_norms=False):
    """Run on every rank: train ``config`` wrapped by ``way`` under a policy.

    ``policy_name`` is a key of :data:`POLICIES`; ``ignore_norms`` leaves
    :func:`block_norms` to the user (who averages their gradients). Returns
    ``params`` (every parameter, whole, after the steps), ``sent`` (bytes by
    ``(op, dtype)`` in the last step, the ring volumes of :mod:`mylib.comm`,
    seen as the ``c10d`` operations run), ``grad_dtypes`` and
    ``param_dtypes`` (of what the optimizer sees), and ``ignored_grads``
    (this rank's gradients of the ignored parameters after the first
    backward, before the user averages them) and ``first_grads`` (the
    averaged gradients after the first backward, whole: :func:`full_gradients`).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_lm(config)
    ignored = block_norms(model) if ignore_norms else set()
    names = {p: name for name, p in model.named_parameters()}
    ignored_names = sorted(names[p] for p in ignored)
    groups = param_groups(model, config)  # before wrapping: ShardedModel flattens
    wrapped = wrap(way, model, POLICIES[policy_name], ignored)
    if way == "fully_shard":  # FSDP2 puts new parameters (DTensors) in the model
        groups = param_groups(model, config)
    opt = config["optimizer"](groups, lr=config["lr"])
    out = {"ignored_grads": None, "first_grads": None}
    for tokens in token_batches(config):
        with Collectives(world) as seen:
            lm_loss(wrapped, tokens.chunk(world)[rank]).backward()
        named = dict(model.named_parameters())
        if out["ignored_grads"] is None:
            out["ignored_grads"] = {n: named[n].grad.clone() for n in ignored_names}
            out["first_grads"] = full_gradients(way, model, wrapped)
        average_ignored_gradients(model, ignored)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        opt.step()
        opt.zero_grad()
    out["sent"] = seen.sent
    out["param_dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
    out["grad_dtypes"] = sorted({str(g.dtype) for g in grads})
    setup = "zero3" if way == "ShardedModel" else "torch-fsdp"
    out["params"] = full_parameters(setup, model, wrapped)
    return out


def train_both_ways(policy_names=tuple(POLICIES), config=CHECK, ignore_norms=False):
    """Run on every rank: :func:`train_rank` for both ways and each policy.

    Returns ``{(way, policy_name): result}``.
    """
    return {
        (way, name): train_rank(way, name, config, ignore_norms)
        for name in policy_names
        for way in WAYS
    }


def local_gradients(config=CHECK, dtype=torch.bfloat16):
    """Run on every rank: what the ranks sum, per parameter, before they reduce.

    Each rank's first-batch gradient, of a plain copy of the model in
    ``dtype`` (what a ``param_dtype=dtype`` policy computes on its gathered
    unit). Returns ``{name: (sum over ranks of |g| / N, mean of g)}`` in
    float64: the scale of a reduction's rounding, and the exact average.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_lm(config).to(dtype)
    lm_loss(model, token_batches(config)[0].chunk(world)[rank]).backward()
    out = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            both = torch.stack([p.grad.double().abs(), p.grad.double()])
            comm.all_reduce(both)
            out[name] = (both[0] / world, both[1] / world)
    return out
