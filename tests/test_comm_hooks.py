"""fp16 and bf16 compression hooks: PyTorch's results and half the bytes.

The rounding stays within what the format allows.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mylib import run_ranks
from mylib.comm_hooks import (
    UNIT_ROUNDOFF,
    fp16_compress_hook,
    rounding_bound_in_units,
    rounding_error_in_units,
)
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
    # One rounding per rank's whole gradient and per addition of the ring: at most
    # `world` units on 2 and 4 ranks, for MyDDP and for PyTorch's DDP (whose ring may
    # add an element's shares in another order).
    bound = rounding_bound_in_units(world)
    assert bound == world
    assert out["rounding_units"] <= bound and out["ddp_rounding_units"] <= bound, out
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
    bound = rounding_bound_in_units(world)  # 3 ranks: the division rounds too
    assert out["rounding_units"] <= bound and out["ddp_rounding_units"] <= bound
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


def _hook_in_one_process(grads, dtype):
    """What a 16-bit hook and a ring make of ``grads``, one element at a time.

    Cast each rank's gradient, divide it by n in the format, then add the shares
    one by one, rounding every partial sum to the format (as gloo's ring does for
    an element that starts on rank 0).
    """
    n = len(grads)
    shares = [g.to(dtype).div_(n) for g in grads]
    total = shares[0]
    for share in shares[1:]:
        total = (total.float() + share.float()).to(dtype)
    return total.float()


@settings(max_examples=30, deadline=None)
@given(
    n=st.integers(2, 8),
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**16),
    spread=st.sampled_from([0.0, 1.0, 3.0]),
)
def test_rounding_bound_holds_in_units_of_a_ranks_whole_gradient(
    n, dtype, seed, spread
):
    g = torch.Generator().manual_seed(seed)
    # ranks' gradients of different sizes (up to e^spread apart), in fp16's range
    grads = [
        torch.randn(4096, generator=g)
        * float(torch.empty(1).uniform_(0, spread, generator=g).exp())
        for _ in range(n)
    ]
    units = rounding_error_in_units(_hook_in_one_process(grads, dtype), grads, dtype)
    u = UNIT_ROUNDOFF[dtype]
    assert units <= rounding_bound_in_units(n) * (1 + 2 * n * u)  # + second order


def test_a_shares_size_is_not_the_unit():
    # In units of a *share* (g_r / n), the same errors are n times larger: they
    # pass n units, the bound the chapter once stated in those units.
    g = torch.Generator().manual_seed(0)
    n, dtype = 4, torch.bfloat16
    grads = [torch.randn(4096, generator=g) for _ in range(n)]
    units = rounding_error_in_units(_hook_in_one_process(grads, dtype), grads, dtype)
    assert 1 < units <= n  # so n * units, in units of a share, is more than n


def test_rounding_bound_in_units():
    assert [rounding_bound_in_units(n) for n in range(1, 9)] == [1, 2, 4, 4, 6, 7, 8, 8]
    with pytest.raises(ValueError, match="positive"):
        rounding_bound_in_units(0)


def test_pytorch_ddp_takes_the_bf16_hook_by_the_build_not_the_gpu():
    """DDP refuses ``bf16_compress_hook`` by name unless the build has CUDA or ROCm
    with NCCL >= 2.10 (or XPU with XCCL): a GPU need not be there."""
    from mylib.experiments.powersgd_costs import bf16_hook_accepted

    if torch.version.cuda is None and torch.version.hip is None:  # this book's build
        for accepted, refusal, _ in run_ranks(bf16_hook_accepted, 2):
            assert not accepted and "NCCL 2.10" in refusal, refusal
    for accepted, refusal, gpu in run_ranks(
        bf16_hook_accepted, 2, kwargs={"as_cuda_build": True}
    ):
        assert accepted and refusal is None
        assert gpu == torch.cuda.is_available()


def test_ddp_buckets_one_at_first_then_a_first_bucket_of_1_mib():
    """The glossary's bucket entry: 25 MiB cap, first bucket 1 MiB after the rebuild."""
    import torch.distributed as dist

    from mylib.experiments.compress_check import ddp_bucket_bytes

    mib, layer = 2**20, (512 * 512 + 512) * 4  # a Linear(512, 512): 1 MiB + 2 KiB
    assert dist._DEFAULT_FIRST_BUCKET_BYTES == mib
    steps = run_ranks(ddp_bucket_bytes, 2)[0]
    assert steps[0] == [8 * layer]  # the first step: everything in one bucket
    assert steps[1] == steps[2] == [layer, 7 * layer]  # rebuilt: closes at >= 1 MiB
    # find_unused_parameters=True: cut at construction, in registration order, and
    # never rebuilt: the 1 MiB bucket holds the first layer's weight, whose gradient
    # comes last.
    steps = run_ranks(ddp_bucket_bytes, 2, kwargs={"find_unused_parameters": True})[0]
    assert steps == [[8 * layer - mib, mib]] * 3


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


def test_uncompressed_from_rank():
    from mylib.models.timeline_compress import uncompressed_from_rank, wire_bytes

    # chapter 5: a 1024 x 1024 matrix still compresses 8x at the slider's rank 64;
    # PyTorch's rule (rate 2) sends it whole only from rank 256 on
    assert wire_bytes(1024, 1024, "fp32") == 8 * wire_bytes(1024, 1024, "powersgd", 64)
    assert uncompressed_from_rank(1024, 1024) == 256
    assert uncompressed_from_rank(4096, 4096) == 1024  # exercise ex-5-bytes
    assert uncompressed_from_rank(1024, 1024, min_compression_rate=1.0) == 512
    assert uncompressed_from_rank(10, 1) == 1  # a vector always goes as it is


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 200), cols=st.integers(1, 200))
def test_below_that_rank_powersgd_compresses_and_from_it_not(rows, cols):
    from mylib.models.timeline_compress import uncompressed_from_rank, wire_bytes

    full = wire_bytes(rows, cols, "fp32")
    first = uncompressed_from_rank(rows, cols)
    for rank in range(1, min(rows, cols) + 1):
        sent = wire_bytes(rows, cols, "powersgd", rank)
        assert (sent == full) == (first is not None and rank >= first)
        assert sent <= full


def test_chapter_5_things_to_try():
    from mylib.figures.timeline_compress import compression_timelines

    fast = compression_timelines(bandwidth_gb_s=100.0)
    assert max(t.step_s for t in fast) < 1.02 * min(t.step_s for t in fast)
    fp32, bf16, low_rank = compression_timelines(bandwidth_gb_s=1.0)
    assert 0.45 < bf16.exposed_comm_s / fp32.exposed_comm_s < 0.55
    assert low_rank.exposed_comm_s < 0.01 * fp32.exposed_comm_s


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


# -- chapter 5's statements about PyTorch, checked against the installed version
# ------------------------------------------------------------------------------


def test_pytorch_hooks_cast_before_dividing_and_register_before_backward():
    import inspect

    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    assert "buffer.to(dtype).div_(world_size)" in inspect.getsource(
        default_hooks._compress_hook
    )
    doc = " ".join(
        torch.nn.parallel.DistributedDataParallel.register_comm_hook.__doc__.split()
    )
    assert (
        "can only be registered once and should be registered before calling backward"
        in doc
    )


def test_pytorch_powersgd_defaults_and_orthogonalisation():
    import inspect

    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    state = powerSGD_hook.PowerSGDState(None)
    assert state.start_powerSGD_iter == 1000 and state.min_compression_rate == 2
    with pytest.raises(ValueError, match="start_powerSGD_iter"):
        powerSGD_hook.PowerSGDState(None, start_powerSGD_iter=1)
    source = inspect.getsource(powerSGD_hook._orthogonalize)
    assert "rank <= 2" in source and "torch.linalg.qr" in source  # QR for r > 2


def test_ddp_lays_out_its_first_bucket_in_registration_order_then_rebuilds():
    # Why chapter 5's DDP row rounds differently in the first step only.
    from mylib.experiments.compress_check import bucket_layouts

    layouts = run_ranks(bucket_layouts, 2)[0]
    ddp, mine = layouts["DDP"], layouts["MyDDP"]
    assert ddp[0] == mine[0][::-1]
    assert ddp[1] == mine[1] == mine[0]
