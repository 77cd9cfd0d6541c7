"""Checks for exercise 4.3: on gloo ranks with PyTorch's DDP, against one process
on the whole batch that clips its gradient before each step.

The ranks send back their weights and the norms they returned; one process's
training (and, to name known mistakes, what clipping at every micro-step or
not at all would give) is computed here, in the judge.
"""

from _judge.checking import check, expect_close, fail
from _judge.ranks import max_diff, on_ranks, spread

RANK_PRELOAD = ("torch.optim", "torch._dynamo", "torch.nn.parallel")
MICRO, STEPS, MAX_NORM = 3, 3, 0.3
CASES = {2: 2, 3: 3}  # ranks -> micro-batches


def make_model(seed):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    )


def batches(seed, world, accum):
    import torch

    g = torch.Generator().manual_seed(700 + seed)
    n = world * accum * MICRO
    return [
        (torch.randn(n, 5, generator=g), 2 * torch.randn(n, 3, generator=g))
        for _ in range(STEPS)
    ]


def micro_batches(x, y, world, accum, rank):
    return [
        (
            x.view(world, accum, MICRO, 5)[rank][i],
            y.view(world, accum, MICRO, 3)[rank][i],
        )
        for i in range(accum)
    ]


def worker(train_step, seed, accum):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DDP(make_model(seed))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    norms = []
    for x, y in batches(seed, world, accum):
        micro = micro_batches(x, y, world, accum, rank)
        norms.append(
            train_step(ddp, opt, micro, torch.nn.functional.mse_loss, MAX_NORM)
        )
    return {"params": [p.detach() for p in ddp.parameters()], "norms": norms}


def one_process(seed, world, accum, clip=True):
    """SGD on each step's whole batch, clipped to MAX_NORM (or not): the weights
    and the norms clip_grad_norm_ measured."""
    import torch

    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    norms = []
    for x, y in batches(seed, world, accum):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        if clip:
            norms.append(
                float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM))
            )
        opt.step()
    return [p.detach() for p in model.parameters()], norms


def clipped_every_micro_step(seed, world, accum):
    """What clipping after every micro-step's backward gives (every rank simulated
    here): each rank clips its own partial gradient, the last backward averages
    the accumulated ones, and that is clipped again."""
    import torch

    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = list(model.parameters())
    for x, y in batches(seed, world, accum):
        per_rank = []
        for rank in range(world):
            acc = [torch.zeros_like(p) for p in params]
            for i, (xm, ym) in enumerate(micro_batches(x, y, world, accum, rank)):
                model.zero_grad()
                (torch.nn.functional.mse_loss(model(xm), ym) / accum).backward()
                acc = [a + p.grad for a, p in zip(acc, params)]
                if i < accum - 1:  # a local gradient, clipped on its own
                    acc = _clipped(acc)
            per_rank.append(acc)
        averaged = [sum(gs) / world for gs in zip(*per_rank)]
        for p, g in zip(params, _clipped(averaged)):
            p.grad = g
        opt.step()
    return [p.detach() for p in params]


def _clipped(grads):
    import torch

    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
    scale = min(1.0, MAX_NORM / (float(norm) + 1e-6))
    return [g * scale for g in grads]


_results = {}


def results(sol, world):
    if world not in _results:
        seed, accum = 3 * world, CASES[world]
        expected, norms = one_process(seed, world, accum)
        if min(norms) <= MAX_NORM:
            raise AssertionError("a step of the checks' data is not clipped")
        candidates = {
            "unclipped": one_process(seed, world, accum, clip=False)[0],
            "every micro-step": clipped_every_micro_step(seed, world, accum),
        }
        ranks = on_ranks(worker, world, sol.train_step, seed, accum)
        _results[world] = (ranks, expected, norms, candidates)
    return _results[world]


def shown(world):
    return (
        f"{world} ranks, DistributedDataParallel(model), {STEPS} steps of "
        f"train_step(ddp, SGD(lr=0.1), {CASES[world]} micro-batches of {MICRO} "
        f"examples, mse_loss, max_norm={MAX_NORM}); every step's gradient norm is "
        f"above {MAX_NORM}"
    )


def named(params, candidates):
    if max_diff(params, candidates["every micro-step"]) <= 1e-6:
        return (
            ": they are what clipping after every micro-step gives, each rank "
            "clipping its own partial gradient before the ranks' are averaged"
        )
    if max_diff(params, candidates["unclipped"]) <= 1e-6:
        return (
            ": they are those of training without clipping: the optimizer stepped "
            "with gradients that were never clipped (clipped after the step, or not "
            "at all?)"
        )
    return ""


def check_weights(sol, world):
    ranks, expected, _, candidates = results(sol, world)
    for rank, r in enumerate(ranks):
        diff = max_diff(r["params"], expected)
        if diff > 1e-6:
            fail(
                f"on rank {rank} the weights after {STEPS} steps differ from one "
                f"process's by up to {diff:.3g}" + named(r["params"], candidates),
                input=shown(world),
            )


@check("2 ranks, 2 micro-batches: the weights equal one process that clips")
def two_ranks(sol):
    check_weights(sol, 2)


@check("3 ranks, 3 micro-batches: the weights equal one process that clips")
def three_ranks(sol):
    check_weights(sol, 3)


@check("the norm returned is the one clip_grad_norm_ measures in one process")
def norms(sol):
    for world in (2, 3):
        ranks, _, expected, _ = results(sol, world)
        for rank, r in enumerate(ranks):
            expect_close(
                r["norms"],
                expected,
                input=shown(world),
                rel=1e-5,
                abs_tol=1e-7,
                what=f"the norms rank {rank} returns (one per step)",
            )
        drift = spread([r["params"] for r in ranks])
        if drift > 0:
            fail(f"the ranks' weights differ by up to {drift:.3g}", input=shown(world))
