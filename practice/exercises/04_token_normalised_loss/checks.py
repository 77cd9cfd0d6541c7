"""Checks for exercise 2.2: on real gloo ranks, against the mean over all tokens.

The ranks send back their gradients and losses; the mean over all tokens is
computed here, in the judge.
"""

from _judge.checking import check, expect_close, fail
from _judge.ranks import on_ranks


def example_worker(token_normalised_loss):
    import torch
    import torch.distributed as dist

    if dist.get_rank() == 0:
        losses, mask = (
            torch.tensor([[1.0, 1.0, 1.0, 0.0]]),
            torch.tensor([[True, True, True, False]]),
        )
    else:
        losses, mask = (
            torch.tensor([[3.0, 0.0, 0.0, 0.0]]),
            torch.tensor([[True, False, False, False]]),
        )
    out = token_normalised_loss(losses.requires_grad_(), mask)
    return float(out)


@check("the example: three tokens of loss 1, one of loss 3")
def example(sol):
    values = on_ranks(example_worker, 2, sol.token_normalised_loss)
    shown = "rank 0: losses [1, 1, 1, pad], rank 1: losses [3, pad, pad, pad]"
    expect_close(
        values,
        [1.5, 1.5],
        input=shown,
        what="the values the two ranks return",
        rel=1e-6,
    )


def make_case(seed, counts):
    """The model, the tokens and each rank's mask: the same wherever they are made."""
    import torch

    world = len(counts)
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    x, target = torch.randn(world, 2, 5, 4), torch.randn(world, 2, 5)
    mask = torch.zeros(world, 2 * 5, dtype=torch.bool)
    for r, count in enumerate(counts):
        mask[r, torch.randperm(10)[:count]] = True
    return model, x, target, mask.view(world, 2, 5)


def worker(token_normalised_loss, seed, counts):
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    model, x, target, mask = make_case(seed, counts)
    token_losses = (model(x[rank]).squeeze(-1) - target[rank]) ** 2
    loss = token_normalised_loss(token_losses, mask[rank])
    loss.backward()
    for p in model.parameters():  # what DDP does: average the gradients
        dist.all_reduce(p.grad)
        p.grad /= world
    return {
        "grads": [p.grad for p in model.parameters()],
        "loss": loss.detach().reshape(()).clone(),
    }


def run(sol, counts, seed):
    import torch

    from _judge.ranks import max_diff

    shown = (
        f"{len(counts)} ranks holding {', '.join(map(str, counts))} target tokens "
        "(of 10); loss.backward(), then gradients averaged over ranks as DDP does"
    )
    # The reference, here: the mean over every rank's target tokens.
    whole, x, target, mask = make_case(seed, counts)
    all_losses = (whole(x).squeeze(-1) - target) ** 2
    n = int(mask.sum())
    reference = all_losses[mask].sum() / n if n else (all_losses * 0).sum()
    reference.backward()
    expected = [p.grad.clone() for p in whole.parameters()]
    results = on_ranks(worker, len(counts), sol.token_normalised_loss, seed, counts)
    for rank, r in enumerate(results):
        values = [*r["grads"], r["loss"]]
        if any(torch.is_tensor(v) and bool(torch.isnan(v).any()) for v in values):
            fail(
                f"on rank {rank} the loss or a gradient is NaN: "
                "guard the division by the token count",
                input=shown,
            )
        diff = max_diff(r["grads"], expected)
        if diff > 1e-5:
            fail(
                f"on rank {rank} the gradients differ from those of the "
                f"mean over all target tokens by up to {diff:.3g}: "
                "normalise by the global count, times the world size",
                input=shown,
            )
    expect_close(
        sum(float(r["loss"]) for r in results) / len(results),
        float(reference.detach()),
        input=shown,
        rel=1e-5,
        abs_tol=1e-7,
        what="the mean over ranks of the returned losses "
        "(it must be the mean over all tokens)",
    )


@check("2 ranks with 7 and 2 tokens: gradients of the global token mean")
def two_ranks(sol):
    run(sol, (7, 2), seed=1)


@check("4 ranks with uneven counts")
def four_ranks(sol):
    run(sol, (10, 1, 4, 6), seed=2)


@check("a rank with no target token (no NaN)")
def empty_rank(sol):
    run(sol, (5, 0, 3), seed=3)


@check("no target tokens on any rank")
def no_tokens(sol):
    run(sol, (0, 0), seed=4)
