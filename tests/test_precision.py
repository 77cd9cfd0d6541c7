"""What PyTorch's mixed-precision setups keep and send: the model and a measurement.

``mylib.models.memory.RECIPES`` states the bytes per parameter of the ZeRO
paper's accounting, of DDP under autocast and of FSDP2 with a
``MixedPrecisionPolicy``; ``mylib.experiments.precision_check`` measures the
last two on gloo ranks. Chapter 6 prints both.
"""

import pytest

from mylib import run_ranks
from mylib.experiments.precision_check import SETUPS, precision_setups
from mylib.models.memory import (
    GB,
    RECIPES,
    fsdp_comm_per_step,
    fsdp_params_after_forward,
    memory_per_rank,
    traffic_ratio,
)


def test_bytes_per_parameter_kept():
    """16 in the paper; 20 under DDP with autocast (two fp32 gradient copies),
    16 with gradient_as_bucket_view=True; FSDP2 keeps 16 too, all sharded."""
    per_param = {name: r.memory(1.0, 1).total for name, r in RECIPES.items()}
    assert per_param["paper DDP"] == memory_per_rank(1.0, 1, 0).total == 16
    assert per_param["DDP + autocast"] == 20
    assert per_param["DDP + autocast, bucket view"] == 16
    assert per_param["FSDP2 bf16, reduce fp32"] == 16
    for n in (8, 64):
        fsdp = RECIPES["FSDP2 bf16, reduce fp32"].memory(1.0, n)
        assert fsdp.total == pytest.approx(16 / n)  # the paper's ZeRO-3 total
        assert (fsdp.params, fsdp.grads) == pytest.approx((4 / n, 4 / n))


@pytest.mark.parametrize("world", [None, 2, 8, 1024])
def test_zero3_moves_one_and_a_half_times_ddp_in_elements_not_always_in_bytes(world):
    assert traffic_ratio("paper ZeRO-3", "paper DDP", world) == pytest.approx(1.5)
    # bf16 gathers, fp32 reduce-scatter against DDP's fp32 all-reduce: the same
    fsdp = "FSDP2 bf16, reduce fp32"
    assert traffic_ratio(fsdp, "DDP + autocast", world) == pytest.approx(1.0)
    # ... against DDP all-reducing bf16 (bf16_compress_hook): twice
    assert traffic_ratio(fsdp, "DDP + autocast, bf16 hook", world) == pytest.approx(2)
    assert traffic_ratio("FSDP2 bf16", "DDP + autocast", world) == pytest.approx(0.75)


def test_hsdp_sends_only_the_shard_across_nodes():
    """7.5B parameters on 4 nodes of 8: the inter-node all-reduce carries Psi/8."""
    psi = 7.5e9
    fsdp = fsdp_comm_per_step(psi, 32)
    hsdp = fsdp_comm_per_step(psi, 8, replicas=4)
    hpz = fsdp_comm_per_step(psi, 32, reshard_to=8)
    assert hsdp["all-reduce"] == (4, pytest.approx(2 * 3 / 4 * psi / 8 * 4))
    assert hsdp["all-reduce"][1] / GB == pytest.approx(5.625)
    across = sum(b for n, b in fsdp.values() if n > 8)
    assert across / GB == pytest.approx(31 / 32 * psi * (2 + 2 + 4) / GB)
    # 8 bytes a parameter over 32 ranks, against 2 x 3/4 x 4 bytes of a shard of 8
    assert across / hsdp["all-reduce"][1] == pytest.approx((31 / 32 * 8) / (3 / 4))
    # hpZ: the backward gathers inside the node, at 2 psi / 8 bytes more memory
    assert hpz["backward all-gather"][0] == 8
    assert sum(b for n, b in hpz.values() if n > 8) == pytest.approx(
        across - fsdp["backward all-gather"][1]
    )
    assert fsdp_params_after_forward(psi, 32, 8) / GB == pytest.approx(1.875)
    assert fsdp_params_after_forward(psi, 32) == 0
    assert fsdp_params_after_forward(psi, 32, 1) == 2 * psi  # False: all whole
    with pytest.raises(ValueError, match="divide"):
        fsdp_comm_per_step(psi, 32, reshard_to=3)


@pytest.fixture(scope="module", params=[2, 4], ids=["N=2", "N=4"])
def measured(request):
    world = request.param
    return world, run_ranks(precision_setups, world, timeout_s=300)


def test_measured_dtypes_bytes_kept_and_sent_match_the_recipes(measured):
    world, ranks = measured
    for facts in ranks:
        for setup in SETUPS:
            f, recipe = facts[setup], RECIPES[setup]
            assert f["param_dtypes"] == f["grad_dtypes"] == ["torch.float32"]
            model = recipe.memory(f["psi"], world)
            for kind in ("params", "grads", "optimizer"):
                # Adam's step counters: a few bytes per tensor
                assert f["held"][kind] == pytest.approx(
                    getattr(model, kind), rel=1e-3
                ), (setup, kind)
            sent = f["sent"]
            if setup.startswith("DDP"):
                assert set(sent) == {("all_reduce", "float32")}
                assert sent["all_reduce", "float32"] == pytest.approx(
                    recipe.comm(f["psi"], world)["all_reduce"]
                )
            else:
                assert set(sent) == {
                    ("all_gather", "bfloat16"),
                    ("reduce_scatter", "float32"),
                }
                comm = recipe.comm(f["psi"], world)
                assert sent["reduce_scatter", "float32"] == comm["reduce_scatter"]
                # the root unit is not gathered again for the backward
                root = (world - 1) / world * f["root_params"] * 2
                assert sent["all_gather", "bfloat16"] == comm["all_gather"] - root
