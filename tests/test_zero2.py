"""ZeRO-2 (ShardedGradOptimizer) on real gloo groups.

Equal to one process, with gradients sharded during backward.
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
    train_single,
)
from mylib.zero2 import ShardedGradOptimizer

TOL = CHECK_TOL  # float32, 10 steps of AdamW


def _train(config, caps_mb, micro_steps):
    """ZeRO-2 for each bucket cap.

    ``micro_steps`` backwards (gradient accumulation) per optimizer step.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    for cap in caps_mb:
        model = tiny_lm(config)
        opt = ShardedGradOptimizer(
            param_groups(model, config),
            config["optimizer"],
            bucket_cap_mb=cap,
            lr=config["lr"],
        )
        facts = []
        for tokens in token_batches(config):
            for micro in tokens.chunk(world)[rank].chunk(micro_steps):
                (lm_loss(model, micro) / micro_steps).backward()
                facts.append(
                    (
                        all(
                            p.grad is None for p in model.parameters()
                        ),  # no full gradient survives
                        opt.reduce_scatters_in_backward,
                    )
                )
            shard_numel = sum(b.grad_shard.numel() for b in opt.buckets)
            opt.step()
            opt.zero_grad()
        out[cap] = {
            "params": {n: p.detach().clone() for n, p in model.named_parameters()},
            "buckets": len(opt.buckets),
            "facts": facts,
            "shard_numel": shard_numel,
            "padded_numel": sum(b.numel for b in opt.buckets),
        }
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_equals_single_process_for_any_bucket_cap(world):
    """Tied and frozen parameters, bucketed three ways.

    One bucket per parameter, several buckets, one bucket.
    """
    reference = train_single(CHECK)
    caps = [0.0, CHECK["bucket_cap_mb"], 25.0]
    for result in run_ranks(_train, world, args=(CHECK, caps, 1), timeout_s=180):
        assert result[0.0]["buckets"] == sum(
            1 for p in tiny_lm(CHECK).parameters() if p.requires_grad
        )
        assert 1 < result[CHECK["bucket_cap_mb"]]["buckets"] < result[0.0]["buckets"]
        assert result[25.0]["buckets"] == 1
        for cap in caps:
            assert max_param_diff(result[cap]["params"], reference) < TOL, cap
            # Every bucket's reduce-scatter started from a gradient hook, during the
            # backward.
            assert all(
                freed and launched == result[cap]["buckets"]
                for freed, launched in result[cap]["facts"]
            )
            assert (
                result[cap]["shard_numel"] * world == result[cap]["padded_numel"]
            )  # 1/N of the gradients


def test_gradient_accumulation_equals_one_big_batch():
    """Two backwards per step add up in the shards.

    Each backward takes half of the rank's share, with the loss halved.
    """
    reference = train_single(CHECK)
    for result in run_ranks(
        _train, 2, args=(CHECK, [CHECK["bucket_cap_mb"]], 2), timeout_s=120
    ):
        assert max_param_diff(result[CHECK["bucket_cap_mb"]]["params"], reference) < TOL


def _bucket_names(config):
    model = tiny_lm(config)
    names = {p: name for name, p in model.named_parameters()}
    groups = param_groups(model, config)  # every matrix, then the rest
    given = ShardedGradOptimizer(groups, config["optimizer"], bucket_cap_mb=0.0)
    given.remove_hooks()
    ordered = ShardedGradOptimizer(
        param_groups(model, config),
        config["optimizer"],
        bucket_cap_mb=0.0,
        module=model,
    )
    with pytest.raises(ValueError, match="pass the model whose parameters"):
        ShardedGradOptimizer(groups, config["optimizer"], module=torch.nn.Linear(2, 2))
    return {
        key: [names[bucket.params[0]] for bucket in opt.buckets]
        for key, opt in (("given", given), ("module", ordered))
    }


def test_module_puts_buckets_in_backward_order_whatever_the_groups():
    """With ``module`` the buckets follow the model backwards, as DDP's do."""
    (buckets,) = run_ranks(_bucket_names, 1, args=(CHECK,))
    model = tiny_lm(CHECK)
    backward = [
        n for n, p in reversed(list(model.named_parameters())) if p.requires_grad
    ]
    assert buckets["module"] == backward  # one parameter a bucket
    assert buckets["given"] != backward  # the biases after every matrix


def test_bad_bucket_cap_names_the_fix():
    with pytest.raises(ValueError, match="one bucket per parameter"):
        ShardedGradOptimizer(
            [torch.nn.Parameter(torch.zeros(2))], torch.optim.Adam, bucket_cap_mb=-1
        )
