"""ZeRO-1 (ShardedOptimizer) on real gloo groups.

Equal to one process and to PyTorch's ZeroRedundancyOptimizer.
"""

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from mylib import run_ranks
from mylib.experiments.common import max_param_diff
from mylib.experiments.zero_check import (
    CHECK,
    CHECK_TOL,
    lm_loss,
    param_groups,
    tiny_lm,
    token_batches,
    train_setups,
    train_single,
    train_single_model,
)
from mylib.zero1 import FlatParams, ShardedOptimizer

TOL = CHECK_TOL  # float32, 10 steps of AdamW


@pytest.mark.parametrize("world", [2, 4])
def test_equals_single_process_and_pytorch_zero(world):
    """Tied and frozen parameters, two parameter groups, 10 steps of AdamW."""
    reference = train_single(CHECK)
    results = run_ranks(
        train_setups,
        world,
        args=(["zero1", "zero1-ddp", "torch-zero1"], CHECK),
        timeout_s=180,
    )
    for rank_result in results:
        for setup in ("zero1", "zero1-ddp", "torch-zero1"):
            assert max_param_diff(rank_result[setup]["params"], reference) < TOL, setup
        assert (
            max_param_diff(
                rank_result["zero1"]["params"], rank_result["torch-zero1"]["params"]
            )
            < TOL
        )
        assert (
            max_param_diff(
                rank_result["zero1"]["params"], results[0]["zero1"]["params"]
            )
            == 0
        )  # ranks agree exactly
    psi = results[0]["zero1"]["psi"]
    for r in (
        results
    ):  # each rank holds Adam's two float32 moments for 1/N of the parameters
        assert r["zero1"]["held"]["optimizer"] == pytest.approx(
            8 * psi / world, rel=0.01
        )
    # Reduce-scatter + all-gather (2 psi) against all-reduce + all-gather (3 psi) behind
    # DDP.
    paper, behind_ddp = (
        results[0]["zero1"]["bytes_by_op"],
        results[0]["zero1-ddp"]["bytes_by_op"],
    )
    assert set(paper) == {"reduce_scatter", "all_gather"} and set(behind_ddp) == {
        "all_reduce",
        "all_gather",
    }
    assert sum(behind_ddp.values()) / sum(paper.values()) == pytest.approx(
        1.5, rel=0.02
    )


def _state_dict_round_trip(config):
    rank, world = dist.get_rank(), dist.get_world_size()

    def train(model, opt, batches):
        for tokens in batches:
            lm_loss(model, tokens.chunk(world)[rank]).backward()
            opt.step()
            opt.zero_grad()

    def sharded(model):
        return ShardedOptimizer(
            param_groups(model, config),
            config["optimizer"],
            average_gradients=True,
            lr=config["lr"],
        )

    model = tiny_lm(config)
    opt = sharded(model)
    train(model, opt, token_batches(config))
    with pytest.raises(RuntimeError, match="consolidate_state_dict"):
        opt.state_dict()
    opt.consolidate_state_dict(to=0)
    box = [opt.state_dict() if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    # Resume from the checkpoint in a fresh model and optimizer; it must continue
    # exactly as the original.
    resumed = tiny_lm(config)
    resumed.load_state_dict(model.state_dict())
    resumed_opt = sharded(resumed)
    resumed_opt.load_state_dict(box[0])
    more = token_batches({**config, "seed": config["seed"] + 7, "steps": 3})
    train(model, opt, more)
    train(resumed, resumed_opt, more)
    after = {n: p.detach().clone() for n, p in model.named_parameters()}
    return box[0], max_param_diff(
        after, {n: p.detach().clone() for n, p in resumed.named_parameters()}
    )


def test_consolidated_state_dict_is_the_unsharded_optimizers_and_resumes_exactly():
    config = dict(
        CHECK, batch=12
    )  # 3 ranks, 4 sequences each: equal shares (and shards that need padding)
    _, opt = train_single_model(config)
    want = opt.state_dict()
    (got, resume_diff), *others = run_ranks(
        _state_dict_round_trip, 3, args=(config,), timeout_s=180
    )
    assert resume_diff == 0 and all(d == 0 for _, d in others)
    assert got["param_groups"] == want["param_groups"]
    assert sorted(got["state"]) == sorted(
        want["state"]
    )  # frozen parameters have no state, as unsharded
    for i, state in want["state"].items():
        assert set(got["state"][i]) == set(state)
        assert float(got["state"][i]["step"]) == float(state["step"])
        for key in ("exp_avg", "exp_avg_sq"):
            assert got["state"][i][key].shape == state[key].shape
            assert (got["state"][i][key] - state[key]).abs().max().item() < TOL


def _sgd_with_scheduler(config, sharded):
    rank, world = (dist.get_rank(), dist.get_world_size()) if sharded else (0, 1)
    model = tiny_lm(config)
    groups = param_groups(model, config)
    opt = (
        ShardedOptimizer(
            groups, torch.optim.SGD, average_gradients=True, lr=0.1, momentum=0.9
        )
        if sharded
        else torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    )
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    for tokens in token_batches(config):
        lm_loss(model, tokens.chunk(world)[rank]).backward()
        opt.step()
        opt.zero_grad()
        assert all(p.grad is None for p in model.parameters())
        schedule.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_any_elementwise_optimizer_and_an_lr_scheduler():
    """SGD with momentum, and StepLR editing the outer groups' lr.

    The lr must reach the shards' optimizer.
    """
    reference = _sgd_with_scheduler(CHECK, sharded=False)
    for params in run_ranks(_sgd_with_scheduler, 2, args=(CHECK, True), timeout_s=120):
        assert max_param_diff(params, reference) < TOL


@given(
    numels=st.lists(st.integers(1, 50), min_size=1, max_size=8), world=st.integers(1, 8)
)
def test_shards_cover_every_parameter_exactly_once(numels, world):
    params = [torch.zeros(n) for n in numels]
    covered = [[0] * n for n in numels]
    for rank in range(world):
        layout = FlatParams(params, world, rank)
        assert (
            layout.numel % world == 0 and layout.numel - sum(numels) < world
        )  # padding: less than one per rank
        for i, start, end in layout.pieces():
            assert layout.shard_start <= start < end <= layout.shard_end
            for j in range(start - layout.offsets[i], end - layout.offsets[i]):
                covered[i][j] += 1
    assert all(c == 1 for counts in covered for c in counts)


def test_shard_slices_are_what_a_reduce_scatter_of_shard_slices_sends():
    """Slices of every shard, back to back, read from the flat layout."""
    g = torch.Generator().manual_seed(0)
    for world in (1, 2, 3, 4):
        numels = torch.randint(1, 9, (5,), generator=g).tolist()
        tensors = [torch.randn(n, generator=g) for n in numels]
        tensors[2] = None  # no gradient: zeros
        layout = FlatParams([torch.zeros(n) for n in numels], world, 0)
        flat = layout.flatten(tensors)
        shards = flat.view(world, layout.shard_numel)
        for start in range(layout.shard_numel):
            for end in range(start + 1, layout.shard_numel + 1):
                want = shards[:, start:end].reshape(-1)
                assert torch.equal(layout.shard_slices(tensors, start, end), want)


def test_bad_input_names_the_fix():
    params = [torch.nn.Parameter(torch.zeros(3))]
    with pytest.raises(TypeError, match="the class, not an instance"):
        ShardedOptimizer(params, torch.optim.Adam(params))
    with pytest.raises(ValueError, match="the most MB one reduce-scatter sends"):
        ShardedOptimizer(params, torch.optim.Adam, reduce_scatter_mb=0)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            ShardedOptimizer(params, torch.optim.Adam, lr=1e-3)
