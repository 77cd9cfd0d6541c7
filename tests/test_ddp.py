"""MyDDP against one process on the whole batch and against PyTorch's DDP.

All on real gloo groups.
"""

import pytest
import torch
import torch.distributed as dist
from ddp_cases import build, make_optimizer, train_three_ways
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from mylib import MyDDP, RankError, run_ranks
from mylib.experiments.common import global_batches, max_param_diff

TOL = 1e-6


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=st.integers(1, 4),
    sizes=st.lists(st.integers(1, 24), min_size=2, max_size=5),
    cap_mb=st.sampled_from([0.0, 0.0005, 0.002, 25.0]),
    opt_name=st.sampled_from(["sgd", "adam"]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_equals_single_process_and_pytorch_ddp(world, sizes, cap_mb, opt_name, dtype):
    args = ("mlp", sizes, cap_mb, opt_name, 3, 4, dtype)
    for single_diff, ddp_diff, _ in run_ranks(
        train_three_ways, world, args=args, show_output=False
    ):
        assert ddp_diff < TOL, ddp_diff
        if (
            dtype == torch.float64 or opt_name == "sgd"
        ):  # see train_three_ways on float32 Adam
            assert single_diff < TOL, single_diff


@pytest.mark.parametrize("kind", ["frozen", "tied", "bn"])
@pytest.mark.parametrize("world", [2, 3])
def test_frozen_tied_and_buffers(kind, world):
    args = (kind, [6, 6, 6, 6], 0.0005, "adam", 4, 4, torch.float64)
    for single_diff, ddp_diff, _ in run_ranks(train_three_ways, world, args=args):
        assert ddp_diff < TOL
        if (
            kind != "bn"
        ):  # BatchNorm statistics differ between a shard and the whole batch
            assert single_diff < TOL


def _bucketing_facts(cap_mb, steps=2):
    """The last of ``steps`` steps: after the first, MyDDP has rebuilt its buckets."""
    model = MyDDP(build("mlp", [32, 32, 32, 32, 32]), bucket_cap_mb=cap_mb)
    x = torch.randn(4, 32)
    for _ in range(steps - 1):
        model(x).sum().backward()
        model.finish_gradient_sync()
    events = []
    model.tracer = lambda event, t, **fields: events.append((event, fields))
    model(x).sum().backward()
    launched_before_last_grad = [
        e
        for e, _ in events[
            : max(i for i, (e, _) in enumerate(events) if e == "grad_ready")
        ]
    ]
    model.finish_gradient_sync()
    owned = all(
        p.grad.data_ptr() == v.data_ptr()
        for b in model.buckets
        for p, v in zip(b.params, b.views)
    )
    order = [name for b in model.buckets for name in b.names]
    return (
        len(model.buckets),
        model.allreduces_in_backward,
        "bucket_launch" in launched_before_last_grad,
        owned,
        order,
    )


def test_buckets_in_backward_order_launched_during_backward_grads_are_views():
    n_buckets, launched, overlapped, views, order = run_ranks(
        _bucketing_facts, 2, args=(0.0,)
    )[0]
    assert (
        n_buckets == 8 and launched == 8
    )  # cap 0: one bucket per parameter, all launched by hooks
    assert (
        overlapped
    )  # the first all-reduce started before autograd produced the last gradient
    assert views  # p.grad is a view of its bucket: nothing is copied back
    assert order[0] == "6.bias" and order[-1] == "0.weight"
    # 5 KB cap, once rebuilt in the order the gradients arrived: 4 params (8.4 KB)
    # close the first bucket, the other 4 the second.
    assert run_ranks(_bucketing_facts, 2, args=(0.005,))[0][:2] == (2, 2)
    # The first step's buckets are PyTorch's guess before any backward: the rule
    # applied in registration order (0.weight, 0.bias, 2.weight fill the first 5 KB),
    # then reversed, so the last bucket is the full one.
    assert run_ranks(_bucketing_facts, 2, args=(0.005, 1))[0][:2] == (3, 3)


def _no_sync_equivalence(m, cap_mb, per_rank=3):
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes = [5, 7, 3]
    model = MyDDP(build("mlp", sizes, rank, torch.float64), bucket_cap_mb=cap_mb)
    single = build("mlp", sizes, 0, torch.float64)
    opt, opt1 = (
        make_optimizer("adam", model.parameters()),
        make_optimizer("adam", single.parameters()),
    )
    for x, y in global_batches(2, per_rank * world * m, sizes, dtype=torch.float64):
        opt.zero_grad()
        micro = list(zip(x.chunk(m * world), y.chunk(m * world)))[
            rank * m : (rank + 1) * m
        ]
        for i, (xs, ys) in enumerate(micro):
            # The forward decides whether its backward syncs (as PyTorch's DDP):
            # it goes inside no_sync() with its backward.
            if i < m - 1:
                with model.no_sync():
                    (nn.functional.mse_loss(model(xs), ys) / m).backward()
            else:
                (nn.functional.mse_loss(model(xs), ys) / m).backward()
        model.finish_gradient_sync()
        opt.step()
        opt1.zero_grad()
        nn.functional.mse_loss(single(x), y).backward()
        opt1.step()
    return max_param_diff(model.module, single)


@pytest.mark.parametrize("world,m,cap", [(2, 3, 0.0), (4, 2, 25.0), (3, 4, 0.0005)])
def test_no_sync_accumulation_equals_whole_batch(world, m, cap):
    assert max(run_ranks(_no_sync_equivalence, world, args=(m, cap))) < TOL


class FirstOnly(nn.Sequential):
    """Two layers; the forward uses the first only."""

    def forward(self, x):
        return self[0](x)


def _misuse(case):
    rank = dist.get_rank()
    if case == "shapes":
        MyDDP(nn.Linear(3, 3 + rank))
    model = MyDDP(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3)), bucket_cap_mb=0)
    x = torch.randn(2, 3)
    if case == "unused":
        model = MyDDP(FirstOnly(nn.Linear(3, 3), nn.Linear(3, 3)), bucket_cap_mb=0)
        model(x).sum().backward()  # the second layer gets no gradient
        model.finish_gradient_sync()
    if case == "inner_module":  # past the wrapper: its forward never ran
        model.module(x).sum().backward()
        model.finish_gradient_sync()
    if case == "twice":
        model(x).sum().backward()
        model.finish_gradient_sync()
        model.finish_gradient_sync()
    if case == "no_backward":
        model.finish_gradient_sync()
    if case == "forgot_finish":
        model(x).sum().backward()
        model(x)
    if case == "bad_cap":
        MyDDP(nn.Linear(2, 2), bucket_cap_mb=-1)


@pytest.mark.parametrize(
    "case,message",
    [
        ("shapes", "differs across ranks"),
        ("unused", "got no gradient"),
        ("inner_module", "instead of model\\(x\\)"),
        ("twice", "without a backward"),
        ("no_backward", "without a backward"),
        ("forgot_finish", "never synchronised"),
        ("bad_cap", "bucket_cap_mb must be"),
    ],
)
def test_misuse_gets_a_clear_error(case, message):
    with pytest.raises(RankError, match=message):
        run_ranks(_misuse, 2, args=(case,), timeout_s=30, show_output=False)


class FirstTwo(nn.Sequential):
    """Three layers; the forward uses the first, and the second if told to."""

    def forward(self, x, second):
        return self[1](self[0](x)) if second else self[0](x)


def _unused_allowed():
    model = MyDDP(
        FirstTwo(nn.Linear(3, 3), nn.Linear(3, 3), nn.Linear(3, 3)),
        bucket_cap_mb=0,
        find_unused_parameters=True,
    )
    x = torch.ones(2, 3) * (dist.get_rank() + 1)
    # the second layer: used on rank 0 only
    model(x, second=dist.get_rank() == 0).sum().backward()
    model.finish_gradient_sync()
    return [layer.weight.grad for layer in model.module]


def test_find_unused_parameters_averages_with_zero_and_leaves_unused_grads_alone():
    (a0, b0, c0), (a1, b1, c1) = run_ranks(_unused_allowed, 2)
    assert torch.equal(a0, a1) and torch.count_nonzero(a0) > 0
    # used on rank 0 only: rank 1 adds a zero to the average
    assert torch.equal(b0, b1) and torch.count_nonzero(b0) > 0
    # used by no rank: .grad stays as it was (None), as in PyTorch's DDP
    assert c0 is None and c1 is None


def _pytorch_hook_runs_unchanged():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    model = MyDDP(nn.Linear(4, 4, bias=False), bucket_cap_mb=0)
    model.register_comm_hook(None, default_hooks.allreduce_hook)
    model(torch.ones(1, 4) * (dist.get_rank() + 1)).sum().backward()
    model.finish_gradient_sync()
    return model.module.weight.grad[0, 0].item()


def test_pytorch_comm_hook_runs_on_mybuckets():
    assert run_ranks(_pytorch_hook_runs_unchanged, 2) == [1.5, 1.5]


def test_needs_a_process_group():
    with pytest.raises(RuntimeError, match="needs a process group"):
        MyDDP(nn.Linear(2, 2))
