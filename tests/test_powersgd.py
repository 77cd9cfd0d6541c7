"""PowerSGD: PyTorch's results, the bytes it sends, exactness on low-rank gradients,
error feedback, warm start, and what it does to a real small training run."""

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from portable_kernels import run_ranks_on_portable_kernels

from mylib import MyDDP, comm, run_ranks
from mylib.experiments.common import mlp
from mylib.experiments.compress_check import (
    error_feedback_ledger,
    hooks_against_pytorch,
    mylib_hooks_on_pytorch_ddp,
)
from mylib.experiments.compress_training import (
    RUNS,
    compare_training,
    held_out_at,
    steps_to_reach,
)
from mylib.powersgd import (
    PowerSGDState,
    compression_plan,
    orthonormalize_,
    powersgd_hook,
)


@pytest.mark.parametrize(
    "world,rank,cap", [(2, 1, 25.0), (2, 2, 25.0), (2, 4, 25.0), (4, 2, 25.0)]
)
def test_matches_pytorch_powersgd(world, rank, cap):
    """One bucket: PyTorch's hook issues its later all-reduces from callbacks, and with
    several buckets on gloo those reach the group in different orders on different ranks
    (it aborts or hangs)."""
    out = run_ranks(
        hooks_against_pytorch,
        world,
        args=("powersgd",),
        kwargs={
            "matrix_approximation_rank": rank,
            "start_powerSGD_iter": 2,
            "steps": 6,
            "bucket_cap_mb": cap,
        },
    )[0]
    assert max(out["vs_ddp"]) < 1e-6 and max(out["vs_torch_hook_on_myddp"]) < 1e-6, out
    assert out["bytes"][:2] == out["fp32_bytes"][:2]  # the plain steps first
    assert all(b < f / 2 for b, f in zip(out["bytes"][2:], out["fp32_bytes"][2:]))


def test_mylib_hooks_run_on_pytorch_ddp():
    for diffs in run_ranks(mylib_hooks_on_pytorch_ddp, 2):
        assert diffs == {"bf16": 0.0, "powersgd": 0.0}, (
            diffs
        )  # same hook, same bucket: the same bits


def test_a_compressed_step_costs_three_products_per_matrix_and_pytorch_copies():
    """Chapter 5: what a compressed step costs besides the bytes, on its model."""
    from mylib.experiments.powersgd_costs import char_model_shapes, powersgd_step_costs

    rank = 4
    out = run_ranks(powersgd_step_costs, 2, kwargs={"rank": rank})[0]
    shapes = char_model_shapes()
    state = PowerSGDState(None, rank, start_powerSGD_iter=2)
    grads = [torch.zeros(s) for s in shapes]
    compress, _ = compression_plan(grads, state)
    p_elements = sum(m.shape[0] * r for m, r in compress)
    q_elements = sum(m.shape[1] * r for m, r in compress)
    theirs, mine = out["PyTorch"], out["mylib"]
    for o in (theirs, mine):
        assert o["compressed"] == len(compress) == 4
        # P = M Q, Q = M^T P, M ~ P Q^T: three products per matrix, every step
        assert o["products"] == [3 * len(compress)] * 3
        numel = sum(s.numel() for s in shapes)
        assert o["error_bytes"] == o["bucket_bytes"] == 4 * numel
        assert o["q_bytes"] == 4 * q_elements
    assert theirs["p_bytes"] == 4 * p_elements and mine["p_bytes"] == 0
    # PyTorch: the error (first step only), then a clone of the bucket and the new
    # error every step; mylib: the error once, reused as the copy.
    assert theirs["new_bucket_sized"] == [3, 2, 2]
    assert mine["new_bucket_sized"] == [1, 0, 0]


def test_pytorch_powersgd_chains_its_three_all_reduces():
    """The rest's all-reduce, then P's from its callback, then Q's from P's."""
    from mylib.experiments.powersgd_costs import allreduce_chain, char_model_shapes

    rank = 4
    issued = run_ranks(allreduce_chain, 2, kwargs={"rank": rank})[0]
    shapes = char_model_shapes()
    state = PowerSGDState(None, rank, start_powerSGD_iter=2)
    compress, plain = compression_plan([torch.zeros(s) for s in shapes], state)
    assert [n for n, _ in issued] == [
        sum(g.numel() for g in plain),
        sum(m.shape[0] * r for m, r in compress),
        sum(m.shape[1] * r for m, r in compress),
    ]
    assert all(done for _, done in issued)  # each issued once the one before is done


def _many_buckets(steps=6):
    """MyDDP with 1 KB buckets and PowerSGD.

    Every rank must end with the very same weights.
    """
    model = MyDDP(mlp((12, 32, 32, 6), seed=dist.get_rank()), bucket_cap_mb=0.001)
    model.register_comm_hook(
        PowerSGDState(None, 2, start_powerSGD_iter=2), powersgd_hook
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 12, generator=g)).pow(2).sum().backward()
        model.finish_gradient_sync()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    return len(model.buckets), max((e - flat).abs().max().item() for e in everyone)


def test_many_buckets_issue_collectives_in_order():
    for buckets, spread in run_ranks(_many_buckets, 3):
        assert buckets == 2 and spread == 0.0  # 6 parameters in two 1 KB buckets


def _plain_steps(model, x, steps=2):
    """The ``start_powerSGD_iter = 2`` plain steps, gradients cleared after each."""
    for _ in range(steps):
        model(x).pow(2).sum().backward()
        model.finish_gradient_sync()
        for p in model.parameters():
            p.grad = None


def _bytes_of_one_step(rank):
    model = MyDDP(mlp((12, 32, 32, 6), seed=0))
    state = PowerSGDState(None, rank, start_powerSGD_iter=2)
    model.register_comm_hook(state, powersgd_hook)
    _plain_steps(model, torch.ones(2, 12))
    with comm.count_bytes() as stats:
        model(torch.ones(2, 12)).sum().backward()
        model.finish_gradient_sync()
    compress, plain = compression_plan(model.buckets[0].gradients(), state)
    return (
        stats.bytes_sent,
        stats.calls["all_reduce"],
        [(tuple(m.shape), r) for m, r in compress],
        [g.numel() for g in plain],
        state.compression_rate(),
    )


@pytest.mark.parametrize("rank", [1, 4])
def test_bytes_are_p_q_and_the_uncompressed_rest(rank):
    sent, calls, compressed, plain, rate = run_ranks(
        _bytes_of_one_step, 2, args=(rank,)
    )[0]
    numel = sum(plain) + sum((n + m) * r for (n, m), r in compressed)
    assert (
        sent == 4 * numel
    )  # 2 ranks: a ring all-reduce sends 2 (n-1)/n = 1 x the bytes
    assert calls == 3  # the uncompressed rest, all the Ps, all the Qs
    total = sum(plain) + sum(n * m for (n, m), _ in compressed)
    assert rate == pytest.approx(total / numel)
    # Matrices are compressed only where it pays by min_compression_rate = 2; vectors
    # never.
    assert all((n + m) * r * 2 < n * m for (n, m), r in compressed)
    if rank == 4:
        assert (
            (6, 32),
            4,
        ) not in compressed  # (6 + 32) x 4 x 2 > 6 x 32: sent as it is


def _low_rank_gradients(rank, error_feedback):
    """Each rank's gradient is one outer product.

    So the average has rank <= world size.
    """
    torch.manual_seed(dist.get_rank())
    model = MyDDP(torch.nn.Linear(32, 24, bias=False))
    x = torch.randn(1, 32)
    model.register_comm_hook(
        PowerSGDState(
            None, rank, start_powerSGD_iter=2, use_error_feedback=error_feedback
        ),
        powersgd_hook,
    )
    _plain_steps(model, x)
    model(x).pow(2).sum().backward()
    model.finish_gradient_sync()
    local = torch.nn.Linear(32, 24, bias=False)
    local.load_state_dict(model.module.state_dict())
    local(x).pow(2).sum().backward()
    everyone = [
        torch.empty_like(local.weight.grad) for _ in range(dist.get_world_size())
    ]
    dist.all_gather(everyone, local.weight.grad)
    return (model.module.weight.grad - torch.stack(everyone).mean(0)).abs().max().item()


def test_rank_r_gradients_pass_exactly():
    assert (
        max(run_ranks(_low_rank_gradients, 2, args=(2, False))) < 1e-5
    )  # rank 2 average, rank 2 hook
    assert (
        min(run_ranks(_low_rank_gradients, 2, args=(1, False))) > 1e-3
    )  # rank 1 hook misses a direction


def test_error_feedback_loses_nothing_only_delays():
    # Per rank: sum of applied averages = sum of its own gradients - its error now (a
    # telescoping sum).
    for gap, scale in run_ranks(error_feedback_ledger, 2, args=(8, 1)):
        assert gap < 1e-5 * scale, (gap, scale)


def _approximation_error(warm_start, steps=6):
    """The same gradient every step (no error feedback).

    Returns how far each step's approximation is from it.
    """
    torch.manual_seed(0)
    model = MyDDP(torch.nn.Linear(32, 24, bias=False))
    model.register_comm_hook(
        PowerSGDState(
            None,
            2,
            start_powerSGD_iter=2,
            use_error_feedback=False,
            warm_start=warm_start,
        ),
        powersgd_hook,
    )
    x = torch.randn(
        16, 32
    )  # the same on every rank: the average is this rank's own gradient
    local = torch.nn.Linear(32, 24, bias=False)
    local.load_state_dict(model.module.state_dict())
    local(x).pow(2).sum().backward()
    exact = local.weight.grad
    errors = []
    for _ in range(2 + steps):
        model.module.weight.grad = None
        model(x).pow(2).sum().backward()
        model.finish_gradient_sync()
        errors.append(((model.module.weight.grad - exact).norm() / exact.norm()).item())
    return errors[2:]  # after the two plain steps


def test_warm_start_continues_the_power_iteration():
    warm = run_ranks(_approximation_error, 2, args=(True,))[0]
    cold = run_ranks(_approximation_error, 2, args=(False,))[0]
    assert (
        warm[-1] < 0.9 * warm[0]
    )  # each step is one more power iteration on the same matrix
    assert warm[-1] < min(cold)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 20), r=st.integers(1, 5), seed=st.integers(0, 1000))
def test_orthonormalize(n, r, seed):
    r = min(r, n)
    m = torch.randn(
        n, r, generator=torch.Generator().manual_seed(seed), dtype=torch.float64
    )
    q, _ = torch.linalg.qr(m)
    orthonormalize_(m)
    assert torch.allclose(m.T @ m, torch.eye(r, dtype=torch.float64), atol=1e-8)
    assert torch.allclose(
        m.abs(), q.abs(), atol=1e-6
    )  # Gram-Schmidt is QR up to column signs


def test_zero_column_stays_zero():
    m = torch.zeros(5, 2)
    orthonormalize_(m)
    assert torch.count_nonzero(m) == 0


@pytest.mark.parametrize(
    "kwargs,fix",
    [
        (
            {"matrix_approximation_rank": 0},
            "matrix_approximation_rank must be an int >= 1",
        ),
        ({"start_powerSGD_iter": -1}, "start_powerSGD_iter must be an int >= 0"),
        # as PyTorch: the buckets are rebuilt after the first step
        ({"start_powerSGD_iter": 1}, "must be >= 2 with error feedback or warm"),
        (
            {"start_powerSGD_iter": 0, "use_error_feedback": False},
            "must be >= 2 with error feedback or warm",
        ),
        ({"min_compression_rate": 0}, "min_compression_rate must be > 0"),
    ],
)
def test_bad_settings_name_the_fix(kwargs, fix):
    with pytest.raises(ValueError, match=fix):
        PowerSGDState(**kwargs)


@pytest.mark.slow
def test_training_with_compression():
    """The chapter's table: the claims it prints are asserted here on the same runs.

    Under the portable kernels (tests/portable_kernels.py): nbval runs the chapter's
    cells on this machine's own, and make test-portable leaves them to this test.
    """
    results = run_ranks_on_portable_kernels(compare_training, 2, timeout_s=900)[0]
    fp32, bf16 = results[RUNS[0]["label"]], results[RUNS[1]["label"]]
    rank4, rank1, no_ef = (results[r["label"]] for r in RUNS[2:])
    steps = len(fp32["loss"])
    target = held_out_at(fp32, steps)
    assert held_out_at(fp32, steps) < held_out_at(fp32, 0) - 1.5  # it learns
    assert abs(held_out_at(bf16, steps) - target) < 0.01  # bf16 trains like fp32
    assert all(b * 2 == f for b, f in zip(bf16["bytes"], fp32["bytes"]))
    assert (
        steps_to_reach(rank4, target) <= 1.5 * steps
    )  # low rank reaches fp32's loss, in more steps
    assert (
        max(rank4["bytes"][20:]) * 20 < fp32["bytes"][0]
    )  # ... sending over 20x fewer bytes per step
    assert held_out_at(rank1, steps) + 0.2 < held_out_at(
        no_ef, steps
    )  # error feedback matters
