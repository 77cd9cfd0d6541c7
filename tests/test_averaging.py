"""Chapter 2's claims on real gloo groups: averaging gradients is exact (with equal
shares), the initial broadcast is needed, DistributedSampler shards the data, and the
global batch adds up."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler

from mylib import run_ranks
from mylib.averaging import (
    accumulation_steps_for,
    average_gradients,
    broadcast_parameters,
    check_shards,
    global_batch_size,
    max_replica_difference,
)
from mylib.experiments.common import max_param_diff, mlp
from mylib.loss import global_mean_loss

TOL = 1e-6


def make_batch(rows, sizes, dtype=torch.float32, seed=1234):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, sizes[0], generator=g).to(dtype), torch.randn(
        rows, sizes[-1], generator=g
    ).to(dtype)


def _three_ways(sizes, rows_per_rank, steps, dtype):
    """Mine (broadcast + average), PyTorch DDP and one process on the whole batch.

    `steps` SGD steps each.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    x, y = make_batch(rows_per_rank * n, sizes, dtype)
    mine_x, mine_y = (
        x[rank * rows_per_rank : (rank + 1) * rows_per_rank],
        y[rank * rows_per_rank : (rank + 1) * rows_per_rank],
    )

    mine = mlp(sizes, seed=rank, dtype=dtype)  # every rank starts elsewhere...
    broadcast_parameters(mine)  # ...until it takes rank 0's weights
    single = mlp(sizes, seed=0, dtype=dtype)
    ddp = DDP(mlp(sizes, seed=0, dtype=dtype))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (mine, single, ddp)]
    first_grad_diff = None
    for step in range(steps):
        for opt in opts:
            opt.zero_grad()
        F.mse_loss(mine(mine_x), mine_y).backward()
        average_gradients(mine)
        F.mse_loss(single(x), y).backward()
        F.mse_loss(ddp(mine_x), mine_y).backward()
        if step == 0:
            first_grad_diff = max(
                (p.grad - q.grad).abs().max().item()
                for p, q in zip(mine.parameters(), single.parameters())
            )
        for opt in opts:
            opt.step()
    return (
        first_grad_diff,
        max_param_diff(mine, single),
        max_param_diff(mine, ddp.module),
        max_replica_difference(mine),
    )


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=st.integers(1, 4),
    sizes=st.lists(st.integers(1, 12), min_size=2, max_size=4),
    rows_per_rank=st.integers(1, 5),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_average_of_equal_share_gradients_is_the_whole_batch_gradient(
    world, sizes, rows_per_rank, dtype
):
    for grad_diff, vs_single, vs_ddp, replicas in run_ranks(
        _three_ways, world, args=(sizes, rows_per_rank, 3, dtype)
    ):
        assert grad_diff < TOL
        assert vs_single < TOL
        assert vs_ddp < TOL
        assert replicas == 0.0


def _unequal_shares():
    """Rank r holds r+1 rows: the mean of per-rank means weighs rows unequally.

    The global mean does not.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    sizes = [3, 4, 2]
    counts = [r + 1 for r in range(n)]
    x, y = make_batch(sum(counts), sizes)
    start = sum(counts[:rank])
    mx, my = x[start : start + counts[rank]], y[start : start + counts[rank]]
    whole = mlp(sizes, seed=0)
    F.mse_loss(whole(x), y, reduction="none").sum(
        dim=1
    ).mean().backward()  # mean over rows
    diffs = {}
    for how in ("mean of means", "global mean"):
        model = mlp(sizes, seed=0)
        per_row = F.mse_loss(model(mx), my, reduction="none").sum(dim=1)
        loss = (
            per_row.mean()
            if how == "mean of means"
            else global_mean_loss(per_row.sum(), len(per_row))
        )
        loss.backward()
        average_gradients(model)
        diffs[how] = max(
            (p.grad - q.grad).abs().max().item()
            for p, q in zip(model.parameters(), whole.parameters())
        )
    return diffs


@pytest.mark.parametrize("world", [2, 3])
def test_unequal_shares_need_the_global_count(world):
    for diffs in run_ranks(_unequal_shares, world):
        assert diffs["mean of means"] > 1e-3
        assert diffs["global mean"] < TOL


def _drift(steps, broadcast, optimizer):
    rank = dist.get_rank()
    sizes = [4, 8, 2]
    model = mlp(
        sizes, seed=rank
    )  # a rank-dependent seed, as when seeding data augmentation per rank
    if broadcast:
        broadcast_parameters(model)
    start = [p.detach().clone() for p in model.parameters()]
    start_rank0 = [p.clone() for p in start]
    for t in start_rank0:
        dist.broadcast(t, 0)
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1)
        if optimizer == "sgd"
        else torch.optim.Adam(model.parameters(), lr=0.01)
    )
    x, y = make_batch(8, sizes, seed=rank)
    for _ in range(steps):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        average_gradients(model)
        opt.step()
    end_rank0 = [p.detach().clone() for p in model.parameters()]
    for t in end_rank0:
        dist.broadcast(t, 0)
    # How far the gap between this rank and rank 0 moved during training.
    gap_change = max(
        ((p.detach() - e0) - (s - s0)).abs().max().item()
        for p, e0, s, s0 in zip(model.parameters(), end_rank0, start, start_rank0)
    )
    return max_replica_difference(model), gap_change


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_without_the_broadcast_replicas_never_meet(optimizer):
    for replicas, gap_change in run_ranks(_drift, 2, args=(10, False, optimizer)):
        assert replicas > 0.05  # two different models...
        assert (
            gap_change < TOL
        )  # ...forever: identical updates keep the gap exactly where it started
    for replicas, _ in run_ranks(_drift, 2, args=(10, True, optimizer)):
        assert replicas == 0.0


def _missing_gradient():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    model[0](torch.ones(1, 2)).sum().backward()  # the second layer is never used
    try:
        average_gradients(model)
    except RuntimeError as e:
        return str(e)


def test_a_parameter_without_gradient_is_named_with_the_fix():
    message = run_ranks(_missing_gradient, 1)[0]
    assert (
        "'1.weight' has no gradient" in message and "requires_grad_(False)" in message
    )


# ---- disjoint data
# ----------------------------------------------------------------------------


def shards_of(dataset_len, world, epoch, seed=0, drop_last=False, set_epoch=True):
    out = []
    for rank in range(world):
        sampler = DistributedSampler(
            range(dataset_len),
            num_replicas=world,
            rank=rank,
            shuffle=True,
            seed=seed,
            drop_last=drop_last,
        )
        if set_epoch:
            sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


@given(
    dataset_len=st.integers(1, 300),
    world=st.integers(1, 8),
    epoch=st.integers(0, 50),
    seed=st.integers(0, 999),
)
def test_distributed_sampler_partitions_the_data_when_the_world_divides_it(
    dataset_len, world, epoch, seed
):
    dataset_len -= dataset_len % world
    if dataset_len == 0:
        return
    check = check_shards(shards_of(dataset_len, world, epoch, seed), dataset_len)
    assert check.disjoint and check.complete
    assert check.per_rank == [dataset_len // world] * world


@given(
    dataset_len=st.integers(1, 300), world=st.integers(2, 8), epoch=st.integers(0, 50)
)
def test_uneven_datasets_are_padded_or_cut(dataset_len, world, epoch):
    rest = dataset_len % world
    padded = check_shards(shards_of(dataset_len, world, epoch), dataset_len)
    assert padded.complete
    padding = world - rest if rest else 0
    assert sum(padded.per_rank) == dataset_len + padding  # padding repeats rows...
    assert len(padded.read_twice) == min(
        padding, dataset_len
    )  # ...from the start of the permutation
    if dataset_len >= world:
        cut = check_shards(
            shards_of(dataset_len, world, epoch, drop_last=True), dataset_len
        )
        assert (
            cut.disjoint and len(cut.missing) == rest
        )  # drop_last leaves rows out this epoch


def test_set_epoch_reshuffles_and_forgetting_it_repeats_the_order():
    assert shards_of(100, 4, epoch=0) != shards_of(100, 4, epoch=1)
    assert shards_of(100, 4, epoch=0, set_epoch=False) == shards_of(
        100, 4, epoch=7, set_epoch=False
    )


def _real_sampler(dataset_len, epochs):
    sampler = DistributedSampler(
        range(dataset_len), shuffle=True, seed=0
    )  # rank and world from the group
    out = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


def test_ranks_of_a_real_group_draw_the_same_permutation():
    per_rank = run_ranks(_real_sampler, 3, args=(30, 2))
    for epoch in range(2):
        shards = [epochs[epoch] for epochs in per_rank]
        assert shards == shards_of(30, 3, epoch)
        assert check_shards(shards, 30).disjoint and check_shards(shards, 30).complete


def _same_rows(rows):
    """Both ranks read the same rows (no sampler).

    The step is a one-rank step at twice the cost.
    """
    sizes = [3, 2]
    x, y = make_batch(2 * rows, sizes)
    same_x, same_y = x[:rows], y[:rows]
    model = mlp(sizes, seed=0)
    F.mse_loss(model(same_x), same_y).backward()
    average_gradients(model)
    one_rank, whole = mlp(sizes, seed=0), mlp(sizes, seed=0)
    F.mse_loss(one_rank(same_x), same_y).backward()
    F.mse_loss(whole(x), y).backward()
    grads = lambda m: torch.cat([p.grad.flatten() for p in m.parameters()])
    return (grads(model) - grads(one_rank)).abs().max().item(), (
        grads(model) - grads(whole)
    ).abs().max().item()


def test_duplicated_rows_waste_a_rank():
    for vs_one_rank, vs_whole in run_ranks(_same_rows, 2, args=(4,)):
        assert vs_one_rank < TOL  # the average of two equal gradients is one of them
        assert (
            vs_whole > 1e-3
        )  # not the gradient of the 8 rows two ranks could have read
    assert check_shards([list(range(10)), list(range(10))], 10).read_twice == list(
        range(10)
    )


def test_check_shards_rejects_indices_outside_the_dataset():
    with pytest.raises(ValueError, match="outside range"):
        check_shards([[0, 5]], 5)


# ---- the global batch
# -------------------------------------------------------------------------


def test_global_batch_arithmetic():
    assert global_batch_size(16, 4, 8) == 512
    assert accumulation_steps_for(512, 16, 8) == 4
    with pytest.raises(ValueError, match="use a global batch of 384 or 512"):
        accumulation_steps_for(500, 16, 8)
    with pytest.raises(
        ValueError, match="use a global batch of 128$|use a global batch of 128,"
    ):
        accumulation_steps_for(100, 16, 8)
    with pytest.raises(ValueError, match="world_size must be a positive int"):
        global_batch_size(16, 4, 0)


def _accumulated(micro, accum):
    """micro x accum x world rows: each rank accumulates `accum` micro-batches.

    Then it averages over ranks.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    sizes = [3, 5, 2]
    rows = global_batch_size(micro, accum, n)
    x, y = make_batch(rows, sizes, torch.float64)
    model, whole = (
        mlp(sizes, seed=0, dtype=torch.float64),
        mlp(sizes, seed=0, dtype=torch.float64),
    )
    mine = range(
        rank * micro * accum, (rank + 1) * micro * accum
    )  # this rank's contiguous share
    for k in range(accum):
        idx = list(mine)[k * micro : (k + 1) * micro]
        (
            F.mse_loss(model(x[idx]), y[idx]) / accum
        ).backward()  # gradients add up over micro-batches
    average_gradients(model)
    F.mse_loss(whole(x), y).backward()
    return max(
        (p.grad - q.grad).abs().max().item()
        for p, q in zip(model.parameters(), whole.parameters())
    )


def test_micro_batch_times_accumulation_times_ranks_is_one_big_batch():
    assert max(run_ranks(_accumulated, 2, args=(3, 2))) < 1e-12


# -- chapter 2's "In practice", checked against the installed PyTorch
# -------------------------------------------------------------------


def test_the_dataloader_refuses_a_sampler_with_shuffle():
    sampler = DistributedSampler(range(8), num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        torch.utils.data.DataLoader(range(8), sampler=sampler, shuffle=True)


def test_ddp_syncs_buffers_every_forward_by_default_as_forward_sync_buffers():
    import inspect

    params = inspect.signature(DDP.__init__).parameters
    assert params["forward_sync_buffers"].default is None  # None means True
    assert "deprecated" in (DDP.__doc__ or "") and "forward_sync_buffers" in (
        DDP.__doc__ or ""
    )

    def buffers_synced():
        return DDP(nn.BatchNorm1d(3)).forward_sync_buffers

    assert run_ranks(buffers_synced, 2) == [True, True]


def test_sync_batchnorm_all_gathers_its_statistics_and_ddp_divides_by_the_world():
    import inspect

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.modules import _functions

    forward = inspect.getsource(_functions.SyncBatchNorm.forward)
    backward = inspect.getsource(_functions.SyncBatchNorm.backward)
    assert "all_gather" in forward and "all_reduce" not in forward
    assert "all_reduce" in backward
    # DDP's Python twin of its reducer: divide by the world size, then all-reduce
    fut = inspect.getsource(default_hooks._allreduce_fut)
    assert fut.index("div_(") < fut.index("all_reduce(")
