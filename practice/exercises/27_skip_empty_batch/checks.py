"""Checks for exercise 8.2: on gloo ranks inside the collective ledger of chapter 8,
against one process on each step's rows and against PyTorch's DDP.

The reader's loop runs in mylib.ledger.CollectiveLedger: ranks whose
collectives part stop there, and the ledger's report comes back instead of
a hang. One process's training is computed here, in the judge; DDP runs on
ranks that load none of the reader's code.
"""

from _judge.checking import check, fail
from _judge.ranks import max_diff, on_ranks, reference_on_ranks

RANK_PRELOAD = ("torch.optim", "torch._dynamo", "torch.nn.parallel")
ROWS = {2: [[2, 2, 2], [2, 2, 0]], 3: [[2, 2, 2], [2, 2, 0], [2, 2, 1]]}
LEDGER_TIMEOUT_S = 5


def make_model(seed):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2)
    )


def make_data(world, seed):
    """data[step][rank] = (x, y), with ROWS[world][rank][step] rows."""
    import torch

    g = torch.Generator().manual_seed(900 + seed)
    steps = len(ROWS[world][0])
    return [
        [
            (
                torch.randn(ROWS[world][r][s], 4, generator=g),
                torch.randn(ROWS[world][r][s], 2, generator=g),
            )
            for r in range(world)
        ]
        for s in range(steps)
    ]


def global_batch(world):
    return 2 * world  # the nominal rows of a step: 2 per rank


def worker(train, seed):
    import contextlib

    import torch
    import torch.distributed as dist

    try:
        from mylib.ledger import CollectiveHang, CollectiveLedger
    except ImportError:  # without the book's library: the judge's hang report
        CollectiveHang, CollectiveLedger = (), None
    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(seed)
    mine = [step[rank] for step in make_data(world, seed)]
    ledger = (
        CollectiveLedger(timeout_s=LEDGER_TIMEOUT_S)
        if CollectiveLedger
        else contextlib.nullcontext()
    )
    try:
        with ledger:
            steps = train(
                model,
                torch.optim.SGD(model.parameters(), lr=0.1),
                mine,
                global_batch(world),
            )
    except CollectiveHang as e:
        return {"ledger": e.report}
    return {"params": [p.detach() for p in model.parameters()], "steps": steps}


def torch_worker(seed):
    """PyTorch's DDP on the same batches, every rank running every step (DDP
    averages, so the summed loss is multiplied by the world size)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    ddp = DDP(make_model(seed))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in make_data(world, seed):
        x, y = step[rank]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y, reduction="sum")
        (loss / global_batch(world) * world).backward()
        opt.step()
    return [p.detach() for p in ddp.parameters()]


def one_process(world, seed, skip_partial=False):
    """SGD on each step's rows of all ranks, the loss their summed squared error
    over the nominal global batch. ``skip_partial``: skip every step in which
    some rank's batch is empty (what stopping all ranks there gives)."""
    import torch

    model = make_model(seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in make_data(world, seed):
        if skip_partial and any(len(x) == 0 for x, _ in step):
            continue
        x = torch.cat([b[0] for b in step])
        y = torch.cat([b[1] for b in step])
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum")
        (loss / global_batch(world)).backward()
        opt.step()
    return [p.detach() for p in model.parameters()]


_results = {}


def results(sol, world):
    if world not in _results:
        seed = 5 + world
        expected = one_process(world, seed)
        skipped = one_process(world, seed, skip_partial=True)
        theirs = reference_on_ranks(torch_worker, world, seed)
        ranks = on_ranks(worker, world, sol.train, seed)
        _results[world] = (ranks, expected, skipped, theirs)
    return _results[world]


def shown(world):
    rows = "; ".join(
        f"rank {r}: {', '.join(map(str, counts))} rows"
        for r, counts in enumerate(ROWS[world])
    )
    return (
        f"{world} ranks, {len(ROWS[world][0])} steps ({rows}), "
        f"train(model, SGD(lr=0.1), batches, global_batch={global_batch(world)})"
    )


def never_part(sol, world):
    ranks, _, _, _ = results(sol, world)
    stopped = [r["ledger"] for r in ranks if "ledger" in r]
    if stopped:
        report = stopped[0].split("\n", 1)[1]
        barrier = " barrier" in report
        fail(
            "the ranks' collectives part ways, so they would hang. The collective "
            "ledger of chapter 8 (mylib.ledger) stopped the ranks where their calls "
            "differ: per rank, the last call all agree on, then its own next call"
            + (
                ". A rank calls barrier where the others all-reduce: a barrier "
                "does not stand in for the all-reduces it skips"
                if barrier
                else ""
            ),
            input=shown(world),
            where=report,
        )
    return ranks


@check("2 ranks, rank 1's last batch empty: the ranks' collectives never part")
def two_ranks_agree(sol):
    never_part(sol, 2)


def check_weights(sol, world):
    ranks = never_part(sol, world)
    _, expected, skipped, _ = results(sol, world)
    for rank, r in enumerate(ranks):
        diff = max_diff(r["params"], expected)
        if diff > 1e-6:
            why = ""
            if max_diff(r["params"], skipped) <= 1e-6:
                why = (
                    ": they are one process's that skipped the steps in which some "
                    "rank's batch was empty. Every rank stopped there, and the rows "
                    "of the ranks that had some were never trained on"
                )
            fail(
                f"on rank {rank} the weights differ from one process's on each "
                f"step's rows of all ranks by up to {diff:.3g}{why}",
                input=shown(world),
            )


@check("2 ranks: the weights equal one process's on every step's rows")
def two_ranks(sol):
    check_weights(sol, 2)


@check("3 ranks, two of them short: the weights equal one process's")
def three_ranks(sol):
    check_weights(sol, 3)


@check("the weights equal PyTorch's DDP on the same batches")
def like_torch(sol):
    for world in (2, 3):
        ranks = never_part(sol, world)
        _, _, _, theirs = results(sol, world)
        for rank, r in enumerate(ranks):
            diff = max_diff(r["params"], theirs[rank])
            if diff > 1e-6:
                fail(
                    f"on rank {rank} the weights differ from PyTorch's DDP's on the "
                    f"same batches by up to {diff:.3g}",
                    input=shown(world),
                )
