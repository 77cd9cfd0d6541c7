"""Checks for exercise 13: on real gloo ranks; a hang is reported, not waited for."""

from _judge.checking import check, expect_close, fail
from _judge.ranks import on_ranks

RANK_PRELOAD = (
    "torch.optim",
    "torch._dynamo",
)  # optimizers and DDP import them: once, before forking

HANG_TIMEOUT_S = 20  # ranks that are still waiting after this are reported as hung


def worker(train_and_log, counts, seed):
    import copy

    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2)
    )
    whole = copy.deepcopy(model)
    batches = [
        [(torch.randn(3, 4), torch.randn(3, 2)) for _ in range(c)] for c in counts
    ]
    losses = train_and_log(
        model, torch.optim.SGD(model.parameters(), lr=0.1), batches[rank]
    )
    steps = min(counts)
    opt_whole = torch.optim.SGD(whole.parameters(), lr=0.1)
    expected = []
    for i in range(steps):
        x = torch.cat([batches[r][i][0] for r in range(world)])
        y = torch.cat([batches[r][i][1] for r in range(world)])
        opt_whole.zero_grad()
        loss = torch.nn.functional.mse_loss(whole(x), y)
        expected.append(float(loss))
        loss.backward()
        opt_whole.step()
    diff = max(
        float((p - q).abs().max())
        for p, q in zip(model.parameters(), whole.parameters())
    )
    return {
        "losses": list(losses) if isinstance(losses, (list, tuple)) else losses,
        "expected": expected,
        "diff": diff,
    }


def run(sol, counts, seed):
    shown = (
        f"{len(counts)} ranks holding {', '.join(map(str, counts))} "
        "batches of 3 examples, SGD lr=0.1"
    )
    results = on_ranks(
        worker, len(counts), sol.train_and_log, counts, seed, timeout_s=HANG_TIMEOUT_S
    )
    for rank, r in enumerate(results):
        expect_close(
            r["losses"],
            r["expected"],
            input=shown,
            rel=1e-5,
            abs_tol=1e-7,
            what=f"the losses rank {rank} returns "
            "(one global mean per step, on every rank)",
        )
        if r["diff"] > 1e-6:
            fail(
                f"on rank {rank} the weights differ from single-process "
                f"training on the whole batch by up to {r['diff']:.3g}",
                input=shown,
            )


@check("2 ranks with 3 batches each")
def even(sol):
    run(sol, (3, 3), seed=0)


@check("2 ranks with 3 and 2 batches")
def uneven(sol):
    run(sol, (3, 2), seed=1)


@check("3 ranks with 4, 2 and 3 batches")
def uneven_three(sol):
    run(sol, (4, 2, 3), seed=2)
