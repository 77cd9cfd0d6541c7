"""Checks for exercise 2.5: on gloo ranks with PyTorch's DDP, step by step against
one process on the whole batch.

The ranks send back the weights after every step and the losses they log;
one process's training on each step's global batch (the mean over all real
tokens) is computed here, in the judge. PyTorch's DDP with the fix a real
project ships (this rank's sum over the global token count, times the number
of ranks, which DDP divides by) runs on ranks that load none of the reader's
code.
"""

from _judge.checking import check, expect_close, fail
from _judge.ranks import max_diff, on_ranks, reference_on_ranks, spread

RANK_PRELOAD = ("torch.optim", "torch._dynamo", "torch.nn.parallel")
ROWS, TOKENS, FEATURES = 2, 6, 4  # rows per rank per batch, tokens per row
BATCHES, EPOCHS = 4, 2  # batches per epoch: the last one is padded
# Real tokens per row in the padded last batch, per rank.
PADDED = {2: [5, 1], 3: [6, 2, 1]}


def make_data(world, seed):
    """Every step's batch on every rank: (x, target, mask) per rank."""
    import torch

    g = torch.Generator().manual_seed(300 + seed)
    steps = []
    for step in range(BATCHES * EPOCHS):
        per_rank = []
        for rank in range(world):
            x = torch.randn(ROWS, TOKENS, FEATURES, generator=g)
            target = torch.randn(ROWS, TOKENS, generator=g)
            mask = torch.ones(ROWS, TOKENS, dtype=torch.bool)
            if step % BATCHES == BATCHES - 1:  # the epoch's last batch: padded
                mask[:, PADDED[world][rank] :] = False
            per_rank.append((x, target, mask))
        steps.append(per_rank)
    return steps


def make_model(seed):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Linear(FEATURES, 1)


def worker(train, seed):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DDP(make_model(seed))
    history = []

    class Recorded(torch.optim.SGD):
        def step(self, *args, **kwargs):
            out = super().step(*args, **kwargs)
            history.append([p.detach().clone() for p in ddp.parameters()])
            return out

    mine = [per_rank[rank] for per_rank in make_data(world, seed)]
    logged = train(ddp, Recorded(ddp.parameters(), lr=0.1), mine)
    return {
        "history": history,
        "logged": list(logged) if isinstance(logged, (list, tuple)) else logged,
    }


def documented_train(ddp, optimizer, batches):
    """The fix open-instruct ships (PR #1161): each rank's sum of token losses over
    the global count of real tokens, times the number of ranks (DDP averages over
    them); the logged loss is the global mean. (torchtitan, PR #2206, divides by
    the same global count and sums the ranks' gradients instead of averaging.)"""
    import torch.distributed as dist

    world, logged = dist.get_world_size(), []
    for x, target, mask in batches:
        optimizer.zero_grad()
        errors = (ddp(x).squeeze(-1) - target) ** 2
        count = mask.sum().to(errors.dtype)
        dist.all_reduce(count)
        total = errors[mask].sum()
        (total / count * world).backward()
        optimizer.step()
        summed = total.detach().clone()
        dist.all_reduce(summed)
        logged.append(float(summed / count))
    return logged


def one_process(world, seed):
    """SGD on each step's global batch, the loss the mean over all real tokens:
    the weights after each step, and each step's loss."""
    import torch

    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history, losses = [], []
    for per_rank in make_data(world, seed):
        x = torch.cat([b[0] for b in per_rank])
        target = torch.cat([b[1] for b in per_rank])
        mask = torch.cat([b[2] for b in per_rank])
        opt.zero_grad()
        loss = ((model(x).squeeze(-1) - target) ** 2)[mask].mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        history.append([p.detach().clone() for p in model.parameters()])
    return history, losses


_results = {}


def results(sol, world):
    if world not in _results:
        seed = 4 + world
        expected = one_process(world, seed)
        theirs = reference_on_ranks(worker, world, documented_train, seed)
        _results[world] = (on_ranks(worker, world, sol.train, seed), expected, theirs)
    return _results[world]


def shown(world):
    return (
        f"{world} ranks, DistributedDataParallel(Linear({FEATURES}, 1)), "
        f"{EPOCHS} epochs of {BATCHES} batches of {ROWS} rows x {TOKENS} tokens per "
        f"rank; in each epoch's last batch the rows of rank 0, 1, ... hold "
        f"{', '.join(map(str, PADDED[world]))} real tokens; SGD lr=0.1"
    )


def step_words(world, step):
    epoch, batch = divmod(step - 1, BATCHES)
    if batch == BATCHES - 1:
        counts = [str(ROWS * n) for n in PADDED[world]]
        counts = ", ".join(counts[:-1]) + " and " + counts[-1]
        return (
            f"after step {step}, the padded last batch of epoch {epoch + 1}, where "
            f"the ranks held {counts} real tokens"
        )
    return f"after step {step}, a full batch (every rank {ROWS * TOKENS} real tokens)"


def check_steps(sol, world):
    ranks, (expected, _), _ = results(sol, world)
    for rank, r in enumerate(ranks):
        history = r["history"]
        if len(history) != len(expected):
            fail(
                f"on rank {rank} the optimizer stepped {len(history)} times for "
                f"{len(expected)} batches",
                input=shown(world),
            )
        for step, (mine, want) in enumerate(zip(history, expected), 1):
            diff = max_diff(mine, want)
            if diff > 1e-6:
                why = ""
                full = (step - 1) % BATCHES != BATCHES - 1
                if full:
                    why = (
                        ": on full batches the ranks' token counts are equal, so "
                        "the gradients must equal one process's there too. Are they "
                        f"1/{world} of them? DDP divides by the number of ranks"
                    )
                fail(
                    f"on rank {rank} the weights first differ from one process's "
                    f"{step_words(world, step)}, by up to {diff:.3g}{why}",
                    input=shown(world),
                )


@check("2 ranks: after every step the weights equal one process's")
def two_ranks(sol):
    check_steps(sol, 2)


@check("3 ranks with uneven padding: the weights equal one process's, step by step")
def three_ranks(sol):
    check_steps(sol, 3)


@check("the logged loss is the mean over all real tokens, the same on every rank")
def logged(sol):
    for world in (2, 3):
        ranks, (_, losses), _ = results(sol, world)
        for rank, r in enumerate(ranks):
            expect_close(
                r["logged"],
                losses,
                input=shown(world),
                rel=1e-5,
                abs_tol=1e-7,
                what=f"the losses rank {rank} logs (one per step)",
            )
        drift = spread([r["history"][-1] for r in ranks])
        if drift > 0:
            fail(
                f"the ranks' final weights differ by up to {drift:.3g}",
                input=shown(world),
            )


@check("the weights equal PyTorch's DDP with the global token count, step by step")
def like_torch(sol):
    for world in (2, 3):
        ranks, _, theirs = results(sol, world)
        for rank, (r, ref) in enumerate(zip(ranks, theirs)):
            for step, (mine, want) in enumerate(zip(r["history"], ref["history"]), 1):
                diff = max_diff(mine, want)
                if diff > 1e-6:
                    fail(
                        f"on rank {rank} the weights first differ from DDP's trained "
                        "on each rank's sum over the global count of real tokens "
                        f"(times {world}, the number of ranks) "
                        f"{step_words(world, step)}, by up to {diff:.3g}",
                        input=shown(world),
                    )
