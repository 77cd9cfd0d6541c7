"""Checks for exercise 11: on real gloo ranks, against whole-batch torch.optim.Adam."""

import math

from _judge.checking import check, expect_equal, fail
from _judge.ranks import on_ranks

RANK_PRELOAD = (
    "torch.optim",
    "torch._dynamo",
)  # optimizers and DDP import them: once, before forking

PER_RANK = 4


def worker(ShardedAdam, steps, seed, tiny):
    import copy

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    if tiny:
        model = torch.nn.Linear(1, 1)  # 2 parameters
        n_in, n_out = 1, 1
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)
        )  # 66
        n_in, n_out = 5, 3
    whole = copy.deepcopy(model)
    opt = ShardedAdam(model.parameters(), lr=1e-2)
    opt_whole = torch.optim.Adam(whole.parameters(), lr=1e-2)
    for _ in range(steps):
        x, y = torch.randn(world * PER_RANK, n_in), torch.randn(world * PER_RANK, n_out)
        mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
        for p in model.parameters():  # DDP's averaging, done for you
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        opt.zero_grad()
        opt_whole.zero_grad()
        torch.nn.functional.mse_loss(whole(x), y).backward()
        opt_whole.step()
    diff = max(
        float((p - q).abs().max())
        for p, q in zip(model.parameters(), whole.parameters())
    )
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = torch.empty(world * flat.numel())
    dist.all_gather_into_tensor(everyone, flat)
    spread = float((everyone.view(world, -1) - flat).abs().max())
    sizes = {}
    for name in ("exp_avg", "exp_avg_sq"):
        value = getattr(opt, name, None)
        sizes[name] = (
            tuple(value.shape)
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
    return {"diff": diff, "spread": spread, "sizes": sizes, "numel": flat.numel()}


def run(sol, world, steps=3, seed=0, tiny=False):
    shown = (
        f"{world} ranks, {steps} steps of ShardedAdam(lr=1e-2) on "
        + (
            "Linear(1, 1) (2 parameters)"
            if tiny
            else "Linear(5, 7)-Tanh-Linear(7, 3) (66 parameters)"
        )
        + f", {PER_RANK} examples per rank"
    )
    results = on_ranks(worker, world, sol.ShardedAdam, steps, seed, tiny)
    for rank, r in enumerate(results):
        if r["diff"] > 1e-5:
            fail(
                f"on rank {rank} the weights differ from torch.optim.Adam "
                f"on the whole batch by up to {r['diff']:.3g}",
                input=shown,
            )
        if r["spread"] > 0:
            fail(
                f"rank {rank}'s weights differ from another rank's by "
                f"{r['spread']:.3g}: every rank must end with every updated slice",
                input=shown,
            )
    return shown, results


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
