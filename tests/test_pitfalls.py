"""Chapter 8: every pitfall fails the way the chapter says, and every fix is exact.

And the tools find them.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DistributedSampler

from mylib import RankError, RankTimeout, run_ranks
from mylib.experiments import pitfalls as pf
from mylib.experiments.common import max_param_diff
from mylib.figures.debug import collective_pairing_figure
from mylib.figures.sharding import sharding_figure, sharding_verdict
from mylib.models import sharding


def _fails(fn, world_size=2, timeout_s=30, **kwargs):
    with pytest.raises((RankError, RankTimeout)) as info:
        run_ranks(fn, world_size, kwargs=kwargs, timeout_s=timeout_s, show_output=False)
    return info.value


# -- 1. unused parameters --------------------------------------------------------


@pytest.mark.parametrize("used_by", ["none", "rank0"])
def test_unused_parameter_is_named(used_by):
    e = _fails(pf.unused_parameters, used_by=used_by)
    assert (
        isinstance(e, RankError)
        and "got no gradient" in str(e)
        and "extra.weight" in str(e)
    )


def test_unused_parameter_torch_ddp_fails_too():
    e = _fails(pf.unused_parameters, wrapper="torch")
    assert "Expected to have finished reduction" in str(e)


def test_find_unused_parameters_is_exact_and_equals_torch():
    ours = run_ranks(
        pf.unused_parameters,
        2,
        kwargs=dict(used_by="rank0", find_unused=True),
        show_output=False,
    )
    theirs = run_ranks(
        pf.unused_parameters,
        2,
        kwargs=dict(used_by="rank0", find_unused=True, wrapper="torch"),
        show_output=False,
    )
    one = pf.reference(pf.BranchNet, 2, 3, use_extra_on={0})
    for params in ours:
        assert max_param_diff(params, one) < 1e-6
    assert max_param_diff(ours[0], theirs[0]) < 1e-6


# -- 2. frozen and tied ---------------------------------------------------------


def _frozen_branchnet():
    net = pf.BranchNet()
    net.trunk.weight.requires_grad_(False)
    return net


def test_frozen_parameter():
    e = _fails(pf.frozen_parameter, freeze_after_wrap=True)
    assert "trunk.weight" in str(e)
    params = run_ranks(pf.frozen_parameter, 2, show_output=False)[0]
    assert max_param_diff(params, pf.reference(_frozen_branchnet, 2, 3)) < 1e-6
    assert torch.equal(params["trunk.weight"], pf.BranchNet().trunk.weight)


@pytest.mark.parametrize("world_size", [2, 3])
def test_tied_parameter(world_size):
    e = _fails(pf.tied_parameter, world_size=world_size, tie_after_wrap=True)
    assert "out.weight" in str(e)
    params, names = run_ranks(pf.tied_parameter, world_size, show_output=False)[0]
    assert "out.weight" not in names and names.count("embed.weight") == 1
    assert "out.weight" not in params  # named_parameters() lists the tied tensor once
    assert (
        max_param_diff(params, pf.reference(pf.TiedNet, world_size, 3, kind="tokens"))
        < 1e-6
    )


# -- 3. buffers -----------------------------------------------------------------


def test_buffers_drift_unless_broadcast():
    loose = run_ranks(
        pf.norm_buffers, 2, kwargs=dict(broadcast_buffers=False), show_output=False
    )
    synced = run_ranks(
        pf.norm_buffers, 2, kwargs=dict(broadcast_buffers=True), show_output=False
    )
    for runs in (loose, synced):
        assert all(
            v == 0.0 for k, v in runs[0]["drift"].items() if k.startswith("param")
        )
        assert runs[0]["drift"] == runs[1]["drift"]  # every rank gets the same report
    assert loose[0]["drift"]["buffer norm.running_mean"] > 0.1
    assert (loose[0]["eval"] - loose[1]["eval"]).abs().max().item() > 1e-3
    assert torch.equal(synced[0]["eval"], synced[1]["eval"])


def test_batchnorm_is_not_the_whole_batch_but_layernorm_is():
    for norm, exact in (("batch", False), ("layer", True)):
        params = run_ranks(
            pf.norm_buffers, 2, kwargs=dict(norm=norm), show_output=False
        )[0]["params"]
        diff = max_param_diff(
            params, pf.reference(lambda: pf.NormNet(norm), 2, 5, shift_per_rank=1.0)
        )
        assert (diff < 1e-6) == exact, (norm, diff)


# -- 4. collectives in different orders ------------------------------------------


def test_mismatched_order_hangs_and_the_timeout_shows_where():
    e = _fails(pf.mismatched_collectives, timeout_s=4)
    if isinstance(e, RankTimeout):  # the launcher's report: where each stuck rank was
        assert "in all_reduce" in e.stuck.get(
            0, "in all_reduce"
        ) and "in broadcast" in e.stuck.get(1, "in broadcast")
        assert any(
            f"in {op}" in stack
            for stack in e.stuck.values()
            for op in ("all_reduce", "broadcast")
        )
    else:  # gloo's own timeout (the group's, the same length) fired first
        assert "Timed out" in str(e) or "timed out" in str(e)


def test_checked_group_names_the_mismatch():
    e = _fails(pf.mismatched_collectives, checked=True)
    assert isinstance(e, RankError) and "Detected mismatch between collectives" in str(
        e
    )


@pytest.mark.parametrize("checked", [False, True])
def test_same_shape_swap_is_silently_wrong(checked):
    values = run_ranks(
        pf.mismatched_collectives,
        2,
        kwargs=dict(kind="same_shape", checked=checked),
        show_output=False,
    )
    # rank 0's gradient all-reduce met rank 1's metric all-reduce: 10 + 2 and 1 + 20.
    assert values[0] == {"metric": 21.0, "grad": 12.0} and values[1] == {
        "metric": 12.0,
        "grad": 21.0,
    }


def _late_rank():
    import time

    import torch.distributed as dist

    from mylib.debug import who_is_missing

    if dist.get_rank() == 2:
        time.sleep(2.5)
    try:
        who_is_missing(timeout_s=0.5)
    except RuntimeError as e:
        return str(e)
    return None


def test_who_is_missing_names_the_late_rank():
    report = run_ranks(_late_rank, 3, show_output=False)[0]
    assert report is not None and "Ranks 2 failed" in report


# -- 5. uneven last batch ---------------------------------------------------------


def test_uneven_batches_hang_and_the_sampler_fixes_them():
    e = _fails(pf.uneven_batches, world_size=4, timeout_s=4)
    assert e is not None
    padded = run_ranks(
        pf.uneven_batches, 4, kwargs=dict(sharding="sampler"), show_output=False
    )
    dropped = run_ranks(
        pf.uneven_batches, 4, kwargs=dict(sharding="drop_last"), show_output=False
    )
    assert [r["steps"] for r in padded] == [2] * 4 and [
        r["steps"] for r in dropped
    ] == [1] * 4
    assert [r["seen"] for r in padded] == [
        sharding.sampler_indices(10, 4, r) for r in range(4)
    ]
    assert [r["seen"] for r in dropped] == [
        sharding.sampler_indices(10, 4, r, drop_last=True) for r in range(4)
    ]


# -- 6. ranks reading the same data ------------------------------------------------


def test_data_shards():
    results = {
        kind: run_ranks(pf.data_shards, 4, kwargs=dict(kind=kind), show_output=False)
        for kind in ("no_sampler", "rank_seed", "no_set_epoch", "sampler")
    }
    no_sampler = results["no_sampler"][0]["report"]
    assert (
        no_sampler["per_rank"] == [16] * 4 and len(no_sampler["read_by_several"]) == 16
    )
    assert (
        results["no_sampler"][0]["epochs"] == results["no_sampler"][3]["epochs"]
    )  # identical on every rank
    rank_seed = results["rank_seed"][0]["report"]
    assert (
        not rank_seed["disjoint"]
        and rank_seed["read_by_several"]
        and rank_seed["never_read"]
    )
    assert results["no_set_epoch"][0]["report"]["disjoint"]
    assert (
        results["no_set_epoch"][0]["epochs"][0]
        == results["no_set_epoch"][0]["epochs"][1]
    )
    good = results["sampler"]
    assert (
        good[0]["report"]["disjoint"] and good[0]["epochs"][0] != good[0]["epochs"][1]
    )
    assert sorted(i for r in good for i in r["epochs"][1]) == list(range(16))


# -- the sampler rule, stdlib, against PyTorch's -----------------------------------


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 60),
    world=st.integers(1, 9),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_sampler_indices_equal_distributed_sampler(
    size, world, drop_last, shuffle, seed
):
    order = (
        torch.randperm(size, generator=torch.Generator().manual_seed(seed)).tolist()
        if shuffle
        else None
    )
    for rank in range(world):
        if drop_last and size < world:
            continue
        theirs = DistributedSampler(
            range(size), world, rank, shuffle=shuffle, seed=seed, drop_last=drop_last
        )
        assert list(theirs) == sharding.sampler_indices(
            size, world, rank, drop_last, order
        )


def test_sharding_helpers_and_bad_input():
    assert sharding.naive_indices(10, 4, 1) == [1, 5, 9]
    assert sharding.batches_of([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert sharding.batches_of([1, 2, 3, 4, 5], 2, drop_last=True) == [[1, 2], [3, 4]]
    assert [len(b) for b in sharding.shares(1000, 16, 8, "sampler")] == [
        8
    ] * 16  # the chapter's exercise
    assert (
        sum(len(b) for r in sharding.shares(1000, 16, 8, "sampler") for b in r) == 1008
    )
    with pytest.raises(ValueError, match="rank"):
        sharding.sampler_indices(10, 4, 4)
    with pytest.raises(ValueError, match="mode"):
        sharding.shares(10, 4, 2, "random")
    with pytest.raises(ValueError, match="order"):
        sharding.sampler_indices(3, 1, 0, order=[0, 1])


# -- the figures -----------------------------------------------------------------------


def test_sharding_figure():
    naive = sharding_verdict(10, 4, 2, "naive")
    assert naive["steps"] == [2, 2, 1, 1] and naive["hangs"] and not naive["repeated"]
    padded = sharding_verdict(10, 4, 2, "sampler")
    assert (
        padded["steps"] == [2] * 4
        and padded["repeated"] == [0, 1]
        and not padded["hangs"]
    )
    dropped = sharding_verdict(11, 3, 2, "drop_last")
    assert dropped["unread"] == [9, 10] and not dropped["hangs"]
    svg = sharding_figure()
    assert "HANG: ranks 0, 1" in svg and svg == sharding_figure()
    assert "every rank takes 2 step(s)" in sharding_figure(mode="sampler")


def test_figures_run_in_the_browser():
    browser = pytest.importorskip("mylib.figures.browser")
    assert {"figures.sharding", "models.sharding", "figures.svg"} <= set(
        browser.module_closure("mylib.figures.sharding")
    )
    assert "torch" not in " ".join(browser.module_closure("mylib.figures.sharding"))
    svg = collective_pairing_figure()
    assert (
        svg.count("pair ok") == 2
        and svg.count("never completes") == 2
        and svg.count("wrong pair") == 2
    )


# -- the collective ledger ----------------------------------------------------------


def _ledger_lines(report):
    """The per-rank lines of a ledger report, the header dropped."""
    return report.splitlines()[1:]


def test_the_ledger_is_among_chapter_8s_tools():
    import mylib.debug
    import mylib.ledger

    assert mylib.debug.CollectiveLedger is mylib.ledger.CollectiveLedger


def test_the_ledger_names_where_two_hung_ranks_parted():
    """The loss logged inside `if rank == 0`: without the ledger gloo aborts or
    the ranks hang; with it both ranks stop at the call that does not pair."""
    e = _fails(pf.logged_on_rank_zero, timeout_s=10)
    assert "Received data size doesn't match" in str(e) or isinstance(e, RankTimeout)
    reports = run_ranks(
        pf.logged_on_rank_zero,
        2,
        kwargs=dict(ledger_timeout_s=5),
        show_output=False,
    )
    n = len(list(pf.BranchNet().parameters()))  # one all-reduce per parameter
    shape = ", ".join(map(str, next(pf.BranchNet().parameters()).shape))
    for rank, report in enumerate(reports):
        assert report.splitlines()[0] == (
            f"collective ledger, rank {rank}: call #{n + 1} differs on rank {1 - rank}"
        )
        zero, zero_at, one, one_at = _ledger_lines(report)
        assert zero == (
            f"rank 0: last matching #{n}; then #{n + 1} all_reduce float32 [] "
            f"[stopped at #{n + 1}]"
        )
        assert zero_at.startswith("    at pitfalls.py:")
        assert zero_at.endswith("  dist.all_reduce(total)"), zero_at
        assert one == (
            f"rank 1: last matching #{n}; then #{n + 1} all_reduce float32 [{shape}] "
            f"[stopped at #{n + 1}]"
        )
        assert one_at.endswith("  dist.all_reduce(p.grad)"), one_at


def _one_more_call(stall_s=0.0):
    import time

    import torch
    import torch.distributed as dist

    from mylib.ledger import CollectiveHang, CollectiveLedger

    try:
        with CollectiveLedger(timeout_s=1.0):
            t = torch.ones(2)
            dist.all_reduce(t)
            if dist.get_rank() == 1:
                time.sleep(stall_s)  # stuck outside any collective
            if dist.get_rank() == 0 or stall_s:
                dist.all_reduce(t)
    except CollectiveHang as e:
        return e.report
    return "no hang"


def test_the_ledger_names_a_rank_that_left_or_went_quiet():
    zero, one = run_ranks(_one_more_call, 2, show_output=False)
    assert one == "no hang"
    assert zero.splitlines()[0] == "collective ledger, rank 0: rank 1 makes no call #2"
    assert _ledger_lines(zero)[2] == (
        "rank 1: last matching #1; then #2 (none) [left after #1]"
    )
    zero, one = run_ranks(
        _one_more_call, 2, kwargs=dict(stall_s=4.0), show_output=False
    )
    assert zero.splitlines()[0] == (
        "collective ledger, rank 0: no call #2 from rank 1 within 1 s"
    )
    assert (
        _ledger_lines(zero)[2] == "rank 1: last matching #1; then #2 (none) [no word]"
    )
    # Rank 1 comes back to its call #2 and finds that rank 0 stopped there.
    assert one.splitlines()[0] == (
        "collective ledger, rank 1: rank 0 stopped at its call #2"
    )


def test_the_ledger_finds_a_same_shape_swap_by_its_lines():
    values = run_ranks(
        pf.mismatched_collectives,
        2,
        kwargs=dict(kind="same_shape", ledger={"timeout_s": 5}),
        show_output=False,
    )
    assert all(isinstance(v, dict) for v in values)  # the sizes agree: no report
    reports = run_ranks(
        pf.mismatched_collectives,
        2,
        kwargs=dict(kind="same_shape", ledger={"timeout_s": 5, "compare_lines": True}),
        show_output=False,
    )
    _, zero, _, one = _ledger_lines(reports[0])
    assert zero.endswith("dist.all_reduce(grad, group=group)"), zero
    assert one.endswith("dist.all_reduce(metric, group=group)"), one
    assert all("[stopped at #1]" in line for line in _ledger_lines(reports[1])[::2])


def _ledger_and_flight_recorder():
    """What the ledger and PyTorch's flight recorder each record of one DDP step,
    a functional all-reduce and a plain one."""
    import json

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    from torch.nn.parallel import DistributedDataParallel as DDP

    from mylib.ledger import CollectiveLedger

    def recorded():
        return json.loads(torch._C._distributed_c10d._dump_fr_trace_json())["entries"]

    before = len(recorded())
    with CollectiveLedger(timeout_s=5) as ledger:
        model = DDP(torch.nn.Linear(3, 2))
        model(torch.ones(4, 3)).sum().backward()
        t = torch.ones(3)
        fc.wait_tensor(fc.all_reduce(t, "sum", dist.group.WORLD))
        dist.all_reduce(t)
    new = recorded()[before:]
    return (
        [e["op"] for e in ledger.entries],
        [e["profiling_name"] for e in new],
        {e["state"] for e in new},
    )


def test_the_ledger_does_not_see_ddp_s_or_functional_collectives():
    """What its docstring says it misses: DDP's collectives (issued in C++) and
    the functional ones, which the flight recorder, inside the process group,
    records on gloo too (where its entries stay "scheduled", as chapter 8 says)."""
    runs = run_ranks(_ledger_and_flight_recorder, 2, show_output=False)
    for ledger, flight, states in runs:
        assert ledger == ["all_reduce"]  # the plain one only
        # DDP: the shapes' all-gather, the weights' broadcast, the bucket's
        # all-reduce; then the functional all-reduce and the plain one.
        assert flight[0] == "gloo:all_gather"
        assert "gloo:broadcast" in flight
        assert flight[-3:] == ["gloo:all_reduce"] * 3
        assert states == {"scheduled"}
