"""ZeRO-3 (ShardedModel) on real gloo groups.

Equal to one process and to PyTorch's FSDP; only shards survive.
"""

import pytest
import torch
import torch.distributed as dist

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
)
from mylib.zero3 import ShardedModel

TOL = CHECK_TOL  # float32, 10 steps of AdamW


@pytest.mark.parametrize("world", [2, 4])
def test_equals_single_process_and_pytorch_fsdp(world):
    """Tied and frozen parameters, two parameter groups, a unit per block.

    With and without prefetch.
    """
    reference = train_single(CHECK)
    setups = ["zero3", "zero3-prefetch", "torch-fsdp"]
    results = run_ranks(train_setups, world, args=(setups, CHECK), timeout_s=240)
    for result in results:
        for setup in setups:
            assert max_param_diff(result[setup]["params"], reference) < TOL, setup
        assert (
            max_param_diff(result["zero3"]["params"], result["torch-fsdp"]["params"])
            < TOL
        )
        assert (
            max_param_diff(
                result["zero3"]["params"], result["zero3-prefetch"]["params"]
            )
            == 0
        )  # same arithmetic
        # Same shards as FSDP: 1/N of the parameters, of the gradients and of Adam's
        # moments.
        ours, theirs = result["zero3"]["held"], result["torch-fsdp"]["held"]
        for key in ("params", "grads", "optimizer"):
            assert ours[key] == pytest.approx(theirs[key], rel=0.02), key


def _facts(config, prefetch, micro_steps=1):
    rank, world = dist.get_rank(), dist.get_world_size()
    model = tiny_lm(config)
    groups = param_groups(model, config)
    sharded = ShardedModel(model, unit_modules=list(model.blocks), prefetch=prefetch)
    opt = config["optimizer"](groups, lr=config["lr"])
    facts = {"freed": [], "grads_are_pieces": []}
    for tokens in token_batches(config):
        for micro in tokens.chunk(world)[rank].chunk(micro_steps):
            (lm_loss(sharded, micro) / micro_steps).backward()
            facts["freed"].append(
                sharded.gathered_bytes == 0
                and all(
                    flat.full.untyped_storage().nbytes() == 0 and flat.full.grad is None
                    for unit in sharded.units
                    for flat in unit.flats
                )
            )
            facts["grads_are_pieces"].append(
                all(
                    (p.grad is None)
                    if not p.requires_grad
                    else (p.grad.shape == p.shape and p.dim() == 1)
                    for p in model.parameters()
                )
            )
        opt.step()
        opt.zero_grad()
    facts["peak"] = sharded.peak_gathered_bytes
    facts["unit_bytes"] = [
        sum(flat.full_bytes for flat in unit.flats) for unit in sharded.units
    ]
    full = sharded.full_parameters()
    plain = tiny_lm(config)
    with torch.no_grad():
        for name, p in plain.named_parameters():
            p.copy_(full[name])
        tokens = token_batches(config)[0]
        facts["eval_diff"] = (sharded(tokens) - plain(tokens)).abs().max().item()
    facts["gathered_after_eval"] = sharded.gathered_bytes
    facts["params"] = full
    return facts


@pytest.mark.parametrize("prefetch", [False, True])
def test_only_shards_survive_and_at_most_one_or_two_units_are_whole(prefetch):
    reference = train_single(CHECK)
    for facts in run_ranks(_facts, 2, args=(CHECK, prefetch), timeout_s=120):
        assert all(facts["freed"]) and all(facts["grads_are_pieces"])
        root, *blocks = facts["unit_bytes"]
        # The root unit (embedding + head, tied) stays whole through forward and
        # backward; the blocks take turns.
        assert facts["peak"] == root + (2 if prefetch else 1) * max(blocks)
        assert (
            facts["eval_diff"] < 1e-6 and facts["gathered_after_eval"] == 0
        )  # no_grad forward: gather, free
        assert max_param_diff(facts["params"], reference) < TOL


def test_gradient_accumulation_adds_up_in_the_shards():
    reference = train_single(CHECK)
    for facts in run_ranks(_facts, 2, args=(CHECK, False, 2), timeout_s=120):
        assert max_param_diff(facts["params"], reference) < TOL


def _wrap_foreign_unit():
    ShardedModel(torch.nn.Linear(2, 2), unit_modules=[torch.nn.Linear(2, 2)])


def test_bad_input_names_the_fix():
    with pytest.raises(Exception, match="must be submodules"):
        run_ranks(_wrap_foreign_unit, 1, show_output=False)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            ShardedModel(torch.nn.Linear(2, 2))
