"""Checks for exercise 1.1: on real gloo ranks, compared with the sum computed here.

The ranks run the reader's ring and send back their tensors; the sum they
must hold is computed in the judge. The bytes sent are counted by a spy in
the ranks (practice/README.md says what a determined reader can fake).
"""

import math

from _judge.checking import check, expect_close, expect_equal, fail
from _judge.ranks import on_ranks

COLLECTIVES = (
    "all_reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "all_gather",
    "all_gather_single",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "batch_isend_irecv",
)


def rank_data(shape, dtype_name, seed, rank):
    """Rank ``rank``'s tensor: the same wherever it is made."""
    import torch

    g = torch.Generator().manual_seed(seed * 100 + rank)
    return torch.randn(shape, generator=g, dtype=getattr(torch, dtype_name))


def worker(ring_all_reduce, shape, dtype_name, seed):
    """On each rank: its tensor, the reader's ring all-reduce; the raw results back."""
    import torch
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    data = rank_data(shape, dtype_name, seed, dist.get_rank())
    with spy_on_dist(
        ["send", "isend"],
        forbid=COLLECTIVES,
        reader_functions=[ring_all_reduce],
        why="build the all-reduce from send/recv/isend/irecv",
    ) as spy:
        out = ring_all_reduce(data)
    dist.barrier()
    return {
        "data": data,
        "out": out if isinstance(out, torch.Tensor) else None,
        "out_type": type(out).__name__,
        "bytes_sent": spy.bytes("send", "isend"),
    }


def run(sol, world_size, shape, dtype_name="float32", seed=0):
    import torch

    shown = (
        f"ring_all_reduce(x) on {world_size} ranks, "
        f"x of shape {tuple(shape)}, {dtype_name}"
    )
    # The reference, here and before the ranks run: the sum of every rank's tensor.
    inputs = [rank_data(shape, dtype_name, seed, r) for r in range(world_size)]
    expected = torch.stack([t.double() for t in inputs]).sum(0)
    results = on_ranks(worker, world_size, sol.ring_all_reduce, shape, dtype_name, seed)
    for rank, r in enumerate(results):
        data, out = r["data"], r["out"]
        if not (torch.is_tensor(data) and tuple(data.shape) == tuple(shape)):
            fail(f"on rank {rank} the tensor changed shape", input=shown)
        error = (data.double() - expected).abs()
        if data.numel() and float(error.max()) > 1e-5:
            returned_sum = (
                out is not None
                and tuple(out.shape) == tuple(shape)
                and float((out.double() - expected).abs().max()) <= 1e-5
            )
            if returned_sum or torch.equal(data, inputs[rank]):
                what = (
                    "the function returned the sum but left the tensor it was "
                    "given unchanged"
                    if returned_sum
                    else "the tensor it was given is unchanged"
                )
                detail = f"{what}: it must be summed in place"
            else:
                wrong = (error > 1e-5).flatten()
                detail = (
                    f"{int(wrong.sum())} of its {data.numel()} elements are wrong "
                    f"afterwards, the first at flat index {int(wrong.nonzero()[0])} "
                    f"(largest difference {float(error.max()):.3g}): do the chunks "
                    "cover every element exactly once (the last chunk too)?"
                )
            fail(
                f"on rank {rank} the tensor does not hold the sum over all ranks: "
                + detail,
                input=shown,
                expected=[round(v, 6) for v in expected.flatten()[:6].tolist()],
                got=[round(v, 6) for v in data.double().flatten()[:6].tolist()],
            )
        if out is None or not torch.equal(out, data):
            fail(
                f"on rank {rank} the function must return "
                f"the tensor it was given, summed (it returned a {r['out_type']})",
                input=shown,
            )
    return shown, results


def tensor_bytes(shape, dtype_name):
    import torch

    return (
        math.prod(shape)
        * torch.empty((), dtype=getattr(torch, dtype_name)).element_size()
    )


@check("2 ranks: the sum of 8 numbers")
def two_ranks(sol):
    run(sol, 2, (8,))


@check("3 ranks: 10 elements (not divisible by 3) and a 4 x 5 float64 tensor")
def three_ranks(sol):
    run(sol, 3, (10,), seed=1)
    run(sol, 3, (4, 5), "float64", seed=2)


@check("4 ranks: fewer elements than ranks")
def tiny(sol):
    run(sol, 4, (3,), seed=3)


@check("each rank sends 2 (n - 1) / n of the bytes (bandwidth-optimal)")
def bandwidth_optimal(sol):
    shown, results = run(sol, 4, (4096,), seed=4)
    for rank, r in enumerate(results):
        expect_equal(
            r["bytes_sent"],
            2 * 3 * tensor_bytes((4096,), "float32") // 4,
            input=shown,
            what=f"the bytes rank {rank} sent",
        )


@check("one rank: nothing to send")
def one_rank(sol):
    shown, results = run(sol, 1, (5,), seed=5)
    expect_close(results[0]["bytes_sent"], 0, input=shown, what="the bytes sent")
