"""Checks for exercise 09: on real gloo ranks, alone and registered on PyTorch's DDP."""

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


def direct_worker(hook, none_state, seed):
    import torch
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed + rank)
    buffer = torch.randn(1000) * 10
    expected = buffer.clone()
    dist.all_reduce(expected)
    expected /= world
    with spy_on_dist(["all_reduce"], reader_functions=[hook]) as spy:
        fut = hook(None if none_state else dist.group.WORLD, FakeBucket(buffer))
        is_future = isinstance(
            fut, torch._C.Future
        )  # torch.futures.Future and what get_future() returns
        value = fut.wait() if is_future else fut
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    ok_tensor = isinstance(value, torch.Tensor) and value.shape == buffer.shape
    rel = (
        float((value.float() - expected).abs().max() / expected.abs().max())
        if ok_tensor
        else None
    )
    return {
        "is_future": is_future,
        "value_type": type(value).__name__,
        "dtype": str(value.dtype) if isinstance(value, torch.Tensor) else None,
        "ok_tensor": ok_tensor,
        "rel": rel,
        "calls": spy.calls,
    }


def run_direct(sol, world, none_state, seed):
    shown = (
        f"bf16_hook({'None' if none_state else 'dist.group.WORLD'}, bucket) "
        f"on {world} ranks, bucket.buffer() = 1000 random float32 gradients"
    )
    results = on_ranks(direct_worker, world, sol.bf16_hook, none_state, seed)
    for rank, r in enumerate(results):
        if not r["is_future"]:
            fail(
                "the hook must return a torch.futures.Future "
                f"(from work.get_future().then(...)), it returned a {r['value_type']}",
                input=shown,
            )
        if not r["ok_tensor"]:
            fail(
                "the future's value must be the flat bucket tensor, "
                f"got a {r['value_type']}",
                input=shown,
            )
        expect_equal(
            r["dtype"],
            "torch.float32",
            input=shown,
            what="the dtype of the future's value",
        )
        if r["rel"] > 2**-7:
            fail(
                f"on rank {rank} the value is not the average over "
                f"ranks (largest relative error {r['rel']:.3g}, "
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


def ddp_worker(hook, steps):
    import copy

    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import _compress_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    from _judge.ranks import spy_on_dist

    def torch_bf16_hook(
        state, bucket
    ):  # PyTorch's bf16 compression (DDP refuses its own name on gloo)
        return _compress_hook(torch.bfloat16, state, bucket)

    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )
    theirs = DDP(copy.deepcopy(model))
    theirs.register_comm_hook(None, torch_bf16_hook)
    ours = DDP(model)
    ours.register_comm_hook(None, hook)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (ours, theirs)]
    torch.manual_seed(1 + rank)
    with spy_on_dist(["all_reduce"], reader_functions=[hook]) as spy:
        for _ in range(steps):
            x, y = torch.randn(8, 16), torch.randn(8, 4)
            for m, opt in zip((ours, theirs), opts):
                opt.zero_grad()
                torch.nn.functional.mse_loss(m(x), y).backward()
                opt.step()
    diff = max(
        float((p - q).abs().max())
        for p, q in zip(ours.parameters(), theirs.parameters())
    )
    n_elements = sum(p.numel() for p in model.parameters())
    dtypes = sorted({c[1] for c in spy.calls})
    return {
        "diff": diff,
        "dtypes": dtypes,
        "elements": sum(c[2] for c in spy.calls),
        "expected": 2 * steps * n_elements,
    }


@check("registered on PyTorch's DDP: trains like PyTorch's own bf16 compression")
def on_ddp(sol):
    results = on_ranks(ddp_worker, 2, sol.bf16_hook, 3)
    shown = (
        "2 ranks, DistributedDataParallel(model).register_comm_hook(None, bf16_hook), "
        "3 SGD steps"
    )
    for rank, r in enumerate(results):
        if r["diff"] > 1e-3:
            fail(
                f"on rank {rank} the weights differ from those trained "
                f"with PyTorch's bf16 hook by up to {r['diff']:.3g}",
                input=shown,
            )
        expect_equal(
            r["dtypes"], ["bfloat16"], input=shown, what="the dtypes of all all-reduces"
        )
        # Both models' hooks are spied: each step all-reduces every element twice (ours
        # and PyTorch's).
        expect_equal(
            r["elements"],
            r["expected"],
            input=shown,
            what="the gradient elements all-reduced (both models, every step)",
        )
