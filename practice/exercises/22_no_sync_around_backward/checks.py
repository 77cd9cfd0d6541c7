"""Checks for exercise 4.2: on gloo ranks with PyTorch's DDP, against one process
on the whole batch and against DDP used as its documentation says.

Which micro-steps all-reduced is decided here, in the judge, from the raw
gradients each rank sends back after every micro-step: after DDP all-reduces,
every rank holds the same gradients; after a micro-step under ``no_sync()``,
each holds its own. (DDP's reducer all-reduces in C++, out of sight of a spy
on torch.distributed, and a hook counting in the ranks is the reader's to
replace.) The weights of one process on the whole batch are computed here;
DDP with the documented no_sync runs on ranks that load none of the reader's
code.
"""

import contextlib

from _judge.checking import check, fail, verbatim
from _judge.ranks import max_diff, on_ranks, reference_on_ranks, spread

RANK_PRELOAD = ("torch.optim", "torch._dynamo", "torch.nn.parallel")
MICRO = 3  # examples per micro-batch
TWO_RANKS = [(1, 2, 10), (2, 2, 11), (4, 2, 12)]  # (micro-batches, steps, seed)
THREE_RANKS = [(3, 2, 13)]


def make_model(seed):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )


def batches(seed, world, accum, steps):
    """Every step's whole batch: world x accum micro-batches of MICRO examples."""
    import torch

    g = torch.Generator().manual_seed(1000 + seed)
    n = world * accum * MICRO
    return [
        (torch.randn(n, 6, generator=g), torch.randn(n, 2, generator=g))
        for _ in range(steps)
    ]


def documented_train_step(ddp, optimizer, micro_batches, loss_fn):
    """DDP's own advice (the warning in ``no_sync``'s docstring): the forward and
    the backward of every micro-batch but the last inside ``no_sync()``."""
    optimizer.zero_grad()
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        with ddp.no_sync() if i < k - 1 else contextlib.nullcontext():
            (loss_fn(ddp(x), y) / k).backward()
    optimizer.step()


def worker(train_step, configs):
    """``train_step`` on DDP: per step, each rank's gradients after every
    micro-step (at the next micro-step's loss, and as the optimizer steps); the
    weights."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for accum, steps, seed in configs:
        ddp = DDP(make_model(seed))
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        seen = []  # per step: the gradients at each loss, then at the step

        def grads():
            return [
                None if p.grad is None else p.grad.detach().clone()
                for p in ddp.parameters()
            ]

        opt.register_step_pre_hook(lambda *_: seen[-1].append(grads()))
        for x, y in batches(seed, world, accum, steps):
            mine = [
                (
                    x.view(world, accum, MICRO, 6)[rank][i],
                    y.view(world, accum, MICRO, 2)[rank][i],
                )
                for i in range(accum)
            ]

            def loss_fn(output, target):
                seen[-1].append(grads())
                return torch.nn.functional.mse_loss(output, target)

            seen.append([])
            train_step(ddp, opt, mine, loss_fn)
        out.append({"seen": seen, "params": [p.detach() for p in ddp.parameters()]})
    return out


def synced(per_rank, accum):
    """The micro-steps of one step after which every rank held the same gradients:
    those that all-reduced. ``per_rank``: each rank's gradients as ``worker``
    saw them in that step (at each micro-step's loss, then at the step)."""
    after = [seen[1:] for seen in per_rank]  # the first loss comes before any
    if any(len(a) != accum for a in after):
        return None
    return [
        i + 1
        for i in range(accum)
        if all(g is not None for a in after for g in a[i])
        and spread([a[i] for a in after]) == 0.0
    ]


def whole_batch(world, configs):
    """One process, SGD on each step's whole batch: the weights, per config."""
    import torch

    out = []
    for accum, steps, seed in configs:
        model = make_model(seed)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in batches(seed, world, accum, steps):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        out.append([p.detach() for p in model.parameters()])
    return out


_results = {}


def per_step(ranks, configs):
    """Per config, per step: the micro-steps that all-reduced (None: unknown)."""
    return [
        [
            synced([r[c]["seen"][step] for r in ranks], accum)
            for step in range(len(ranks[0][c]["seen"]))
        ]
        for c, (accum, _, _) in enumerate(configs)
    ]


def results(sol, world):
    """(the reader's ranks, DDP as documented on reference ranks, one process,
    and which micro-steps all-reduced in each: the reader's, documented DDP's)."""
    if world not in _results:
        configs = TWO_RANKS if world == 2 else THREE_RANKS
        expected = whole_batch(world, configs)
        theirs = reference_on_ranks(worker, world, documented_train_step, configs)
        mine = on_ranks(worker, world, sol.train_step, configs)
        _results[world] = (
            mine,
            theirs,
            expected,
            (per_step(mine, configs), per_step(theirs, configs)),
        )
    return _results[world]


def shown(world, accum, steps):
    return (
        f"{world} ranks, DistributedDataParallel(model), {steps} steps of "
        f"train_step(ddp, SGD(lr=0.1), {accum} micro-batches of {MICRO} examples, "
        "mse_loss)"
    )


def synced_words(synced, accum):
    """What the per-micro-step reductions of one step say, in words."""
    if synced is None:
        return (
            f"loss_fn was not called once per micro-batch ({accum}), or "
            "optimizer.step() not once per step, so which micro-step all-reduced "
            "cannot be told"
        )
    if not synced:
        return (
            f"no micro-step all-reduced: the ranks' gradients were never averaged "
            f"(the last of the {accum} micro-steps must synchronise: its backward "
            "averages what all of them accumulated)"
        )
    if synced == list(range(1, accum + 1)) and accum > 1:
        return (
            f"every micro-step all-reduced (all {accum}): no_sync() saved nothing, "
            f"{accum} times the communication of one step"
        )
    which = ", ".join(map(str, synced))
    return (
        f"micro-step{'s' if len(synced) > 1 else ''} {which} of {accum} all-reduced; "
        f"only the last one, micro-step {accum}, should"
    )


def check_weights(sol, world):
    ranks, _, expected, (mine, _) = results(sol, world)
    configs = TWO_RANKS if world == 2 else THREE_RANKS
    for rank, per_config in enumerate(ranks):
        for c, ((accum, steps, _), r, want) in enumerate(
            zip(configs, per_config, expected)
        ):
            diff = max_diff(r["params"], want)
            if diff > 1e-6:
                first = next((s for s in mine[c] if s != [accum]), [accum])
                fail(
                    f"on rank {rank} the weights differ from one process's on the "
                    f"whole batch by up to {diff:.3g}"
                    + (f": {synced_words(first, accum)}" if first != [accum] else ""),
                    input=shown(world, accum, steps),
                )


@check("2 ranks, 1, 2 and 4 micro-batches: the weights equal one process's")
def two_ranks(sol):
    check_weights(sol, 2)


@check("3 ranks, 3 micro-batches, two steps: the weights equal one process's")
def three_ranks(sol):
    check_weights(sol, 3)


@check("only the last micro-step all-reduces, as DDP with no_sync done right does")
def communication(sol):
    for world in (2, 3):
        _, _, _, (mine, theirs) = results(sol, world)
        configs = TWO_RANKS if world == 2 else THREE_RANKS
        for (accum, steps, _), got, want in zip(configs, mine, theirs):
            for step, (m, w) in enumerate(zip(got, want), 1):
                if m != w:
                    fail(
                        f"step {step}: {synced_words(m, accum)}",
                        input=shown(world, accum, steps),
                        expected=verbatim(f"all-reduces in micro-step(s) {w}"),
                        got=verbatim(f"all-reduces in micro-step(s) {m}"),
                    )


@check("the weights equal PyTorch's DDP with no_sync as its documentation says")
def like_torch(sol):
    for world in (2, 3):
        ranks, theirs, _, _ = results(sol, world)
        configs = TWO_RANKS if world == 2 else THREE_RANKS
        for rank, per_config in enumerate(ranks):
            for (accum, steps, _), r, ref in zip(configs, per_config, theirs[rank]):
                diff = max_diff(r["params"], ref["params"])
                if diff > 1e-6:
                    fail(
                        f"on rank {rank} the weights differ from DDP's with no_sync "
                        f"around each early micro-step's forward and backward by up "
                        f"to {diff:.3g}",
                        input=shown(world, accum, steps),
                    )
