"""Checks for exercise 2.1: on real gloo ranks, against whole-batch gradients.

The ranks only run the reader's function and send back their raw gradients;
the whole batch's gradients, and every difference, are computed here, in the
judge, where the reader's code cannot reach them.
"""

from _judge.checking import check, fail
from _judge.ranks import on_ranks

PER_RANK = 4


def make_case(seed, world, freeze):
    """The model and the whole batch, the same wherever it is built."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)
    )
    if freeze:
        model[0].bias.requires_grad_(False)
    x, y = torch.randn(world * PER_RANK, 5), torch.randn(world * PER_RANK, 3)
    return model, x, y


def gradients(model, x, y):
    """The gradients of the mean loss on (x, y), None where a parameter is frozen."""
    import torch

    model.zero_grad(set_to_none=True)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [None if p.grad is None else p.grad.clone() for p in model.parameters()]


def worker(average_gradients, seed, freeze):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    model, x, y = make_case(seed, world, freeze)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    gradients(model, x[mine], y[mine])
    average_gradients(model)
    return {
        "grads": [None if p.grad is None else p.grad for p in model.parameters()],
        "params": [p.detach() for p in model.parameters()],
    }


def run(sol, world, seed=0, freeze=False):
    shown = (
        f"{world} ranks, each {PER_RANK} examples of a Linear-Tanh-Linear model"
        + (", first bias frozen" if freeze else "")
        + "; backward, then average_gradients(model)"
    )
    # The references, before the reader's code runs: the whole batch's gradients
    # and each rank's own (what it holds before averaging).
    model, x, y = make_case(seed, world, freeze)
    initial = [p.detach().clone() for p in model.parameters()]
    whole = gradients(model, x, y)
    local = [
        gradients(
            model,
            x[r * PER_RANK : (r + 1) * PER_RANK],
            y[r * PER_RANK : (r + 1) * PER_RANK],
        )
        for r in range(world)
    ]
    results = on_ranks(worker, world, sol.average_gradients, seed, freeze)
    found = [_compare(r, whole, local[rank], initial) for rank, r in enumerate(results)]
    for rank, f in enumerate(found):
        if not f["none_ok"]:
            fail(
                f"on rank {rank} a frozen parameter got a gradient, "
                "or a gradient was lost: skip parameters whose .grad is None",
                input=shown,
            )
    for rank, f in enumerate(found):
        if f["grad_diff"] > 1e-6:
            fail(
                f"on rank {rank} the gradients differ from the whole batch's "
                f"by up to {f['grad_diff']:.3g}{_why(found, rank, world)}",
                input=shown,
            )
    return shown, found


def _compare(result, whole, local, initial):
    """What one rank's raw tensors say, computed here."""
    import torch

    grads, params = result["grads"], result["params"]
    found = {"none_ok": len(grads) == len(whole), "grad_diff": 0.0}
    pairs = []
    for g, w, mine in zip(grads, whole, local):
        if (g is None) != (w is None) or (
            g is not None and tuple(g.shape) != tuple(w.shape)
        ):
            found["none_ok"] = False
        elif g is not None:
            pairs.append((g.double(), w.double(), mine.double()))
    found["grad_diff"] = max(
        (float((g - w).abs().max()) for g, w, _ in pairs), default=0
    )
    found["unchanged"] = bool(pairs) and all(torch.equal(g, m) for g, _, m in pairs)
    # How many times the whole batch's gradient they are (world: a sum, not a mean).
    dot = sum(float((g * w).sum()) for g, w, _ in pairs)
    norm = sum(float((w * w).sum()) for _, w, _ in pairs)
    found["ratio"] = dot / norm if norm else 1.0
    found["flat"] = torch.cat([g.flatten() for g, _, _ in pairs]) if pairs else None
    found["param_change"] = max(
        (float((p.double() - b.double()).abs().max()) for p, b in zip(params, initial)),
        default=0.0,
    )
    return found


def _why(found, rank, world):
    """What the gradients look like, when that names the mistake."""
    f = found[rank]
    if f["unchanged"]:
        return (
            ": they are still this rank's own gradients. Was the average written "
            "back into each parameter's .grad (in place, or assigned)?"
        )
    if world > 1 and abs(f["ratio"] - world) < 1e-3 * world:
        return (
            f": they are {world} times the whole batch's (a sum instead of a mean? "
            "divide by the number of ranks)"
        )
    right = [r for r, other in enumerate(found) if other["grad_diff"] <= 1e-6]
    if right and rank not in right:
        who = "rank " + " and ".join(map(str, right))
        return (
            f", while {who} holds the right mean: the result reached "
            f"{'that rank' if len(right) == 1 else 'those ranks'} only. "
            "dist.reduce sends the sum to one rank (dst) and leaves the others "
            "with partial sums: every rank needs it, so all-reduce (or broadcast "
            "the result back)"
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
    shown, found = run(sol, 4, seed=2)
    for rank, f in enumerate(found):
        spread = float((f["flat"] - found[0]["flat"]).abs().max())
        if spread > 1e-7:
            fail(
                f"rank {rank}'s gradients differ from rank 0's by {spread:.3g}: "
                "every rank must end with the same gradients",
                input=shown,
            )
        if f["param_change"] != 0.0:
            fail(
                f"on rank {rank} the parameters changed: only the gradients may change",
                input=shown,
            )


@check("1 rank: nothing changes")
def one_rank(sol):
    run(sol, 1, seed=3)
