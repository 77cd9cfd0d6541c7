"""Checks for exercise 6.4: on gloo ranks, against one process, with the gathered
parameter bytes a rank holds measured at every all-gather.

The ranks send back their shards; one process's SGD on the whole batch runs
here, in the judge, which also puts the shards together. The bytes alive are
measured in the ranks (what a determined reader can fake there:
practice/README.md).
"""

import math

from _judge.checking import check, fail
from _judge.ranks import on_ranks

RANK_PRELOAD = ("torch.optim", "torch._dynamo", "torch.utils._python_dispatch")
DIMS = (8, 16, 16, 4)
PER_RANK, STEPS = 4, 3
_results = {}  # world size -> the ranks' results, computed once for the checks


def make_tracker(persistent):
    """A dispatch mode that counts the bytes of gathered parameters alive.

    Every tensor an all-gather touches is noted, except the storages in
    ``persistent`` (the shards); it counts with its storage's current size
    (0 once freed or resized to 0). ``peak`` is the most counted at an all-gather.
    """
    import gc
    import time
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Tracker(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen, self.peak = {}, 0

        def alive(self, generation=2, settle_s=0.0):
            # A storage in a reference cycle lives until the collector runs, and
            # gloo's thread may hold a finished all-gather's output a moment
            # longer: collect, and give a nonzero count up to settle_s to settle.
            deadline = time.monotonic() + settle_s
            while True:
                gc.collect(generation)
                live = [r() for r in self.seen.values()]
                held = sum(s.nbytes() for s in live if s)
                if held == 0 or time.monotonic() >= deadline:
                    return held
                time.sleep(0.01)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func.name().startswith("c10d::") and "allgather" in func.name():
                for t in tree_leaves((args, kwargs, out)):
                    if torch.is_tensor(t):
                        storage = t.untyped_storage()
                        if id(storage) not in persistent:
                            self.seen.setdefault(id(storage), weakref.ref(storage))
                self.seen = {k: r for k, r in self.seen.items() if r() is not None}
                self.peak = max(self.peak, self.alive(generation=0))
            return out

    return Tracker()


def make_model(seed):
    import torch

    torch.manual_seed(seed)
    layers = []
    for i, (a, b) in enumerate(zip(DIMS, DIMS[1:])):
        layers += [torch.nn.Linear(a, b)] + ([torch.nn.Tanh()] if i < 2 else [])
    return torch.nn.Sequential(*layers)


def batches(seed, world):
    """Every step's whole batch, the same wherever it is drawn."""
    import torch

    g = torch.Generator().manual_seed(100 + seed)
    return [
        (
            torch.randn(world * PER_RANK, DIMS[0], generator=g),
            torch.randn(world * PER_RANK, DIMS[-1], generator=g),
        )
        for _ in range(STEPS)
    ]


def worker(ShardedLinear, seed):
    import torch
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    rank, world = dist.get_rank(), dist.get_world_size()
    units = [m for m in make_model(seed) if isinstance(m, torch.nn.Linear)]
    names = [
        "all_gather_single",
        "all_gather",
        "reduce_scatter_single",
        "reduce_scatter",
    ]
    spied = {
        "forbid": ["all_reduce", "broadcast"],
        "reader_functions": [ShardedLinear.__init__],
        "why": "in ZeRO-3 parameters travel by all-gather and gradients by "
        "reduce-scatter",
    }
    with spy_on_dist(names, **spied):
        sharded = [ShardedLinear(u) for u in units]
    out = {
        "steps": [],
        "shards": [[p.detach().clone() for p in m.parameters()] for m in sharded],
    }
    if any(len(s) != 1 for s in out["shards"]):
        return out  # the layout is wrong: the check says how
    model = torch.nn.Sequential(
        sharded[0], torch.nn.Tanh(), sharded[1], torch.nn.Tanh(), sharded[2]
    )
    persistent = {id(p.untyped_storage()) for p in model.parameters()}
    tracker = make_tracker(persistent)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    with spy_on_dist(names, **spied) as spy, tracker:
        for x, y in batches(seed, world):
            spy.calls.clear()
            loss = torch.nn.functional.mse_loss(model(x[mine]), y[mine])
            after_forward = tracker.alive(settle_s=0.1)
            gathers_forward = sum(c[0].startswith("all_gather") for c in spy.calls)
            loss.backward()
            opt.step()
            opt.zero_grad()
            out["steps"].append(
                {
                    "after_forward": after_forward,
                    "after_step": tracker.alive(settle_s=0.1),
                    "gathers_forward": gathers_forward,
                    "gathers": sum(c[0].startswith("all_gather") for c in spy.calls),
                    "scatters": sum(
                        c[0].startswith("reduce_scatter") for c in spy.calls
                    ),
                }
            )
    out["final"] = [next(m.parameters()).detach() for m in sharded]
    out["peak"] = tracker.peak
    return out


def flat_units(model, world):
    """Each Linear's weight.flatten() then bias, zero-padded to a multiple of world."""
    import torch

    out = []
    for unit in (m for m in model if isinstance(m, torch.nn.Linear)):
        flat = torch.cat([unit.weight.detach().flatten(), unit.bias.detach()])
        size = math.ceil(flat.numel() / world)
        padded = torch.zeros(size * world)
        padded[: flat.numel()] = flat
        out.append((padded, size, unit))
    return out


def whole_batch(seed, world):
    """SGD on the whole batch in one process: each unit's flat weights, at the start
    and at the end."""
    import torch

    whole = make_model(seed)
    start = flat_units(whole, world)
    opt = torch.optim.SGD(whole.parameters(), lr=0.1)
    for x, y in batches(seed, world):
        opt.zero_grad()
        torch.nn.functional.mse_loss(whole(x), y).backward()
        opt.step()
    return start, flat_units(whole, world)


def unit_bytes(world):
    return [math.ceil((a * b + b) / world) * world * 4 for a, b in zip(DIMS, DIMS[1:])]


def results(sol, world):
    shown = (
        f"{world} ranks, Sequential(ShardedLinear(Linear(8, 16)), Tanh, "
        "ShardedLinear(Linear(16, 16)), Tanh, ShardedLinear(Linear(16, 4))), "
        f"{PER_RANK} examples per rank, {STEPS} steps of "
        "torch.optim.SGD(model.parameters(), lr=0.1)"
    )
    if world not in _results:
        expected = whole_batch(world, world)  # here, before the ranks run
        _results[world] = (on_ranks(worker, world, sol.ShardedLinear, world), expected)
    ranks, (start, _) = _results[world]
    for rank, r in enumerate(ranks):  # the layout: one parameter, its S elements
        for k, ((padded, size, unit), params) in enumerate(zip(start, r["shards"])):
            if len(params) != 1 or params[0].numel() != size:
                fail(
                    f"on rank {rank}: unit {k} (Linear({unit.in_features}, "
                    f"{unit.out_features})) has {len(params)} parameters of "
                    f"{[p.numel() for p in params]} elements: it should have one, "
                    f"its shard of {size} elements",
                    input=shown,
                )
            if not bool(
                (params[0].flatten() == padded[rank * size : (rank + 1) * size]).all()
            ):
                fail(
                    f"on rank {rank}: unit {k}'s shard does not hold elements "
                    f"{rank * size} to {(rank + 1) * size - 1} of the flat vector "
                    "(weight.flatten(), then bias, zero-padded)",
                    input=shown,
                )
    return shown, ranks


def trains(sol, world):
    shown, ranks = results(sol, world)
    _, (_, final) = _results[world]
    for k, (padded, _, _) in enumerate(final):
        # The whole unit, gathered here from every rank's shard.
        gathered = torch_cat([r["final"][k].flatten() for r in ranks])
        diff = (
            float((gathered - padded).abs().max())
            if gathered.shape == padded.shape
            else float("inf")
        )
        if diff > 1e-6:
            fail(
                f"the gathered weights of unit {k} after {STEPS} steps differ "
                f"from one process's on the whole batch by up to {diff:.3g}",
                input=shown,
            )


def torch_cat(tensors):
    import torch

    return torch.cat(tensors)


@check("2 ranks: each keeps its shard; three steps equal one process")
def two_ranks(sol):
    trains(sol, 2)


@check("3 ranks (padded shards): three steps equal one process")
def three_ranks(sol):
    trains(sol, 3)


@check("each step gathers every unit twice and reduce-scatters it once")
def traffic(sol):
    units = len(DIMS) - 1
    for world in (2, 3):
        shown, ranks = results(sol, world)
        for rank, r in enumerate(ranks):
            for step, s in enumerate(r["steps"], 1):
                where = f"on rank {rank}, step {step}"
                if s["gathers_forward"] != units:
                    fail(
                        f"{where}, the forward made {s['gathers_forward']} all-gathers "
                        f"for {units} units: one per unit, just before it computes",
                        input=shown,
                    )
                if s["gathers"] != 2 * units:
                    fail(
                        f"{where}, the step made {s['gathers']} all-gathers for "
                        f"{units} units: gather each unit again in the backward",
                        input=shown,
                    )
                if s["scatters"] != units:
                    fail(
                        f"{where}, the backward made {s['scatters']} reduce-scatters "
                        f"for {units} units: one per unit's gradient",
                        input=shown,
                    )


@check("the gathered parameters are freed after use")
def freed(sol):
    for world in (2, 3):
        shown, ranks = results(sol, world)
        two_units = sum(sorted(unit_bytes(world))[-2:])
        # gloo's worker thread can hold the output of the collective it ran last
        # for a while after wait() returns (measured: one unit, now and then),
        # so one unit's worth is not counted against the reader.
        in_flight = max(unit_bytes(world))
        for rank, r in enumerate(ranks):
            for step, s in enumerate(r["steps"], 1):
                if s["after_forward"] > in_flight:
                    fail(
                        f"on rank {rank}, step {step}, {s['after_forward']} bytes of "
                        "gathered parameters are still alive when the forward "
                        "returns: do not keep (or let autograd save) the full "
                        "weights; gather them again in the backward",
                        input=shown,
                    )
                if s["after_step"] > in_flight:
                    fail(
                        f"on rank {rank}, after step {step}, {s['after_step']} bytes "
                        "of gathered parameters are still alive: free them after "
                        "the backward too",
                        input=shown,
                    )
            if r["peak"] > two_units:
                fail(
                    f"on rank {rank} the gathered parameters alive peaked at "
                    f"{r['peak']} bytes, more than two units' worth ({two_units}): "
                    "free each unit's full parameters once it has computed",
                    input=shown,
                    expected=f"at most {two_units} bytes",
                    got=r["peak"],
                )
