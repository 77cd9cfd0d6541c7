"""The checks of chapter 4: gradient accumulation with ``no_sync()``.

An optimizer step over ``m`` micro-batches per rank: the first ``m - 1``
backward passes run inside ``model.no_sync()`` (gradients add up locally, no
communication), the last one outside it (its buckets are all-reduced, and
they hold the sum of all ``m`` micro-steps). With each micro-step's loss
divided by ``m``, the result is the gradient of the mean loss over all
``m x ranks`` micro-batches: one step on the whole batch.

:func:`accumulate` is that loop; it drives ``MyDDP`` and PyTorch's DDP
alike. The other functions run on every rank of a process group and are
what chapter 4 and ``tests/test_no_sync.py`` execute:

* :func:`accumulation_three_ways`: MyDDP with no_sync, PyTorch's DDP with its
  own no_sync, one process on the whole batch; the largest differences.
* :func:`bytes_per_optimizer_step`: bytes sent per optimizer step with and
  without no_sync (measured with :func:`mylib.comm.count_bytes`).
* :func:`loss_scaling_effects`: what dividing the loss by ``m`` (or the
  gradient at the end, or nothing) does to the gradient and to SGD and Adam.
* :func:`placements_both_ways`: a micro-step with its forward and its
  backward each inside or outside ``no_sync()``, on MyDDP and on PyTorch's
  DDP: which ones all-reduce (the forward decides, in both).
* :func:`gradient_sets`: how many full sets of gradients a rank holds between
  micro-steps, under DDP (``gradient_as_bucket_view``, ``zero_grad``'s
  ``set_to_none``) and under MyDDP.
"""

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from mylib import comm
from mylib.ddp import MyDDP
from mylib.experiments.common import global_batches, max_param_diff, mlp

SIZES = (12, 32, 32, 6)  # a small MLP: 12 inputs, two hidden layers of 32, 6 outputs
SCALINGS = ("divide_loss", "divide_grad", "none")


def make_model(seed=0, dtype=torch.float64):
    """The chapter's MLP (:data:`SIZES`, tanh between the layers), seeded."""
    return mlp(SIZES, seed=seed, dtype=dtype)


def my_micro_batches(x, y, micro_steps):
    """This rank's equal share of the batch, as ``micro_steps`` equal micro-batches."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if len(x) % (world * micro_steps):
        raise ValueError(
            f"a global batch of {len(x)} rows does not split into {world} ranks "
            f"x {micro_steps} equal micro-batches; equal shares are what make the "
            "average the whole-batch gradient"
        )
    return list(
        zip(
            x.chunk(world)[rank].chunk(micro_steps),
            y.chunk(world)[rank].chunk(micro_steps),
        )
    )


def accumulate(
    model, micro_batches, scaling="divide_loss", sync_every_micro_step=False
):
    """Backward over ``micro_batches`` for one optimizer step.

    Afterwards ``p.grad`` is averaged over ranks. The first ``m - 1`` backward
    passes run inside ``model.no_sync()`` (unless ``sync_every_micro_step``:
    then every one is all-reduced). ``scaling`` is ``divide_loss`` (each
    micro-step's loss / m), ``divide_grad`` (the summed gradient / m at the
    end) or ``none`` (the bug: a gradient m times too large). ``model`` is a
    MyDDP or PyTorch's DDP.
    """
    if scaling not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
    m = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        sync = sync_every_micro_step or i == m - 1
        # The forward goes inside too: PyTorch's DDP decides at forward time
        # whether the backward syncs.
        with contextlib.nullcontext() if sync else model.no_sync():
            loss = F.mse_loss(model(x), y)
            if scaling == "divide_loss":
                loss = loss / m
            loss.backward()
        if sync and isinstance(model, MyDDP):
            model.finish_gradient_sync()  # PyTorch's DDP waits inside backward()
    if scaling == "divide_grad":
        for p in model.parameters():
            p.grad.div_(m)


def accumulation_three_ways(
    micro_steps,
    steps=4,
    micro_batch=2,
    optimizer="adam",
    bucket_cap_mb=0.002,
    dtype=torch.float64,
):
    """On every rank: ``steps`` optimizer steps three ways.

    MyDDP and PyTorch's DDP each take ``micro_steps`` micro-batches of
    ``micro_batch`` rows per rank and step (no_sync on all but the last);
    one process takes the whole global batch at once. The replicas start
    from different weights: both DDPs must broadcast rank 0's. Returns a
    dict: ``vs_single`` and ``vs_ddp`` (largest parameter differences from
    MyDDP), and the all-reduces of one more accumulated step,
    ``my_allreduces`` and ``ddp_allreduces`` (a hook on PyTorch's DDP counts
    them), to set beside the number of ``buckets``: no_sync() really skipped
    the first micro-steps.
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = MyDDP(make_model(rank, dtype=dtype), bucket_cap_mb=bucket_cap_mb)
    theirs = nn.parallel.DistributedDataParallel(
        make_model(rank, dtype=dtype), bucket_cap_mb=max(bucket_cap_mb, 1e-6)
    )
    ddp_allreduces = []

    def counting_hook(state, bucket):  # PyTorch's default all-reduce, counted
        ddp_allreduces.append(bucket.index())
        return allreduce_hook(state, bucket)

    theirs.register_comm_hook(None, counting_hook)
    single = make_model(0, dtype=dtype)
    make_opt = {
        "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
        "sgd": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    }[optimizer]
    opts = [make_opt(m.parameters()) for m in (mine, theirs, single)]
    for x, y in global_batches(
        steps, micro_batch * micro_steps * world, SIZES, dtype=dtype
    ):
        for model, opt in zip((mine, theirs, single), opts):
            opt.zero_grad()
            if model is single:
                F.mse_loss(single(x), y).backward()
            else:
                accumulate(model, my_micro_batches(x, y, micro_steps))
            opt.step()
    out = {
        "vs_single": max_param_diff(mine.module, single),
        "vs_ddp": max_param_diff(mine.module, theirs.module),
        "buckets": len(mine.buckets),
    }
    # one more accumulation each, counted (DDP rebuilds its buckets after step 1)
    ddp_allreduces.clear()
    with comm.count_bytes() as stats:
        accumulate(mine, my_micro_batches(x, y, micro_steps))
    accumulate(theirs, my_micro_batches(x, y, micro_steps))
    out["my_allreduces"], out["ddp_allreduces"] = (
        stats.calls["all_reduce"],
        len(ddp_allreduces),
    )
    return out


def bytes_per_optimizer_step(micro_steps, bucket_cap_mb=0.002, micro_batch=2):
    """On every rank: bytes sent and all-reduces per optimizer step, no_sync or not.

    The step counted is the second (the first runs on the buckets MyDDP has
    before it knows the order gradients arrive in). Returns a dict:
    ``grad_bytes``, ``buckets``, and for ``no_sync`` and ``every_micro_step``
    the bytes sent, the all-reduce calls, and the largest difference of the
    averaged gradient from the whole-batch one.
    """
    world = dist.get_world_size()
    ((x, y),) = global_batches(
        1, micro_batch * micro_steps * world, SIZES, dtype=torch.float64
    )
    single = make_model(0)
    F.mse_loss(single(x), y).backward()
    out = {}
    for mode in ("no_sync", "every_micro_step"):
        model = MyDDP(make_model(0), bucket_cap_mb=bucket_cap_mb)
        # One step first: MyDDP, like PyTorch's DDP, rebuilds its buckets after
        # the first one. What is counted is a step after that.
        accumulate(model, my_micro_batches(x, y, micro_steps))
        model.zero_grad()
        with comm.count_bytes() as stats:
            accumulate(
                model,
                my_micro_batches(x, y, micro_steps),
                sync_every_micro_step=mode != "no_sync",
            )
        grad_diff = max(
            (p.grad - q.grad).abs().max().item()
            for p, q in zip(model.module.parameters(), single.parameters())
        )
        out[mode] = {
            "bytes": stats.by_op["all_reduce"],
            "allreduces": stats.calls["all_reduce"],
            "grad_diff": grad_diff,
        }
        out["grad_bytes"], out["buckets"] = (
            sum(b.nbytes for b in model.buckets),
            len(model.buckets),
        )
    return out


def loss_scaling_effects(micro_steps, steps=5, micro_batch=2):
    """On every rank: what each loss scaling does to the gradient, to SGD and to Adam.

    Returns ``{scaling: {"grad_ratio", "grad_diff", "sgd_diff", "adam_diff"}}``:
    the ratio of gradient norms (accumulated / whole batch) and the largest
    gradient difference on the first step, and the largest parameter
    difference from whole-batch training after ``steps`` steps of SGD and
    of Adam.
    """
    world = dist.get_world_size()
    batches = global_batches(
        steps, micro_batch * micro_steps * world, SIZES, dtype=torch.float64
    )
    out = {}
    for scaling in SCALINGS:
        row = {}
        for name, make_opt in (
            ("sgd", lambda ps: torch.optim.SGD(ps, lr=0.05)),
            ("adam", lambda ps: torch.optim.Adam(ps, lr=0.01)),
        ):
            model, single = MyDDP(make_model(0)), make_model(0)
            opt, opt1 = make_opt(model.parameters()), make_opt(single.parameters())
            for step, (x, y) in enumerate(batches):
                opt.zero_grad()
                opt1.zero_grad()
                accumulate(model, my_micro_batches(x, y, micro_steps), scaling=scaling)
                F.mse_loss(single(x), y).backward()
                if step == 0 and name == "sgd":
                    mine = torch.cat(
                        [p.grad.flatten() for p in model.module.parameters()]
                    )
                    whole = torch.cat([p.grad.flatten() for p in single.parameters()])
                    row["grad_ratio"] = (mine.norm() / whole.norm()).item()
                    row["grad_diff"] = (mine - whole).abs().max().item()
                opt.step()
                opt1.step()
            row[f"{name}_diff"] = max_param_diff(model.module, single)
        out[scaling] = row
    return out


PLACEMENTS = {
    "forward and backward inside": (True, True),
    "forward outside, backward inside": (False, True),
    "forward inside, backward outside": (True, False),
    "forward and backward outside": (False, False),
}
"""Where a micro-step's forward and backward run: (forward inside, backward inside)."""


def micro_step(model, x, y, forward_inside, backward_inside, scale=1.0):
    """One micro-step, its forward and its backward each inside no_sync() or not.

    Returns the buckets the backward launched (``model.buckets_launched``, set
    by :func:`counting_hook`); a MyDDP that launched some is then finished.
    """
    model.buckets_launched = []
    with model.no_sync() if forward_inside else contextlib.nullcontext():
        loss = F.mse_loss(model(x), y) * scale
    with model.no_sync() if backward_inside else contextlib.nullcontext():
        loss.backward()
    if isinstance(model, MyDDP) and model.buckets_launched:
        model.finish_gradient_sync()
    return model.buckets_launched


def counting_hook(model, bucket):
    """PyTorch's default all-reduce, noting each bucket and its buffer on ``model``."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    model.buckets_launched.append(bucket.index())
    storage = bucket.buffer().untyped_storage()
    model.bucket_storages[storage.data_ptr()] = storage.nbytes()
    return allreduce_hook(None, bucket)


def _counted(model):
    model.buckets_launched, model.bucket_storages = [], {}
    model.register_comm_hook(model, counting_hook)
    return model


def placements_both_ways(micro_batch=2, bucket_cap_mb=0.002):
    """On every rank: one micro-step per placement, on MyDDP and on PyTorch's DDP.

    For each of :data:`PLACEMENTS`, from the same weights: ``zero_grad()``, one
    micro-step placed so, then the last micro-step, outside ``no_sync()``.
    Returns ``{placement: {...}}`` with the buckets each all-reduced in the
    placed micro-step's backward (``"mine"``, ``"ddp"``; a counting
    communication hook on both) and the largest gradient differences between
    the two after it (``diff_after_placed``) and at the end (``diff_at_end``);
    and ``buckets``, how many each has.
    """
    world = dist.get_world_size()
    ((x, y),) = global_batches(1, 2 * micro_batch * world, SIZES, dtype=torch.float64)
    micro = my_micro_batches(x, y, 2)
    mine = _counted(MyDDP(make_model(0), bucket_cap_mb=bucket_cap_mb))
    theirs = _counted(
        nn.parallel.DistributedDataParallel(make_model(0), bucket_cap_mb=bucket_cap_mb)
    )
    for model in (mine, theirs):
        accumulate(model, micro)  # both rebuild their buckets after a first step
    out = {}
    for placement, (forward_inside, backward_inside) in PLACEMENTS.items():
        row, grads = {}, {}
        for name, model in (("mine", mine), ("ddp", theirs)):
            model.zero_grad()
            (x1, y1), (x2, y2) = micro
            row[name] = len(micro_step(model, x1, y1, *PLACEMENTS[placement], 0.5))
            placed = [p.grad.clone() for p in model.module.parameters()]
            micro_step(model, x2, y2, False, False, 0.5)
            grads[name] = placed, [p.grad.clone() for p in model.module.parameters()]
        for i, when in enumerate(("after_placed", "at_end")):
            row[f"diff_{when}"] = max(
                (a - b).abs().max().item()
                for a, b in zip(grads["mine"][i], grads["ddp"][i])
            )
        out[placement] = row
    out["buckets"] = len(mine.buckets)
    return out


GRADIENT_SETUPS = ("DDP", "DDP, gradient_as_bucket_view=True", "MyDDP")
"""The setups :func:`gradient_sets` measures, each with both ``set_to_none``."""


def gradient_sets(micro_steps=3, bucket_cap_mb=0.002, steps=3, micro_batch=2):
    """On every rank: the full sets of gradients held during accumulation, measured.

    Each setup of :data:`GRADIENT_SETUPS` trains ``steps`` accumulated steps,
    with ``zero_grad(set_to_none=True)`` (the default) or ``False``. In the
    last step (the buckets were rebuilt before the second) it counts the bytes
    of the gradient storages alive, each storage once (``.grad`` tensors, and
    the bucket buffers a counting communication hook found in the step before),
    after the micro-steps inside ``no_sync()`` and after the synchronised
    backward, as a multiple of the model's gradient bytes. Returns
    ``{(setup, set_to_none): {"inside_no_sync", "after_sync", "grad_bytes"}}``.
    """
    world = dist.get_world_size()
    batches = global_batches(
        steps, micro_batch * micro_steps * world, SIZES, dtype=torch.float64
    )
    out = {}
    for setup in GRADIENT_SETUPS:
        for set_to_none in (True, False):
            if setup == "MyDDP":
                model = MyDDP(make_model(0), bucket_cap_mb=bucket_cap_mb)
            else:
                model = nn.parallel.DistributedDataParallel(
                    make_model(0),
                    bucket_cap_mb=bucket_cap_mb,
                    gradient_as_bucket_view=setup.endswith("True"),
                )
            model = _counted(model)
            params = list(model.module.parameters())
            grad_bytes = sum(p.numel() * p.element_size() for p in params)

            def sets_held():
                held = dict(model.bucket_storages)  # the buckets live throughout
                for p in params:
                    if p.grad is not None:
                        storage = p.grad.untyped_storage()
                        held[storage.data_ptr()] = storage.nbytes()
                return sum(held.values()) / grad_bytes

            for x, y in batches:
                model.zero_grad(set_to_none=set_to_none)
                *first, (x_last, y_last) = my_micro_batches(x, y, micro_steps)
                for xs, ys in first:
                    micro_step(model, xs, ys, True, True, 1 / micro_steps)
                inside = sets_held()
                model.bucket_storages.clear()  # a rebuild replaces the buckets
                micro_step(model, x_last, y_last, False, False, 1 / micro_steps)
            out[setup, set_to_none] = {
                "inside_no_sync": inside,
                "after_sync": sets_held(),
                "grad_bytes": grad_bytes,
            }
    return out
