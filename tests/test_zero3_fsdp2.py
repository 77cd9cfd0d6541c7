"""ShardedModel with FSDP2's two options, against fully_shard itself (torch 2.13, gloo).

``mp_policy`` (a MixedPrecisionPolicy) and ``ignored_params``, as
``torch.distributed.fsdp.fully_shard`` takes them, on chapter 6's check model
(tied embedding and head, a frozen layer, two blocks; 10 steps of AdamW).

The tolerance. Both run the same operations on the same values in the same
dtypes; what differs is the layout of a unit's gradient in the reduce-scatter
(ShardedModel: one flat buffer cut in N; FSDP2: every tensor cut along its
first dimension), and gloo's ring adds each element's N contributions in an
order that depends on its position. On 2 ranks that order cannot matter (a + b
is b + a, bit for bit), so the two must agree exactly, under every policy. On
4 ranks fp32 sums, and fp32 sums of bf16 gradients, differ in the last bits of
float32 at most, which 10 AdamW steps keep below CHECK_TOL (1e-5, the fp32
check of tests/test_zero3.py); bf16 sums (reduce_dtype bf16) differ by whole bf16
roundings, which Adam, dividing by the root of a tiny second moment, can turn
into steps of the learning rate. There the parameters are not compared; the
first averaged gradient is, against a bound from the rounding itself
(:func:`test_bf16_reductions_agree_within_their_rounding`).
"""

import pytest
import torch
import torch.distributed as dist

from mylib import run_ranks
from mylib.experiments.common import max_param_diff
from mylib.experiments.fsdp2_check import (
    POLICIES,
    block_norms,
    local_gradients,
    train_both_ways,
)
from mylib.experiments.zero_check import (
    CHECK,
    CHECK_TOL,
    num_trainable,
    tiny_lm,
    train_single,
)

TOL = CHECK_TOL  # float32 rounding after 10 AdamW steps: see the docstring


@pytest.fixture(scope="module", params=[2, 4], ids=["N=2", "N=4"])
def both(request):
    world = request.param
    results = run_ranks(train_both_ways, world, timeout_s=600)
    return world, results


@pytest.mark.parametrize("policy", list(POLICIES))
def test_same_parameters_as_fully_shard_with_the_same_policy(both, policy):
    world, results = both
    for out in results:
        mine, theirs = out["ShardedModel", policy], out["fully_shard", policy]
        gap = max_param_diff(mine["params"], theirs["params"])
        if world == 2:
            assert gap == 0, (policy, gap)  # two-term sums: no order to differ in
        elif policy != "bf16":
            assert gap < TOL, (policy, gap)
        # fp32 master shards, fp32 gradients on the shard, whatever the policy
        for way in (mine, theirs):
            assert way["param_dtypes"] == way["grad_dtypes"] == ["torch.float32"]


def test_bf16_reductions_agree_within_their_rounding(both):
    """The first averaged gradient, reduced in bf16 on N ranks, both ways.

    Each rank's bf16 gradient g_r is divided by N (a power of two here: exact)
    and the N terms summed in bf16 in some order: N - 1 additions, each
    rounded to bf16's 8 significant bits, a relative error of at most
    u = 2^-8 of a partial sum, and a partial sum is at most
    S = sum_r |g_r| / N. So each way lies within ((1 + u)^(N-1) - 1) S of the
    exact mean, element by element, and the two ways within twice that.
    S and the exact mean come from the ranks' own gradients
    (fsdp2_check.local_gradients, float64); that they are the gradients both
    ways summed is checked on the fp32 reduction of the same bf16 gradients,
    which must match the exact mean to float32 rounding (u = 2^-24).
    """
    world, results = both
    local = run_ranks(local_gradients, world)[0]
    bf16, fp32 = 2.0**-8, 2.0**-24
    for out in results:
        for policy, u in (("bf16, reduce fp32", fp32), ("bf16", bf16)):
            mine = out["ShardedModel", policy]["first_grads"]
            theirs = out["fully_shard", policy]["first_grads"]
            assert sorted(mine) == sorted(theirs) == sorted(local)
            bound = (1 + u) ** (world - 1) - 1
            for name, (scale, mean) in local.items():
                for grads in (mine, theirs):
                    off = (grads[name].double() - mean).abs()
                    assert (off <= bound * scale).all(), (policy, name)
                gap = (mine[name].double() - theirs[name].double()).abs()
                assert (gap <= 2 * bound * scale).all(), (policy, name)
                if world == 2:  # one addition: a + b is b + a, bit for bit
                    assert torch.equal(mine[name], theirs[name]), (policy, name)


def test_the_gathers_halve_in_bf16_the_reduce_scatter_in_reduce_dtype(both):
    world, results = both
    model = tiny_lm(CHECK)
    root = num_trainable(model) - num_trainable(model.blocks)
    root += sum(p.numel() for p in model.proj.parameters())  # frozen, gathered too
    for out in results:
        sent = {key: out[key]["sent"] for key in out}
        for way in ("ShardedModel", "fully_shard"):
            fp32 = sent[way, "fp32"]
            mixed, bf16 = sent[way, "bf16, reduce fp32"], sent[way, "bf16"]
            gather = fp32["all_gather", "float32"]
            assert mixed["all_gather", "bfloat16"] == bf16["all_gather", "bfloat16"]
            assert 2 * mixed["all_gather", "bfloat16"] == gather
            scatter = fp32["reduce_scatter", "float32"]
            assert mixed["reduce_scatter", "float32"] == scatter  # reduce_dtype fp32
            assert 2 * bf16["reduce_scatter", "bfloat16"] == scatter
        for policy in POLICIES:
            mine, theirs = sent["ShardedModel", policy], sent["fully_shard", policy]
            assert {op for op, _ in mine} == {op for op, _ in theirs}
            for (op, dtype), nbytes in mine.items():
                if op == "reduce_scatter":
                    assert nbytes == theirs[op, dtype]
                else:  # FSDP2 keeps the root unit whole after the forward: it
                    # gathers it once (reshard_after_forward=None is False there)
                    size = 2 if dtype == "bfloat16" else 4
                    once = (world - 1) * root * size // world
                    assert nbytes - theirs[op, dtype] == once, (policy, op)


@pytest.fixture(scope="module", params=[2, 4], ids=["N=2", "N=4"])
def ignoring(request):
    world = request.param
    policies = ("fp32", "bf16, reduce fp32")
    kwargs = {"policy_names": policies, "ignore_norms": True}
    return world, run_ranks(train_both_ways, world, kwargs=kwargs, timeout_s=600)


def test_ignored_parameters_are_left_whole_and_unreduced_as_by_fully_shard(ignoring):
    world, results = ignoring
    reference = train_single(CHECK)
    model = tiny_lm(CHECK)
    names = {p: name for name, p in model.named_parameters()}
    norms = sorted(names[p] for p in block_norms(model))
    for out in results:
        for policy in ("fp32", "bf16, reduce fp32"):
            mine, theirs = out["ShardedModel", policy], out["fully_shard", policy]
            # whole (not sharded), this rank's own gradients (not reduced), in both
            assert sorted(mine["ignored_grads"]) == sorted(theirs["ignored_grads"])
            assert sorted(mine["ignored_grads"]) == norms
            for name, grad in mine["ignored_grads"].items():
                assert grad.shape == (CHECK["dim"],)
                assert torch.equal(grad, theirs["ignored_grads"][name]), name
            gap = max_param_diff(mine["params"], theirs["params"])
            assert (gap == 0) if world == 2 else (gap < TOL), (policy, gap)
        # the user averaged them (fsdp2_check.average_ignored_gradients): the
        # whole-batch training of one process
        assert max_param_diff(out["ShardedModel", "fp32"]["params"], reference) < TOL
    # unreduced indeed: each rank's gradient is its own share's
    first, second = (r["ShardedModel", "fp32"]["ignored_grads"] for r in results[:2])
    assert not any(torch.equal(first[name], second[name]) for name in norms)


def _with_torchs_policy():
    from torch.distributed.fsdp import MixedPrecisionPolicy as TorchPolicy

    from mylib.experiments.zero_check import lm_loss, token_batches
    from mylib.zero3 import MixedPrecisionPolicy, ShardedModel

    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for policy in (MixedPrecisionPolicy, TorchPolicy):
        model = tiny_lm(CHECK)
        sharded = ShardedModel(
            model,
            unit_modules=list(model.blocks),
            mp_policy=policy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32),
        )
        lm_loss(sharded, token_batches(CHECK)[0].chunk(world)[rank]).backward()
        out.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    return out


def test_pytorchs_own_policy_object_works_too():
    for mine, torchs in run_ranks(_with_torchs_policy, 2):
        assert len(mine) == len(torchs) > 0
        assert all(torch.equal(a, b) for a, b in zip(mine, torchs))
        assert {g.dtype for g in mine} == {torch.float32}


def _output_dtype_both_ways():
    from torch.distributed.fsdp import MixedPrecisionPolicy as TorchPolicy
    from torch.distributed.fsdp import fully_shard

    from mylib.experiments.zero_check import full_parameters, lm_loss, token_batches
    from mylib.zero3 import MixedPrecisionPolicy, ShardedModel

    rank, world = dist.get_rank(), dist.get_world_size()
    policy = {"param_dtype": torch.bfloat16, "output_dtype": torch.float32}
    tokens = token_batches(CHECK)[0].chunk(world)[rank]
    out = {}
    for way in ("ShardedModel", "fully_shard"):
        model = tiny_lm(CHECK)  # one unit, the root: only its output is cast
        if way == "ShardedModel":
            wrapped = ShardedModel(model, mp_policy=MixedPrecisionPolicy(**policy))
        else:
            wrapped = fully_shard(model, mp_policy=TorchPolicy(**policy))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with torch.no_grad():
            dtype = wrapped(tokens[:, :-1]).dtype
        lm_loss(wrapped, tokens).backward()
        opt.step()
        setup = "zero3" if way == "ShardedModel" else "torch-fsdp"
        out[way] = dtype, full_parameters(setup, model, wrapped)
    return out


def test_output_dtype_casts_the_units_output_as_fully_shard():
    for out in run_ranks(_output_dtype_both_ways, 2, timeout_s=300):
        (mine_dtype, mine), (theirs_dtype, theirs) = out.values()
        assert mine_dtype == theirs_dtype == torch.float32
        assert max_param_diff(mine, theirs) == 0  # 2 ranks: see the docstring
