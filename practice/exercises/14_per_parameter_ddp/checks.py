"""Checks for exercise 3.3: on gloo ranks, against one process on the whole batch.

The ranks send back their gradients and weights; one process's training on
the whole batch runs here, in the judge, before the ranks do.
"""

from _judge.checking import check, fail
from _judge.ranks import on_ranks

RANK_PRELOAD = (
    "torch.optim",
    "torch._dynamo",
)  # SGD imports them: once, before forking
PER_RANK = 4
STEPS = 3
LAST_LAYER = 2  # the last Linear's weight and bias: launched before the first's weight
_results = {}  # world size -> the ranks' results, computed once for the checks


def make_model(seed, freeze):
    import torch

    torch.manual_seed(seed)
    net = torch.nn.Sequential(
        torch.nn.Linear(5, 8),
        torch.nn.Tanh(),
        torch.nn.Linear(8, 6),
        torch.nn.Tanh(),
        torch.nn.Linear(6, 3),
    )
    if freeze:
        net[2].bias.requires_grad_(False)
    return net


def batches(seed, world):
    """Every step's whole batch, the same wherever it is drawn."""
    import torch

    g = torch.Generator().manual_seed(100 + seed)
    return [
        (
            torch.randn(world * PER_RANK, 5, generator=g),
            torch.randn(world * PER_RANK, 3, generator=g),
        )
        for _ in range(STEPS)
    ]


def worker(PerParameterDDP, seed, freeze):
    import torch
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(seed + rank, freeze)  # each rank starts from its own weights
    seen = {}
    # Registered before the reader's hooks, so it runs first: how many
    # all-reduces were launched before the first layer's weight gradient?
    model[0].weight.register_post_accumulate_grad_hook(
        lambda p: seen.__setitem__("at_first", spy.count("all_reduce"))
    )
    out = {"steps": [], "trainable": sum(p.requires_grad for p in model.parameters())}
    with spy_on_dist(
        ["all_reduce"], reader_functions=[PerParameterDDP.__init__]
    ) as spy:
        ddp = PerParameterDDP(model)
        out["started"] = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
        for x, y in batches(seed, world):
            before = spy.count("all_reduce")
            seen["at_first"] = None
            torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
            after_backward = spy.count("all_reduce")
            ddp.finish_gradient_sync()
            out["steps"].append(
                {
                    "in_backward": after_backward - before,
                    "at_first": None
                    if seen["at_first"] is None
                    else seen["at_first"] - before,
                    "in_finish": spy.count("all_reduce") - after_backward,
                    "grads": [  # copies: a flat buffer is reused next step
                        None if p.grad is None else p.grad.clone()
                        for p in model.parameters()
                    ],
                }
            )
            opt.step()
            opt.zero_grad()
    out["params"] = [p.detach() for p in model.parameters()]
    return out


def whole_batch(seed, world, freeze):
    """One process on the whole batch, from rank 0's weights: each step's
    gradients, and the weights at the end."""
    import torch

    whole = make_model(seed, freeze)
    opt = torch.optim.SGD(whole.parameters(), lr=0.1)
    steps = []
    for x, y in batches(seed, world):
        torch.nn.functional.mse_loss(whole(x), y).backward()
        steps.append(
            [None if p.grad is None else p.grad.clone() for p in whole.parameters()]
        )
        opt.step()
        opt.zero_grad()
    return (
        [p.detach().clone() for p in make_model(seed, freeze).parameters()],
        steps,
        [p.detach() for p in whole.parameters()],
    )


def results(sol, world):
    freeze = world == 3
    shown = (
        f"{world} ranks, each from its own random weights, {PER_RANK} examples each "
        "of Linear(5, 8)-Tanh-Linear(8, 6)-Tanh-Linear(6, 3)"
        + (" (second bias frozen)" if freeze else "")
        + f": ddp = PerParameterDDP(model), then {STEPS} steps of backward, "
        "ddp.finish_gradient_sync(), SGD"
    )
    if world not in _results:
        expected = whole_batch(world, world, freeze)  # before the ranks run
        _results[world] = (
            on_ranks(worker, world, sol.PerParameterDDP, world, freeze),
            expected,
        )
    return shown, _results[world]


def averaged(sol, world):
    from _judge.ranks import max_diff

    shown, (ranks, (start, expected, final)) = results(sol, world)
    for rank, r in enumerate(ranks):  # first: a wrong start explains the rest
        if max_diff(r["started"], start) != 0:
            fail(
                f"after PerParameterDDP(model), rank {rank}'s weights are not rank "
                "0's: broadcast every parameter from rank 0 in __init__",
                input=shown,
            )
    for rank, r in enumerate(ranks):
        for step, (s, want) in enumerate(zip(r["steps"], expected), 1):
            grads = s["grads"]
            if any(g is not None and w is None for g, w in zip(grads, want)):
                fail(
                    f"on rank {rank} the frozen parameter got a gradient: hook only "
                    "the parameters with requires_grad",
                    input=shown,
                )
            if any(g is None and w is not None for g, w in zip(grads, want)):
                fail(
                    f"on rank {rank}, step {step}, a trainable parameter has no "
                    "gradient after finish_gradient_sync()",
                    input=shown,
                )
            diff = max_diff(grads, want)
            if diff > 1e-6 and world > 1:
                summed = [None if w is None else w * world for w in want]
                if max_diff(grads, summed) <= 1e-6:
                    fail(
                        f"on rank {rank}, step {step}, the gradients are the sum over "
                        "ranks, not the mean: divide by the world size",
                        input=shown,
                    )
            if diff > 1e-6:
                fail(
                    f"on rank {rank}, step {step}, the gradients differ from the whole "
                    f"batch's by up to {diff:.3g} after finish_gradient_sync()",
                    input=shown,
                )
        diff = max_diff(r["params"], final)
        if diff > 1e-6:
            fail(
                f"on rank {rank} the weights after {STEPS} steps differ from one "
                f"process's by up to {diff:.3g}",
                input=shown,
            )


@check("2 ranks: the averaged gradients and the weights equal one process's")
def two_ranks(sol):
    averaged(sol, 2)


@check("3 ranks with a frozen parameter")
def three_ranks(sol):
    averaged(sol, 3)


@check("one all-reduce per parameter, launched during the backward")
def launched_in_backward(sol):
    for world in (2, 3):
        shown, (ranks, _) = results(sol, world)
        for rank, r in enumerate(ranks):
            for step, s in enumerate(r["steps"], 1):
                where = f"on rank {rank}, step {step}"
                if s["in_backward"] != r["trainable"]:
                    fail(
                        f"{where}, the backward launched {s['in_backward']} "
                        f"all-reduces for {r['trainable']} trainable parameters: "
                        "launch one from each parameter's hook",
                        input=shown,
                    )
                if s["in_finish"]:
                    fail(
                        f"{where}, finish_gradient_sync() launched {s['in_finish']} "
                        "all-reduces: it should only wait for those of the backward",
                        input=shown,
                    )


@check("the last layer's all-reduces start before the first layer's gradient")
def overlap(sol):
    for world in (2, 3):
        shown, (ranks, _) = results(sol, world)
        for rank, r in enumerate(ranks):
            for step, s in enumerate(r["steps"], 1):
                if s["at_first"] is None or s["at_first"] < LAST_LAYER:
                    fail(
                        f"on rank {rank}, step {step}, only {s['at_first'] or 0} "
                        "all-reduces had been launched when the first layer's weight "
                        "gradient was ready: launch each one from its hook, as soon "
                        "as its gradient is ready, not at the end of the backward",
                        input=shown,
                    )
