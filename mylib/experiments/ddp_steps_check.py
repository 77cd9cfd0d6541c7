"""Chapter 3's side-by-side check: the four steps of :mod:`mylib.ddp_steps` and MyDDP.

:func:`compare_steps` runs on every rank (through :func:`mylib.run_ranks`).
It trains the same MLP, from each rank's *own* random weights, wrapped in
each of the four steps and in :class:`mylib.MyDDP`, each rank on its share of
the batch; and, as references, PyTorch's ``DistributedDataParallel`` on the
same shares and one process on the whole batch. For each wrapper it returns
what chapter 3 prints side by side: how far its weights end from the two
references, how many all-reduces one step launches and how many of those
leave during the backward (counted by :func:`mylib.comm.count_bytes`, not
taken from the wrapper), the gradient bytes it copies per step, and its
step times, which :func:`time_ratios` sets against step 1's side by side.

:func:`static_graph_buckets` shows what PyTorch's ``static_graph=True``
changes in its bucketing: the buckets each step sends, with and without
``find_unused_parameters``.
"""

import statistics
import time

import torch
import torch.distributed as dist
from torch import nn

from mylib import comm
from mylib.ddp import MyDDP
from mylib.ddp_steps import (
    Step1AfterBackward,
    Step2PerParamHooks,
    Step3CatBuckets,
    Step4BucketViews,
)
from mylib.experiments.common import global_batches, max_param_diff, mlp
from mylib.figures.show import below

NAMES = (
    "1 after backward",
    "2 hook per parameter",
    "3 buckets, cat, copy back",
    "4 buckets, .grad views",
    "MyDDP",
)


def wrappers(bucket_cap_mb):
    """``(name, wrap)`` for the four steps and MyDDP, ``wrap(module)`` -> model."""
    cap = {"bucket_cap_mb": bucket_cap_mb}
    return list(
        zip(
            NAMES,
            (
                Step1AfterBackward,
                Step2PerParamHooks,
                lambda m: Step3CatBuckets(m, **cap),
                lambda m: Step4BucketViews(m, **cap),
                lambda m: MyDDP(m, **cap),
            ),
        )
    )


def compare_steps(
    sizes,
    *,
    steps=4,
    per_rank=8,
    bucket_cap_mb=25.0,
    dtype=torch.float64,
    lr=0.1,
    set_to_none=False,
):
    """Train each wrapper ``steps`` SGD steps; return one dict per wrapper.

    Each dict: ``name``; ``vs_single`` and ``vs_ddp`` (max |weight difference|
    at the end); per step, lists ``collectives`` (all-reduces launched),
    ``in_backward`` (of those, launched inside ``loss.backward()``),
    ``copied_bytes`` (gradient bytes copied), ``own`` (the wrapper's own
    ``(collectives, launched_in_backward)``, None for MyDDP) and ``step_s``;
    ``step_ms`` (median step time, the first step left out when there are
    more); ``n_params`` and ``n_buckets`` (None for steps 1 and 2);
    ``grad_bytes`` (one full set of gradients). ``set_to_none`` is passed to
    ``optimizer.zero_grad``.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    single = mlp(sizes, seed=0, dtype=dtype)
    ddp = nn.parallel.DistributedDataParallel(
        mlp(sizes, seed=rank, dtype=dtype), bucket_cap_mb=max(bucket_cap_mb, 1e-6)
    )
    # Every rank starts from its own weights: each wrapper must broadcast rank 0's.
    models = {
        name: wrap(mlp(sizes, seed=rank, dtype=dtype))
        for name, wrap in wrappers(bucket_cap_mb)
    }
    models.update(single=single, ddp=ddp)
    opts = {name: torch.optim.SGD(m.parameters(), lr=lr) for name, m in models.items()}
    records = {name: {k: [] for k in _RECORDED} for name in models}
    shard = slice(rank * per_rank, (rank + 1) * per_rank)
    for x, y in global_batches(steps, per_rank * world, sizes, dtype=dtype):
        # One step of every model in turn: the machine's drift hits them alike.
        for name, model in models.items():
            xs, ys = (x, y) if model is single else (x[shard], y[shard])
            _step(model, opts[name], xs, ys, set_to_none, records[name])
    rows = []
    for name, _ in wrappers(bucket_cap_mb):
        model, row = models[name], records[name]
        timed = row["step_s"][1:] or row["step_s"]
        params = [p for p in model.module.parameters() if p.requires_grad]
        buckets = getattr(model, "buckets", None)
        row.update(
            name=name,
            vs_single=max_param_diff(model.module, single),
            vs_ddp=max_param_diff(model.module, ddp.module),
            step_ms=statistics.median(timed) * 1e3,
            n_params=len(params),
            n_buckets=None if buckets is None else len(buckets),
            grad_bytes=sum(comm.nbytes(p) for p in params),
        )
        rows.append(row)
    return rows


_RECORDED = ("collectives", "in_backward", "copied_bytes", "own", "step_s")


def _step(model, opt, x, y, set_to_none, record):
    """One SGD step of ``model``; appends what it launched, copied and took."""
    start = time.perf_counter()
    opt.zero_grad(set_to_none=set_to_none)
    copies = _mylib_copies(model) if isinstance(model, MyDDP) else 0
    loss = nn.functional.mse_loss(model(x), y)
    with comm.count_bytes() as during_backward:
        loss.backward()
    with comm.count_bytes() as after:
        if hasattr(model, "finish_gradient_sync"):
            model.finish_gradient_sync()
    opt.step()
    record["step_s"].append(time.perf_counter() - start)
    launched = during_backward.calls["all_reduce"]
    record["in_backward"].append(launched)
    record["collectives"].append(launched + after.calls["all_reduce"])
    record["copied_bytes"].append(getattr(model, "copied_bytes", copies))
    counts = hasattr(model, "launched_in_backward")  # the four steps count
    record["own"].append(
        (model.collectives, model.launched_in_backward) if counts else None
    )


def _mylib_copies(model):
    """Bytes MyDDP's hooks will copy in this backward: each ``.grad`` not its view."""
    return sum(
        comm.nbytes(view)
        for bucket in model.buckets
        for p, view in zip(bucket.params, bucket.views)
        if p.grad is None or p.grad.data_ptr() != view.data_ptr()
    )


def time_ratios(rows, reference=NAMES[0]):
    """``{name: step time as a multiple of reference's}``, measured side by side.

    ``rows`` are :func:`compare_steps`'s on every rank. Per rank and step (the
    first left out), a wrapper's step over the reference's step of the same
    iteration, taken moments apart, so that the machine's load hits both alike;
    then the median over every rank's steps. Steadier than a ratio of medians
    on a shared machine.
    """
    k = [row["name"] for row in rows[0]].index(reference)
    return {
        row["name"]: statistics.median(
            mine / theirs
            for ranks in rows
            for mine, theirs in zip(ranks[i]["step_s"][1:], ranks[k]["step_s"][1:])
        )
        for i, row in enumerate(rows[0])
    }


def table(rows):
    """The lines chapter 3 prints, from :func:`compare_steps`'s rows on every rank.

    Counts come from rank 0; differences are the worst over ranks; the time is
    :func:`time_ratios`'s, against step 1.
    """
    lines = [
        f"{'':25s} {'all-reduces':>16s} {'copied':>8s} {'max |diff| vs':>25s} "
        f"{'time vs':>8s}",
        f"{'step':25s} {'per step':>8s} {'in bwd':>7s} {'KiB/step':>8s} "
        f"{'1 proc':>12s} {'DDP':>12s} {'step 1':>8s}",
    ]
    ratios = time_ratios(rows)
    for i, row in enumerate(rows[0]):
        mine = [ranks[i] for ranks in rows]
        # rounding only: the bound the check asserts, not digits the CPU decides
        vs_single = below(max(r["vs_single"] for r in mine), 1e-12)
        vs_ddp = below(max(r["vs_ddp"] for r in mine), 1e-12)
        lines.append(
            f"{row['name']:25s} {row['collectives'][-1]:8d} "
            f"{row['in_backward'][-1]:7d} {row['copied_bytes'][-1] / 1024:8.0f} "
            f"{vs_single:>12s} {vs_ddp:>12s} "
            f"{ratios[row['name']]:8.2f}"
        )
    return lines


def static_graph_buckets(static_graph, find_unused_parameters, steps=4, cap_mb=0.005):
    """On every rank: the buckets PyTorch's DDP sends per step, and if it rebuilt.

    A 4-layer MLP of 32 units (about 17 KB of fp32 gradients) under
    ``DistributedDataParallel(..., bucket_cap_mb=cap_mb, static_graph=...,
    find_unused_parameters=...)``; a counting communication hook sees each
    bucket. Returns ``{"buckets": [per step], "rebuilt": bool}``, the latter
    DDP's own flag (``_has_rebuilt_buckets``, set when the rebuild happens,
    before a forward).
    """
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    sent = []

    def counting_hook(state, bucket):
        sent.append(bucket.index())
        return allreduce_hook(state, bucket)

    model = nn.parallel.DistributedDataParallel(
        mlp([32] * 5, seed=0),
        bucket_cap_mb=cap_mb,
        static_graph=static_graph,
        find_unused_parameters=find_unused_parameters,
    )
    model.register_comm_hook(None, counting_hook)
    per_step = []
    for x, _ in global_batches(steps, 4, [32] * 5):
        sent.clear()
        model(x).sum().backward()
        per_step.append(len(sent))
    return {"buckets": per_step, "rebuilt": model._has_rebuilt_buckets}
