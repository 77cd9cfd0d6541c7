"""Checks for exercise 01: on real gloo ranks, compared with dist.all_reduce."""

from _judge.checking import check, expect_close, expect_equal, fail
from _judge.ranks import on_ranks

COLLECTIVES = (
    "all_reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_gather",
    "all_gather_into_tensor",
    "broadcast",
    "reduce",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "batch_isend_irecv",
)


def worker(ring_all_reduce, shape, dtype_name, seed):
    """On each rank: random data, the reader's ring all-reduce, and dist.all_reduce.

    dist.all_reduce gives the result to compare with.
    """
    import torch
    import torch.distributed as dist

    from _judge.ranks import spy_on_dist

    rank = dist.get_rank()
    g = torch.Generator().manual_seed(seed * 100 + rank)
    data = torch.randn(shape, generator=g, dtype=getattr(torch, dtype_name))
    expected = data.clone()
    original = data.clone()
    dist.all_reduce(expected)
    with spy_on_dist(
        ["send", "isend"],
        forbid=COLLECTIVES,
        reader_functions=[ring_all_reduce],
        why="build the all-reduce from send/recv/isend/irecv",
    ) as spy:
        out = ring_all_reduce(data)
    dist.barrier()
    returned_ok = (
        isinstance(out, torch.Tensor)
        and out.shape == data.shape
        and bool(torch.equal(out, data))
    )
    returned_sum = (
        isinstance(out, torch.Tensor)
        and out.shape == data.shape
        and bool(torch.allclose(out.to(data.dtype), expected, atol=1e-5))
    )
    wrong = ((data - expected).abs() > 1e-5).flatten()
    return {
        "in_place_diff": float((data - expected).abs().max()) if data.numel() else 0.0,
        "returned_sum": returned_sum,
        "unchanged": bool(torch.equal(data, original)),
        "wrong": int(wrong.sum()),
        "first_wrong": int(wrong.nonzero()[0]) if bool(wrong.any()) else -1,
        "numel": data.numel(),
        "returned_ok": returned_ok,
        "bytes_sent": spy.bytes("send", "isend"),
        "tensor_bytes": data.numel() * data.element_size(),
        "got": data.flatten()[:6].tolist(),
        "expected": expected.flatten()[:6].tolist(),
    }


def run(sol, world_size, shape, dtype_name="float32", seed=0):
    shown = (
        f"ring_all_reduce(x) on {world_size} ranks, "
        f"x of shape {tuple(shape)}, {dtype_name}"
    )
    results = on_ranks(worker, world_size, sol.ring_all_reduce, shape, dtype_name, seed)
    for rank, r in enumerate(results):
        if r["in_place_diff"] > 1e-5:
            if r["returned_sum"] or r["unchanged"]:
                what = (
                    "the function returned the sum but left the tensor it was "
                    "given unchanged"
                    if r["returned_sum"]
                    else "the tensor it was given is unchanged"
                )
                detail = f"{what}: it must be summed in place"
            else:
                detail = (
                    f"{r['wrong']} of its {r['numel']} elements are wrong "
                    f"afterwards, the first at flat index {r['first_wrong']} "
                    f"(largest difference {r['in_place_diff']:.3g}): do the chunks "
                    "cover every element exactly once (the last chunk too)?"
                )
            fail(
                f"on rank {rank} the tensor does not hold the sum over all ranks: "
                + detail,
                input=shown,
                expected=r["expected"],
                got=r["got"],
            )
        if not r["returned_ok"]:
            fail(
                f"on rank {rank} the function must return "
                "the tensor it was given, summed",
                input=shown,
            )
    return shown, results


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
            2 * 3 * r["tensor_bytes"] // 4,
            input=shown,
            what=f"the bytes rank {rank} sent",
        )


@check("one rank: nothing to send")
def one_rank(sol):
    shown, results = run(sol, 1, (5,), seed=5)
    expect_close(results[0]["bytes_sent"], 0, input=shown, what="the bytes sent")
