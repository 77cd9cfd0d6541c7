"""mylib.comm: collectives give torch's results and count the bytes each rank sends."""

import math

import pytest
import torch
import torch.distributed as dist

from mylib import RankError, comm, run_ranks
from mylib.comm import count_bytes, nbytes
from mylib.ring import ring_all_reduce

NUMEL = 12  # divisible by 1, 2, 3 and 4: the ring formulas are exact


def _every_collective():
    """Run each wrapped collective next to torch's own.

    Returns (results equal?, bytes counted) per op.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.arange(NUMEL, dtype=torch.float32) + 100 * rank
    out = {}

    a, b = x.clone(), x.clone()
    with count_bytes() as stats:
        comm.all_reduce(a)
    dist.all_reduce(b)
    out["all_reduce"] = (torch.equal(a, b), stats.bytes_sent, dict(stats.calls))

    shard, expected = torch.empty(NUMEL // n), torch.empty(NUMEL // n)
    with count_bytes() as stats:
        comm.reduce_scatter_single(shard, x.clone())
    dist.reduce_scatter_single(expected, x.clone())
    out["reduce_scatter"] = (
        torch.equal(shard, expected),
        stats.bytes_sent,
        dict(stats.calls),
    )

    mine = x[: NUMEL // n].clone()
    gathered, expected = torch.empty(NUMEL), torch.empty(NUMEL)
    with count_bytes() as stats:
        comm.all_gather_single(gathered, mine)
    dist.all_gather_single(expected, mine)
    out["all_gather"] = (
        torch.equal(gathered, expected),
        stats.bytes_sent,
        dict(stats.calls),
    )

    root = n - 1  # not rank 0, so the "rank before the root" rule is exercised
    a, b = x.clone(), x.clone()
    with count_bytes() as stats:
        comm.broadcast(a, root)
    dist.broadcast(b, root)
    out["broadcast"] = (torch.equal(a, b), stats.bytes_sent, dict(stats.calls))
    return out


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_collectives_match_torch_and_count_ring_bytes(world):
    b = NUMEL * 4
    results = run_ranks(_every_collective, world)
    for rank, out in enumerate(results):
        assert all(same for same, _, _ in out.values()), out
        assert out["all_reduce"][1] == 2 * (world - 1) * b // world
        assert out["reduce_scatter"][1] == (world - 1) * b // world
        assert out["all_gather"][1] == (world - 1) * (b // world)
        predecessor_of_root = (world - 1 - 1) % world
        expected_broadcast = 0 if world == 1 or rank == predecessor_of_root else b
        assert out["broadcast"][1] == expected_broadcast
        assert out["all_reduce"][2] == {"all_reduce": 1}
    # A pipelined broadcast moves the tensor over n-1 links in all.
    assert sum(out["broadcast"][1] for out in results) == (world - 1) * b


def _point_to_point_and_nesting():
    rank = dist.get_rank()
    t = torch.zeros(10, dtype=torch.float64)
    with count_bytes() as outer:
        with count_bytes() as inner:
            if rank == 0:
                comm.send(t, 1)
                comm.isend(t[:3], 1).wait()
            else:
                comm.recv(t, 0)
                comm.irecv(t[:3], 0).wait()
        comm.all_reduce(t)
    return (
        inner.bytes_sent,
        dict(inner.by_op),
        dict(inner.calls),
        outer.bytes_sent,
        dict(outer.by_op),
        repr(outer),
    )


def test_send_counts_bytes_receive_counts_none_and_blocks_nest():
    sender, receiver = run_ranks(_point_to_point_and_nesting, 2)
    assert sender[:3] == (80 + 24, {"send": 104}, {"send": 2})
    assert receiver[:3] == (0, {}, {})
    # The outer block saw everything the inner one did, plus the all-reduce (2(n-1)/n x
    # 80 = 80 bytes).
    assert sender[3] == 104 + 80 and sender[4] == {"send": 104, "all_reduce": 80}
    assert receiver[3] == 80
    assert "bytes_sent=184" in sender[5]


def _counting_stops_after_block():
    with count_bytes() as stats:
        comm.all_reduce(torch.ones(4))
    comm.all_reduce(torch.ones(4))  # outside: not counted
    return stats.bytes_sent


def test_counting_stops_at_the_end_of_the_block():
    assert run_ranks(_counting_stops_after_block, 2) == [16, 16]


def _ring_vs_model(numel):
    t = torch.ones(numel)
    with count_bytes() as measured:
        ring_all_reduce(t)
    with count_bytes() as modelled:
        comm.all_reduce(t)
    return measured.bytes_sent, modelled.bytes_sent


@pytest.mark.parametrize("world", [2, 3, 4])
def test_measured_ring_equals_the_counter_of_dist_all_reduce(world):
    # The counter's all_reduce formula is what the ring, built from sends, really sends.
    for measured, modelled in run_ranks(_ring_vs_model, world, args=(world * 1000,)):
        assert measured == modelled


def test_nbytes_is_numel_times_element_size():
    assert nbytes(torch.zeros(3, 5, dtype=torch.bfloat16)) == 30
    assert nbytes(torch.zeros(0)) == 0


# -- what gloo itself sends, against the counter's ring model (chapter 1)
# ---------------------------------------------------------------------


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gloo_runs_reduce_scatter_as_an_all_reduce(world):
    # torch.profiler names the gloo operation each collective runs.
    from mylib.experiments.commbench import gloo_ops_recorded

    for ops in run_ranks(gloo_ops_recorded, world, args=(world * 8,)):
        assert ops == {
            "all-reduce": ["gloo:all_reduce"],
            "reduce-scatter": ["gloo:all_reduce"],  # no reduce-scatter of its own
            "all-gather": ["gloo:all_gather"],
            "broadcast": ["gloo:broadcast"],
        }


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gloo_writes_the_ring_bytes_except_for_reduce_scatter_and_broadcast(world):
    from mylib.experiments.commbench import gloo_wire_bytes, wire_bytes_measurable

    if not wire_bytes_measurable():
        pytest.skip("counting written bytes needs Linux's /proc/self/io")
    numel = world * 2**16
    b = 4 * numel
    wire = run_ranks(gloo_wire_bytes, world, args=(numel,))

    def close(a, c):  # up to gloo's message headers, a few KB whatever the size
        return abs(a - c) < 4096

    for w in wire:
        for name in ("all-reduce", "all-gather"):
            assert close(w[name][1], w[name][0]), (name, w)
        assert close(w["all-reduce"][1], 2 * (world - 1) * b / world)
        # an all-reduce underneath: twice what a ring reduce-scatter sends
        assert close(w["reduce-scatter"][1], w["all-reduce"][1])
        assert close(w["reduce-scatter"][1], 2 * w["reduce-scatter"][0])
    # broadcast: gloo's binomial tree; the root sends ceil(log2 n) copies, the
    # ranks together n - 1, as the ring the counter assumes
    assert close(wire[0]["broadcast"][1], math.ceil(math.log2(world)) * b)
    assert close(sum(w["broadcast"][1] for w in wire), (world - 1) * b)
    assert sum(w["broadcast"][0] for w in wire) == (world - 1) * b


def test_written_bytes_need_linux():
    from mylib.experiments import commbench

    if commbench.wire_bytes_measurable():
        assert commbench.bytes_written() >= 0
    else:
        with pytest.raises(RuntimeError, match="needs Linux"):
            commbench.bytes_written()
    with pytest.raises(RankError, match="divisible"):
        run_ranks(commbench.gloo_wire_bytes, 2, args=(3,), show_output=False)


# -- chapter 1's "In practice", checked against the installed PyTorch
# -------------------------------------------------------------------


def test_ddp_buckets_are_25_mib_by_default():
    from torch.nn.parallel import distributed

    assert distributed._DEFAULT_BUCKET_CAP_MB == 25
    assert distributed._MB_TO_BYTES == 2**20  # "MB" in bucket_cap_mb is MiB


def test_detail_debug_wraps_the_group_to_compare_calls():
    import inspect

    c10d = dist.distributed_c10d
    source = inspect.getsource(c10d)
    wrapped = source.index("backend_class = _create_process_group_wrapper(")
    assert "DebugLevel.DETAIL" in source[wrapped - 800 : wrapped]
    assert "_ProcessGroupWrapper(" in inspect.getsource(
        c10d._create_process_group_wrapper
    )


def test_work_wait_on_nccl_blocks_the_stream_not_the_cpu():
    doc = dist.Work.wait.__doc__ or ""
    assert "Letting the current stream block on the completion of the NCCL work" in doc
