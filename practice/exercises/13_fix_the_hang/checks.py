"""Checks for exercise 8.1: on real gloo ranks; a hang is reported, not waited for.

The ranks send back their losses and weights; one process's training on the
whole batch is computed here, in the judge.
"""

from _judge.checking import check, expect_close, fail
from _judge.ranks import on_ranks

RANK_PRELOAD = (
    "torch.optim",
    "torch._dynamo",
)  # optimizers and DDP import them: once, before forking

HANG_TIMEOUT_S = 20  # ranks that are still waiting after this are reported as hung
LEDGER_TIMEOUT_S = 5  # a rank whose next collective does not come within this


def make_case(counts, seed):
    """The model and every rank's batches: the same wherever they are made."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2)
    )
    batches = [
        [(torch.randn(3, 4), torch.randn(3, 2)) for _ in range(c)] for c in counts
    ]
    return model, batches


def worker(train_and_log, counts, seed):
    """The reader's loop on this rank's batches, inside the book's collective
    ledger (mylib.ledger, chapter 8): ranks whose collectives part stop there,
    and the ledger's report comes back instead of a hang."""
    import contextlib

    import torch
    import torch.distributed as dist

    try:
        from mylib.ledger import CollectiveHang, CollectiveLedger
    except ImportError:  # without the book's library: the judge's hang report
        CollectiveHang, CollectiveLedger = (), None
    model, batches = make_case(counts, seed)
    ledger = (
        CollectiveLedger(timeout_s=LEDGER_TIMEOUT_S)
        if CollectiveLedger
        else contextlib.nullcontext()
    )
    try:
        with ledger:
            losses = train_and_log(
                model,
                torch.optim.SGD(model.parameters(), lr=0.1),
                batches[dist.get_rank()],
            )
    except CollectiveHang as e:
        return {"ledger": e.report}
    return {
        "losses": list(losses) if isinstance(losses, (list, tuple)) else losses,
        "params": [p.detach() for p in model.parameters()],
    }


def whole_batch(counts, seed):
    """One process, the whole batch of each step: the losses and final weights."""
    import torch

    whole, batches = make_case(counts, seed)
    opt = torch.optim.SGD(whole.parameters(), lr=0.1)
    losses = []
    for i in range(min(counts)):
        x = torch.cat([b[i][0] for b in batches])
        y = torch.cat([b[i][1] for b in batches])
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(whole(x), y)
        losses.append(float(loss.detach()))
        loss.backward()
        opt.step()
    return losses, [p.detach() for p in whole.parameters()]


def run(sol, counts, seed):
    from _judge.ranks import max_diff

    shown = (
        f"{len(counts)} ranks holding {', '.join(map(str, counts))} "
        "batches of 3 examples, SGD lr=0.1"
    )
    expected, weights = whole_batch(counts, seed)  # here, before the ranks run
    results = on_ranks(
        worker, len(counts), sol.train_and_log, counts, seed, timeout_s=HANG_TIMEOUT_S
    )
    stopped = [r["ledger"] for r in results if "ledger" in r]
    if stopped:
        fail(
            "the ranks' collectives part ways, so they would hang (or gloo abort on "
            "mismatched sizes). The collective ledger of chapter 8 (mylib.ledger) "
            "numbered each rank's collectives and stopped the ranks where they "
            "differ: per rank, the last call all agree on, then its own next call",
            input=shown,
            where=stopped[0].split("\n", 1)[1],
        )
    for rank, r in enumerate(results):
        expect_close(
            r["losses"],
            expected,
            input=shown,
            rel=1e-5,
            abs_tol=1e-7,
            what=f"the losses rank {rank} returns "
            "(one global mean per step, on every rank)",
        )
        diff = max_diff(r["params"], weights)
        if diff > 1e-6:
            fail(
                f"on rank {rank} the weights differ from single-process "
                f"training on the whole batch by up to {diff:.3g}",
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
