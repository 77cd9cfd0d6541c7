"""fp16 and bf16 compression hooks: PyTorch's results and half the bytes.

The rounding stays within what the format allows.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mylib import run_ranks
from mylib.comm_hooks import UNIT_ROUNDOFF, fp16_compress_hook, rounding_error_in_units
from mylib.experiments.compress_check import hooks_against_pytorch, through_each_hook


@pytest.mark.parametrize("name", ["fp16", "bf16"])
@pytest.mark.parametrize("world", [2, 4])
def test_matches_pytorch_hooks_with_half_the_bytes(name, world):
    out = run_ranks(hooks_against_pytorch, world, args=(name,))[0]
    # PyTorch's hook on MyDDP's bucket: the same casts and sums on the same buffer, bit
    # for bit.
    assert max(out["vs_torch_hook_on_myddp"]) == 0.0, out
    assert all(
        b * 2 == f for b, f in zip(out["bytes"], out["fp32_bytes"])
    )  # exactly half, every step
    # One rounding per summand and per addition of the ring: at most `world` units of
    # the format,
    # for MyDDP and for PyTorch's DDP (whose ring may add an element's shares in another
    # order).
    assert out["rounding_units"] <= world and out["ddp_rounding_units"] <= world, out
    assert max(out["vs_ddp"]) < 1e-4, (
        out
    )  # five SGD steps (lr 0.1) apart by those roundings only


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["fp16", "bf16"]),
    world=st.integers(2, 3),
    sizes=st.lists(st.integers(1, 40), min_size=2, max_size=4),
    cap=st.sampled_from([0.0, 0.001, 25.0]),
)
def test_rounding_stays_in_the_format(name, world, sizes, cap):
    out = run_ranks(
        hooks_against_pytorch,
        world,
        args=(name,),
        kwargs={"steps": 2, "sizes": tuple(sizes), "bucket_cap_mb": cap},
        show_output=False,
    )[0]
    assert out["rounding_units"] <= world and out["ddp_rounding_units"] <= world
    assert max(out["vs_torch_hook_on_myddp"]) == 0.0
    # Half, up to the byte counter's rounding: it floors 2 (n-1)/n x bytes once per
    # all-reduce (per bucket),
    # which matters for tiny buckets on 3 ranks. There are at most 2 (len(sizes) - 1)
    # buckets.
    assert all(
        abs(b * 2 - f) <= 2 * 2 * len(sizes)
        for b, f in zip(out["bytes"], out["fp32_bytes"])
    )


def test_fp16_range_versus_bf16_range():
    tiny = run_ranks(through_each_hook, 2, args=(1e-9,))[
        0
    ]  # average 1.5e-9: under fp16's smallest subnormal (6e-8)
    assert tiny["fp16"] == 0.0
    assert (
        abs(tiny["bf16"] - tiny["fp32"])
        <= UNIT_ROUNDOFF[torch.bfloat16] * 2 * tiny["fp32"]
    )
    huge = run_ranks(through_each_hook, 2, args=(1e5,))[
        0
    ]  # rank 1 sends 2e5 / 2 = 1e5: over fp16's largest, 65504
    assert huge["fp16"] == float("inf")
    assert (
        abs(huge["bf16"] - huge["fp32"])
        <= UNIT_ROUNDOFF[torch.bfloat16] * 2 * huge["fp32"]
    )


def test_rounding_units_measures_against_the_exact_average():
    g = [torch.tensor([1.0, -2.0]), torch.tensor([3.0, 2.0])]
    exact = torch.tensor([2.0, 0.0])
    assert rounding_error_in_units(exact, g, torch.bfloat16) == 0.0
    off = exact + torch.tensor(
        [0.0, 2.0 * UNIT_ROUNDOFF[torch.bfloat16]]
    )  # mean |g| of element 1 is 2
    assert rounding_error_in_units(off, g, torch.bfloat16) == pytest.approx(1.0)


def test_integer_bucket_names_the_problem():
    class IntBucket:
        def buffer(self):
            return torch.zeros(3, dtype=torch.int64)

    with pytest.raises(TypeError, match="floating-point gradients"):
        fp16_compress_hook(None, IntBucket())


# -- chapter 5's timeline model: the bytes each hook puts on the wire
# -----------------------


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 300), cols=st.integers(1, 300), rank=st.integers(1, 8))
def test_model_bytes_are_what_powersgd_sends(rows, cols, rank):
    from mylib.models.timeline_compress import wire_bytes
    from mylib.powersgd import PowerSGDState, compression_plan

    grad = torch.zeros(rows) if cols == 1 else torch.zeros(rows, cols)
    compress, plain = compression_plan([grad], PowerSGDState(None, rank))
    sent = sum(g.numel() for g in plain) + sum(
        (m.shape[0] + m.shape[1]) * r for m, r in compress
    )
    assert wire_bytes(rows, cols, "powersgd", rank) == 4 * sent
    assert (
        wire_bytes(rows, cols, "fp32")
        == 2 * wire_bytes(rows, cols, "bf16")
        == 4 * rows * cols
    )


def test_compression_figure():
    from mylib.figures.livefig import LiveFigure
    from mylib.figures.timeline_compress import (
        COMPRESSION_SLIDERS,
        compression_figure,
        compression_timelines,
    )
    from mylib.models.timeline_compress import wire_bytes

    fp32, bf16, low_rank = compression_timelines()
    assert low_rank.comm_s < bf16.comm_s < fp32.comm_s
    assert bf16.step_s <= fp32.step_s and low_rank.exposed_comm_s <= bf16.exposed_comm_s
    fig = LiveFigure(compression_figure, COMPRESSION_SLIDERS)
    assert (
        "models.timeline_compress" in fig.modules and "powersgd" not in fig.modules
    )  # no torch in the browser
    with pytest.raises(ValueError, match="scheme must be"):
        wire_bytes(2, 2, "int8")
