"""Checks for exercise 4.1: on real gloo ranks, against whole-batch SGD."""

from _judge.checking import check, expect_equal, fail
from _judge.ranks import on_ranks

RANK_PRELOAD = (
    "torch.optim",
    "torch._dynamo",
)  # optimizers and DDP import them: once, before forking

MICRO = 3  # examples per micro-batch


def no_sync_worker(TinyDDP, raise_inside):
    import torch
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    torch.manual_seed(0)
    ddp = TinyDDP(
        torch.nn.Sequential(
            torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
        )
    )
    torch.manual_seed(1 + dist.get_rank())  # each rank its own data
    x, y = torch.randn(4, 6), torch.randn(4, 2)
    with spy_on_dist(["all_reduce"]) as spy:
        if raise_inside:
            try:
                with ddp.no_sync():
                    raise KeyError("an error inside the block")
            except KeyError:
                pass
        else:
            with ddp.no_sync():
                torch.nn.functional.mse_loss(ddp(x), y).backward()
        inside = spy.count("all_reduce")
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        after = spy.count("all_reduce") - inside
    return {
        "inside": inside,
        "after": after,
        "n_params": sum(1 for _ in ddp.parameters()),
    }


@check("no all-reduce inside no_sync, syncing again after it")
def no_sync_silences(sol):
    results = on_ranks(no_sync_worker, 2, sol.TinyDDP, False)
    shown = (
        "with ddp.no_sync(): loss.backward()   "
        "then, outside it: loss.backward()  (2 ranks)"
    )
    r = results[0]
    expect_equal(
        r["inside"], 0, input=shown, what="the number of all-reduces inside no_sync"
    )
    expect_equal(
        r["after"],
        r["n_params"],
        input=shown,
        what="the number of all-reduces in the backward after the block "
        "(one per parameter)",
    )


@check("syncing comes back even when the block raises")
def no_sync_exception(sol):
    results = on_ranks(no_sync_worker, 2, sol.TinyDDP, True)
    shown = (
        "with ddp.no_sync(): raise KeyError   "
        "then, outside it: loss.backward()  (2 ranks)"
    )
    expect_equal(
        results[0]["after"],
        results[0]["n_params"],
        input=shown,
        what="the number of all-reduces after the failed block (use try/finally)",
    )


def placement_worker(TinyDDP, forward_inside, backward_inside):
    import contextlib

    import torch
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    torch.manual_seed(0)
    ddp = TinyDDP(
        torch.nn.Sequential(
            torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
        )
    )
    torch.manual_seed(1 + dist.get_rank())
    x, y = torch.randn(4, 6), torch.randn(4, 2)
    with spy_on_dist(["all_reduce"]) as spy:
        with ddp.no_sync() if forward_inside else contextlib.nullcontext():
            loss = torch.nn.functional.mse_loss(ddp(x), y)
        with ddp.no_sync() if backward_inside else contextlib.nullcontext():
            loss.backward()
    return {"calls": spy.count("all_reduce"), "n_params": len(list(ddp.parameters()))}


@check("the forward decides whether its backward syncs, as in PyTorch's DDP")
def forward_decides(sol):
    for forward_inside, backward_inside in ((False, True), (True, False)):
        r = on_ranks(placement_worker, 2, sol.TinyDDP, forward_inside, backward_inside)[
            0
        ]
        where = {True: "inside no_sync()", False: "outside it"}
        shown = (
            f"loss = loss_fn(ddp(x), y) {where[forward_inside]}, "
            f"loss.backward() {where[backward_inside]}  (2 ranks)"
        )
        expected = 0 if forward_inside else r["n_params"]
        if r["calls"] != expected:
            fail(
                f"{r['calls']} all-reduce(s) in that backward, expected {expected}: "
                "PyTorch's DDP decides in forward() whether the coming backward "
                "synchronises (DistributedDataParallel._pre_forward and "
                "_post_forward read require_backward_grad_sync), and TinyDDP's "
                "forward() does the same. Leave TinyDDP as given and let no_sync() "
                "only set self.require_backward_grad_sync to False, and back",
                input=shown,
            )


def make_case(world, accum, steps, seed):
    """The model and each step's whole batch, the same wherever it is built."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)
    )
    n = world * accum * MICRO
    batches = [(torch.randn(n, 6), torch.randn(n, 2)) for _ in range(steps)]
    return model, batches


def whole_batch_sgd(world, accum, steps, seed):
    """The reference: one process, SGD on each step's whole batch."""
    import torch

    model, batches = make_case(world, accum, steps, seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in batches:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def train_worker(TinyDDP, train_step, configs):
    import torch
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for accum, steps, seed in configs:
        model, batches = make_case(world, accum, steps, seed)
        ddp = TinyDDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        calls, synced = [], []
        for x, y in batches:
            mine_x, mine_y = (
                x.view(world, accum, MICRO, 6)[rank],
                y.view(world, accum, MICRO, 2)[rank],
            )
            marks = []  # the all-reduces so far, at each micro-step's forward

            def loss_fn(output, target):
                marks.append(spy.count("all_reduce"))
                return torch.nn.functional.mse_loss(output, target)

            with spy_on_dist(["all_reduce"]) as spy:
                train_step(
                    ddp,
                    opt,
                    [(mine_x[i], mine_y[i]) for i in range(accum)],
                    loss_fn,
                )
            calls.append(spy.count("all_reduce"))
            marks.append(calls[-1])
            # Which micro-steps (from 1) all-reduced: between their forward and
            # the next one's.
            synced.append(
                [i + 1 for i in range(len(marks) - 1) if marks[i + 1] > marks[i]]
            )
        out.append(
            {
                "accum": accum,
                "steps": steps,
                "params": [p.detach() for p in model.parameters()],
                "calls": calls,
                "synced": synced,
                "n_params": sum(1 for _ in model.parameters()),
            }
        )
    return out


def run_training(sol, world, configs):
    # The references first, here in the judge, where the reader's code cannot
    # reach them; the ranks send back only their raw parameters.
    from _judge.ranks import max_diff

    references = [whole_batch_sgd(world, *config) for config in configs]
    results = on_ranks(train_worker, world, sol.TinyDDP, sol.train_step, configs)
    for rank, per_config in enumerate(results):
        for r, reference in zip(per_config, references):
            shown = (
                f"{world} ranks, {r['steps']} step(s) of train_step with "
                f"{r['accum']} micro-batch(es) of {MICRO} examples each, SGD lr=0.1"
            )
            expect_placement(r, shown)
            diff = max_diff(r["params"], reference)
            if diff > 1e-6:
                fail(
                    f"on rank {rank} the weights differ from single-process "
                    f"training on the whole batch by up to {diff:.3g}"
                    + _which_synced(r),
                    input=shown,
                )
    return results


def expect_placement(r, shown):
    """Both wrong placements of forward and backward around no_sync(), by name."""
    n = r["n_params"]
    for calls in r["calls"]:
        if calls == 0:
            fail(
                "nothing was all-reduced in a step, so each rank stepped with its "
                "own gradients: the last micro-batch's forward ran inside "
                "no_sync(). The forward decides whether its backward synchronises "
                "(as in PyTorch's DDP), so running only the backward outside the "
                "block is not enough: run the last micro-batch's forward and "
                "backward both outside no_sync()",
                input=shown,
            )
        if calls > n:
            fail(
                f"{calls} all-reduces in one step, {calls / n:g} per parameter: "
                "micro-batches before the last synchronised too. The forward "
                "decides whether its backward synchronises (as in PyTorch's DDP): "
                "a forward outside no_sync() makes its backward all-reduce even "
                "when that backward runs inside the block. Run each earlier "
                "micro-batch's forward and backward both inside `with ddp.no_sync():`",
                input=shown,
            )


def _which_synced(r):
    """Name the micro-step that synchronised, when it is not the last one alone."""
    accum = r["accum"]
    for step, synced in enumerate(r["synced"], 1):
        if synced != [accum]:
            said = (
                "no micro-step"
                if not synced
                else "micro-step"
                + ("s " if len(synced) > 1 else " ")
                + ", ".join(map(str, synced))
            )
            return (
                f": in step {step}, {said} of {accum} all-reduced "
                f"the gradients; only the last, micro-step {accum}, should "
                "(after it every micro-step's gradient is in .grad): an off-by-one "
                "in the test that picks the last micro-batch?"
            )
    return " (loss divided by the number of micro-batches? zero_grad first?)"


@check("2 ranks: train_step with 1, 2 and 4 micro-batches equals whole-batch SGD")
def two_ranks(sol):
    run_training(sol, 2, [(1, 1, 10), (2, 1, 11), (4, 1, 12)])


@check("3 ranks, 3 micro-batches, two steps in a row")
def three_ranks(sol):
    run_training(sol, 3, [(3, 2, 13)])


@check("one all-reduce per parameter per step, whatever the number of micro-batches")
def communication(sol):
    results = run_training(sol, 2, [(4, 2, 14)])
    r = results[0][0]
    expect_equal(
        r["calls"],
        [r["n_params"]] * r["steps"],
        input="2 ranks, 2 steps of train_step with 4 micro-batches each",
        what="the number of all-reduces in each step"
        + (_which_synced(r) if any(s != [r["accum"]] for s in r["synced"]) else ""),
    )
