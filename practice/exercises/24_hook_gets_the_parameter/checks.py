"""Checks for exercise 3.6: on gloo ranks, against one process on the whole batch
and against PyTorch's DDP doing the same gradient accumulation.

The ranks send back their weights and which tensors the hooks all-reduced;
one process's training, and the replicas' spread, are computed here, in the
judge; PyTorch's DDP runs on ranks that load none of the reader's code.
"""

import contextlib

from _judge.checking import check, fail
from _judge.ranks import max_diff, on_ranks, reference_on_ranks, spread

RANK_PRELOAD = ("torch.optim", "torch._dynamo", "torch.nn.parallel")
MICRO, ACCUM, STEPS = 3, 2, 3


def make_model(seed):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2)
    )


def batches(seed, world):
    """Each step's whole batch: world x ACCUM micro-batches of MICRO examples."""
    import torch

    g = torch.Generator().manual_seed(500 + seed)
    n = world * ACCUM * MICRO
    return [
        (torch.randn(n, 5, generator=g), torch.randn(n, 2, generator=g))
        for _ in range(STEPS)
    ]


def micro_batches(x, y, world, rank):
    return [
        (
            x.view(world, ACCUM, MICRO, 5)[rank][i],
            y.view(world, ACCUM, MICRO, 2)[rank][i],
        )
        for i in range(ACCUM)
    ]


def train(ddp, model, seed, world, rank):
    """The training loop of the statement: accumulation with no_sync, SGD."""
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches(seed, world):
        opt.zero_grad()
        for i, (xm, ym) in enumerate(micro_batches(x, y, world, rank)):
            with ddp.no_sync() if i < ACCUM - 1 else contextlib.nullcontext():
                (torch.nn.functional.mse_loss(ddp(xm), ym) / ACCUM).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def worker(DataParallelNaive, seed):
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(seed)
    weights = {p.data_ptr() for p in model.parameters()}
    with spy_on_dist(
        ["all_reduce"], reader_functions=[DataParallelNaive.__init__]
    ) as spy:
        ddp = DataParallelNaive(model)
        params = train(ddp, model, seed, world, rank)
    return {
        "params": params,
        "on_weights": sum(c[4] in weights for c in spy.calls),
        "calls": len(spy.calls),
    }


def torch_worker(seed):
    """PyTorch's DDP, the same loop, on ranks that run none of the reader's code."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = make_model(seed)
    return train(DDP(model), model, seed, dist.get_world_size(), dist.get_rank())


def one_process(seed, world):
    """SGD on each step's whole batch in one process."""
    import torch

    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches(seed, world):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


def last_micro_batch_only(seed, world):
    """Each rank's weights if only the last micro-batch's gradient were averaged
    (a tensor hook, ``register_hook``, fires before ``.grad`` accumulates): every
    rank simulated here, one after the other."""
    import torch

    models = [make_model(seed) for _ in range(world)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    for x, y in batches(seed, world):
        local, last = [], []
        for r, m in enumerate(models):
            grads = []
            for xm, ym in micro_batches(x, y, world, r):
                m.zero_grad()
                (torch.nn.functional.mse_loss(m(xm), ym) / ACCUM).backward()
                grads.append([p.grad.clone() for p in m.parameters()])
            local.append(grads[0])
            last.append(grads[-1])
        mean_last = [sum(g) / world for g in zip(*last)]
        for r, (m, opt) in enumerate(zip(models, opts)):
            for p, g0, g1 in zip(m.parameters(), local[r], mean_last):
                p.grad = g0 + g1
            opt.step()
    return [[p.detach() for p in m.parameters()] for m in models]


_results = {}


def results(sol, world):
    if world not in _results:
        seed = 7 * world
        expected = one_process(seed, world)
        candidates = {"last micro-batch only": last_micro_batch_only(seed, world)}
        theirs = reference_on_ranks(torch_worker, world, seed)
        ranks = on_ranks(worker, world, sol.DataParallelNaive, seed)
        _results[world] = (ranks, expected, theirs, candidates)
    return _results[world]


def shown(world):
    return (
        f"{world} ranks from the same weights, ddp = DataParallelNaive(model), "
        f"{STEPS} SGD steps, each of {ACCUM} micro-batches of {MICRO} examples "
        "(the first inside ddp.no_sync())"
    )


def diagnosis(r, rank, candidates):
    if r["on_weights"]:
        return (
            f": {r['on_weights']} of the {r['calls']} all-reduces were applied to "
            "tensors that are the model's weights (the same storage), so the "
            "weights were averaged and the gradients were not"
        )
    if max_diff(r["params"], candidates["last micro-batch only"][rank]) <= 1e-6:
        return (
            ": they are what averaging only the last micro-batch's gradient gives. "
            "A hook that sees one backward's gradient, before it is accumulated "
            "into .grad (register_hook), misses the micro-batches before"
        )
    return ""


@check("2 ranks: the weights equal one process's on the whole batch")
def two_ranks(sol):
    check_weights(sol, 2)


@check("3 ranks: the weights equal one process's on the whole batch")
def three_ranks(sol):
    check_weights(sol, 3)


def check_weights(sol, world):
    ranks, expected, _, candidates = results(sol, world)
    for rank, r in enumerate(ranks):
        diff = max_diff(r["params"], expected)
        if diff > 1e-6:
            fail(
                f"on rank {rank} the weights after {STEPS} steps differ from one "
                f"process's by up to {diff:.3g}" + diagnosis(r, rank, candidates),
                input=shown(world),
            )


@check("the replicas stay equal, and no all-reduce touches a weight")
def replicas(sol):
    for world in (2, 3):
        ranks, _, _, _ = results(sol, world)
        drift = spread([r["params"] for r in ranks])
        if drift > 0:
            fail(
                f"the ranks' weights differ from rank 0's by up to {drift:.3g} after "
                f"{STEPS} steps: the replicas drifted apart",
                input=shown(world),
            )
        for rank, r in enumerate(ranks):
            if r["on_weights"]:
                fail(
                    f"on rank {rank}, {r['on_weights']} all-reduces were applied "
                    "to the model's weights themselves",
                    input=shown(world),
                )


@check("the weights equal PyTorch's DDP doing the same accumulation")
def like_torch(sol):
    for world in (2, 3):
        ranks, _, theirs, _ = results(sol, world)
        for rank, r in enumerate(ranks):
            diff = max_diff(r["params"], theirs[rank])
            if diff > 1e-6:
                fail(
                    f"on rank {rank} the weights differ from PyTorch's DDP's with "
                    f"no_sync by up to {diff:.3g}",
                    input=shown(world),
                )
