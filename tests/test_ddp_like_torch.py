"""MyDDP does what PyTorch's DistributedDataParallel does (torch 2.13), each behaviour
compared with DDP itself: the bucketing rule with mixed dtypes, the bucket rebuild after
the first step, unused parameters, no_sync() decided at the forward, and the gradient
copies and the gradients held during accumulation."""

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

from mylib import MyDDP, run_ranks
from mylib.experiments.accum_check import (
    GRADIENT_SETUPS,
    PLACEMENTS,
    gradient_sets,
    placements_both_ways,
)
from mylib.models.buckets import MB, assign_buckets, first_iteration_buckets

DTYPES = [torch.float32, torch.bfloat16, torch.float64]


# -- the bucketing rule: torch.distributed._compute_bucket_assignment_by_size ---------


@settings(max_examples=300, deadline=None)
@given(
    params=st.lists(
        st.tuples(st.integers(0, 40), st.sampled_from(DTYPES)), min_size=1, max_size=12
    ),
    cap=st.sampled_from([0, 1, 40, 100, 300, 10**9]),
    first_cap=st.sampled_from([None, 0, 50, 10**9]),
)
def test_bucketing_rule_is_pytorchs(params, cap, first_cap):
    tensors = [torch.empty(n, dtype=dtype) for n, dtype in params]
    sizes = [t.numel() * t.element_size() for t in tensors]
    keys = [t.dtype for t in tensors]
    first = min(cap, MB) if first_cap is None else first_cap
    limits = [first, cap]
    # In a given order (the rebuild passes the order gradients arrived in as
    # tensor_indices): buckets as they close, then the ones left open.
    order = list(range(len(tensors)))
    theirs, _ = dist._compute_bucket_assignment_by_size(tensors, limits, [], order)
    assert assign_buckets(sizes, cap, first_cap, keys) == theirs
    # Before any backward (no tensor_indices): sorted by the smallest index, and DDP
    # reverses the list; MyDDP lays each bucket out in backward order.
    theirs, _ = dist._compute_bucket_assignment_by_size(tensors, limits)
    mine = first_iteration_buckets(sizes, cap, first_cap, keys)
    assert mine == [bucket[::-1] for bucket in reversed(theirs)]


def test_one_open_bucket_per_dtype():
    # bf16 weights (2 KB) with fp32 norms (40 B) between them, as in a transformer:
    # closing the bucket at every change of dtype would make 6 buckets.
    sizes, keys = [2000, 40] * 3, ["bf16", "fp32"] * 3
    # The bucket left open by the dtype seen last comes first (PyTorch's order).
    assert assign_buckets(sizes, 4000, keys=keys) == [[0, 2], [1, 3, 5], [4]]


# -- the bucket rebuild after the first step ------------------------------------------


class Shuffled(nn.Module):
    """Registers layers a, b, c, d; the forward uses them in the order it is given."""

    def __init__(self, width, dtype=torch.float32):
        super().__init__()
        for name in "abcd":
            setattr(self, name, nn.Linear(width, width, dtype=dtype))

    def forward(self, x, order="cadb"):
        for name in order:
            x = torch.tanh(getattr(self, name)(x))
        return x


def _indices(text):
    """DDP's logging data lists buckets as "3 2, 7 6 1 0 5 4"."""
    return [[int(i) for i in bucket.split()] for bucket in text.split(", ")]


def _numbers(text):
    """A list in DDP's logging data: "1444800, 1200"."""
    return [int(i) for i in text.split(", ")]


def _my_buckets(model):
    index = {id(p): i for i, p in enumerate(model.module.parameters())}
    return [[index[id(p)] for p in bucket.params] for bucket in model.buckets]


def _both(make, cap_mb, find_unused=False):
    """MyDDP and DDP on the same model; MyDDP with DDP's first cap for that cap_mb."""
    torch.manual_seed(0)
    theirs = DDP(make(), bucket_cap_mb=cap_mb, find_unused_parameters=find_unused)
    first = {} if cap_mb is None else {"first_bucket_cap_mb": cap_mb}
    mine = MyDDP(
        make(),
        bucket_cap_mb=25.0 if cap_mb is None else cap_mb,
        find_unused_parameters=find_unused,
        **first,
    )
    mine.module.load_state_dict(theirs.module.state_dict())
    return mine, theirs


def _rebuild_both_ways(cap_mb, orders, width=600, steps=3):
    """Train both a few steps; the forward's order of layers may differ per rank."""
    order = orders[dist.get_rank()]
    mine, theirs = _both(lambda: Shuffled(width), cap_mb)
    launched = []  # DDP's bucket indices, as its comm hook sees them

    def counting_hook(state, bucket):
        launched.append(bucket.index())
        return allreduce_hook(state, bucket)

    theirs.register_comm_hook(None, counting_hook)
    x = torch.randn(4, width, generator=torch.Generator().manual_seed(dist.get_rank()))
    mine_per_step, theirs_per_step = [], []
    for _ in range(steps):
        launched.clear()
        for model in (mine, theirs):
            model.zero_grad()
            model(x, order).sum().backward()
        mine.finish_gradient_sync()
        mine_per_step.append(_my_buckets(mine))  # the buckets that step ran on
        theirs_per_step.append(len(launched))
    data = theirs._get_ddp_logging_data()
    return {
        "mine": mine_per_step,
        "theirs_per_step": theirs_per_step,
        "theirs": _indices(data["rebuilt_per_bucket_param_indices"]),
        "their_order": _numbers(data["prev_iteration_grad_ready_order_indices"]),
        "grad_diff": max(
            (p.grad - q.grad).abs().max().item()
            for p, q in zip(mine.module.parameters(), theirs.module.parameters())
        ),
    }


@pytest.mark.parametrize(
    "cap_mb,orders",
    [(None, ("cadb", "cadb")), (0.5, ("cadb", "cadb")), (0.5, ("cadb", "dbca"))],
)
def test_buckets_are_rebuilt_in_rank0s_order_as_pytorch(cap_mb, orders):
    sizes = [600 * 600 * 4, 600 * 4] * 4
    cap = int((25 if cap_mb is None else cap_mb) * MB)
    first = None if cap_mb is None else cap
    for out in run_ranks(_rebuild_both_ways, 2, args=(cap_mb, orders)):
        # Step 1: the reverse of registration order, before any gradient was seen.
        assert out["mine"][0] == first_iteration_buckets(sizes, cap, first)
        # From step 2 on: rebuilt in the order the gradients arrived on rank 0, which
        # is the order the forward used the layers in, reversed.
        assert out["mine"][1] == out["mine"][2] == out["theirs"]
        assert out["theirs"] != out["mine"][0]
        assert out["grad_diff"] < 1e-6
        # DDP: one bucket in step 1 (find_unused_parameters=False), the rebuilt
        # ones from step 2 on: it rebuilds before the second forward, as MyDDP.
        assert out["theirs_per_step"] == [1] + [len(out["theirs"])] * 2
    if cap_mb is None:  # the 1 MB first cap: the layer used last, 1.44 MB, alone
        assert out["theirs"] == [[3, 2], [7, 6, 1, 0, 5, 4]]
    if orders[0] != orders[1]:  # rank 1's gradients arrived in another order
        assert out["their_order"] != sum(out["theirs"], [])


def _no_rebuild_with_find_unused(cap_mb, width=600):
    mine, theirs = _both(lambda: Shuffled(width), cap_mb, find_unused=True)
    x = torch.randn(4, width)
    sizes = []
    for _ in range(3):
        for model in (mine, theirs):
            model(x).sum().backward()
        mine.finish_gradient_sync()
        sizes.append([b.nbytes for b in mine.buckets])
    data = theirs._get_ddp_logging_data()
    return sizes, _numbers(data["bucket_sizes"]), data["has_rebuilt_buckets"]


@pytest.mark.parametrize("cap_mb", [None, 0.5])
def test_no_rebuild_with_find_unused_parameters(cap_mb):
    sizes, theirs, rebuilt = run_ranks(_no_rebuild_with_find_unused, 2, args=(cap_mb,))[
        0
    ]
    assert rebuilt == 0 and sizes == [theirs] * 3
    if cap_mb is None:  # the 1 MB cap holds a.weight, the first parameter: sent last
        assert theirs == [3 * (600 * 600 * 4 + 600 * 4) + 600 * 4, 600 * 600 * 4]


# -- mixed dtypes: bf16 weights, fp32 norms ------------------------------------------


class Blocks(nn.Module):
    """Three blocks of a bf16 Linear and an fp32 LayerNorm, registered interleaved."""

    def __init__(self, width=64):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "lin": nn.Linear(width, width, dtype=torch.bfloat16),
                    "norm": nn.LayerNorm(width),
                }
            )
            for _ in range(3)
        )

    def forward(self, x):
        for block in self.blocks:
            x = block["norm"](block["lin"](x.to(torch.bfloat16)).float())
        return x


def _mixed_both_ways(cap_mb):
    mine, theirs = _both(Blocks, cap_mb)
    unused_mine, unused_theirs = _both(Blocks, cap_mb, find_unused=True)
    first = [b.nbytes for b in mine.buckets]
    x = torch.randn(4, 64)
    for _ in range(3):  # DDP's logging data shows the rebuild one forward late
        for model in (mine, theirs, unused_mine, unused_theirs):
            model(x).sum().backward()
        mine.finish_gradient_sync()
        unused_mine.finish_gradient_sync()
    data = theirs._get_ddp_logging_data()
    order = _numbers(data["prev_iteration_grad_ready_order_indices"])
    params = list(theirs.module.parameters())
    cap = int((25 if cap_mb is None else cap_mb) * MB)
    limits = [min(cap, MB) if cap_mb is None else cap, cap]
    by_size, _ = dist._compute_bucket_assignment_by_size(
        [params[i] for i in order], limits, [], order
    )
    return {
        "mine": _my_buckets(mine),
        "theirs": _indices(data["rebuilt_per_bucket_param_indices"]),
        "by_size": by_size,
        "first": first,
        "unused": [b.nbytes for b in unused_mine.buckets],
        "their_unused": _numbers(unused_theirs._get_ddp_logging_data()["bucket_sizes"]),
        "dtypes": [b.flat.dtype for b in mine.buckets],
    }


@pytest.mark.parametrize("cap_mb", [None, 0.01, 0.001])
def test_mixed_dtypes_bucket_as_pytorch(cap_mb):
    out = run_ranks(_mixed_both_ways, 2, args=(cap_mb,))[0]
    assert out["mine"] == out["theirs"] == out["by_size"]
    assert out["unused"] == out["their_unused"]  # no rebuild: DDP's first buckets
    # one bucket per dtype at the 25 MB cap, not one per change of dtype
    assert len(out["first"]) == 2 or cap_mb is not None
    assert set(out["dtypes"]) == {torch.bfloat16, torch.float32}


# -- unused parameters (find_unused_parameters=True) ----------------------------------


class Heads(nn.Module):
    """``a`` always; ``b`` and ``c`` when the forward is told to use them.

    ``c`` is registered last, so its bucket is the first to be sent (cap 0).
    """

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(4, 4, bias=False) for _ in range(3))

    def forward(self, x, use=""):
        y = self.a(x)
        for name in use:
            y = y + getattr(self, name)(x)
        return y


def _grads(model):
    return {
        n: None if p.grad is None else p.grad.clone()
        for n, p in model.module.named_parameters()
    }


def _unused_both_ways():
    """Three steps on MyDDP and DDP; each rank's gradients after each, and the order
    of gradients and launches in the first."""
    rank = dist.get_rank()
    mine, theirs = _both(Heads, 1e-6, find_unused=True)  # one bucket per parameter
    x = torch.ones(2, 4) * (rank + 1)
    events, out = [], {}
    for model in (mine, theirs):
        for p in model.module.parameters():
            p.register_post_accumulate_grad_hook(lambda p: events.append("grad"))

    names = {id(p): n for m in (mine, theirs) for n, p in m.module.named_parameters()}

    def launch_hook(state, bucket):
        events.append([names[id(p)] for p in bucket.parameters()])
        return allreduce_hook(state, bucket)

    mine.register_comm_hook(None, launch_hook)
    theirs.register_comm_hook(None, launch_hook)
    for name, model in (("mine", mine), ("theirs", theirs)):
        sync = model.finish_gradient_sync if model is mine else lambda: None
        # 1. b used on rank 0 only, c on no rank (every .grad starts as None)
        events.clear()
        model(x, "b" if rank == 0 else "").sum().backward()
        sync()
        out[name, 1], out[name, "events"] = _grads(model), list(events)
        if model is mine:
            out["in_backward"] = (model.allreduces_in_backward, len(model.buckets))
        # 2. c holds a gradient of its own and no rank uses it: left alone
        model.module.c.weight.grad = torch.full((4, 4), 10.0 * (rank + 1))
        model.module.a.weight.grad = model.module.b.weight.grad = None
        model(x).sum().backward()
        sync()
        out[name, 2] = _grads(model)
        # 3. c used in a no_sync() micro-step on rank 0 only: that counts as used
        model.zero_grad()
        with model.no_sync():
            model(x, "c" if rank == 0 else "").sum().backward()
        model(x).sum().backward()
        sync()
        out[name, 3] = _grads(model)
    return out


def test_unused_parameters_as_pytorch():
    results = run_ranks(_unused_both_ways, 2)
    for rank, out in enumerate(results):
        for step in (1, 2, 3):
            mine, theirs = out["mine", step], out["theirs", step]
            for name in mine:
                assert (mine[name] is None) == (theirs[name] is None), (step, name)
                if mine[name] is not None:
                    assert torch.equal(mine[name], theirs[name]), (step, name)
        assert out["mine", 1]["c.weight"] is None  # used by no rank: untouched
        assert out["mine", 2]["c.weight"][0, 0].item() == 10.0 * (rank + 1)
        assert out["mine", 3]["c.weight"] is not None  # averaged: used on rank 0
        # Every bucket is launched from a hook during the backward.
        launched, buckets = out["in_backward"]
        assert launched == buckets == 3
    # Rank 0 (gradients for a and b): the unused c's bucket is launched at the first
    # gradient's hook, before the second gradient arrives, by both.
    out = results[0]
    for events in (out["mine", "events"], out["theirs", "events"]):
        grads = [i for i, e in enumerate(events) if e == "grad"]
        assert len(grads) == 2 and events.index(["c.weight"]) < grads[-1]


# -- gradient copies: zero_grad(set_to_none=...) and no_sync() -----------------------


def _mlp():
    torch.manual_seed(0)
    layers = [nn.Linear(32, 32) for _ in range(4)]
    return nn.Sequential(*[m for layer in layers for m in (layer, nn.Tanh())][:-1])


def _grads_are_views(model):
    """Every .grad is its bucket's view, and the buckets hold the only gradients."""
    views = all(
        p.grad is not None and p.grad.data_ptr() == view.data_ptr()
        for bucket in model.buckets
        for p, view in zip(bucket.params, bucket.views)
    )
    flats = {b.flat.untyped_storage().data_ptr() for b in model.buckets}
    storages = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
    return views and storages <= flats


def _copies(set_to_none, steps=4, micro_steps=3):
    # 5 KB buckets: three in the first step, two once rebuilt (a copy of its own)
    model = MyDDP(_mlp(), bucket_cap_mb=0.005)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(4, 32)
    out = {"copied": [], "views": [], "no_sync_views": [], "buckets": []}
    for step in range(steps):
        opt.zero_grad(set_to_none=set_to_none)
        for _ in range(micro_steps - 1):
            with model.no_sync():
                model(x).sum().backward()
            out["no_sync_views"].append(_grads_are_views(model))
        model(x).sum().backward()
        model.finish_gradient_sync()
        out["copied"].append(model.copied_bytes)
        out["views"].append(_grads_are_views(model))
        out["buckets"].append(len(model.buckets))
        opt.step()
    out["grad_bytes"] = sum(b.nbytes for b in model.buckets)
    return out


@pytest.mark.parametrize("set_to_none", [True, False])
def test_copies_per_step_and_no_sync_accumulates_in_the_buckets(set_to_none):
    out = run_ranks(_copies, 2, args=(set_to_none,))[0]
    assert out["buckets"] == [3, 2, 2, 2]  # rebuilt before the second forward
    every = out["grad_bytes"]
    # set_to_none=True (zero_grad's default) drops the views: every step copies every
    # gradient into its bucket once (at the first micro-step: not once per micro-step).
    # set_to_none=False keeps them: nothing is copied after the first step.
    assert out["copied"] == ([every] * 4 if set_to_none else [every, 0, 0, 0])
    # Inside no_sync() the micro-steps accumulate in the bucket views: one gradient
    # buffer, no second full copy.
    assert all(out["no_sync_views"]) and all(out["views"])


# -- no_sync() is decided at the forward ----------------------------------------------


def test_the_forward_decides_whether_the_backward_syncs_as_in_pytorch():
    """All four placements of a micro-step's forward and backward around no_sync()."""
    for out in run_ranks(placements_both_ways, 2):
        buckets = out["buckets"]
        for placement, (forward_inside, _) in PLACEMENTS.items():
            row = out[placement]
            # DDP's _pre_forward/_post_forward prepare the reducer only outside
            # no_sync(): the backward follows its forward, wherever it runs.
            expected = 0 if forward_inside else buckets
            assert row["ddp"] == row["mine"] == expected, (placement, row)
            assert row["diff_after_placed"] == 0 and row["diff_at_end"] == 0, row


def test_gradient_sets_held_during_accumulation_as_pytorch():
    """Two full sets inside no_sync() under DDP but with gradient_as_bucket_view=True
    and zero_grad(set_to_none=False); MyDDP one set always (it copies into its
    buckets inside no_sync() too)."""
    expected = {  # (inside no_sync, after the synchronised backward)
        ("DDP", True): (2, 2),
        ("DDP", False): (2, 2),
        ("DDP, gradient_as_bucket_view=True", True): (2, 1),
        ("DDP, gradient_as_bucket_view=True", False): (1, 1),
        ("MyDDP", True): (1, 1),
        ("MyDDP", False): (1, 1),
    }
    assert {setup for setup, _ in expected} == set(GRADIENT_SETUPS)
    for out in run_ranks(gradient_sets, 2):
        for key, (inside, after) in expected.items():
            assert out[key]["inside_no_sync"] == inside, key
            assert out[key]["after_sync"] == after, key


# -- static_graph=True (PyTorch's; MyDDP has none) -----------------------------------


def _static_graph_cases():
    from mylib.experiments.ddp_steps_check import static_graph_buckets

    return {
        (static, unused): static_graph_buckets(static, unused)
        for static in (False, True)
        for unused in (False, True)
    }


def test_static_graph_rebuilds_even_with_find_unused_parameters():
    """compute_bucket_size_limits: one bucket first, when static_graph or not
    find_unused_parameters; Reducer::should_rebuild_buckets: (static_graph_ ||
    !find_unused_parameters_). With static_graph the first iteration all-reduces
    after the backward (delay_all_reduce) and the order is recorded in the
    second, so the rebuild comes one step later."""
    out = run_ranks(_static_graph_cases, 2)[0]
    assert out[False, False] == {"buckets": [1, 2, 2, 2], "rebuilt": True}
    assert out[False, True] == {"buckets": [3, 3, 3, 3], "rebuilt": False}
    for unused in (False, True):
        assert out[True, unused] == {"buckets": [1, 1, 2, 2], "rebuilt": True}
