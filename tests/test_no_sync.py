"""Gradient accumulation with MyDDP.no_sync(): equal to the whole batch and to PyTorch's
DDP, m-fold fewer bytes, and the edge cases (no_sync twice in a row, a step on local
gradients, switching bucket caps) on real gloo groups."""

import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mylib import MyDDP, RankError, comm, run_ranks
from mylib.experiments.accum_check import (
    SIZES,
    accumulate,
    accumulation_three_ways,
    bytes_per_optimizer_step,
    loss_scaling_effects,
    make_model,
    my_micro_batches,
)
from mylib.experiments.common import global_batches

TOL = 1e-12  # float64: the three ways add the same numbers in different orders


@pytest.mark.parametrize(
    "world,micro_steps,optimizer", [(2, 3, "adam"), (4, 2, "sgd"), (4, 4, "adam")]
)
def test_accumulation_equals_whole_batch_and_pytorch_ddp(world, micro_steps, optimizer):
    for out in run_ranks(
        accumulation_three_ways,
        world,
        args=(micro_steps,),
        kwargs={"optimizer": optimizer},
    ):
        assert out["vs_single"] < TOL and out["vs_ddp"] < TOL, out
        # Both synchronised only the last micro-step: one all-reduce per bucket per
        # optimizer step.
        assert out["ddp_allreduces"] == out["my_allreduces"] == out["buckets"], out


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=st.integers(1, 3),
    micro_steps=st.integers(1, 4),
    micro_batch=st.integers(1, 3),
    cap_mb=st.sampled_from([0.0, 0.001, 25.0]),
)
def test_accumulation_property(world, micro_steps, micro_batch, cap_mb):
    results = run_ranks(
        accumulation_three_ways,
        world,
        args=(micro_steps,),
        kwargs={"steps": 2, "micro_batch": micro_batch, "bucket_cap_mb": cap_mb},
        show_output=False,
    )
    for out in results:
        assert out["vs_single"] < TOL and out["vs_ddp"] < TOL
        assert out["ddp_allreduces"] == out["my_allreduces"] == out["buckets"]


@pytest.mark.parametrize("world,micro_steps", [(2, 4), (4, 3)])
def test_no_sync_sends_m_times_fewer_bytes(world, micro_steps):
    out = run_ranks(bytes_per_optimizer_step, world, args=(micro_steps,))[0]
    once = (
        2 * (world - 1) * out["grad_bytes"] // world
    )  # one ring all-reduce of every gradient
    assert out["no_sync"]["bytes"] == once
    assert out["every_micro_step"]["bytes"] == micro_steps * once
    assert out["no_sync"]["allreduces"] == out["buckets"]
    assert out["every_micro_step"]["allreduces"] == micro_steps * out["buckets"]
    # Both give the whole batch's gradient: syncing every micro-step costs bytes, not
    # correctness.
    assert (
        out["no_sync"]["grad_diff"] < TOL and out["every_micro_step"]["grad_diff"] < TOL
    )


def test_loss_scaling():
    m = 4
    out = run_ranks(loss_scaling_effects, 2, args=(m,))[0]
    for fixed in ("divide_loss", "divide_grad"):
        assert (
            abs(out[fixed]["grad_ratio"] - 1) < 1e-12 and out[fixed]["grad_diff"] < TOL
        )
        assert out[fixed]["sgd_diff"] < TOL and out[fixed]["adam_diff"] < TOL
    assert (
        abs(out["none"]["grad_ratio"] - m) < 1e-12
    )  # the gradient is m times too large
    assert out["none"]["sgd_diff"] > 1e-2  # SGD takes m-times larger steps
    # Adam divides by sqrt(v), which is m times larger too: the bug almost cancels (only
    # epsilon sees it).
    assert 0 < out["none"]["adam_diff"] < out["none"]["sgd_diff"] / 100


def test_micro_batches_must_split_equally():
    def worker():
        x = torch.zeros(6, 2)
        my_micro_batches(x, x, micro_steps=4)

    with pytest.raises(RankError, match="equal micro-batches"):
        run_ranks(worker, 2, show_output=False)


# -- edge cases
# ----------------------------------------------------------------------------


def _edge_cases():
    """Every edge case on one group.

    Returns what each did: an error message, or numbers.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    ((x, y),) = global_batches(1, 4 * world, SIZES, dtype=torch.float64)
    micro = my_micro_batches(x, y, 4)
    single = make_model(0)
    F.mse_loss(single(x), y).backward()
    whole = [p.grad.clone() for p in single.parameters()]
    out = {}

    def grad_diff(model):
        return max(
            (p.grad - g).abs().max().item()
            for p, g in zip(model.module.parameters(), whole)
        )

    def error_of(action):
        try:
            action()
        except RuntimeError as e:
            return str(e)
        return None

    # no_sync() twice in a row, then nested: gradients keep adding up until a backward
    # outside it.
    model = MyDDP(make_model(0), bucket_cap_mb=0)
    for xs, ys in micro[:2]:
        with model.no_sync():
            (F.mse_loss(model(xs), ys) / 4).backward()
    with model.no_sync():
        with model.no_sync():
            (F.mse_loss(model(micro[2][0]), micro[2][1]) / 4).backward()
        assert (
            not model.require_backward_grad_sync
        )  # leaving the inner block keeps the outer one's setting
    (F.mse_loss(model(micro[3][0]), micro[3][1]) / 4).backward()
    model.finish_gradient_sync()
    out["twice_in_a_row_diff"] = grad_diff(model)

    # An optimizer step inside no_sync(), or after it without a synchronised backward,
    # is refused.
    model = MyDDP(make_model(0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with model.no_sync():
        F.mse_loss(model(x), y).backward()
        out["step_inside"] = error_of(opt.step)
    out["step_after_no_sync"] = error_of(opt.step)
    out["finish_after_only_no_sync"] = error_of(model.finish_gradient_sync)
    # The forward decides (as PyTorch's DDP): a backward outside no_sync() whose
    # forward ran inside sends nothing either.
    last = MyDDP(make_model(0))
    with last.no_sync():
        loss = F.mse_loss(last(x), y)
    loss.backward()
    out["last_forward_inside"] = error_of(last.finish_gradient_sync)
    last.zero_grad()
    other = torch.nn.Linear(
        2, 2
    )  # another model's optimizer is none of MyDDP's business
    other(torch.ones(1, 2)).sum().backward()
    out["other_optimizer"] = error_of(torch.optim.SGD(other.parameters(), lr=0.1).step)
    F.mse_loss(model(x), y).backward()  # a synchronised backward, not yet finished
    out["step_before_finish"] = error_of(opt.step)

    def enter_no_sync():
        with model.no_sync():
            pass

    out["no_sync_before_finish"] = error_of(enter_no_sync)
    model.finish_gradient_sync()
    out["step_after_recovery"] = error_of(opt.step)  # the proper order works again

    # Switching bucket caps: wrap the same module again; the new MyDDP takes the
    # parameters over.
    net = make_model(rank)  # different weights per rank: each wrap broadcasts rank 0's
    ref = make_model(0)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    sent, buckets = [], []
    for cap in (0.0, 25.0, 0.001):
        model = MyDDP(net, bucket_cap_mb=cap)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            ref_opt.zero_grad()
            with comm.count_bytes() as stats:
                accumulate(model, micro)
            sent.append(stats.bytes_sent)
            opt.step()
            F.mse_loss(ref(x), y).backward()
            ref_opt.step()
        buckets.append(len(model.buckets))
        if cap == 0.0:
            first = model
    out["switch_param_diff"] = max(
        (p - q).abs().max().item() for p, q in zip(net.parameters(), ref.parameters())
    )
    out["switch_sent"], out["switch_buckets"] = sent, buckets
    out["grad_bytes"] = sum(p.numel() * p.element_size() for p in net.parameters())
    out["old_wrapper"] = error_of(lambda: first(x))
    return out


@pytest.fixture(scope="module")
def edge():
    return run_ranks(_edge_cases, 2)[0]


def test_no_sync_twice_in_a_row_and_nested(edge):
    assert edge["twice_in_a_row_diff"] < TOL


@pytest.mark.parametrize(
    "case,message",
    [
        ("step_inside", "inside no_sync\\(\\) and never averaged"),
        ("step_after_no_sync", "inside no_sync\\(\\) and never averaged"),
        (
            "finish_after_only_no_sync",
            "followed a forward inside no_sync\\(\\), so nothing was sent",
        ),
        (
            "last_forward_inside",
            "followed a forward inside no_sync\\(\\), so nothing was sent",
        ),
        ("step_before_finish", "before finish_gradient_sync"),
        (
            "no_sync_before_finish",
            "still being averaged: call finish_gradient_sync\\(\\) first",
        ),
        ("old_wrapper", "a newer MyDDP wraps the same parameters"),
    ],
)
def test_misuse_gets_a_clear_error(edge, case, message):
    assert edge[case] is not None, f"{case}: no error was raised"
    assert re.search(message, edge[case]), edge[case]


def test_guard_leaves_other_optimizers_and_the_proper_order_alone(edge):
    assert edge["other_optimizer"] is None
    assert edge["step_after_recovery"] is None


def test_switching_bucket_caps(edge):
    assert (
        edge["switch_param_diff"] < TOL
    )  # three wrappers in turn train like one process
    assert edge["switch_buckets"] == [6, 1, 3]  # 6 parameters; one bucket; 1 KB caps
    # Every step sends exactly one all-reduce of every gradient: the replaced wrappers'
    # hooks are gone.
    assert edge["switch_sent"] == [edge["grad_bytes"]] * 6
