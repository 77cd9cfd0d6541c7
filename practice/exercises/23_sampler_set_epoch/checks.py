"""Checks for exercise 2.4: on gloo ranks, the order each rank reads against
PyTorch's DistributedSampler, and the weights against one process.

The ranks send back the indices they read and their weights. The orders
DistributedSampler gives with set_epoch(epoch), and one process's training
on the same global batches, are computed here, in the judge.
"""

from _judge.checking import check, fail
from _judge.ranks import max_diff, on_ranks

RANK_PRELOAD = ("torch.optim", "torch._dynamo", "torch.utils.data")
EPOCHS, BATCH, SEED = 3, 3, 0  # SEED: the sampler's, as in the starter
CASES = {2: 20, 3: 22}  # ranks -> samples (22 over 3 ranks: padded to 24)


def make_case(n):
    """The model and the dataset of (index, x, y), the same wherever built."""
    import torch
    from torch.utils.data import TensorDataset

    torch.manual_seed(n)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2)
    )
    g = torch.Generator().manual_seed(100 + n)
    data = TensorDataset(
        torch.arange(n), torch.randn(n, 4, generator=g), torch.randn(n, 2, generator=g)
    )
    return model, data


def worker(train, n):
    import torch

    model, data = make_case(n)
    read = train(
        model, torch.optim.SGD(model.parameters(), lr=0.05), data, EPOCHS, BATCH
    )
    return {
        "read": [list(epoch) for epoch in read]
        if isinstance(read, (list, tuple))
        else read,
        "params": [p.detach() for p in model.parameters()],
    }


def expected_orders(n, world):
    """What PyTorch's DistributedSampler gives rank r in epoch e after set_epoch(e)."""
    from torch.utils.data import DistributedSampler

    orders = []
    for rank in range(world):
        sampler = DistributedSampler(
            range(n), num_replicas=world, rank=rank, shuffle=True, seed=SEED
        )
        per_epoch = []
        for epoch in range(EPOCHS):
            sampler.set_epoch(epoch)
            per_epoch.append(list(sampler))
        orders.append(per_epoch)
    return orders


def one_process(n, world, orders):
    """SGD in one process on each step's global batch: every rank's batch of it."""
    import torch

    model, data = make_case(n)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    _, x_all, y_all = data.tensors
    for epoch in range(EPOCHS):
        steps = -(-len(orders[0][epoch]) // BATCH)
        for step in range(steps):
            rows = [
                orders[r][epoch][step * BATCH : (step + 1) * BATCH]
                for r in range(world)
            ]
            opt.zero_grad()
            # the mean of each rank's mean: the ranks' batches are of one size
            losses = [
                torch.nn.functional.mse_loss(model(x_all[i]), y_all[i]) for i in rows
            ]
            (sum(losses) / world).backward()
            opt.step()
    return [p.detach() for p in model.parameters()]


_results = {}


def results(sol, world):
    if world not in _results:
        n = CASES[world]
        orders = expected_orders(n, world)
        weights = one_process(n, world, orders)
        _results[world] = (on_ranks(worker, world, sol.train, n), orders, weights)
    return _results[world]


def shown(world):
    return (
        f"{world} ranks, {CASES[world]} samples, DistributedSampler(shuffle=True, "
        f"seed={SEED}), batches of {BATCH}, {EPOCHS} epochs of SGD"
    )


def read_lists(ranks, world):
    for rank, r in enumerate(ranks):
        read = r["read"]
        if not (
            isinstance(read, list)
            and len(read) == EPOCHS
            and all(isinstance(e, list) for e in read)
        ):
            fail(
                f"on rank {rank} train must return one list of indices per epoch "
                f"({EPOCHS} lists)",
                input=shown(world),
                got=read,
            )
    return [r["read"] for r in ranks]


@check("each epoch, the ranks read disjoint shares that cover the dataset")
def disjoint(sol):
    for world in (2, 3):
        ranks, orders, _ = results(sol, world)
        read = read_lists(ranks, world)
        n = CASES[world]
        for epoch in range(EPOCHS):
            owners = {}
            for rank in range(world):
                for i in set(read[rank][epoch]):
                    owners.setdefault(i, set()).add(rank)
            padded = len(orders[0][epoch]) * world - n  # repeats that pad the shares
            shared = sorted(i for i, who in owners.items() if len(who) > 1)
            if len(shared) > padded:
                fail(
                    f"in epoch {epoch} samples {shared[:8]} were read by several "
                    "ranks: the ranks' shares overlap, so their samplers do not "
                    "agree on one shuffled order (the same seed on every rank)",
                    input=shown(world),
                )
            missing = sorted(set(range(n)) - set(owners))
            if missing:
                fail(
                    f"in epoch {epoch} samples {missing[:8]} were read by no rank",
                    input=shown(world),
                )


def same_order_words(read, orders, rank):
    """What is wrong with a rank's orders over the epochs, when that names it."""
    mine = read[rank]
    if all(epoch == mine[0] for epoch in mine[1:]):
        return (
            "every epoch repeats epoch 0's order: the sampler draws the same "
            "shuffle each time"
        )
    if mine[0] == orders[rank][0] and all(
        mine[e] == orders[rank][e - 1] for e in range(1, len(mine))
    ):
        return (
            "each epoch got the shuffle the epoch before should have had. The order "
            "is drawn when the epoch's iteration over the DataLoader begins"
        )
    return ""


@check("a new order each epoch: DistributedSampler's with set_epoch(epoch)")
def reshuffled(sol):
    for world in (2, 3):
        ranks, orders, _ = results(sol, world)
        read = read_lists(ranks, world)
        for rank in range(world):
            for epoch in range(EPOCHS):
                if read[rank][epoch] != orders[rank][epoch]:
                    why = same_order_words(read, orders, rank)
                    fail(
                        f"on rank {rank}, epoch {epoch} read the samples in another "
                        "order than PyTorch's DistributedSampler gives that epoch"
                        + (f": {why}" if why else ""),
                        input=shown(world),
                        expected=orders[rank][epoch][:10],
                        got=read[rank][epoch][:10],
                    )


@check("the weights equal one process trained on the same global batches")
def weights(sol):
    for world in (2, 3):
        ranks, _, expected = results(sol, world)
        for rank, r in enumerate(ranks):
            diff = max_diff(r["params"], expected)
            if diff > 1e-6:
                fail(
                    f"on rank {rank} the weights after {EPOCHS} epochs differ from "
                    f"one process's on the same global batches by up to {diff:.3g}",
                    input=shown(world),
                )
