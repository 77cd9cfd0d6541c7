"""Chapter 5's checks: mylib's compression hooks vs PyTorch's, and their properties.

Chapter 5 and ``tests/test_comm_hooks.py`` / ``tests/test_powersgd.py`` run
these functions, so what the book shows is what CI asserts. They run on
every rank of a process group (``mylib.run_ranks``).

* :func:`hooks_against_pytorch`: a few steps of MyDDP with a mylib hook,
  of PyTorch's DDP with PyTorch's hook, and of MyDDP with PyTorch's hook,
  from the same weights on the same data; the largest parameter difference,
  the bytes each step sent, and how far the first step's averaged gradient
  is from the exact average, in units of the wire format's rounding.
* :func:`mylib_hooks_on_pytorch_ddp`: the other way round.
* :func:`through_each_hook`: the ranges of fp16 and bf16.
* :func:`error_feedback_ledger`: PowerSGD's error feedback loses nothing.
* :func:`bucket_layouts`, :func:`ddp_bucket_bytes`: the buckets a hook sees.

What the hooks do to training is :mod:`mylib.experiments.compress_training`.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mylib import comm
from mylib.comm_hooks import HOOKS, WIRE_DTYPES, rounding_error_in_units
from mylib.ddp import MyDDP
from mylib.experiments.common import max_param_diff, mlp
from mylib.powersgd import PowerSGDState, powersgd_hook


def _torch_hook(name, **powersgd):
    """PyTorch's own hook and its state, for ``name`` in fp16, bf16, powersgd."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import (
        powerSGD_hook as torch_powersgd,
    )

    if name == "powersgd":
        return torch_powersgd.PowerSGDState(
            None, **powersgd
        ), torch_powersgd.powerSGD_hook
    hook = getattr(default_hooks, f"{name}_compress_hook")

    # DDP refuses a function *named* bf16_compress_hook unless the build has
    # CUDA or ROCm with NCCL >= 2.10, or XPU with XCCL; gloo sums bf16 fine, so
    # DDP gets PyTorch's very function under another name.
    def pytorch_hook(state, bucket):
        return hook(state, bucket)

    return None, pytorch_hook


def my_hook(name, **powersgd):
    """mylib's hook and its state, for ``name`` in fp16, bf16, powersgd.

    ``powersgd``: PowerSGDState's settings.
    """
    if name == "powersgd":
        return PowerSGDState(None, **powersgd), powersgd_hook
    return None, HOOKS[name]


def hooks_against_pytorch(
    name,
    steps=5,
    sizes=(12, 32, 32, 6),
    per_rank=4,
    bucket_cap_mb=25.0,
    lr=0.1,
    **powersgd,
):
    """On every rank: mylib's hook on MyDDP vs PyTorch's hook on DDP and on MyDDP.

    The models train with SGD in float32. ``name`` is fp16, bf16 or powersgd
    (``powersgd`` are PowerSGDState's settings, the same for both). Returns
    rank 0's view: the largest parameter difference to PyTorch's DDP and to
    PyTorch's hook on MyDDP after every step, the bytes MyDDP sent per step
    with this hook and with the default fp32 all-reduce, and (fp16/bf16) the
    first step's rounding error of MyDDP's and of DDP's averaged gradient, in
    units of the format's rounding (see
    :func:`mylib.comm_hooks.rounding_error_in_units`).

    PyTorch's hook on MyDDP gets the very same bucket, so it must agree to
    the bit. PyTorch's DDP orders its bucket by the order gradients arrived
    in its first step, and a ring sums an element in an order that depends
    on where it sits in the bucket, so there the two agree to a few
    roundings of the wire format.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    mine, plain = (
        MyDDP(mlp(sizes, seed=rank), bucket_cap_mb=bucket_cap_mb),
        MyDDP(mlp(sizes, seed=rank), bucket_cap_mb=bucket_cap_mb),
    )
    theirs = nn.parallel.DistributedDataParallel(
        mlp(sizes, seed=rank), bucket_cap_mb=bucket_cap_mb
    )
    borrowed = MyDDP(mlp(sizes, seed=rank), bucket_cap_mb=bucket_cap_mb)
    mine.register_comm_hook(*my_hook(name, **powersgd))
    theirs.register_comm_hook(*_torch_hook(name, **powersgd))
    borrowed.register_comm_hook(*_torch_hook(name, **powersgd))
    models = [mine, theirs, borrowed, plain]
    opts = [torch.optim.SGD(m.parameters(), lr=lr) for m in models]
    g = torch.Generator().manual_seed(1)
    out = {
        "vs_ddp": [],
        "vs_torch_hook_on_myddp": [],
        "bytes": [],
        "fp32_bytes": [],
        "rounding_units": None,
        "ddp_rounding_units": None,
    }
    for step in range(steps):
        x, y = (
            torch.randn(per_rank * world, sizes[0], generator=g),
            torch.randn(per_rank * world, sizes[-1], generator=g),
        )
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
        if step == 0 and name in WIRE_DTYPES:
            # every rank's own gradient, for the exact average
            local = mlp(sizes, seed=0)
            local.load_state_dict(mine.module.state_dict())
            F.mse_loss(local(xs), ys).backward()
            own = torch.cat([p.grad.flatten() for p in local.parameters()])
            everyone = [torch.empty_like(own) for _ in range(world)]
            dist.all_gather(everyone, own)  # the check's own traffic: not counted
        for model, opt in zip(models, opts):
            opt.zero_grad()
            with comm.count_bytes() as stats:
                F.mse_loss(model(xs), ys).backward()
                if isinstance(model, MyDDP):
                    model.finish_gradient_sync()
            if model is mine:
                out["bytes"].append(stats.bytes_sent)
            if model is plain:
                out["fp32_bytes"].append(stats.bytes_sent)
            if step == 0 and model in (mine, theirs) and name in WIRE_DTYPES:
                averaged = torch.cat(
                    [p.grad.flatten() for p in model.module.parameters()]
                )
                key = "rounding_units" if model is mine else "ddp_rounding_units"
                out[key] = rounding_error_in_units(
                    averaged, everyone, WIRE_DTYPES[name]
                )
            opt.step()
        out["vs_ddp"].append(max_param_diff(mine.module, theirs.module))
        out["vs_torch_hook_on_myddp"].append(
            max_param_diff(mine.module, borrowed.module)
        )
    return out


def mylib_hooks_on_pytorch_ddp(steps=5, sizes=(12, 32, 32, 6)):
    """On every rank: mylib's bf16 and PowerSGD hooks on PyTorch's DDP and on MyDDP.

    Both wrappers take the same steps. The contract is PyTorch's, so
    PyTorch's DDP runs mylib's hooks as they are. Returns the largest
    parameter difference between the two wrappers after ``steps`` SGD steps,
    per hook (one bucket each).
    """
    out = {}
    for name, settings in (
        ("bf16", {}),
        ("powersgd", dict(matrix_approximation_rank=2, start_powerSGD_iter=2)),
    ):
        models = [
            nn.parallel.DistributedDataParallel(mlp(sizes, seed=0)),
            MyDDP(mlp(sizes, seed=0)),
        ]
        for model in models:
            state, hook = my_hook(name, **settings)
            # DDP checks a hook's parameter names (state, bucket), and refuses one
            # named bf16_compress_hook on a build without CUDA/ROCm and NCCL.
            model.register_comm_hook(
                state, lambda state, bucket, hook=hook: hook(state, bucket)
            )
        opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
        g = torch.Generator().manual_seed(dist.get_rank())
        for _ in range(steps):
            x = torch.randn(4, sizes[0], generator=g)
            for model, opt in zip(models, opts):
                opt.zero_grad()
                model(x).pow(2).sum().backward()
                if isinstance(model, MyDDP):
                    model.finish_gradient_sync()
                opt.step()
        out[name] = max_param_diff(models[0].module, models[1].module)
    return out


def bucket_layouts(steps=2, sizes=(12, 32, 32, 6)):
    """On every rank: the parameters' order in the one bucket, each step.

    For PyTorch's DDP and for MyDDP, as a hook sees them
    (``bucket.parameters()``), by shape. DDP lays out its first step in
    registration order and rebuilds the bucket in the order the gradients
    arrived; MyDDP starts in the reverse of registration order, and rebuilds
    too. Returns ``{"DDP": [shapes per step], "MyDDP": [...]}``.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    from mylib.ddp import allreduce_average_hook

    out = {}
    for name, wrap, average in (
        ("DDP", nn.parallel.DistributedDataParallel, default_hooks.allreduce_hook),
        ("MyDDP", MyDDP, allreduce_average_hook),
    ):
        model, seen = wrap(mlp(sizes, seed=0)), []

        def hook(state, bucket, seen=seen, average=average):
            seen.append([tuple(p.shape) for p in bucket.parameters()])
            return average(state, bucket)

        model.register_comm_hook(None, hook)
        for _ in range(steps):
            model(torch.ones(2, sizes[0])).sum().backward()
            if isinstance(model, MyDDP):
                model.finish_gradient_sync()
        out[name] = seen
    return out


def ddp_bucket_bytes(find_unused_parameters=False, steps=3, layers=8, width=512):
    """On every rank: the bytes of each bucket PyTorch's DDP hands a hook, per step.

    A stack of ``Linear(width, width)`` (1 MiB and 2 KiB each, in fp32) under
    DDP's default cap (``bucket_cap_mb=None``: 25 MiB, first bucket 1 MiB).
    Returns one list per step, in the order the hook saw the buckets. DDP
    sends everything in one bucket in its first step and then rebuilds the
    buckets in the order the gradients arrived; with ``find_unused_parameters``
    it cuts the buckets at construction and never rebuilds them.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    ddp = nn.parallel.DistributedDataParallel(
        model, find_unused_parameters=find_unused_parameters
    )
    seen = []

    def hook(state, bucket):
        seen[-1].append(bucket.buffer().nbytes)
        return default_hooks.allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    for _ in range(steps):
        seen.append([])
        ddp(torch.ones(2, width)).sum().backward()
    return seen


def through_each_hook(scale):
    """On every rank: a gradient through the fp32, fp16 and bf16 hooks, one number each.

    The gradient is ``scale x (rank + 1)``, averaged by each hook. Shows the
    formats' ranges: fp16 flushes what is below its smallest subnormal (6e-8)
    to zero and overflows above 65504; bf16 has fp32's range.
    """
    out = {}
    for name, hook in (
        ("fp32", None),
        ("fp16", HOOKS["fp16"]),
        ("bf16", HOOKS["bf16"]),
    ):
        model = MyDDP(nn.Linear(3, 2, bias=False), bucket_cap_mb=0)
        if hook is not None:
            model.register_comm_hook(None, hook)
        (model(torch.ones(1, 3)).sum() * scale * (dist.get_rank() + 1)).backward()
        model.finish_gradient_sync()
        out[name] = model.module.weight.grad[0, 0].item()
    return out


def error_feedback_ledger(steps=8, rank=1, start=2):
    """On every rank: PowerSGD with error feedback loses nothing, it only delays.

    Each compressed step the hook sends ``g_t + e_{t-1}`` (this rank's
    gradient plus the error it kept) and everyone receives the same
    approximation ``A_t``; the rank keeps ``e_t = g_t + e_{t-1} - A_t``. Summed
    over the ``steps`` compressed steps this telescopes: ``sum A_t = sum g_t -
    e_T`` on every rank. They follow ``start`` plain steps, during which the
    buckets are rebuilt (as PyTorch, PowerSGD keeps its error per bucket, so it
    starts after that). Returns the largest gap between the two sides and the
    largest summed gradient (the scale).
    """
    torch.manual_seed(0)
    model = MyDDP(nn.Linear(16, 12))
    state = PowerSGDState(None, rank, start_powerSGD_iter=start)
    model.register_comm_hook(state, powersgd_hook)
    local = nn.Linear(16, 12)  # this rank's own gradient, for the ledger
    g = torch.Generator().manual_seed(dist.get_rank())
    applied = own = 0
    for step in range(start + steps):
        x = torch.randn(4, 16, generator=g)
        for p in [*model.parameters(), *local.parameters()]:
            p.grad = None
        model(x).pow(2).sum().backward()
        model.finish_gradient_sync()
        if step < start:  # plain all-reduce: no error kept, nothing to account
            continue
        local.load_state_dict(model.module.state_dict())
        local(x).pow(2).sum().backward()
        # the bucket holds bias, then weight (backward order)
        applied = applied + model.buckets[0].flat.clone()
        own = own + torch.cat([local.bias.grad, local.weight.grad.flatten()])
    return (
        applied - (own - state.error_dict[0])
    ).abs().max().item(), own.abs().max().item()
