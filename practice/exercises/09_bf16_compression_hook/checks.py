"""Checks for exercise 5.1: on real gloo ranks, alone and registered on PyTorch's DDP.

The averages are computed here, in the judge; PyTorch's own bf16 hook trains
on ranks that run none of the reader's code (reference_on_ranks), and the
weights of both are compared here.
"""

from _judge.checking import check, expect_equal, fail
from _judge.ranks import on_ranks

RANK_PRELOAD = (
    "torch.optim",
    "torch._dynamo",
)  # optimizers and DDP import them: once, before forking


class FakeBucket:
    """What a hook sees of a DDP bucket (``dist.GradBucket``).

    Enough to call a hook directly.
    """

    def __init__(self, buffer):
        self._buffer = buffer

    def buffer(self):
        return self._buffer

    def index(self):
        return 0

    def is_last(self):
        return True


def bucket(seed, rank):
    """Rank ``rank``'s bucket: 1000 float32 gradients, the same wherever made."""
    import torch

    torch.manual_seed(seed + rank)
    return torch.randn(1000) * 10


def direct_worker(hook, none_state, seed):
    import torch
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    buffer = bucket(seed, dist.get_rank())
    with spy_on_dist(["all_reduce"], reader_functions=[hook]) as spy:
        fut = hook(None if none_state else dist.group.WORLD, FakeBucket(buffer))
        is_future = isinstance(
            fut, torch._C.Future
        )  # torch.futures.Future and what get_future() returns
        value = fut.wait() if is_future else fut
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    return {
        "is_future": is_future,
        "value_type": type(value).__name__,
        "value": value if isinstance(value, torch.Tensor) else None,
        "calls": spy.calls,
    }


def run_direct(sol, world, none_state, seed):
    import torch

    shown = (
        f"bf16_hook({'None' if none_state else 'dist.group.WORLD'}, bucket) "
        f"on {world} ranks, bucket.buffer() = 1000 random float32 gradients"
    )
    # The reference, here: the mean of every rank's bucket.
    expected = torch.stack([bucket(seed, r) for r in range(world)]).mean(0)
    results = on_ranks(direct_worker, world, sol.bf16_hook, none_state, seed)
    for rank, r in enumerate(results):
        value = r["value"]
        if not r["is_future"]:
            fail(
                "the hook must return a torch.futures.Future "
                f"(from work.get_future().then(...)), it returned a {r['value_type']}",
                input=shown,
            )
        if value is None or tuple(value.shape) != (1000,):
            fail(
                "the future's value must be the flat bucket tensor, "
                f"got a {r['value_type']}",
                input=shown,
            )
        expect_equal(
            str(value.dtype),
            "torch.float32",
            input=shown,
            what="the dtype of the future's value",
        )
        rel = float((value - expected).abs().max() / expected.abs().max())
        if rel > 2**-7:
            fail(
                f"on rank {rank} the value is not the average over "
                f"ranks (largest relative error {rel:.3g}, "
                "more than bf16's precision): divide by the world size",
                input=shown,
            )
        expect_equal(
            [(c[0], c[1], c[2]) for c in r["calls"]],
            [("all_reduce", "bfloat16", 1000)],
            input=shown,
            what="the all-reduces the hook started (name, dtype, elements)",
        )


@check("called on a bucket: a Future of the float32 average, sent as bf16")
def direct(sol):
    run_direct(sol, 2, none_state=False, seed=0)


@check("state None means the default group (3 ranks)")
def none_state(sol):
    run_direct(sol, 3, none_state=True, seed=1)


def torch_bf16_hook(state, bucket):
    """PyTorch's bf16 compression, by another name (DDP refuses its own on a
    CPU-only build: _check_comm_hook)."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import _compress_hook

    return _compress_hook(torch.bfloat16, state, bucket)


def ddp_worker(hook, steps):
    """DDP with ``hook`` registered: its weights after ``steps`` SGD steps.

    Run twice: with the reader's hook on the reader's ranks, and with PyTorch's
    own on ranks that run none of the reader's code (reference_on_ranks).
    """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from _judge.ranks import spy_on_dist

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )
    ddp = DDP(model)
    ddp.register_comm_hook(None, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    torch.manual_seed(1 + dist.get_rank())
    with spy_on_dist(["all_reduce"], reader_functions=[hook]) as spy:
        for _ in range(steps):
            x, y = torch.randn(8, 16), torch.randn(8, 4)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
    return {
        "params": [p.detach() for p in ddp.parameters()],
        "dtypes": sorted({c[1] for c in spy.calls}),
        "elements": sum(c[2] for c in spy.calls),
        "expected": steps * sum(p.numel() for p in model.parameters()),
    }


@check("registered on PyTorch's DDP: trains like PyTorch's own bf16 compression")
def on_ddp(sol):
    from _judge.ranks import max_diff, reference_on_ranks

    theirs = reference_on_ranks(ddp_worker, 2, torch_bf16_hook, 3)
    results = on_ranks(ddp_worker, 2, sol.bf16_hook, 3)
    shown = (
        "2 ranks, DistributedDataParallel(model).register_comm_hook(None, bf16_hook), "
        "3 SGD steps"
    )
    for rank, r in enumerate(results):
        diff = max_diff(r["params"], theirs[rank]["params"])
        if diff > 1e-3:
            fail(
                f"on rank {rank} the weights differ from those trained "
                f"with PyTorch's bf16 hook by up to {diff:.3g}",
                input=shown,
            )
        expect_equal(
            r["dtypes"], ["bfloat16"], input=shown, what="the dtypes of all all-reduces"
        )
        expect_equal(
            r["elements"],
            r["expected"],
            input=shown,
            what="the gradient elements all-reduced (every step, every element once)",
        )
