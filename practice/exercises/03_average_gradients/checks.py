"""Checks for exercise 03: on real gloo ranks, against whole-batch gradients."""

from _judge.checking import check, expect_equal, fail
from _judge.ranks import on_ranks

PER_RANK = 4


def worker(average_gradients, seed, freeze):
    import copy

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)  # same seed on every rank: same model, same whole batch
    model = torch.nn.Sequential(
        torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    )
    if freeze:
        model[0].bias.requires_grad_(False)
    whole = copy.deepcopy(model)
    x, y = torch.randn(world * PER_RANK, 5), torch.randn(world * PER_RANK, 3)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
    before = [p.detach().clone() for p in model.parameters()]
    local = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    average_gradients(model)
    torch.nn.functional.mse_loss(whole(x), y).backward()
    grad_diff, none_ok = 0.0, True
    for p, q in zip(model.parameters(), whole.parameters()):
        if q.grad is None:
            none_ok = none_ok and p.grad is None
        elif p.grad is None:
            none_ok = False
        else:
            grad_diff = max(grad_diff, float((p.grad - q.grad).abs().max()))
    flat = torch.cat(
        [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    )
    everyone = torch.zeros(world * flat.numel())
    dist.all_gather_into_tensor(everyone, flat)
    spread = float((everyone.view(world, -1) - flat).abs().max())
    param_change = max(
        float((p.detach() - b).abs().max()) for p, b in zip(model.parameters(), before)
    )
    pairs = [
        (p.grad, q.grad, g)
        for p, q, g in zip(model.parameters(), whole.parameters(), local)
        if p.grad is not None and q.grad is not None and g is not None
    ]
    # Unchanged: the average was computed but never written back into .grad.
    unchanged = bool(pairs) and all(torch.equal(p, g) for p, _, g in pairs)
    # How many times the whole batch's gradient they are (world: a sum, not a mean).
    dot = sum(float((p * q).sum()) for p, q, _ in pairs)
    norm = sum(float((q * q).sum()) for _, q, _ in pairs)
    return {
        "grad_diff": grad_diff,
        "unchanged": unchanged,
        "ratio": dot / norm if norm else 1.0,
        "none_ok": none_ok,
        "spread": spread,
        "param_change": param_change,
    }


def run(sol, world, seed=0, freeze=False):
    shown = (
        f"{world} ranks, each {PER_RANK} examples of a Linear-Tanh-Linear model"
        + (", first bias frozen" if freeze else "")
        + "; backward, then average_gradients(model)"
    )
    results = on_ranks(worker, world, sol.average_gradients, seed, freeze)
    for rank, r in enumerate(results):
        if not r["none_ok"]:
            fail(
                f"on rank {rank} a frozen parameter got a gradient, "
                "or a gradient was lost: skip parameters whose .grad is None",
                input=shown,
            )
        if r["grad_diff"] > 1e-6:
            fail(
                f"on rank {rank} the gradients differ from the whole batch's "
                f"by up to {r['grad_diff']:.3g}{_why(r, world)}",
                input=shown,
            )
    return shown, results


def _why(r, world):
    """What the gradients look like, when that names the mistake."""
    if r["unchanged"]:
        return (
            ": they are still this rank's own gradients. Was the average written "
            "back into each parameter's .grad (in place, or assigned)?"
        )
    if world > 1 and abs(r["ratio"] - world) < 1e-3 * world:
        return (
            f": they are {world} times the whole batch's (a sum instead of a mean? "
            "divide by the number of ranks)"
        )
    return ""


@check("2 ranks: the gradients equal the whole batch's")
def two_ranks(sol):
    run(sol, 2)


@check("3 ranks with a frozen parameter")
def frozen(sol):
    run(sol, 3, seed=1, freeze=True)


@check("4 ranks: identical gradients everywhere, parameters untouched")
def identical(sol):
    shown, results = run(sol, 4, seed=2)
    for rank, r in enumerate(results):
        expect_equal(
            r["spread"] <= 1e-7,
            True,
            input=shown,
            what=f"rank {rank}'s gradients equal every other rank's",
        )
        if r["param_change"] != 0.0:
            fail(
                f"on rank {rank} the parameters changed: only the gradients may change",
                input=shown,
            )


@check("1 rank: nothing changes")
def one_rank(sol):
    run(sol, 1, seed=3)
