"""The ring all-reduce from send/recv: its schedule, its result, the bytes it sends."""

import math

import pytest
import torch
import torch.distributed as dist
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mylib import run_ranks
from mylib.comm import count_bytes
from mylib.figures.ring import holdings
from mylib.ring import (
    ALL_GATHER,
    REDUCE_SCATTER,
    chunk_bounds,
    reduce_scatter_phase,
    ring_all_reduce,
    ring_bytes_sent,
    ring_steps,
    simulate_ring,
)

# ---- the schedule, on paper
# ------------------------------------------------------------


@given(numel=st.integers(0, 300), n=st.integers(1, 9))
def test_chunks_are_torch_tensor_split(numel, n):
    bounds = chunk_bounds(numel, n)
    sizes = [stop - start for start, stop in bounds]
    assert sizes == [len(c) for c in torch.tensor_split(torch.arange(numel), n)]
    assert bounds[0][0] == 0 and bounds[-1][1] == numel
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert max(sizes) - min(sizes) <= 1


@given(n=st.integers(1, 12))
def test_schedule_shape_every_link_busy_and_neighbours_only(n):
    steps = ring_steps(n)
    assert len(steps) == 2 * (n - 1)
    for i, step in enumerate(steps):
        assert [phase for phase, *_ in step] == [
            REDUCE_SCATTER if i < n - 1 else ALL_GATHER
        ] * n
        assert sorted(src for _, src, _, _ in step) == list(
            range(n)
        )  # each rank sends once per step
        assert all(dst == (src + 1) % n for _, src, dst, _ in step)


@given(n=st.integers(1, 12))
def test_simulation_every_rank_ends_with_every_contribution(n):
    states = simulate_ring(n)
    everyone = frozenset(range(n))
    assert len(states) == 2 * (n - 1) + 1
    assert all(cell == everyone for row in states[-1] for cell in row)
    after_phase_1 = states[n - 1]
    assert all(after_phase_1[r][(r + 1) % n] == everyone for r in range(n))
    # During reduce-scatter a rank only ever adds (contributions never get lost).
    for before, after in zip(states[: n - 1], states[1:n]):
        assert all(b <= a for rb, ra in zip(before, after) for b, a in zip(rb, ra))


@given(
    numel=st.integers(0, 10_000),
    n=st.integers(1, 9),
    element_size=st.sampled_from([1, 2, 4, 8]),
)
def test_predicted_bytes_match_2_n_minus_1_over_n(numel, n, element_size):
    nbytes = numel * element_size
    per_rank = [ring_bytes_sent(numel, element_size, n, r) for r in range(n)]
    assert sum(per_rank) == 2 * (n - 1) * nbytes  # over all ranks: exact for every size
    for sent in per_rank:
        if numel % n == 0:
            assert sent == 2 * (n - 1) * nbytes // n
        # every chunk is within one element of numel/n, and two chunks are not sent
        else:
            assert abs(sent - 2 * (n - 1) * nbytes / n) < 2 * element_size


def test_chunk_bounds_rejects_no_chunks():
    with pytest.raises(ValueError, match="at least one chunk"):
        chunk_bounds(5, 0)


# ---- on real gloo groups
# --------------------------------------------------------------


def _compare_with_gloo(shapes, dtype, op):
    """Ring and dist.all_reduce on the same data.

    Returns (max diff, measured bytes, predicted bytes) per shape.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    out = []
    for i, shape in enumerate(shapes):
        g = torch.Generator().manual_seed(1000 * i + rank)
        # Small whole numbers: every order of summation gives exactly the same result.
        x = torch.randint(1, 4, shape, generator=g).to(dtype)
        expected = x.clone()
        if op == dist.ReduceOp.AVG:  # gloo has no AVG: sum, then divide
            dist.all_reduce(expected)
            expected /= n
        else:
            dist.all_reduce(expected, op=op)
        with count_bytes() as stats:
            result = ring_all_reduce(x, op=op)
        assert result is x
        diff = (x.double() - expected.double()).abs().max().item() if x.numel() else 0.0
        out.append(
            (
                diff,
                stats.bytes_sent,
                ring_bytes_sent(x.numel(), x.element_size(), n, rank),
            )
        )
    return out


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=st.integers(1, 4),
    shapes=st.lists(
        st.lists(st.integers(0, 9), min_size=1, max_size=3).map(tuple),
        min_size=1,
        max_size=4,
    ),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.int64]),
)
def test_ring_equals_gloo_and_sends_the_predicted_bytes(world, shapes, dtype):
    for per_shape in run_ranks(
        _compare_with_gloo, world, args=(shapes, dtype, dist.ReduceOp.SUM)
    ):
        for diff, measured, predicted in per_shape:
            assert diff == 0
            assert measured == predicted


@pytest.mark.parametrize("world", [2, 3, 4])
def test_sizes_that_do_not_divide_and_large_tensors(world):
    shapes = [(1,), (world - 1,), (world + 1,), (7, 13), (100_003,)]
    for per_shape in run_ranks(
        _compare_with_gloo, world, args=(shapes, torch.float32, dist.ReduceOp.SUM)
    ):
        for (diff, measured, predicted), shape in zip(per_shape, shapes):
            assert diff == 0
            assert measured == predicted
            nbytes = math.prod(shape) * 4
            assert abs(measured - 2 * (world - 1) * nbytes / world) < 2 * 4


def _each_op(shapes, dtype, ops):
    return [_compare_with_gloo(shapes, dtype, getattr(dist.ReduceOp, op)) for op in ops]


def test_other_reduce_ops():
    ops = ["MAX", "MIN", "PRODUCT", "AVG"]
    for per_op in run_ranks(_each_op, 3, args=([(5,), (2, 4)], torch.float64, ops)):
        for op, per_shape in zip(ops, per_op):
            assert all(diff < 1e-12 for diff, _, _ in per_shape), op


def _random_floats(world_size):
    torch.manual_seed(dist.get_rank())
    x = torch.randn(1001)
    expected = x.clone()
    dist.all_reduce(expected)
    ring_all_reduce(x)
    return (x - expected).abs().max().item()


def test_random_floats_agree_up_to_rounding():
    # A different order of additions: equal up to float32 rounding, not bit for bit.
    assert max(run_ranks(_random_floats, 4, args=(4,))) < 1e-5


def _non_contiguous():
    rank = dist.get_rank()
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (rank + 1)
    x = base.t()  # a transposed view: not contiguous
    ring_all_reduce(x)
    return x.clone(), base.clone()


def test_non_contiguous_tensor_is_reduced_in_place():
    for x, base in run_ranks(_non_contiguous, 2):
        expected = torch.arange(12, dtype=torch.float32).reshape(3, 4) * 3
        assert torch.equal(x, expected.t())
        assert torch.equal(base, expected)  # the caller's storage holds the result


def _subgroup():
    group = dist.new_group([1, 2])
    rank = dist.get_rank()
    x = torch.full((5,), float(rank + 1))
    if rank in (1, 2):
        with count_bytes() as stats:
            ring_all_reduce(x, group=group)
        return x.tolist(), stats.bytes_sent
    return x.tolist(), 0


def test_subgroup_uses_global_ranks_of_its_members():
    results = run_ranks(_subgroup, 3)
    assert results[0] == ([1.0] * 5, 0)
    assert results[1][0] == results[2][0] == [5.0] * 5  # ranks 1 and 2: 2 + 3


def _phase_one_states():
    """Bit-mask data: after phase 1 the real tensors say who holds what.

    The test compares them with the simulation.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.full((n,), float(2**rank))
    chunks = [x[start:stop] for start, stop in chunk_bounds(n, n)]
    reduce_scatter_phase(chunks, rank, n)
    return x.tolist()


@pytest.mark.parametrize("world", [2, 3, 4])
def test_real_reduce_scatter_phase_matches_the_schedule_on_paper(world):
    rows = run_ranks(_phase_one_states, world)
    assert holdings(rows) == [list(row) for row in simulate_ring(world)[world - 1]]


def _bad_calls():
    errors = []
    for call in (
        lambda: ring_all_reduce([1.0, 2.0]),
        lambda: ring_all_reduce(torch.ones(3), op=dist.ReduceOp.BAND),
        lambda: ring_all_reduce(torch.ones(3, dtype=torch.int64), op=dist.ReduceOp.AVG),
    ):
        try:
            call()
        except (TypeError, ValueError) as e:
            errors.append(f"{type(e).__name__}: {e}")
    return errors


def test_bad_input_is_named():
    errors = run_ranks(_bad_calls, 2)[0]
    assert "TypeError" in errors[0] and "torch.Tensor" in errors[0]
    assert "ValueError" in errors[1] and "SUM, AVG, PRODUCT, MAX and MIN" in errors[1]
    assert "TypeError" in errors[2] and "use SUM and divide" in errors[2]
