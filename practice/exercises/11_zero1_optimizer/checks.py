"""Checks for exercise 6.2: on real gloo ranks, against whole-batch torch.optim.Adam.

The ranks send back their weights; Adam on the whole batch runs here, in the
judge, and every difference is computed here.
"""

import math

from _judge.checking import check, expect_equal, fail
from _judge.ranks import on_ranks

RANK_PRELOAD = (
    "torch.optim",
    "torch._dynamo",
)  # optimizers and DDP import them: once, before forking

PER_RANK = 4


def make_model(seed, tiny):
    import torch

    torch.manual_seed(seed)
    if tiny:
        return torch.nn.Linear(1, 1), 1, 1  # 2 parameters
    model = torch.nn.Sequential(
        torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)
    )  # 66
    return model, 5, 3


def batches(seed, tiny, world, steps):
    """Every step's whole batch, the same wherever it is drawn."""
    import torch

    _, n_in, n_out = make_model(seed, tiny)
    g = torch.Generator().manual_seed(1000 + seed)
    return [
        (
            torch.randn(world * PER_RANK, n_in, generator=g),
            torch.randn(world * PER_RANK, n_out, generator=g),
        )
        for _ in range(steps)
    ]


def worker(ShardedAdam, steps, seed, tiny):
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    model, _, _ = make_model(seed, tiny)
    opt = ShardedAdam(model.parameters(), lr=1e-2)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    for x, y in batches(seed, tiny, world, steps):
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        for p in model.parameters():  # DDP's averaging, done for you
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        opt.zero_grad()
    sizes = {}
    for name in ("exp_avg", "exp_avg_sq"):
        value = getattr(opt, name, None)
        sizes[name] = (
            tuple(value.shape)
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
    return {"params": [p.detach() for p in model.parameters()], "sizes": sizes}


def whole_batch(steps, seed, tiny, world):
    """torch.optim.Adam on the whole batch, in one process: the final weights."""
    import torch

    whole, _, _ = make_model(seed, tiny)
    opt = torch.optim.Adam(whole.parameters(), lr=1e-2)
    for x, y in batches(seed, tiny, world, steps):
        opt.zero_grad()
        torch.nn.functional.mse_loss(whole(x), y).backward()
        opt.step()
    return [p.detach() for p in whole.parameters()]


def run(sol, world, steps=3, seed=0, tiny=False):
    from _judge.ranks import max_diff

    shown = (
        f"{world} ranks, {steps} steps of ShardedAdam(lr=1e-2) on "
        + (
            "Linear(1, 1) (2 parameters)"
            if tiny
            else "Linear(5, 7)-Tanh-Linear(7, 3) (66 parameters)"
        )
        + f", {PER_RANK} examples per rank"
    )
    expected = whole_batch(steps, seed, tiny, world)  # here, before the ranks run
    results = on_ranks(worker, world, sol.ShardedAdam, steps, seed, tiny)
    for rank, r in enumerate(results):
        diff = max_diff(r["params"], expected)
        if diff > 1e-5:
            fail(
                f"on rank {rank} the weights differ from torch.optim.Adam "
                f"on the whole batch by up to {diff:.3g}",
                input=shown,
            )
        spread = max_diff(r["params"], results[0]["params"])
        if spread > 0:
            fail(
                f"rank {rank}'s weights differ from rank 0's by "
                f"{spread:.3g}: every rank must end with every updated slice",
                input=shown,
            )
    r0 = results[0]["params"]
    return shown, [{**r, "numel": sum(p.numel() for p in r0)} for r in results]


@check("2 ranks: three steps equal torch.optim.Adam on the whole batch")
def two_ranks(sol):
    run(sol, 2)


@check("4 ranks: 66 parameters do not split evenly")
def four_ranks(sol):
    run(sol, 4, seed=1)


@check("each rank keeps Adam's moments for its own slice only")
def sharded_state(sol):
    shown, results = run(sol, 3, steps=1, seed=2)
    numel = results[0]["numel"]
    size = math.ceil(numel / 3)
    for rank, r in enumerate(results):
        owned = max(0, min((rank + 1) * size, numel) - min(rank * size, numel))
        expect_equal(
            r["sizes"],
            {"exp_avg": (owned,), "exp_avg_sq": (owned,)},
            input=shown,
            what=f"the shapes of rank {rank}'s exp_avg and exp_avg_sq",
        )


@check("3 ranks, 2 parameters: one rank owns nothing")
def empty_slice(sol):
    run(sol, 3, seed=3, tiny=True)


@check("1 rank: plain Adam")
def one_rank(sol):
    run(sol, 1, seed=4)
