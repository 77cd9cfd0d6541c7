"""Chapter 7: the scaling model, its figure, stragglers, and local SGD.

Local SGD runs on real gloo groups.
"""

import math
import random
import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mylib import run_ranks
from mylib.figures.scaling import (
    SCALING_SLIDERS,
    parallelism_picture,
    scaling_figure,
    scaling_rows,
)
from mylib.local_sgd import LocalSGD, bytes_per_step
from mylib.models.buckets import MB, assign_buckets
from mylib.models.cluster import Cluster, dgx_h100, one_nic_nodes
from mylib.models.costmodel import ring_all_reduce_time
from mylib.models.scaling import (
    H100_NVLINK_BOTH_WAYS,
    H100_NVLINK_EACH_WAY,
    NIC_400G_EACH_WAY,
    STRONG,
    WEAK,
    bucket_bytes,
    bucketed_comm_s,
    comm_bound_ranks,
    compute_factor,
    expected_slowest_delay_s,
    harmonic_number,
    llama_like_layers,
    per_rank_layers,
    ring_limit_s,
    samples_to_target,
    scaled_step,
    scaling_table,
    steps_to_target,
    synchronous_step_s,
    transformer_like_layers,
)
from mylib.models.timeline import Layer, uniform_layers

# -- the worked numbers of the chapter ---------------------------------------


def test_worked_numbers_7b():
    grad_bytes = 7e9 * 2  # bf16
    # The often quoted "31 ms": 2 G / beta with beta = 900 GB/s, NVLink's total over
    # both directions. With n = 8 the ring's 2 (n-1)/n takes an eighth off (27.2 ms);
    # a ring's beta is one direction's rate, 450 GB/s: 54.4 ms, 62.2 ms as n grows.
    assert ring_limit_s(grad_bytes, H100_NVLINK_BOTH_WAYS) == pytest.approx(
        0.0311111, rel=1e-5
    )
    assert ring_all_reduce_time(
        grad_bytes, 8, 0.0, H100_NVLINK_BOTH_WAYS
    ) == pytest.approx(0.0272222, rel=1e-5)
    t8 = ring_all_reduce_time(grad_bytes, 8, 0.0, H100_NVLINK_EACH_WAY)
    assert t8 == pytest.approx(0.0544444, rel=1e-5)
    assert t8 / ring_limit_s(grad_bytes, H100_NVLINK_BOTH_WAYS) == pytest.approx(1.75)
    assert ring_limit_s(grad_bytes, H100_NVLINK_EACH_WAY) == pytest.approx(
        0.0622222, rel=1e-5
    )
    # 64 ranks on 50 GB/s: 0.551 s of ring traffic against 0.8 s of backward.
    assert NIC_400G_EACH_WAY == 50e9
    assert ring_all_reduce_time(grad_bytes, 64, 0.0, 50e9) == pytest.approx(
        0.55125, rel=1e-9
    )
    layers = transformer_like_layers(grad_bytes, 0.8 * 64)
    t = scaled_step(layers, 64, 0.0, 50e9, 25 * MB)
    assert t.backward_end_s == pytest.approx(0.8)
    assert t.comm_s == pytest.approx(0.55125, rel=1e-6)
    assert t.exposed_comm_s < 0.05  # hidden, but for the last block's buckets
    # Halve the backward (128 ranks, same global batch): no longer hidden.
    t128 = scaled_step(layers, 128, 0.0, 50e9, 25 * MB)
    assert t128.exposed_comm_s > 0.15


def test_nvlink_beta_is_half_the_quoted_total():
    assert H100_NVLINK_BOTH_WAYS == 900e9
    assert H100_NVLINK_EACH_WAY == 450e9  # 18 links of 25 GB/s each way
    # The ring's beta is one direction's: any ring over it takes twice the time the
    # both-ways total would give.
    for n in (2, 8, 64):
        assert ring_all_reduce_time(1e9, n, 0.0, H100_NVLINK_EACH_WAY) == pytest.approx(
            2 * ring_all_reduce_time(1e9, n, 0.0, H100_NVLINK_BOTH_WAYS)
        )


def test_the_7b_bucket_counts_each_explained():
    """224, 226, 535 and 560 buckets for "a 7B model": four ways of counting."""
    grad_bytes, cap = 7e9 * 2, 25 * MB
    assert MB == 1024 * 1024  # as DDP: bucket_cap_mb * 1024 * 1024
    # The chapter's 7B: 224 equal tensors of 62.5 MB, each above the cap, each alone.
    book = transformer_like_layers(grad_bytes, 1.0)
    sizes = [b for layer in book for b in layer.param_bytes]
    assert len(sizes) == 224 and min(sizes) > cap
    assert len(bucket_bytes(book, cap)) == 224
    # Llama 2 7B's shapes: every matrix alone (32 x 7, embedding, output layer);
    # the norms ride along with the next matrix.
    llama = llama_like_layers(1.0)
    sizes = [b for layer in llama for b in layer.param_bytes]
    assert sum(1 for b in sizes if b >= cap) == 32 * 7 + 2
    assert len(bucket_bytes(llama, cap)) == 226
    # Exercise 12 cuts the bytes into equal buckets, which DDP never does.
    assert math.ceil(grad_bytes / cap) == 535
    assert math.ceil(grad_bytes / 25e6) == 560  # the same with decimal megabytes


def test_llama_like_layers():
    layers = llama_like_layers(2.0)
    n_params = sum(sum(layer.param_bytes) for layer in layers) / 2
    assert n_params == 6_738_415_616  # Llama 2 7B
    assert sum(layer.backward_s for layer in layers) == pytest.approx(2.0)
    assert layers[0].name == "output" and layers[-1].name == "embedding"
    assert layers[-1].backward_s == 0.0  # a lookup
    assert [layer.name for layer in layers[1:3]] == ["block31", "block30"]
    # fp32, a smaller model: the bytes follow the shapes.
    small = llama_like_layers(
        1.0, hidden=8, intermediate=16, n_layers=2, vocab=10, bytes_per_number=4
    )
    assert sum(sum(layer.param_bytes) for layer in small) == 4 * (
        2 * 10 * 8 + 2 * (3 * 8 * 16 + 4 * 8 * 8 + 2 * 8) + 8
    )
    with pytest.raises(ValueError):
        llama_like_layers(1.0, n_layers=0)


# -- the model ---------------------------------------------------------------


def test_compute_factor():
    assert compute_factor(1) == 1.0
    assert compute_factor(4, STRONG) == 0.25
    assert compute_factor(4, WEAK) == 1.0
    assert compute_factor(4, STRONG, cores=2) == 0.5  # 4 ranks time-share 2 cores
    assert compute_factor(2, STRONG, cores=2) == 0.5
    with pytest.raises(ValueError, match="mode must be"):
        compute_factor(2, "both")
    with pytest.raises(ValueError, match="ranks must be"):
        compute_factor(0)


def test_one_rank_has_no_communication():
    layers = uniform_layers(6, 4 * MB, 0.01)
    t = scaled_step(layers, 1, 1e-5, 1e9, 25 * MB, forward_s=0.02, optimizer_s=0.005)
    assert t.comm_s == 0.0 and t.exposed_comm_s == 0.0
    assert t.step_s == pytest.approx(0.02 + 0.06 + 0.005)


def test_gradient_sizes_do_not_shrink():
    layers = uniform_layers(3, 1000, 0.3)
    scaled = per_rank_layers(layers, 4)
    assert [l.param_bytes for l in scaled] == [l.param_bytes for l in layers]
    assert [l.backward_s for l in scaled] == pytest.approx([0.075] * 3)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 512),
    k=st.integers(1, 20),
    tensor_mb=st.floats(0.01, 200),
    alpha_us=st.floats(0, 100),
    gbps=st.floats(0.1, 1000),
    cap_mb=st.sampled_from([0, 1, 25, 100]),
)
def test_bucketed_comm_closed_form(n, k, tensor_mb, alpha_us, gbps, cap_mb):
    """K buckets cost 2(n-1) K alpha + 2(n-1)/n G / beta.

    And the timeline's link is busy exactly that long.
    """
    layers = [Layer(f"l{i}", 0.001, [int(tensor_mb * MB)]) for i in range(k)]
    alpha, beta = alpha_us * 1e-6, gbps * 1e9
    sizes = bucket_bytes(layers, int(cap_mb * MB))
    assert len(sizes) == len(
        assign_buckets([int(tensor_mb * MB)] * k, int(cap_mb * MB))
    )
    total = sum(sizes)
    expected = 2 * (n - 1) * len(sizes) * alpha + 2 * (n - 1) / n * total / beta
    assert bucketed_comm_s(layers, n, alpha, beta, int(cap_mb * MB)) == pytest.approx(
        expected, rel=1e-9, abs=1e-15
    )
    t = scaled_step(layers, n, alpha, beta, int(cap_mb * MB))
    assert t.comm_s == pytest.approx(expected, rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(
    backward_s=st.floats(0.01, 100),
    grad_mb=st.floats(1, 5000),
    gbps=st.floats(1, 1000),
    alpha_us=st.floats(0, 50),
)
def test_comm_bound_ranks_is_the_first_crossing(backward_s, grad_mb, gbps, alpha_us):
    layers = transformer_like_layers(
        grad_mb * MB, backward_s, n_layers=4, tensors_per_layer=2
    )
    alpha, beta = alpha_us * 1e-6, gbps * 1e9
    n = comm_bound_ranks(layers, alpha, beta, 25 * MB, max_ranks=4096)
    if n is None:
        assert backward_s / 4096 >= bucketed_comm_s(layers, 4096, alpha, beta, 25 * MB)
        return
    assert backward_s / n < bucketed_comm_s(layers, n, alpha, beta, 25 * MB)
    if n > 2:
        assert backward_s / (n - 1) >= bucketed_comm_s(
            layers, n - 1, alpha, beta, 25 * MB
        )


def test_scaling_table_strong_and_weak():
    layers = transformer_like_layers(14e9, 51.2)
    rows = scaling_table(layers, [1, 2, 8, 64, 256], 5e-6, 50e9, forward_s=25.6)
    assert rows[0]["speedup"] == 1.0 and rows[0]["efficiency"] == 1.0
    for row in rows:
        assert row["efficiency"] <= 1.0 + 1e-12
        assert row["step_s"] >= row["compute_s"] - 1e-12
        assert row["step_s"] == pytest.approx(row["compute_s"] + row["exposed_comm_s"])
    effs = [r["efficiency"] for r in rows]
    assert effs == sorted(effs, reverse=True)  # more ranks, lower efficiency
    weak = scaling_table(layers, [1, 64], 5e-6, 50e9, mode=WEAK)
    assert weak[1]["speedup"] == pytest.approx(
        64 * weak[0]["step_s"] / weak[1]["step_s"]
    )
    with pytest.raises(ValueError, match="at least one rank count"):
        scaling_table(layers, [], 0, 1e9)


# -- the figure --------------------------------------------------------------


def test_scaling_figure_draws_the_model_numbers():
    svg = scaling_figure(ranks=64)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg == scaling_figure(ranks=64)  # deterministic: stored outputs stay current
    row = next(r for r in scaling_rows() if r["ranks"] == 64)
    summary = re.search(r'data-metric="summary"[^>]*>([^<]*)<', svg).group(1)
    assert f"efficiency {row['efficiency']:.0%}" in summary
    layers = transformer_like_layers(14e9, 1024 * 0.05)
    dgx = Cluster("dgx", 1, 8, 360e9, 8, 50e9, 5e-6, 5e-6)
    bound = comm_bound_ranks(layers, None, None, 25 * MB, max_ranks=1024, cluster=dgx)
    assert f"Communication-bound from {bound} ranks" in svg
    assert "8 nodes of 8 GPUs, bus bandwidth β = 400 GB/s" in svg
    assert scaling_figure(ranks=8) != svg
    with pytest.raises(ValueError):
        scaling_figure(ranks=0)


def test_scaling_figure_remembers_only_what_a_move_leaves_unchanged():
    """A redraw reuses the model of unchanged sliders, and draws the same picture.

    Moving ``ranks`` (it only marks a rank count) replays no step; moving any
    other slider replays the model. Each drawing equals one drawn afresh.
    """
    import mylib.figures.scaling as fs

    moves = [
        {"ranks": 64},
        {"ranks": 128},
        {"ranks": 128, "grad_gb": 20.0},
        {"ranks": 8, "alpha_us": 0.0, "bucket_cap_mb": 400},
        {"ranks": 64},
    ]
    remembered = [scaling_figure(**move) for move in moves]
    for move, svg in zip(moves, remembered):
        fs._model.cache_clear()
        fs._weak_curve.cache_clear()
        assert scaling_figure(**move) == svg
    hits = fs._model.cache_info().hits
    scaling_figure(ranks=2)
    assert fs._model.cache_info().hits == hits + 1
    layers, forward_s = fs._layers(16, 50.0, 14.0)
    cluster, cap = link = fs._link(8, 8, 50, 360, 5.0, 25)
    one, many = (
        scaled_step(
            layers, n, None, None, cap, mode=WEAK, forward_s=forward_s, cluster=cluster
        ).step_s
        for n in (1, 64)
    )
    assert fs.weak_efficiency(16, 64, 50.0, 14.0, link) == one / many


def test_scaling_figure_runs_in_the_browser():
    """The render function imports only the standard library.

    Or mylib modules that themselves import only the standard library.
    """
    browser = pytest.importorskip("mylib.figures.browser")
    modules = browser.module_closure("mylib.figures.scaling")
    assert {
        "figures.scaling",
        "models.scaling",
        "models.timeline",
        "figures.svg",
        "models.costmodel",
        "models.buckets",
    } <= set(modules)


def test_network_sliders_are_each_way_and_default_to_dgx_h100():
    by = {s["name"]: s for s in SCALING_SLIDERS}
    nvlink = [value for _, value in by["nvlink_gb_s"]["options"]]
    assert dgx_h100().nvlink_bw / 1e9 in nvlink and 900 not in nvlink
    assert "each way" in by["nvlink_gb_s"]["label"]
    assert "each way" in by["nic_gb_s"]["label"]
    default = {name: spec["default"] for name, spec in by.items()}
    assert default["nvlink_gb_s"] * 1e9 == dgx_h100().nvlink_bw
    assert default["nic_gb_s"] * 1e9 == dgx_h100().nic_bw
    assert default["gpus_per_node"] == default["nics_per_node"] == 8


def test_nodes_of_one_gpu_are_the_flat_link():
    """One GPU and one NIC per node: the figure's rows are chapter 1's flat ring."""
    rows = scaling_rows(gpus_per_node=1, nics_per_node=1, nic_gb_s=50)
    layers = transformer_like_layers(14e9, 1024 * 0.05)
    flat = scaling_table(
        layers, [r["ranks"] for r in rows], 5e-6, 50e9, 25 * MB, forward_s=25.6
    )
    for got, want in zip(rows, flat):
        assert got["step_s"] == pytest.approx(want["step_s"], rel=1e-12)
        assert got["comm_s"] == pytest.approx(want["comm_s"], rel=1e-12)


def test_scaled_step_takes_a_flat_link_or_a_cluster():
    layers = transformer_like_layers(14e9, 0.8 * 64)
    dgx = scaled_step(layers, 64, None, None, 25 * MB, cluster=dgx_h100())
    one_nic = scaled_step(layers, 64, None, None, 25 * MB, cluster=one_nic_nodes())
    assert dgx.comm_s < one_nic.comm_s
    with pytest.raises(ValueError, match="not both"):
        scaled_step(layers, 64, 5e-6, 50e9, cluster=dgx_h100())
    with pytest.raises(ValueError, match="or cluster="):
        scaled_step(layers, 64, None, None)


def test_parallelism_picture():
    svg = parallelism_picture()
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg == parallelism_picture()  # deterministic: the stored output stays
    for text in (
        "Data parallel",
        "Tensor parallel",
        "Pipeline parallel",
        "tensor parallel inside a node, data parallel across nodes",
        "NVLink, 450 GB/s each way",
        "Network, 50 GB/s each way per GPU",
        "only its 1/4 of them",
    ):
        assert text in svg, text
    assert "only its 1/8 of them" in parallelism_picture(ranks=8, n_layers=8)
    with pytest.raises(ValueError):
        parallelism_picture(ranks=4, n_layers=2)


def test_parallelism_picture_runs_in_the_browser():
    browser = pytest.importorskip("mylib.figures.browser")
    assert {"figures.scaling", "models.scaling", "figures.svg"} <= set(
        browser.module_closure("mylib.figures.scaling")
    )


# -- the critical batch size -------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    batch=st.floats(1e-3, 1e6),
    critical=st.floats(1e-3, 1e6),
)
def test_critical_batch_model(batch, critical):
    """McCandlish et al.: (S/S_min - 1)(E/E_min - 1) = 1, E = B S.

    With B_crit = E_min / S_min.
    """
    s, e = steps_to_target(batch, critical), samples_to_target(batch, critical)
    assert (s - 1) * (e - 1) == pytest.approx(1.0, rel=1e-6)
    # E = B S, in units of E_min = B_crit S_min.
    assert e == pytest.approx(batch * s / critical, rel=1e-9)
    assert s > 1 and e > 1


def test_past_the_critical_batch_a_bigger_batch_stops_paying():
    assert steps_to_target(1, 1) == samples_to_target(1, 1) == 2
    # Below B_crit doubling the batch nearly halves the steps, for little compute ...
    assert 1 - steps_to_target(0.25, 1) / steps_to_target(0.125, 1) == pytest.approx(
        4 / 9
    )
    assert samples_to_target(0.25, 1) / samples_to_target(0.125, 1) == pytest.approx(
        10 / 9
    )
    # ... above it, it saves a quarter of the steps at most and costs 1.5x or more.
    for b in (1, 2, 4, 8, 100):
        assert 1 - steps_to_target(2 * b, 1) / steps_to_target(b, 1) <= 0.25 + 1e-12
        assert samples_to_target(2 * b, 1) / samples_to_target(b, 1) >= 1.5 - 1e-12
    with pytest.raises(ValueError):
        steps_to_target(0, 1)
    with pytest.raises(ValueError):
        samples_to_target(1, -1)


# -- stragglers --------------------------------------------------------------


def test_synchronous_step_waits_for_the_slowest():
    assert synchronous_step_s([0.1, 0.1, 0.4, 0.1], comm_s=0.05) == pytest.approx(0.45)
    with pytest.raises(ValueError):
        synchronous_step_s([])


def test_expected_slowest_delay_matches_simulation():
    assert harmonic_number(1) == 1.0 and harmonic_number(4) == pytest.approx(25 / 12)
    rng = random.Random(0)
    for n in (1, 2, 4, 16):
        draws = [max(rng.expovariate(1 / 0.02) for _ in range(n)) for _ in range(20000)]
        assert sum(draws) / len(draws) == pytest.approx(
            expected_slowest_delay_s(n, 0.02), rel=0.03
        )


def test_a_slow_rank_makes_every_rank_slow():
    """Chapter 7's claim: every rank's step lasts at least the slowest's compute."""
    from mylib.experiments.scaling_measure import straggler_steps, typical

    results = run_ranks(
        straggler_steps,
        3,
        args=(0.005, [0.0, 0.0, 0.02], 6),
        show_output=False,
    )
    own = [typical(o) for o, _, _ in results]
    step = [typical(s) for _, s, _ in results]
    assert max(own[:2]) < own[2] and min(step) > own[2] - 1e-3


def test_injected_hiccups_never_fall_with_more_ranks():
    """Rank r draws the same delays at any rank count: the slowest can only grow."""
    from mylib.experiments.scaling_measure import slowest_delays, straggler_steps

    injected = {}
    for n in (1, 2, 3):
        results = run_ranks(
            straggler_steps,
            n,
            args=(0.001, None, 5, 0.002),
            show_output=False,
        )
        for r, (_, step, delays) in enumerate(results):
            if r < len(injected.get(n - 1, [])):
                assert delays == injected[n - 1][r]  # the same draws as before
            # Steps wait for the slowest delay (1 ms of slack at the barrier).
            slowest = slowest_delays(results)
            assert sum(step) / 5 > 0.001 + sum(slowest) / 5 - 1e-3
        injected[n] = [delays for _, _, delays in results]
    means = {n: sum(map(max, zip(*d))) / 5 for n, d in injected.items()}
    assert means[1] <= means[2] <= means[3]


# -- the chapter's staleness and local-SGD claims (seeded: the same every run) --


def test_staleness_claims():
    from mylib.experiments.local_sgd_check import staleness_tails

    runs = ((0, 0.1), (3, 0.1), (15, 0.1), (0, 0.02), (15, 0.02))
    fresh, little, lot, slow_fresh, slow_stale = (
        staleness_tails(runs)[run] for run in runs
    )
    assert fresh < little < 1  # a little staleness costs a little
    assert not lot < 1  # a lot diverges at a learning rate that was fine
    assert fresh < slow_fresh < slow_stale < 1  # a smaller rate survives, slower
    assert slow_fresh - fresh > slow_stale - slow_fresh  # mostly the smaller rate


def test_local_sgd_tradeoff_claims():
    from mylib.experiments.local_sgd_check import local_sgd_tradeoff

    periods = [1, 4, 16, 64]
    results = run_ranks(
        local_sgd_tradeoff, 4, args=(periods, 128, [0.0, 1.0]), show_output=False
    )
    report = results[0][0]
    assert all(r[0] == report for r in results)  # every rank ends on the average
    assert max(r[1] for r in results) < 1e-6 and max(r[2] for r in results) < 1e-6
    for period in periods:  # bytes fall by H exactly
        assert report[0.0, period][1] * period == pytest.approx(report[0.0, 1][1])
    alike = [report[0.0, h][0] for h in periods]
    differ = [report[1.0, h][0] for h in periods]
    assert max(alike) - min(alike) < 0.01 * min(alike)
    assert differ == sorted(differ) and differ[-1] > differ[0]


# -- local SGD on real gloo groups -------------------------------------------


def _train_local_sgd(sync_every, steps, use_torch_averager, seed=0):
    import torch.distributed as dist
    from torch.distributed.algorithms.model_averaging.averagers import (
        PeriodicModelAverager,
    )

    from mylib.comm import count_bytes
    from mylib.local_sgd import LocalSGD

    rank = dist.get_rank()
    torch.manual_seed(
        seed + rank
    )  # different initial weights: the broadcast must fix them
    model = torch.nn.Sequential(
        torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if use_torch_averager:
        for p in model.parameters():
            dist.broadcast(p.data, 0)
        averager = PeriodicModelAverager(period=sync_every, warmup_steps=sync_every - 1)
    else:
        local = LocalSGD(model, opt, sync_every)
    gen = torch.Generator().manual_seed(1000 + rank)
    with count_bytes() as stats:
        for _ in range(steps):
            x = torch.randn(8, 5, generator=gen)
            torch.nn.functional.mse_loss(model(x), x[:, :2]).backward()
            if use_torch_averager:
                opt.step()
                averager.average_parameters(model.parameters())
            else:
                local.step()
            opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()], stats.by_op.get(
        "all_reduce", 0
    )


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("sync_every", [2, 4])
def test_local_sgd_equals_pytorch_periodic_model_averager(world_size, sync_every):
    ours = run_ranks(
        _train_local_sgd, world_size, args=(sync_every, 8, False), show_output=False
    )
    theirs = run_ranks(
        _train_local_sgd, world_size, args=(sync_every, 8, True), show_output=False
    )
    for (a, _), (b, _) in zip(ours, theirs):
        for pa, pb in zip(a, b):
            assert (pa - pb).abs().max().item() < 1e-6
    # After a step that ends a period, every rank holds the same parameters.
    for params, _ in ours[1:]:
        for p, p0 in zip(params, ours[0][0]):
            assert torch.equal(p, p0)
    # Bytes: one all-reduce of all parameters per period.
    n_params = sum(p.numel() for p in ours[0][0])
    assert ours[0][1] == (8 // sync_every) * (
        2 * (world_size - 1) * n_params * 4 // world_size
    )


def _sync_every_step_vs_gradient_averaging(steps):
    import torch.distributed as dist

    from mylib.local_sgd import LocalSGD

    rank, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    a = torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3)
    )
    b = torch.nn.Sequential(
        torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 3)
    )
    b.load_state_dict(a.state_dict())
    opt_a, opt_b = (
        torch.optim.SGD(a.parameters(), lr=0.05),
        torch.optim.SGD(b.parameters(), lr=0.05),
    )
    local = LocalSGD(a, opt_a, sync_every=1)
    gen = torch.Generator().manual_seed(7 + rank)
    for _ in range(steps):
        x = torch.randn(5, 4, generator=gen)
        for model in (a, b):
            model(x).square().mean().backward()
        local.step()
        for p in b.parameters():  # synchronous data parallelism: average the gradients
            dist.all_reduce(p.grad)
            p.grad /= n
        opt_b.step()
        opt_a.zero_grad()
        opt_b.zero_grad()
    return max(
        (pa - pb).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters())
    )


def test_local_sgd_every_step_is_synchronous_sgd():
    diffs = run_ranks(
        _sync_every_step_vs_gradient_averaging, 3, args=(6,), show_output=False
    )
    assert max(diffs) < 1e-6


def test_local_sgd_bad_input():
    with pytest.raises(RuntimeError, match="process group"):
        LocalSGD(torch.nn.Linear(2, 2), None, 2)
    with pytest.raises(ValueError):
        bytes_per_step(100, 2, 0)
    assert bytes_per_step(1000, 4, 2) == pytest.approx(2 * 3 / 4 * 1000 / 2)


# -- the chapter's exercises: their key points are asserted here -------------


def test_chapter_exercise_answers():
    assert comm_bound_ranks(transformer_like_layers(2.6e9, 20.0), 0.0, 25e9) == 98
    assert expected_slowest_delay_s(256, 0.004) == pytest.approx(0.0245, abs=1e-4)
    assert expected_slowest_delay_s(16, 0.004) == pytest.approx(0.0135, abs=1e-4)
    assert bytes_per_step(1.4e9, 16, 1) == pytest.approx(2.625e9)
    assert bytes_per_step(1.4e9, 16, 8) == pytest.approx(0.328125e9)


# -- the measured run: the arithmetic does not change with the rank count ----


def _small_model():
    from mylib.experiments.common import mlp

    return mlp([32] * 4)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_fixed_global_batch_equals_one_process(world_size):
    from mylib.experiments.common import global_batches
    from mylib.experiments.scaling_measure import (
        train_fixed_global_batch,
        train_single_process,
    )

    batches = global_batches(4, 12, [32])
    reference = train_single_process(_small_model, batches, 0.05)
    results = run_ranks(
        train_fixed_global_batch,
        world_size,
        args=(_small_model, batches, 0.05),
        kwargs=dict(comm_sizes=[4096, 65536]),
        show_output=False,
    )
    for step_s, allreduce_s, params in results:
        assert len(step_s) == 4 and (allreduce_s is None) == (world_size == 1)
        for p, r in zip(params, reference):
            assert (p - r).abs().max().item() < 1e-6


def test_fixed_global_batch_mylib_equals_torch_ddp():
    from mylib.experiments.common import global_batches
    from mylib.experiments.scaling_measure import train_fixed_global_batch

    batches = global_batches(3, 8, [32])
    ours = run_ranks(
        train_fixed_global_batch,
        2,
        args=(_small_model, batches, 0.05),
        kwargs=dict(comm_sizes=[4096, 65536]),
        show_output=False,
    )
    theirs = run_ranks(
        train_fixed_global_batch,
        2,
        args=(_small_model, batches, 0.05),
        kwargs=dict(comm_sizes=[4096, 65536], use_torch_ddp=True),
        show_output=False,
    )
    for p, q in zip(ours[0][2], theirs[0][2]):
        assert (p - q).abs().max().item() < 1e-6


def test_fixed_global_batch_needs_an_even_split():
    from mylib import RankError
    from mylib.experiments.common import global_batches
    from mylib.experiments.scaling_measure import train_fixed_global_batch

    with pytest.raises(RankError, match="split evenly"):
        run_ranks(
            train_fixed_global_batch,
            3,
            args=(_small_model, global_batches(1, 8, [32]), 0.05),
            show_output=False,
        )


def test_predicted_step_recovers_the_link():
    from mylib.experiments.scaling_measure import (
        COMM_SIZES,
        linear_layers,
        predicted_step,
    )

    model = _small_model()
    alpha, beta = 50e-6, 2e9
    measured = [ring_all_reduce_time(b, 4, alpha, beta) for b in COMM_SIZES]
    timeline, fit = predicted_step(model, 4, 0.001, 0.002, measured, cores=2)
    assert fit.alpha == pytest.approx(alpha, rel=1e-6) and fit.beta == pytest.approx(
        beta, rel=1e-6
    )
    assert timeline.backward_end_s == pytest.approx(
        0.001 * 2 + 0.002 * 2
    )  # 4 ranks share 2 cores
    layers = linear_layers(model, 0.003)
    assert [l.param_bytes for l in layers] == [(32 * 4, 32 * 32 * 4)] * 3
    one, no_fit = predicted_step(model, 1, 0.001, 0.002)
    assert no_fit is None and one.comm_s == 0.0


def test_straggler_steps_shape():
    from mylib.experiments.scaling_measure import straggler_steps

    results = run_ranks(
        straggler_steps,
        2,
        args=(0.001, [0.0, 0.002], 3),
        kwargs=dict(jitter_mean_s=0.001),
        show_output=False,
    )
    for own, step, delays in results:
        assert len(own) == len(step) == len(delays) == 3
        assert all(s >= o for s, o in zip(step, own))  # the step includes the compute


# -- asynchronous SGD: staleness ---------------------------------------------


def test_stale_gradient_sgd():
    from mylib.local_sgd import stale_gradient_sgd

    def model():
        torch.manual_seed(0)
        return torch.nn.Sequential(
            torch.nn.Linear(3, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1)
        )

    gen = torch.Generator().manual_seed(2)
    batches = [
        (torch.randn(4, 3, generator=gen), torch.randn(4, 1, generator=gen))
        for _ in range(6)
    ]
    fresh, plain = model(), model()
    stale_gradient_sgd(fresh, batches, 0.1, 0, torch.nn.functional.mse_loss)
    for x, y in batches:  # delay 0 is plain SGD
        torch.nn.functional.mse_loss(plain(x), y).backward()
        with torch.no_grad():
            for p in plain.parameters():
                p.add_(p.grad, alpha=-0.1)
                p.grad = None
    for p, q in zip(fresh.parameters(), plain.parameters()):
        assert (p - q).abs().max().item() < 1e-6
    # delay 2: the first three steps all use the initial parameters' gradients.
    stale = model()
    stale_gradient_sgd(stale, batches[:3], 0.1, 2, torch.nn.functional.mse_loss)
    expected = model()
    grads = []
    for x, y in batches[:3]:
        expected.zero_grad()
        torch.nn.functional.mse_loss(expected(x), y).backward()
        grads.append([p.grad.clone() for p in expected.parameters()])
    with torch.no_grad():
        for i, p in enumerate(expected.parameters()):
            p.sub_(0.1 * sum(g[i] for g in grads))
    for p, q in zip(stale.parameters(), expected.parameters()):
        assert (p - q).abs().max().item() < 1e-6
    with pytest.raises(ValueError, match="delay"):
        stale_gradient_sgd(model(), batches, 0.1, -1, torch.nn.functional.mse_loss)
