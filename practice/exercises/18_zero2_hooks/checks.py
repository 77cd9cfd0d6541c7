"""Checks for exercise 6.3: on gloo ranks, against one process, with the gradient
bytes a rank holds measured at every reduce-scatter and every fresh gradient.

The ranks send back their weights; one process's SGD on the whole batch runs
here, in the judge. The bytes held are measured in the ranks (what a
determined reader can fake there: practice/README.md).
"""

import math

from _judge.checking import check, fail
from _judge.ranks import on_ranks

RANK_PRELOAD = ("torch.optim", "torch._dynamo", "torch.utils._python_dispatch")
LAYERS, WIDTH, PER_RANK, STEPS = 12, 32, 4, 3
_results = {}  # world size -> the ranks' results, computed once for the checks


def make_tracker():
    """A dispatch mode that counts the bytes of gradient storages alive.

    A storage counts from when it is noted (a fresh ``param.grad``, or any tensor
    a reduce-scatter reads or writes) until it is freed; ``peak`` is the most
    bytes counted at once.
    """
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Tracker(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.alive, self.peak = {}, 0

        def note(self, tensor):
            storage = tensor.untyped_storage()
            key = id(storage)
            if key not in self.alive:
                self.alive[key] = storage.nbytes()
                weakref.finalize(storage, self.alive.pop, key, None)
            self.peak = max(self.peak, sum(self.alive.values()))

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func.name().startswith("c10d::") and "reduce_scatter" in func.name():
                for t in tree_leaves((args, kwargs, out)):
                    if torch.is_tensor(t):
                        self.note(t)
            return out

    return Tracker()


def make_model(seed):
    import torch

    torch.manual_seed(seed)
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def batches(seed, world):
    """Every step's whole batch, the same wherever it is drawn."""
    import torch

    g = torch.Generator().manual_seed(100 + seed)
    return [
        (
            torch.randn(world * PER_RANK, WIDTH, generator=g),
            torch.randn(world * PER_RANK, WIDTH, generator=g),
        )
        for _ in range(STEPS)
    ]


def worker(Zero2SGD, seed):
    import torch
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model(seed)
    tracker = make_tracker()
    for p in model.parameters():  # before the reader's hooks: sees each fresh .grad
        p.register_post_accumulate_grad_hook(lambda p: tracker.note(p.grad))
    out = {"steps": []}
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    with (
        spy_on_dist(
            ["reduce_scatter_single", "reduce_scatter"],
            forbid=["all_reduce"],
            reader_functions=[Zero2SGD.__init__],
            why="in ZeRO-2 a rank receives only its shard of the gradient "
            "(reduce_scatter_single), never the whole of it",
        ) as spy,
        tracker,
    ):
        opt = Zero2SGD(model, lr=0.1)
        for x, y in batches(seed, world):
            before = len(spy.calls)
            torch.nn.functional.mse_loss(model(x[mine]), y[mine]).backward()
            out["steps"].append(
                {
                    "reduce_scatters": len(spy.calls) - before,
                    "kept_grads": sum(p.grad is not None for p in model.parameters()),
                }
            )
            opt.step()
    out["params"] = [p.detach() for p in model.parameters()]
    out["peak"] = tracker.peak
    return out


def whole_batch(seed, world):
    """SGD on the whole batch in one process: the final weights."""
    import torch

    whole = make_model(seed)
    opt = torch.optim.SGD(whole.parameters(), lr=0.1)
    for x, y in batches(seed, world):
        opt.zero_grad()
        torch.nn.functional.mse_loss(whole(x), y).backward()
        opt.step()
    return [p.detach() for p in whole.parameters()]


def bounds(world):
    """(shards, bound, everything) in bytes for the model of the checks."""
    sizes = [WIDTH * WIDTH, WIDTH] * LAYERS
    shards = sum(math.ceil(n / world) for n in sizes) * 4
    largest_flat = math.ceil(WIDTH * WIDTH / world) * world * 4
    layer = (WIDTH * WIDTH + WIDTH) * 4
    return shards, shards + layer + 3 * largest_flat, sum(sizes) * 4


def results(sol, world):
    shown = (
        f"{world} ranks, {LAYERS} x (Linear({WIDTH}, {WIDTH}), Tanh), {PER_RANK} "
        f"examples per rank; opt = Zero2SGD(model, lr=0.1), then {STEPS} steps of "
        "backward() and opt.step()"
    )
    if world not in _results:
        expected = whole_batch(world, world)  # here, before the ranks run
        ranks = on_ranks(worker, world, sol.Zero2SGD, world)
        for r in ranks:
            r["expected"] = expected
            r["n_params"] = len(expected)
        _results[world] = ranks
    return shown, _results[world]


def trains(sol, world):
    from _judge.ranks import max_diff

    shown, ranks = results(sol, world)
    for rank, r in enumerate(ranks):
        diff = max_diff(r["params"], r["expected"])
        if diff > 1e-6:
            fail(
                f"on rank {rank} the weights after {STEPS} steps differ from SGD "
                f"on the whole batch in one process by up to {diff:.3g}",
                input=shown,
            )
        spread = max_diff(r["params"], ranks[0]["params"])
        if spread > 0:
            fail(
                f"rank {rank}'s weights differ from rank 0's by "
                f"{spread:.3g}: all-gather every updated slice",
                input=shown,
            )


@check("2 ranks: three steps equal SGD on the whole batch")
def two_ranks(sol):
    trains(sol, 2)


@check("3 ranks (padded shards): three steps equal SGD on the whole batch")
def three_ranks(sol):
    trains(sol, 3)


@check("the backward reduce-scatters every gradient and keeps none whole")
def in_backward(sol):
    for world in (2, 3):
        shown, ranks = results(sol, world)
        for rank, r in enumerate(ranks):
            for step, s in enumerate(r["steps"], 1):
                if s["kept_grads"]:
                    fail(
                        f"on rank {rank}, after backward {step}, {s['kept_grads']} "
                        "parameters still hold a full .grad: set param.grad = None "
                        "in the hook, once it is in the flat buffer",
                        input=shown,
                    )
                if s["reduce_scatters"] != r["n_params"]:
                    fail(
                        f"on rank {rank}, backward {step} launched "
                        f"{s['reduce_scatters']} reduce-scatters for {r['n_params']} "
                        "parameters: launch one from each parameter's hook",
                        input=shown,
                    )


@check("bounded memory: the shards, one layer and at most a few buffers in flight")
def bounded(sol):
    for world in (2, 3):
        shown, ranks = results(sol, world)
        shards, bound, everything = bounds(world)
        for rank, r in enumerate(ranks):
            if r["peak"] > bound:
                fail(
                    f"on rank {rank} the gradient bytes held peaked at {r['peak']}, "
                    f"over the bound of {bound} (the shards, {shards}, one layer's "
                    "gradients and three flat buffers; the whole gradient is "
                    f"{everything}): set param.grad = None in its hook, and wait "
                    "for the oldest reduce-scatter (dropping its flat buffer) "
                    "before a third starts",
                    input=shown,
                    expected=f"at most {bound} bytes",
                    got=r["peak"],
                )
