"""Every ZeRO stage equals single-process training.

For varied shapes, world sizes and bucket caps.

In float64: tiny random models (a LayerNorm over two features, say) amplify
float32 rounding into visible differences for *any* data-parallel run, PyTorch's
DDP included; the float32 claim is checked on the chapter's model in
test_zero1/2/3.
"""

import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from mylib import run_ranks
from mylib.experiments.common import max_param_diff
from mylib.experiments.zero_check import (
    CHECK,
    train_setups,
    train_single,
)

TOL = 1e-9  # float64


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=st.integers(1, 4),
    vocab=st.integers(5, 40),
    dim=st.integers(2, 24),  # LayerNorm over 1 feature normalises pure rounding noise
    hidden=st.integers(1, 40),
    layers=st.integers(1, 3),
    cap_mb=st.sampled_from([0.0, 0.0005, 0.004, 25.0]),
    rs_mb=st.sampled_from([0.0001, 25.0]),  # ZeRO-1: 104 bytes a call, or one call
    frozen=st.booleans(),
    tied=st.booleans(),
)
@example(
    world=1,
    vocab=7,
    dim=3,
    hidden=5,
    layers=1,
    cap_mb=25.0,
    rs_mb=25.0,
    frozen=True,
    tied=True,
)  # one rank: no sharding
@example(
    world=3,
    vocab=5,
    dim=2,
    hidden=1,
    layers=2,
    cap_mb=0.0,
    rs_mb=0.0001,
    frozen=False,
    tied=True,
)  # shards of padding only
def test_all_stages_equal_single_process(
    world, vocab, dim, hidden, layers, cap_mb, rs_mb, frozen, tied
):
    config = dict(
        CHECK,
        vocab=vocab,
        dim=dim,
        hidden=hidden,
        layers=layers,
        bucket_cap_mb=cap_mb,
        reduce_scatter_mb=rs_mb,
        frozen=frozen,
        tied=tied,
        batch=2 * world,
        steps=4,
        dtype=torch.float64,
    )
    reference = train_single(config)
    setups = ["zero1", "zero2", "zero3-prefetch"]
    for result in run_ranks(
        train_setups, world, args=(setups, config), timeout_s=240, show_output=False
    ):
        for setup in setups:
            assert max_param_diff(result[setup]["params"], reference) < TOL, setup
