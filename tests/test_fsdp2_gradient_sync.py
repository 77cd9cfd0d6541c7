"""Chapter 4's "In practice": FSDP2 has no ``no_sync()``; it has a per-module flag.

``fully_shard`` (FSDP2) turns gradient reduction off with
``FSDPModule.set_requires_gradient_sync(False)``, which its docstring calls "the
equivalence of ``no_sync`` in FSDP1". Checked on the installed torch, on CPU
with gloo: the method exists and ``no_sync`` does not; with the flag off the
sharded gradients do not appear (nothing was reduce-scattered), and the one
synchronised backward after them gives the whole batch's gradient.
"""

import inspect

import torch
import torch.distributed as dist

from mylib import run_ranks


def test_fsdp2_has_set_requires_gradient_sync_and_no_no_sync():
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    assert not hasattr(FSDPModule, "no_sync")
    assert hasattr(FullyShardedDataParallel, "no_sync")  # FSDP1 keeps it
    params = inspect.signature(FSDPModule.set_requires_gradient_sync).parameters
    assert list(params) == ["self", "requires_gradient_sync", "recurse"]
    assert params["recurse"].default is True
    # With HSDP, set_requires_all_reduce(False) skips only the all-reduce.
    assert hasattr(FSDPModule, "set_requires_all_reduce")


def _accumulate_without_sync(micro_steps):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    reference = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2))
    reference.load_state_dict(model.state_dict())
    mesh = init_device_mesh("cpu", (n,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randn(2 * n, 4, generator=gen) for _ in range(micro_steps)]
    sharded_grad_seen = []
    for i, x in enumerate(batches):
        model.set_requires_gradient_sync(i == micro_steps - 1)
        (model(x.chunk(n)[rank]).sum() / micro_steps).backward()
        sharded_grad_seen.append(all(p.grad is not None for p in model.parameters()))
    for x in batches:  # the whole global batch in one process, mean over ranks
        (reference(x).sum() / (n * micro_steps)).backward()
    diff = max(
        (p.grad.full_tensor() - q.grad).abs().max().item()
        for p, q in zip(model.parameters(), reference.parameters())
    )
    return sharded_grad_seen, diff


def test_set_requires_gradient_sync_false_accumulates_then_syncs_once():
    for seen, diff in run_ranks(
        _accumulate_without_sync, 2, args=(3,), show_output=False
    ):
        assert seen == [False, False, True]  # reduce-scattered on the last only
        assert diff < 1e-6
